//! Redis Streams source for idem's consumer runner.
#![deny(missing_docs)]
