//! Keeping a filter current while it serves: rotation and snapshots on an
//! interval, a last snapshot at shutdown.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use idem_core::SharedClock;
use tokio::time::MissedTickBehavior;

use super::{KeyFilter, SnapshotError};

/// Every `every`: rotates `filter` to the clock's time, refreshes its
/// estimated false-positive rate, then writes its snapshot to `snapshot` (on a blocking thread). When `shutdown` completes:
/// rotates and writes a last snapshot, and returns its result.
///
/// Choose `every` well below a window (a late rotation keeps keys longer,
/// never shorter); a snapshot that fails on the way is logged and retried at
/// the next tick. Stop inserting before `shutdown` completes, so that the
/// last snapshot holds every key (a loaded one is caught up from its time
/// either way).
///
/// ```no_run
/// # async fn run(filter: std::sync::Arc<idem_tiered::filter::KeyFilter>) -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use idem_core::SystemClock;
/// use idem_tiered::filter::maintain;
///
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let path = "idem-data/filter.snapshot".into();
/// let every = Duration::from_secs(60);
/// let task = tokio::spawn(maintain(filter, path, every, Arc::new(SystemClock), async {
///     let _ = stopped.await;
/// }));
/// // ... serve; at shutdown, once inserts have stopped:
/// let _ = stop.send(());
/// task.await??;
/// # Ok(())
/// # }
/// ```
pub async fn maintain(
    filter: Arc<KeyFilter>,
    snapshot: PathBuf,
    every: Duration,
    clock: SharedClock,
    shutdown: impl Future<Output = ()>,
) -> Result<(), SnapshotError> {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = ticks.tick() => {
                if let Err(error) = rotate_and_snapshot(&filter, &snapshot, &clock).await {
                    tracing::warn!(%error, "key filter snapshot failed; retrying at the next tick");
                }
            }
        }
    }
    rotate_and_snapshot(&filter, &snapshot, &clock).await
}

async fn rotate_and_snapshot(
    filter: &Arc<KeyFilter>,
    path: &Path,
    clock: &SharedClock,
) -> Result<(), SnapshotError> {
    let (filter, target, clock) = (filter.clone(), path.to_owned(), clock.clone());
    let written = tokio::task::spawn_blocking(move || {
        let now = clock.now();
        filter.rotate(now);
        filter.estimated_false_positive_rate();
        filter.write_snapshot(&target, now).map(drop)
    })
    .await;
    match written {
        Ok(result) => result,
        Err(error) => match error.try_into_panic() {
            // A panic in the writer surfaces as one here.
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(SnapshotError::Write {
                path: path.to_owned(),
                source: std::io::Error::other(
                    "the runtime shut down before the snapshot was written",
                ),
            }),
        },
    }
}
