//! Until a rebuild has fed it the stored keys, the filter answers `Maybe`
//! to everything; a rebuild reports its progress, and one that fails or is
//! dropped leaves the filter answering `Maybe`.

mod filter_support;

use std::cell::RefCell;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::stream;
use idem_core::Key;
use idem_tiered::filter::{KeyFilter, Membership, REBUILD_PROGRESS_EVERY, Readiness, RebuildError};

use filter_support::{at, config, feed, key, no_keys};

#[derive(Debug, thiserror::Error)]
#[error("the cold tier went away")]
struct ColdTierDown;

#[test]
fn a_new_filter_answers_maybe_until_rebuilt() {
    let filter = KeyFilter::new(&config(1_000), at(0)).unwrap();
    assert_eq!(filter.readiness(), Readiness::NeedsRebuild { since: None });
    assert_eq!(filter.check(&key(1)), Membership::Maybe);
    filter.rebuild(feed([key(2)]), Some(1), |_, _| {}).unwrap();
    assert_eq!(filter.readiness(), Readiness::Ready);
    assert_eq!(filter.check(&key(1)), Membership::Absent);
    assert_eq!(filter.check(&key(2)), Membership::Maybe);
}

#[test]
fn lookups_during_a_rebuild_answer_maybe_and_progress_is_reported_to_the_end() {
    let filter = KeyFilter::new(&config(100_000), at(0)).unwrap();
    let total = 3 * REBUILD_PROGRESS_EVERY + 5;
    let calls = RefCell::new(Vec::new());
    let fed = filter
        .rebuild(feed((0..total).map(key)), Some(total), |done, of| {
            calls.borrow_mut().push((done, of));
            if done < total {
                assert_eq!(
                    filter.readiness(),
                    Readiness::Rebuilding {
                        done,
                        total: Some(total)
                    }
                );
                assert_eq!(filter.check(&key(total + 1)), Membership::Maybe);
            }
        })
        .unwrap();
    assert_eq!(fed, total);
    let every = REBUILD_PROGRESS_EVERY;
    assert_eq!(
        calls.into_inner(),
        [
            (0, Some(total)),
            (every, Some(total)),
            (2 * every, Some(total)),
            (3 * every, Some(total)),
            (total, Some(total))
        ]
    );
    assert_eq!(filter.check(&key(total + 1)), Membership::Absent);
    assert!((0..total).all(|n| filter.check(&key(n)) == Membership::Maybe));
}

#[test]
fn keys_inserted_during_a_rebuild_are_kept() {
    let filter = KeyFilter::new(&config(100_000), at(0)).unwrap();
    let keys = feed((0..2 * REBUILD_PROGRESS_EVERY).map(key));
    filter
        .rebuild(keys, None, |done, _| {
            if done == REBUILD_PROGRESS_EVERY {
                filter.insert(&Key::new("orders", "live").unwrap());
            }
        })
        .unwrap();
    assert_eq!(
        filter.check(&Key::new("orders", "live").unwrap()),
        Membership::Maybe
    );
}

#[test]
fn a_failed_rebuild_leaves_the_filter_answering_maybe_and_can_be_retried() {
    let filter = KeyFilter::new(&config(1_000), at(0)).unwrap();
    let failing = [Ok(key(1)), Ok(key(2)), Err(ColdTierDown)];
    let error = filter.rebuild(failing, Some(3), |_, _| {}).unwrap_err();
    assert!(
        matches!(error, RebuildError::Source { done: 2, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("retry it"), "{error}");
    assert_eq!(filter.readiness(), Readiness::NeedsRebuild { since: None });
    assert_eq!(filter.check(&key(9)), Membership::Maybe);

    filter
        .rebuild(feed([key(1), key(2), key(3)]), Some(3), |_, _| {})
        .unwrap();
    assert_eq!(filter.check(&key(9)), Membership::Absent);
}

#[test]
fn one_rebuild_runs_at_a_time_and_a_ready_filter_refuses_another() {
    let filter = KeyFilter::new(&config(1_000), at(0)).unwrap();
    filter
        .rebuild(feed([key(1)]), None, |done, _| {
            if done == 0 {
                let again = filter.rebuild(no_keys(), None, |_, _| {}).unwrap_err();
                assert!(matches!(again, RebuildError::AlreadyRunning), "{again}");
            }
        })
        .unwrap();
    let ready = filter.rebuild(no_keys(), None, |_, _| {}).unwrap_err();
    assert!(matches!(ready, RebuildError::AlreadyReady), "{ready}");
    assert!(ready.to_string().contains("build a new filter"), "{ready}");
    assert_eq!(filter.readiness(), Readiness::Ready);
}

#[tokio::test]
async fn a_rebuild_from_a_stream_makes_the_filter_ready() {
    let filter = KeyFilter::new(&config(100_000), at(0)).unwrap();
    let keys = stream::iter((0..10_000).map(|n| Ok::<_, ColdTierDown>(key(n))));
    let mut last = (0, None);
    let fed = filter
        .rebuild_from_stream(keys, None, |done, total| last = (done, total))
        .await
        .unwrap();
    assert_eq!((fed, last), (10_000, (10_000, None)));
    assert_eq!(filter.readiness(), Readiness::Ready);
    assert_eq!(filter.check(&key(9_999)), Membership::Maybe);
    assert_eq!(filter.check(&key(10_000)), Membership::Absent);
}

#[tokio::test]
async fn a_dropped_stream_rebuild_leaves_the_filter_answering_maybe() {
    let filter = KeyFilter::new(&config(1_000), at(0)).unwrap();
    let stalls = stream::iter([Ok::<_, ColdTierDown>(key(1))]).chain(stream::pending());
    let rebuild = filter.rebuild_from_stream(stalls, Some(2), |_, _| {});
    assert!(
        tokio::time::timeout(Duration::from_millis(50), rebuild)
            .await
            .is_err()
    );
    assert_eq!(filter.readiness(), Readiness::NeedsRebuild { since: None });
    assert_eq!(filter.check(&key(2)), Membership::Maybe);
}
