use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use http::Response;

use super::GatewayBody;

/// The response future of [`Idempotency`](super::Idempotency).
///
/// # Cancel safety
///
/// Dropping it never cancels a claimed request half-way: once the key is
/// claimed, the upstream call and storing its answer run in a spawned task
/// that finishes without the caller, and a retry gets the stored answer. A
/// future dropped before the claim (while the request body is read) leaves
/// nothing behind. See [`Idempotency`](super::Idempotency#cancel-safety).
pub struct ResponseFuture<E> {
    pub(super) inner: BoxFuture<'static, Result<Response<GatewayBody>, E>>,
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response<GatewayBody>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}
