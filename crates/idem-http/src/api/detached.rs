//! Store operations run detached from the client's connection.
//!
//! A client that times out or disconnects drops its request's future; a
//! store operation polled inside it would stop wherever it was. So an
//! operation that does not finish in its first poll runs on a task of its
//! own and the handler awaits its result: the operation finishes whether or
//! not anyone is left to answer.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use http::StatusCode;
use idem_core::StoreError;
use tokio_util::task::TaskTracker;

use super::Problem;

/// The store operations the service has started, each on its own task.
///
/// Clones share the set. A server waits for them ([`wait`](Self::wait))
/// before it closes the store, so an operation whose client left is not cut
/// short at shutdown either.
#[derive(Clone, Debug, Default)]
pub struct Detached {
    tasks: TaskTracker,
}

impl Detached {
    /// Runs `operation` to its end whatever becomes of the caller, and
    /// returns its result as an answer.
    ///
    /// It is polled once here: most operations (every one of the memory
    /// store's, a file store's `begin`) finish in that poll and need no
    /// task. One that does not is moved, within the same poll, to a task of
    /// its own that the caller then awaits, so no moment exists at which a
    /// dropped caller could stop it half-way.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        operation: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, Problem> {
        let mut operation = Box::pin(operation);
        let first = std::future::poll_fn(|cx| Poll::Ready(operation.as_mut().poll(cx))).await;
        let result = match first {
            Poll::Ready(result) => result,
            Poll::Pending => match self.tasks.spawn(operation).await {
                Ok(result) => result,
                // A panic in a store is a bug: let it take the request down
                // as it would have without the task.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // Only a runtime shutting down cancels the task.
                Err(_) => {
                    return Err(Problem::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "store-unavailable",
                        "Store unavailable",
                        "the server is shutting down; retry",
                    )
                    .retry_after(Duration::from_secs(1)));
                }
            },
        };
        result.map_err(Problem::store)
    }

    /// Completes when every operation started so far has finished.
    ///
    /// # Cancel safety
    ///
    /// Only waits: dropping it stops the waiting, never an operation.
    pub async fn wait(&self) {
        self.tasks.close();
        self.tasks.wait().await;
        self.tasks.reopen();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_dropped_caller_does_not_cut_its_operation_short_and_wait_waits_for_it() {
        let detached = Detached::default();
        let done = Arc::new(AtomicBool::new(false));
        let operation = {
            let done = done.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                done.store(true, Ordering::SeqCst);
                Ok::<_, StoreError>(())
            }
        };
        // The caller gives up after its first poll, as a request does when
        // its client disconnects.
        let caller = detached.run(operation);
        let gave_up = tokio::time::timeout(Duration::from_millis(1), caller).await;
        assert!(gave_up.is_err(), "the operation takes longer than that");
        assert!(!done.load(Ordering::SeqCst));
        tokio::time::timeout(Duration::from_secs(5), detached.wait())
            .await
            .expect("finished once the operation has");
        assert!(done.load(Ordering::SeqCst), "the operation was cut short");
        assert!(detached.tasks.is_empty());
    }
}
