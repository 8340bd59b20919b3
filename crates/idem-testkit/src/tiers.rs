//! The conformance cases of a store that can be a tier
//! ([`Tier`], docs/contract.md §2 "Tiers"), written by
//! [`tier_conformance_tests!`](crate::tier_conformance_tests).

use bytes::Bytes;
use idem_core::tier::{ImportItem, Imported, Tier};
use idem_core::{
    Begin, Clock, Completed, Fenced, FencingToken, Fingerprint, Key, Lease, Record, SystemClock,
    Timestamp,
};

use crate::Subject;
use crate::cases::{acquired, deliver};

/// The store's time now, as the subject knows it: its manual clock, or the
/// machine's (the server of a real-time store runs on it too).
fn now<S: Tier + Clone>(s: &Subject<S>) -> Timestamp {
    s.now().unwrap_or_else(|| SystemClock.now())
}

fn record(
    token: u64,
    outcome: &'static str,
    completed_at: Timestamp,
    expires_at: Timestamp,
) -> Completed {
    Completed {
        token: FencingToken::new(token),
        fingerprint: Some(Fingerprint::sha256(b"imported")),
        outcome: Some(Bytes::from_static(outcome.as_bytes())),
        completed_at,
        expires_at,
    }
}

async fn import<S: Tier + Clone>(s: &Subject<S>, key: &Key, r: Completed) -> Imported {
    let answers = s
        .store
        .import_many(&[ImportItem {
            key: key.clone(),
            record: r,
        }])
        .await
        .expect("import_many should succeed");
    assert_eq!(answers.len(), 1, "one answer per item");
    answers[0]
}

/// An imported record is the key's record, with its own token, times and
/// outcome, and duplicates are answered from it.
pub async fn import_writes_the_record_as_given<S: Tier + Clone>(s: &Subject<S>) {
    let key = s.key("import-as-given");
    let t = now(s);
    let given = record(
        7_777,
        "imported",
        Timestamp::from_millis(t.as_millis() - 5_000),
        t.after(s.steps(600)),
    );
    assert_eq!(import(s, &key, given.clone()).await, Imported::Written);
    match s.store.get(&key).await.unwrap() {
        Some(Record::Completed(c)) => assert_eq!(c, given),
        other => panic!("expected the imported record, got {other:?}"),
    }
    let lease = Lease::new(s.steps(60));
    match s.store.begin(&key, given.fingerprint, lease).await.unwrap() {
        Begin::Completed {
            outcome,
            completed_at,
        } => {
            assert_eq!(outcome, given.outcome);
            assert_eq!(completed_at, given.completed_at);
        }
        other => panic!("a duplicate of an imported key replays it, got {other:?}"),
    }
    let other = Some(Fingerprint::sha256(b"other content"));
    let mismatch = s.store.begin(&key, other, lease).await.unwrap();
    assert!(matches!(mismatch, Begin::Mismatch), "{mismatch:?}");
}

/// A live completed record stays: importing cannot rewrite history.
pub async fn import_keeps_a_live_completed_record<S: Tier + Clone>(s: &Subject<S>) {
    let key = s.key("import-keeps");
    let token = deliver(&s.store, &key, "first").await;
    let t = now(s);
    let later = record(token.get() + 1, "second", t, t.after(s.steps(600)));
    assert_eq!(import(s, &key, later).await, Imported::Kept);
    match s.store.get(&key).await.unwrap() {
        Some(Record::Completed(c)) => {
            assert_eq!(c.outcome.as_deref(), Some(&b"first"[..]));
            assert_eq!(c.token, token);
        }
        other => panic!("expected the first completion, got {other:?}"),
    }
}

/// A record in progress gives way to an imported completion: the key is
/// done, and its holder's token no longer owns it.
pub async fn import_replaces_a_record_in_progress<S: Tier + Clone>(s: &Subject<S>) {
    let key = s.key("import-replaces");
    let claim = acquired(
        s.store
            .begin(&key, None, Lease::new(s.steps(60)))
            .await
            .unwrap(),
    );
    let t = now(s);
    let done = record(
        claim.token.get() + 1_000,
        "done elsewhere",
        t,
        t.after(s.steps(600)),
    );
    assert_eq!(import(s, &key, done).await, Imported::Written);
    let late = s
        .store
        .complete(&key, claim.token, None, s.steps(600))
        .await
        .unwrap();
    assert_eq!(
        late,
        Fenced::Stale,
        "the holder no longer owns a completed key"
    );
    match s
        .store
        .begin(&key, None, Lease::new(s.steps(60)))
        .await
        .unwrap()
    {
        Begin::Completed { outcome, .. } => {
            assert_eq!(outcome.as_deref(), Some(&b"done elsewhere"[..]));
        }
        other => panic!("expected the imported completion, got {other:?}"),
    }
}

/// A record past its retention is not brought back.
pub async fn import_of_an_expired_record_writes_nothing<S: Tier + Clone>(s: &Subject<S>) {
    let key = s.key("import-expired");
    let t = now(s);
    let gone = record(
        5,
        "gone",
        Timestamp::from_millis(t.as_millis() - 20_000),
        Timestamp::from_millis(t.as_millis() - 10_000),
    );
    assert_eq!(import(s, &key, gone).await, Imported::Kept);
    assert!(s.store.get(&key).await.unwrap().is_none());
    acquired(
        s.store
            .begin(&key, None, Lease::new(s.steps(60)))
            .await
            .unwrap(),
    );
}

/// The high-water mark covers what was imported and what was issued.
pub async fn token_high_water_covers_imported_and_issued_tokens<S: Tier + Clone>(s: &Subject<S>) {
    let issued = deliver(&s.store, &s.key("high-water-issued"), "ok").await;
    let before = s.store.token_high_water().await.unwrap();
    assert!(
        before >= issued,
        "high water {before:?} below issued {issued:?}"
    );
    let key = s.key("high-water-imported");
    let t = now(s);
    let above = before.get() + 1_000;
    assert_eq!(
        import(s, &key, record(above, "x", t, t.after(s.steps(600)))).await,
        Imported::Written
    );
    let after = s.store.token_high_water().await.unwrap();
    assert!(
        after.get() >= above,
        "high water {after:?} below imported {above}"
    );
}

/// After `raise_token_floor`, every new token is above the floor, and the
/// high-water mark counts it.
pub async fn raised_floor_lifts_every_later_token<S: Tier + Clone>(s: &Subject<S>) {
    let floor = FencingToken::new(s.store.token_high_water().await.unwrap().get() + 100);
    s.store.raise_token_floor(floor).await.unwrap();
    let high = s.store.token_high_water().await.unwrap();
    assert!(
        high >= floor,
        "high water {high:?} below the raised floor {floor:?}"
    );
    for i in 0..3 {
        let key = s.key(&format!("floor-{i}"));
        let claim = acquired(
            s.store
                .begin(&key, None, Lease::new(s.steps(60)))
                .await
                .unwrap(),
        );
        assert!(
            claim.token > floor,
            "token {:?} not above floor {floor:?}",
            claim.token
        );
    }
}

/// A recorded mark counts in the high-water mark at once.
pub async fn recorded_high_water_counts_at_once<S: Tier + Clone>(s: &Subject<S>) {
    let mark = FencingToken::new(s.store.token_high_water().await.unwrap().get() + 10);
    let started = std::time::Instant::now();
    s.store.record_high_water(mark).await.unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_millis(500),
        "recording a mark waited {:?}",
        started.elapsed()
    );
    let high = s.store.token_high_water().await.unwrap();
    assert!(
        high >= mark,
        "high water {high:?} below the recorded mark {mark:?}"
    );
}

/// `completed_keys` pages through completed records in key order, and
/// leaves out records in progress.
pub async fn completed_keys_page_in_key_order<S: Tier + Clone>(s: &Subject<S>) {
    let probe = s.key("completed-keys");
    let ns = format!("tier{}", &probe.to_string()[probe.to_string().len() - 12..]);
    let key = |i: usize| Key::new(&ns, format!("k{i:02}")).unwrap();
    for i in 0..7 {
        deliver(&s.store, &key(i), "ok").await;
    }
    acquired(
        s.store
            .begin(&key(99), None, Lease::new(s.steps(60)))
            .await
            .unwrap(),
    );
    let mut seen = Vec::new();
    let mut after = Some(Key::new(&ns, vec![0u8]).unwrap());
    'pages: loop {
        let page = s.store.completed_keys(after.as_ref(), 3).await.unwrap();
        assert!(page.len() <= 3, "a page holds at most its limit");
        if page.is_empty() {
            break;
        }
        for k in &page {
            if k.namespace().as_str() != ns {
                break 'pages;
            }
            seen.push(k.clone());
        }
        after = page.last().cloned();
    }
    let want: Vec<Key> = (0..7).map(key).collect();
    assert_eq!(seen, want);
}

/// `completed_since` pages through the records completed at or after its
/// time, and leaves out older ones and records in progress. A store that
/// cannot list by completion time says so with `None` on every call.
pub async fn completed_since_pages_the_records_completed_since<S: Tier + Clone>(s: &Subject<S>) {
    let probe = s.key("completed-since");
    let ns = format!(
        "since{}",
        &probe.to_string()[probe.to_string().len() - 12..]
    );
    let key = |i: usize| Key::new(&ns, format!("k{i:02}")).unwrap();
    let t = now(s);
    let since = Timestamp::from_millis(t.as_millis() - 30_000);
    let expires = t.after(s.steps(600));
    for i in 0..4 {
        let old = record(
            100 + i as u64,
            "old",
            Timestamp::from_millis(t.as_millis() - 60_000),
            expires,
        );
        assert_eq!(import(s, &key(i), old).await, Imported::Written);
    }
    let mut want = Vec::new();
    for i in 4..11 {
        // Two records share each completion time: the page order breaks
        // the tie by key.
        let at = Timestamp::from_millis(t.as_millis() - 20_000 + (i as u64 / 2) * 100);
        assert_eq!(
            import(s, &key(i), record(100 + i as u64, "new", at, expires)).await,
            Imported::Written
        );
        want.push(key(i));
    }
    acquired(
        s.store
            .begin(&key(99), None, Lease::new(s.steps(60)))
            .await
            .unwrap(),
    );
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let Some(page) = s
            .store
            .completed_since(since, after.as_ref(), 2)
            .await
            .unwrap()
        else {
            assert!(
                after.is_none(),
                "a store lists by completion time, or never"
            );
            return;
        };
        assert!(page.len() <= 2, "a page holds at most its limit");
        let Some(last) = page.last().cloned() else {
            break;
        };
        for entry in page {
            assert!(
                entry.at >= since,
                "{entry:?} was completed before {since:?}"
            );
            if entry.key.namespace().as_str() == ns {
                seen.push(entry.key);
            }
        }
        after = Some(last);
    }
    seen.sort_by_key(Key::encode);
    assert_eq!(seen, want, "each record completed since, once");
}
