//! Store layers: a layered store is still a store (the conformance kit
//! passes through every layer and through the run-time form), a layered
//! tier is still the tier it wraps, and each layer does its one thing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::layer::{CheckLimits, Measure, Measured, StoreExt, TierOperation, Traced};
use idem_core::tier::{
    CompletedKey, FilterProbe, Handover, ImportItem, Imported, SharedFilter, SoleFront, Tier,
};
use idem_core::{
    Begin, Clock, Completed, FencingToken, InvalidInput, Key, Lease, Limits, MemoryStore, Record,
    Store, StoreError, SystemClock, Timestamp,
};

mod layered {
    use idem_core::layer::{CheckLimits, Measure, StoreExt, Trace};
    use idem_core::{ManualClock, MemoryStore};
    use idem_testkit::{Subject, TimeControl};

    idem_testkit::conformance_tests!(async {
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .build()
            .layer(CheckLimits)
            .layer(Trace)
            .layer(Measure::named("conformance"));
        Subject::new(store, TimeControl::Manual(clock))
    });
}

mod shared {
    use idem_core::layer::{StoreExt, Trace};
    use idem_core::{ManualClock, MemoryStore};
    use idem_testkit::{Subject, TimeControl};

    idem_testkit::conformance_tests!(async {
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .build()
            .layer(Trace)
            .shared();
        Subject::new(store, TimeControl::Manual(clock))
    });
}

fn key(k: &str) -> Key {
    Key::new("layers", k.to_owned()).unwrap()
}

#[tokio::test]
async fn checked_refuses_input_over_the_inner_stores_limits() {
    let limits = Limits {
        max_key_bytes: 8,
        ..Limits::default()
    };
    let store = MemoryStore::builder()
        .limits(limits)
        .build()
        .layer(CheckLimits);
    let long = key("123456789");
    let refused = store.begin(&long, None, Lease::from_secs(5)).await;
    assert!(
        matches!(
            refused,
            Err(StoreError::Invalid(InvalidInput::KeyTooLong {
                len: 9,
                limit: 8
            }))
        ),
        "{refused:?}"
    );
    assert!(store.get(&key("12345678")).await.unwrap().is_none());
    assert_eq!(store.limits().max_key_bytes, 8);
}

#[tokio::test]
async fn metrics_count_each_operation_by_how_it_ended() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let render = recorder.handle();
    let store: Measured<MemoryStore> = metrics::with_local_recorder(&recorder, || {
        MemoryStore::new().layer(Measure::named("orders"))
    });

    let k = key("m-1");
    let Begin::Acquired(claim) = store.begin(&k, None, Lease::from_secs(5)).await.unwrap() else {
        panic!("a new key is acquired")
    };
    let stale = store.release(&k, FencingToken::new(claim.token.get() + 1));
    assert!(stale.await.unwrap().is_stale());
    let done = store
        .complete(&k, claim.token, None, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!done.is_stale());
    let refused = store.get(&key(&"x".repeat(300))).await;
    assert!(refused.is_err());

    let text = render.render();
    for line in [
        r#"idem_store_calls_total{store="orders",operation="begin",outcome="ok"} 1"#,
        r#"idem_store_calls_total{store="orders",operation="release",outcome="stale"} 1"#,
        r#"idem_store_calls_total{store="orders",operation="complete",outcome="ok"} 1"#,
        r#"idem_store_calls_total{store="orders",operation="get",outcome="refused"} 1"#,
        r#"idem_store_call_seconds_count{store="orders",operation="begin"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line} in:\n{text}");
    }
    assert!(
        !text.contains("tier="),
        "a store outside a tiered store has no tier label:\n{text}"
    );
}

/// A tier whose every method answers what none of `Tier`'s default bodies
/// would, and notes that it was called: a wrapper that let a default body
/// stand in for one of them would be caught.
struct Unlike {
    inner: MemoryStore,
    called: Arc<Mutex<Vec<&'static str>>>,
}

impl Unlike {
    fn note(&self, operation: &'static str) {
        self.called.lock().unwrap().push(operation);
    }
}

impl idem_core::layer::StoreWrapper for Unlike {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
}

const LATEST: Timestamp = Timestamp::from_millis(42);

impl Tier for Unlike {
    const VOLATILE: bool = false;
    const KEEPS_HANDOVERS: bool = true;
    const SHARES_FILTER: bool = true;

    async fn import_many(&self, items: &[ImportItem]) -> Result<Vec<Imported>, StoreError> {
        self.note("import_many");
        self.inner.import_many(items).await
    }
    async fn raise_token_floor(&self, floor: FencingToken) -> Result<(), StoreError> {
        self.note("raise_token_floor");
        self.inner.raise_token_floor(floor).await
    }
    async fn record_high_water(&self, _: FencingToken) -> Result<(), StoreError> {
        self.note("record_high_water");
        Ok(())
    }
    async fn token_high_water(&self) -> Result<FencingToken, StoreError> {
        self.note("token_high_water");
        self.inner.token_high_water().await
    }
    async fn shorten(&self, items: &[Handover], keep: Duration) -> Result<(), StoreError> {
        self.note("shorten");
        self.inner.shorten(items, keep).await
    }
    async fn list_handovers(&self, _: &str, _: &[Handover]) -> Result<(), StoreError> {
        self.note("list_handovers");
        Ok(())
    }
    async fn due_handovers(
        &self,
        _: &str,
        _: Duration,
        _: usize,
    ) -> Result<Vec<Handover>, StoreError> {
        self.note("due_handovers");
        Ok(vec![Handover {
            key: key("due"),
            token: FencingToken::new(7),
        }])
    }
    async fn unlist_handovers(&self, _: &str, _: &[Handover]) -> Result<(), StoreError> {
        self.note("unlist_handovers");
        Err(StoreError::unavailable("unlisting refused"))
    }
    async fn agree_filter(&self, proposed: &SharedFilter) -> Result<SharedFilter, StoreError> {
        self.note("agree_filter");
        Ok(proposed.clone())
    }
    async fn filter_insert(&self, _: &SharedFilter, _: &[FilterProbe]) -> Result<(), StoreError> {
        self.note("filter_insert");
        Ok(())
    }
    async fn filter_check(
        &self,
        _: &SharedFilter,
        probes: &[FilterProbe],
    ) -> Result<Vec<bool>, StoreError> {
        self.note("filter_check");
        Ok(vec![false; probes.len()])
    }
    async fn filter_ready(&self, _: &SharedFilter) -> Result<bool, StoreError> {
        self.note("filter_ready");
        Ok(true)
    }
    async fn filter_mark_ready(&self, _: &SharedFilter) -> Result<(), StoreError> {
        self.note("filter_mark_ready");
        Ok(())
    }
    async fn filter_rebuild_lease(
        &self,
        _: &SharedFilter,
        _: &str,
        _: Duration,
    ) -> Result<bool, StoreError> {
        self.note("filter_rebuild_lease");
        Ok(true)
    }
    async fn hold_sole_front(&self) -> Result<SoleFront, StoreError> {
        self.note("hold_sole_front");
        Ok(SoleFront::holding(()))
    }
    async fn latest_expiry(&self) -> Result<Option<Timestamp>, StoreError> {
        self.note("latest_expiry");
        Ok(Some(LATEST))
    }
    async fn completed_since(
        &self,
        _: Timestamp,
        _: Option<&CompletedKey>,
        _: usize,
    ) -> Result<Option<Vec<CompletedKey>>, StoreError> {
        self.note("completed_since");
        Ok(Some(vec![CompletedKey {
            at: LATEST,
            key: key("since"),
        }]))
    }
    async fn completed_keys(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        self.note("completed_keys");
        self.inner.completed_keys(after, limit).await
    }
}

fn filter() -> SharedFilter {
    SharedFilter {
        name: "cold".into(),
        seed: 1,
        bits: 1024,
        hashes: 3,
        window: Duration::from_secs(60),
        generations: 2,
        epoch: 9,
    }
}

/// Calls every tier operation of `tier` once, in [`TierOperation::ALL`]'s
/// order, checking each answer against [`Unlike`]'s.
async fn every_tier_operation<T: Tier>(tier: &T) {
    let probe = FilterProbe {
        key: key("probe"),
        hash: 5,
    };
    let handover = Handover {
        key: key("h"),
        token: FencingToken::new(1),
    };
    let now = SystemClock.now();
    let record = Completed {
        token: FencingToken::new(3),
        fingerprint: None,
        outcome: None,
        completed_at: now,
        expires_at: now.after(Duration::from_secs(3600)),
    };
    let items = [ImportItem {
        key: key("imported"),
        record,
    }];
    assert_eq!(tier.import_many(&items).await.unwrap(), [Imported::Written]);
    tier.raise_token_floor(FencingToken::new(10)).await.unwrap();
    tier.record_high_water(FencingToken::new(1_000))
        .await
        .unwrap();
    assert_eq!(tier.token_high_water().await.unwrap().get(), 10);
    let one = std::slice::from_ref(&handover);
    tier.shorten(one, Duration::from_secs(1)).await.unwrap();
    tier.list_handovers("cold", one).await.unwrap();
    let due = tier
        .due_handovers("cold", Duration::ZERO, 10)
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
    let unlisted = tier.unlist_handovers("cold", &[handover]).await;
    assert!(
        unlisted
            .unwrap_err()
            .to_string()
            .contains("unlisting refused")
    );
    let filter = filter();
    assert_eq!(tier.agree_filter(&filter).await.unwrap(), filter);
    tier.filter_insert(&filter, std::slice::from_ref(&probe))
        .await
        .unwrap();
    assert_eq!(tier.filter_check(&filter, &[probe]).await.unwrap(), [false]);
    assert!(tier.filter_ready(&filter).await.unwrap());
    tier.filter_mark_ready(&filter).await.unwrap();
    let leased = tier.filter_rebuild_lease(&filter, "me", Duration::from_secs(1));
    assert!(leased.await.unwrap());
    let held = tier.hold_sole_front().await.unwrap();
    assert_eq!(format!("{held:?}"), "SoleFront(held)");
    assert_eq!(tier.latest_expiry().await.unwrap(), Some(LATEST));
    let since = tier.completed_since(LATEST, None, 10).await.unwrap();
    assert_eq!(since.unwrap()[0].key, key("since"));
    assert_eq!(
        tier.completed_keys(None, 10).await.unwrap(),
        [key("imported")]
    );
}

/// `VOLATILE`, `KEEPS_HANDOVERS`, `SHARES_FILTER`.
fn capabilities<T: Tier>() -> (bool, bool, bool) {
    (T::VOLATILE, T::KEEPS_HANDOVERS, T::SHARES_FILTER)
}

#[tokio::test]
async fn a_measured_and_traced_tier_is_the_tier_it_wraps() {
    type Wrapped = Traced<Measured<Unlike>>;
    assert_eq!(capabilities::<Wrapped>(), capabilities::<Unlike>());
    assert_eq!(
        capabilities::<Traced<Measured<MemoryStore>>>(),
        capabilities::<MemoryStore>()
    );

    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let render = recorder.handle();
    let called = Arc::new(Mutex::new(Vec::new()));
    let tier: Wrapped = metrics::with_local_recorder(&recorder, || {
        let unlike = Unlike {
            inner: MemoryStore::new(),
            called: called.clone(),
        };
        Traced::in_tier(Measured::in_tier(unlike, "unlike", "cold"), "cold")
    });
    every_tier_operation(&tier).await;

    let called = called.lock().unwrap().clone();
    let all: Vec<&str> = TierOperation::ALL.map(TierOperation::name).into();
    assert_eq!(
        called, all,
        "each tier operation reaches the wrapped tier once"
    );
    let text = render.render();
    for op in all {
        let outcome = if op == "unlist_handovers" {
            "failed"
        } else {
            "ok"
        };
        let line = format!(
            r#"idem_store_calls_total{{store="unlike",tier="cold",operation="{op}",outcome="{outcome}"}} 1"#
        );
        assert!(text.contains(&line), "missing {line} in:\n{text}");
    }
}

#[tokio::test]
async fn a_tier_measured_apart_counts_its_calls_under_its_tier() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let render = recorder.handle();
    let (hot, cold) = metrics::with_local_recorder(&recorder, || {
        (
            Measured::in_tier(MemoryStore::new(), "memory", "hot"),
            Measured::in_tier(MemoryStore::new(), "memory", "cold"),
        )
    });
    let k = key("t-1");
    let Begin::Acquired(claim) = hot.begin(&k, None, Lease::from_secs(5)).await.unwrap() else {
        panic!("a new key is acquired")
    };
    let done = hot.complete(&k, claim.token, None, Duration::from_secs(3600));
    assert!(!done.await.unwrap().is_stale());
    let Some(Record::Completed(record)) = hot.get(&k).await.unwrap() else {
        panic!("completed")
    };
    let moving = [ImportItem {
        key: k.clone(),
        record: record.clone(),
    }];
    let moved = cold.import_many(&moving).await.unwrap();
    assert_eq!(moved, [Imported::Written]);
    let handover = Handover {
        key: k.clone(),
        token: claim.token,
    };
    hot.shorten(&[handover], Duration::from_secs(1))
        .await
        .unwrap();

    // The memory store's own shorten and latest_expiry, not the defaults
    // (which change nothing and know nothing).
    let Some(Record::Completed(short)) = hot.get(&k).await.unwrap() else {
        panic!("still completed")
    };
    assert_eq!(
        short.expires_at.since(short.completed_at),
        Duration::from_secs(1)
    );
    assert_eq!(cold.latest_expiry().await.unwrap(), Some(record.expires_at));
    assert_eq!(cold.completed_keys(None, 10).await.unwrap(), [k]);

    let text = render.render();
    for line in [
        r#"idem_store_calls_total{store="memory",tier="hot",operation="begin",outcome="ok"} 1"#,
        r#"idem_store_calls_total{store="memory",tier="hot",operation="complete",outcome="ok"} 1"#,
        r#"idem_store_calls_total{store="memory",tier="hot",operation="shorten",outcome="ok"} 1"#,
        r#"idem_store_calls_total{store="memory",tier="cold",operation="import_many",outcome="ok"} 1"#,
        r#"idem_store_calls_total{store="memory",tier="cold",operation="latest_expiry",outcome="ok"} 1"#,
        r#"idem_store_call_seconds_count{store="memory",tier="hot",operation="begin"} 1"#,
        r#"idem_store_call_seconds_count{store="memory",tier="cold",operation="import_many"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line} in:\n{text}");
    }
}

/// A span's `operation`, and its `tier` if it has one.
type OperationTier = (String, Option<String>);

/// The `operation` and `tier` of every span opened while it is the
/// thread's subscriber.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<OperationTier>>>);

#[derive(Default)]
struct OperationAndTier(Option<String>, Option<String>);

impl tracing::field::Visit for OperationAndTier {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "operation" => self.0 = Some(value.to_owned()),
            "tier" => self.1 = Some(value.to_owned()),
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut seen = OperationAndTier::default();
        attrs.record(&mut seen);
        let operation = seen.0.unwrap_or_default();
        self.0.lock().unwrap().push((operation, seen.1));
    }
}

#[tokio::test]
async fn a_tier_traced_apart_names_its_tier_in_each_span() {
    use tracing_subscriber::layer::SubscriberExt as _;

    let spans = Spans::default();
    let _subscriber = tracing::subscriber::set_default(
        tracing_subscriber::registry()
            .with(spans.clone())
            .with(tracing_subscriber::filter::LevelFilter::DEBUG),
    );
    let handover = [Handover {
        key: key("s-1"),
        token: FencingToken::new(1),
    }];
    let keep = Duration::from_secs(1);

    let hot = Traced::in_tier(MemoryStore::new(), "hot");
    let plain = Traced::new(MemoryStore::new());
    for store in [&hot, &plain] {
        let claim = store.begin(&key("s-1"), None, Lease::from_secs(5)).await;
        assert!(matches!(claim, Ok(Begin::Acquired(_))), "{claim:?}");
        store.shorten(&handover, keep).await.unwrap();
    }

    let hot = Some("hot".to_owned());
    assert_eq!(
        *spans.0.lock().unwrap(),
        [
            ("begin".to_owned(), hot.clone()),
            ("shorten".to_owned(), hot),
            // Outside a tiered store: no tier, and tier operations untraced.
            ("begin".to_owned(), None),
        ]
    );
}
