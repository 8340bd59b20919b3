//! A Redis that stops taking writes for half a second just as a handler
//! finishes does not make the handler run again: the guard retries the
//! `complete` (safe: by the same token it answers `Ok` again once one has
//! landed) until Redis is back, and the outcome is stored. On a Redis of
//! its own, paused with `CLIENT PAUSE … WRITE` from a separate connection
//! (pausing a shared Redis would stall every other test using it).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use idem_core::{Guard, Key, Lease, Record, Store};
use idem_redis::RedisStore;
use idem_testkit::services;
use support::{OwnRedis, free_port};

mod support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_pause_at_completion_stores_the_outcome_and_runs_the_handler_once() {
    if !services::program("redis-server") {
        return;
    }
    let port = free_port();
    let _redis = OwnRedis::start(port).await;
    let url = format!("redis://127.0.0.1:{port}");
    // Calls give up after 100 ms, so the pause fails several `complete`s
    // in a row rather than holding one.
    let store = RedisStore::builder(&url)
        .timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let mut pauser = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let guard = Guard::new(store.clone()).lease(Lease::from_secs(30));
    let k = Key::new("completion-pause", "charge-1").unwrap();
    let runs = AtomicU32::new(0);
    let mut paused_at = None;
    for _delivery in 0..2 {
        let (pauser, paused_at, runs) = (&mut pauser, &mut paused_at, &runs);
        let receipt = guard
            .run(&k, None, |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let _: () = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(500)
                    .arg("WRITE")
                    .query_async(pauser)
                    .await
                    .unwrap();
                *paused_at = Some(Instant::now());
                Ok::<_, String>("charged".to_string())
            })
            .await;
        assert_eq!(receipt.expect("the outcome is stored"), "charged");
    }
    let paused_at = paused_at.expect("the handler ran");
    assert!(
        paused_at.elapsed() >= Duration::from_millis(500),
        "the outcome was stored after the pause"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    assert!(matches!(
        store.get(&k).await.unwrap(),
        Some(Record::Completed(c)) if c.outcome.as_deref() == Some(&b"\"charged\""[..])
    ));
}
