//! `maintain` rotates and snapshots on every tick, keeps going when a
//! snapshot fails, and writes a last snapshot at shutdown.

mod filter_support;

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Clock, ManualClock};
use idem_tiered::filter::{KeyFilter, Membership, Readiness, SnapshotError, maintain};

use filter_support::{HOUR, at, config, key, no_keys, ready};

const TICK: Duration = Duration::from_millis(20);

#[tokio::test]
async fn each_tick_rotates_and_snapshots_and_shutdown_writes_a_last_snapshot() {
    let config = config(1_000);
    let clock = ManualClock::at(at(0));
    let filter = Arc::new(ready(&config, at(0)));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("filter.snapshot");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(maintain(
        filter.clone(),
        path.clone(),
        TICK,
        Arc::new(clock.clone()),
        async {
            let _ = stopped.await;
        },
    ));

    filter.insert(&key(1));
    wait_for(|| path.exists()).await;
    clock.advance(HOUR);
    wait_for(|| filter.stats().rotations == 1).await;
    // Inserted after the last tick: only the last snapshot holds it.
    clock.advance(Duration::from_secs(1));
    filter.insert(&key(2));
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();

    let loaded = KeyFilter::load_snapshot(&path, &config, clock.now()).unwrap();
    assert_eq!(
        loaded.readiness(),
        Readiness::NeedsRebuild {
            since: Some(clock.now())
        }
    );
    assert_eq!(loaded.generation_starts(), filter.generation_starts());
    loaded.rebuild(no_keys(), None, |_, _| {}).unwrap();
    assert_eq!(loaded.check(&key(1)), Membership::Maybe);
    assert_eq!(loaded.check(&key(2)), Membership::Maybe);
    assert_eq!(loaded.check(&key(3)), Membership::Absent);
}

#[tokio::test]
async fn a_failing_snapshot_does_not_stop_rotation_and_the_last_error_is_returned() {
    let clock = ManualClock::at(at(0));
    let filter = Arc::new(ready(&config(1_000), at(0)));
    let dir = tempfile::tempdir().unwrap();
    let unwritable = dir.path().join("no-such-dir").join("filter.snapshot");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(maintain(
        filter.clone(),
        unwritable,
        TICK,
        Arc::new(clock.clone()),
        async {
            let _ = stopped.await;
        },
    ));
    tokio::time::sleep(3 * TICK).await;
    clock.advance(HOUR);
    wait_for(|| filter.stats().rotations == 1).await;
    stop.send(()).unwrap();
    let error = task.await.unwrap().unwrap_err();
    assert!(matches!(error, SnapshotError::Write { .. }), "{error}");
}

/// Polls `condition` until it holds, for at most five seconds.
async fn wait_for(condition: impl Fn() -> bool) {
    for _ in 0..500 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the condition did not hold within five seconds");
}
