//! The operator's cases (docs/contract.md §2, "Operations for operators"):
//! what [`Admin`] counts, lists and removes, for every store that offers it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_core::admin::{Admin, NamespaceStats, Purge};
use idem_core::{BeginItem, CompleteItem, Fenced, Key, Lease, Namespace, Store};

use crate::Subject;
use crate::cases::acquired;

fn namespace<S>(s: &Subject<S>, case: &str) -> Namespace {
    Namespace::new(&format!("admin-{case}-{}", s.run)).expect("a valid namespace")
}

fn key(ns: &Namespace, k: &str) -> Key {
    Key::in_namespace(ns.clone(), k.to_owned()).expect("a valid key")
}

/// One record in each state: `live` in progress, `abandoned` (lease ended),
/// `done` completed, `gone` completed and past its retention. Answers the
/// live claim's token.
async fn one_of_each<S: Store + Clone>(s: &Subject<S>, ns: &Namespace) -> u64 {
    let short = Lease::new(s.steps(1));
    acquired(
        s.store
            .begin(&key(ns, "abandoned"), None, short)
            .await
            .unwrap(),
    );
    let gone = acquired(s.store.begin(&key(ns, "gone"), None, short).await.unwrap());
    let done = s
        .store
        .complete(&key(ns, "gone"), gone.token, None, s.steps(1))
        .await
        .unwrap();
    assert_eq!(done, Fenced::Ok(()));
    s.pass(3).await;
    let long = Lease::new(s.steps(600));
    let live = acquired(s.store.begin(&key(ns, "live"), None, long).await.unwrap());
    let c = acquired(s.store.begin(&key(ns, "done"), None, long).await.unwrap());
    let done = s
        .store
        .complete(
            &key(ns, "done"),
            c.token,
            Some(Bytes::from_static(b"ok")),
            s.steps(600),
        )
        .await
        .unwrap();
    assert_eq!(done, Fenced::Ok(()));
    live.token.get()
}

fn live_counts(stats: &NamespaceStats) -> (u64, u64, u64) {
    (stats.in_progress, stats.abandoned, stats.completed)
}

/// Claims `records` keys of `ns` in batches, completing every `every`th;
/// answers the keys.
async fn claim_all<S: Store + Clone>(
    s: &Subject<S>,
    ns: &Namespace,
    records: usize,
    every: usize,
) -> Vec<Key> {
    let lease = Lease::new(s.steps(600));
    let batch = s.store.limits().max_batch.min(500);
    let keys: Vec<Key> = (0..records).map(|i| key(ns, &format!("k{i:05}"))).collect();
    for chunk in keys.chunks(batch) {
        let items: Vec<BeginItem> = chunk
            .iter()
            .map(|k| BeginItem {
                key: k.clone(),
                fingerprint: None,
                lease,
            })
            .collect();
        let claims = s.store.begin_many(&items).await.unwrap();
        let done: Vec<CompleteItem> = chunk
            .iter()
            .zip(claims)
            .step_by(every)
            .map(|(k, b)| CompleteItem {
                key: k.clone(),
                token: acquired(b).token,
                outcome: None,
                retention: s.steps(600),
            })
            .collect();
        s.store.complete_many(&done).await.unwrap();
    }
    keys
}

/// `stats` counts each state, and dates the oldest claim in progress.
pub async fn stats_count_each_state<S: Store + Admin + Clone>(s: &Subject<S>) {
    let ns = namespace(s, "stats");
    let empty = s.store.stats(&ns).await.unwrap();
    assert_eq!(empty, NamespaceStats::default(), "a namespace never used");
    one_of_each(s, &ns).await;
    let stats = s.store.stats(&ns).await.unwrap();
    assert_eq!(live_counts(&stats), (1, 1, 1), "{stats:?}");
    assert!(stats.expired <= 1, "{stats:?}");
    let Some(idem_core::Record::InProgress(abandoned)) =
        s.store.get(&key(&ns, "abandoned")).await.unwrap()
    else {
        panic!("the abandoned claim is still a record in progress");
    };
    assert_eq!(stats.oldest_in_progress, Some(abandoned.started_at));

    // Every namespace in one call gives the same counts, and the bounded
    // count too.
    let all = s.store.stats_all().await.unwrap();
    let mine: Vec<_> = all.iter().filter(|(n, _)| *n == ns).collect();
    assert_eq!(mine.len(), 1, "listed once: {all:?}");
    assert_eq!(live_counts(&mine[0].1), (1, 1, 1), "{all:?}");
    assert_eq!(mine[0].1.oldest_in_progress, stats.oldest_in_progress);
    assert!(
        all.windows(2).all(|w| w[0].0 < w[1].0),
        "in order, once each"
    );
    let within = s
        .store
        .stats_within(&ns, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(live_counts(&within), (1, 1, 1), "{within:?}");
    assert_eq!(within.oldest_in_progress, stats.oldest_in_progress);
}

/// `namespaces` lists every namespace holding a record, in order.
pub async fn namespaces_lists_each_used_namespace<S: Store + Admin + Clone>(s: &Subject<S>) {
    let (a, b) = (namespace(s, "list-a"), namespace(s, "list-b"));
    let never = namespace(s, "list-never");
    crate::cases::deliver(&s.store, &key(&a, "k"), "1").await;
    crate::cases::deliver(&s.store, &key(&b, "k"), "2").await;
    let listed = s.store.namespaces().await.unwrap();
    assert!(listed.contains(&a) && listed.contains(&b), "{listed:?}");
    assert!(!listed.contains(&never));
    assert!(
        listed.windows(2).all(|w| w[0] < w[1]),
        "in order, once each"
    );
}

/// `purge(Expired)` removes only what no caller can see.
pub async fn purge_expired_changes_nothing_callers_see<S: Store + Admin + Clone>(s: &Subject<S>) {
    let ns = namespace(s, "expired");
    one_of_each(s, &ns).await;
    let before = s.store.stats(&ns).await.unwrap();
    let removed = s.store.purge(&ns, Purge::Expired, &|_| {}).await.unwrap();
    assert!(removed <= 1, "only the expired record can go: {removed}");
    let after = s.store.stats(&ns).await.unwrap();
    assert_eq!(live_counts(&after), live_counts(&before));
    assert_eq!(after.expired, 0, "{after:?}");
    assert!(s.store.get(&key(&ns, "done")).await.unwrap().is_some());
    assert!(s.store.get(&key(&ns, "abandoned")).await.unwrap().is_some());
}

/// `purge(All)` empties the namespace; a purged holder's token is stale,
/// and the key's next claim gets a larger token. Other namespaces keep
/// their records.
pub async fn purge_all_empties_the_namespace_and_fencing_holds<S: Store + Admin + Clone>(
    s: &Subject<S>,
) {
    let (ns, other) = (namespace(s, "all"), namespace(s, "all-other"));
    let live = one_of_each(s, &ns).await;
    crate::cases::deliver(&s.store, &key(&other, "kept"), "kept").await;
    let removed = s.store.purge(&ns, Purge::All, &|_| {}).await.unwrap();
    assert!(
        removed >= 3,
        "the live, abandoned and done records: {removed}"
    );
    let stats = s.store.stats(&ns).await.unwrap();
    assert_eq!(stats, NamespaceStats::default(), "nothing left");
    for k in ["live", "abandoned", "done", "gone"] {
        assert_eq!(s.store.get(&key(&ns, k)).await.unwrap(), None, "{k}");
    }
    let stale = s
        .store
        .complete(
            &key(&ns, "live"),
            idem_core::FencingToken::new(live),
            None,
            s.steps(600),
        )
        .await
        .unwrap();
    assert_eq!(stale, Fenced::Stale, "a purged claim's holder is stale");
    let again = acquired(
        s.store
            .begin(&key(&ns, "live"), None, Lease::new(s.steps(600)))
            .await
            .unwrap(),
    );
    assert!(
        again.token.get() > live,
        "{} after {live}",
        again.token.get()
    );
    assert!(s.store.get(&key(&other, "kept")).await.unwrap().is_some());
    assert!(!s.store.namespaces().await.unwrap().is_empty());
}

/// A namespace of thousands of records purges in batches, reporting its
/// progress, and ends empty.
pub async fn purge_of_thousands_runs_in_batches<S: Store + Admin + Clone>(s: &Subject<S>) {
    const RECORDS: usize = 5_000;
    let ns = namespace(s, "many");
    // Half completed, half left in progress.
    claim_all(s, &ns, RECORDS, 2).await;
    let stats = s.store.stats(&ns).await.unwrap();
    assert_eq!(
        (stats.in_progress, stats.completed),
        (RECORDS as u64 / 2, RECORDS as u64 / 2)
    );
    let seen = Mutex::new(Vec::new());
    let last = AtomicU64::new(0);
    let progress = |n: u64| {
        last.store(n, Ordering::Relaxed);
        seen.lock().unwrap().push(n);
    };
    let removed = s.store.purge(&ns, Purge::All, &progress).await.unwrap();
    assert_eq!(removed, RECORDS as u64);
    let seen = seen.into_inner().unwrap();
    assert!(!seen.is_empty(), "progress after each batch");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert_eq!(last.load(Ordering::Relaxed), removed);
    assert_eq!(s.store.stats(&ns).await.unwrap(), NamespaceStats::default());
}

/// A purge dropped part way (after one poll, and after its first batch)
/// leaves every key usable, and running it again finishes the job.
pub async fn purge_dropped_part_way_leaves_keys_usable<S: Store + Admin + Clone>(s: &Subject<S>) {
    const RECORDS: usize = 3_000;
    let ns = namespace(s, "dropped");
    let keys = claim_all(s, &ns, RECORDS, 1).await;
    // Dropped after one poll.
    crate::cancel::DropPoint::AfterPolls(1)
        .run(s.store.purge(&ns, Purge::All, &|_| {}))
        .await;
    // Dropped once its first batch is reported.
    {
        let first = std::sync::Arc::new(tokio::sync::Notify::new());
        let told = first.clone();
        let progress = move |n: u64| {
            if n > 0 {
                told.notify_one();
            }
        };
        let purge = s.store.purge(&ns, Purge::All, &progress);
        tokio::select! {
            _ = purge => {}
            () = first.notified() => {}
        }
    }
    // Every key answers: completed if its record is left, acquired if not;
    // never an error, never a claim nobody holds.
    for k in keys.iter().step_by(97) {
        match s
            .store
            .begin(k, None, Lease::new(s.steps(600)))
            .await
            .unwrap()
        {
            idem_core::Begin::Completed { .. } => {}
            idem_core::Begin::Acquired(c) => {
                let released = s.store.release(k, c.token).await.unwrap();
                assert_eq!(released, Fenced::Ok(()), "{k}");
            }
            other => panic!("{k}: {other:?}"),
        }
    }
    s.store.purge(&ns, Purge::All, &|_| {}).await.unwrap();
    assert_eq!(
        s.store.stats(&ns).await.unwrap(),
        NamespaceStats::default(),
        "running it again finishes the job"
    );
}

/// `size` answers, and says what it measured.
pub async fn size_says_what_it_measures<S: Store + Admin + Clone>(s: &Subject<S>) {
    crate::cases::deliver(&s.store, &key(&namespace(s, "size"), "k"), "v").await;
    if let Some(size) = s.store.size().await.unwrap() {
        assert!(size.bytes > 0 && !size.what.is_empty(), "{size:?}");
    }
}

/// Writes one `#[tokio::test]` per operator case, with the same argument as
/// [`conformance_tests!`](crate::conformance_tests); the store must also
/// implement [`Admin`].
#[macro_export]
macro_rules! admin_conformance_tests {
    ($subject:expr) => {
        $crate::admin_conformance_tests!(@cases $subject;
            stats_count_each_state,
            namespaces_lists_each_used_namespace,
            purge_expired_changes_nothing_callers_see,
            purge_all_empties_the_namespace_and_fencing_holds,
            purge_of_thousands_runs_in_batches,
            purge_dropped_part_way_leaves_keys_usable,
            size_says_what_it_measures,
        );
    };
    (@cases $subject:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(subject) = $crate::IntoSubject::into_subject($subject.await) else {
                    return;
                };
                $crate::admin::$case(&subject).await;
            }
        )*
    };
}
