//! Store layers: a layered store is still a store (the conformance kit
//! passes through every layer and through the run-time form), and each
//! layer does its one thing.

use std::time::Duration;

use idem_core::layer::{CheckLimits, Measure, Measured, StoreExt};
use idem_core::{
    Begin, FencingToken, InvalidInput, Key, Lease, Limits, MemoryStore, Store, StoreError,
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
}
