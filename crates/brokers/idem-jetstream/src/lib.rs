//! NATS JetStream source for idem's consumer runner.
#![deny(missing_docs)]
