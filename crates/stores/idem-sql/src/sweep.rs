//! The background sweeper: deletes expired rows in small batches.

use std::sync::Weak;
use std::time::Duration;

use crate::store::Inner;

/// Stops the sweeper when the last handle to the store is dropped.
pub(crate) struct Sweeper(tokio::task::AbortHandle);

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Sweeps every `every` on the current Tokio runtime, for as long as the
/// store lives. A failed sweep is logged and tried again next time.
pub(crate) fn spawn(inner: Weak<Inner>, every: Duration) -> Sweeper {
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(inner) = inner.upgrade() else { break };
            match inner.sweep().await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(rows = n, "swept expired records"),
                Err(e) => {
                    tracing::warn!(error = %e, "sweeping expired records failed; trying again later")
                }
            }
        }
    });
    Sweeper(task.abort_handle())
}
