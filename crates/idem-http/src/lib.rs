//! idem over HTTP.
//!
//! - [`api`]: the service API (DESIGN.md §5) as an axum router over any
//!   store, for clients in any language.
//! - [`gateway`]: the `Idempotency-Key` layer (`docs/contract.md` §6), a plain
//!   `tower::Layer` usable with axum, hyper or tonic.
#![deny(missing_docs)]

pub mod api;
pub mod gateway;
