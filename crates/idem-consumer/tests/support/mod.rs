//! What the runner's test files share.

use std::time::Duration;

use idem_consumer::{Handler, Report, Runner, Source};
use idem_core::Store;
use tokio_util::sync::CancellationToken;

/// Runs until `done` holds or 10 s pass, then shuts down gracefully.
pub async fn run_until<S, Src, H>(
    runner: Runner<S, Src, H>,
    done: impl Fn() -> bool + Send + 'static,
) -> Report
where
    S: Store + Clone,
    Src: Source,
    H: Handler,
{
    let stop = CancellationToken::new();
    let watcher = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while !done() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            stop.cancel();
        })
    };
    let report = runner.run(stop).await.expect("runner starts");
    watcher.await.unwrap();
    report
}
