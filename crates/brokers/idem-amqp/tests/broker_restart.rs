//! A broker restart loses none of idem's copies: retries waiting in the
//! retry queues and dead letters are persistent copies in quorum queues,
//! even when the producer published the originals transient.
//!
//! The test restarts the broker (`rabbitmqctl stop_app`, then
//! `start_app`), so it is the only test of this binary: no other test of
//! the crate runs while the broker is away.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idem_amqp::AmqpSource;
use idem_consumer::{Backoff, HandlerError, Runner};
use idem_core::{Bytes, Guard, MemoryStore};
use idem_testkit::services;
use support::{
    Calls, Inspect, Running, broker, config, eventually, message, recording, restart_broker, unique,
};

/// The delay each retried message asks for: one per retry bucket, and one
/// past the last.
const DELAYS_MS: [u64; 17] = [
    100, 250, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 30_000, 60_000, 120_000, 300_000, 600_000,
    1_200_000, 1_800_000, 3_600_000, 7_200_000,
];

/// Delays short enough for their message to come back during the test.
const BACK_WITHIN_MS: u64 = 10_000;

/// Messages refused for good: dead-lettered at once.
const DEAD: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_and_dead_letters_of_transient_messages_survive_a_broker_restart() {
    let Some(url) = broker().await else { return };
    if !services::program("rabbitmqctl") {
        return;
    }
    let queue = unique("restart");
    let config = config(&url, &queue);
    let dead = config.dead_letter_queue();
    let retry_queues: Vec<String> = config
        .queues()
        .into_iter()
        .filter(|q| *q != queue && *q != dead)
        .collect();
    assert_eq!(retry_queues.len(), DELAYS_MS.len());

    let calls: Calls = Arc::default();
    let handler = recording(&calls, |id, attempt| match id.strip_prefix("retry-") {
        Some(ms) if attempt == 1 => Err(HandlerError::transient("not yet")
            .retry_after(Duration::from_millis(ms.parse().unwrap()))),
        Some(_) => Ok(Bytes::new()),
        None => Err(HandlerError::permanent("refused")),
    });
    let source = AmqpSource::connect(config).await.unwrap();
    let inspect = Inspect::new(&url).await;
    for ms in DELAYS_MS {
        let m = message(&format!("retry-{ms}"));
        inspect.publish_transient(&queue, &m).await;
    }
    for i in 0..DEAD {
        inspect
            .publish_transient(&queue, &message(&format!("dead-{i}")))
            .await;
    }
    let runner =
        Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler).backoff(Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(10),
            jitter: 0.0,
        });
    let running = Running::start(runner);
    let called = |calls: &Calls, ms: u64, attempt: u32| {
        let id = format!("retry-{ms}");
        calls.lock().iter().any(|c| c.0 == id && c.1 >= attempt)
    };
    // Those of 20 s and more wait in their retry queue at the restart.
    let later = DELAYS_MS.iter().filter(|ms| **ms >= 20_000).count() as u32;
    let all_copied = eventually(Duration::from_secs(20), || async {
        DELAYS_MS.iter().all(|ms| called(&calls, *ms, 1))
            && inspect.ready_or_zero(&dead).await == DEAD as u32
            && waiting(&inspect, &retry_queues).await >= later
    })
    .await;
    assert!(all_copied, "every copy made before the restart");
    inspect.close().await;

    restart_broker(&url).await;

    // Every retried message is back and handled, or still waits in a retry
    // queue; every dead letter is still there.
    let inspect = Inspect::new(&url).await;
    let short = |ms: &&u64| **ms <= BACK_WITHIN_MS;
    let accounted = || async {
        let back_late = DELAYS_MS
            .iter()
            .filter(|ms| **ms > BACK_WITHIN_MS && called(&calls, **ms, 2))
            .count() as u32;
        let all_short_back = DELAYS_MS
            .iter()
            .filter(short)
            .all(|ms| called(&calls, *ms, 2));
        let late = DELAYS_MS.len() as u32 - DELAYS_MS.iter().filter(short).count() as u32;
        all_short_back
            && waiting(&inspect, &retry_queues).await + back_late == late
            && inspect.ready_or_zero(&dead).await == DEAD as u32
    };
    let none_lost = eventually(Duration::from_secs(45), accounted).await;
    let report = running.stop().await;
    source.close().await;

    let not_back: Vec<u64> = DELAYS_MS
        .iter()
        .copied()
        .filter(|ms| *ms <= BACK_WITHIN_MS && !called(&calls, *ms, 2))
        .collect();
    assert!(
        none_lost,
        "short retries not back: {not_back:?}; retries waiting: {}; dead letters: {} of {DEAD}; {report:?}",
        waiting(&inspect, &retry_queues).await,
        inspect.ready_or_zero(&dead).await
    );
    assert!(report.fetch_errors >= 1, "the restart was seen: {report:?}");
    let types = queue_types().await;
    for q in retry_queues.iter().chain([&dead]) {
        assert_eq!(types.get(q).map(String::as_str), Some("quorum"), "{q}");
    }
    assert_eq!(
        types.get(&queue).map(String::as_str),
        Some("classic"),
        "the work queue is the user's: declared as before"
    );
    inspect.delete(&queue).await;
    inspect.close().await;
}

/// Messages ready in `queues`.
async fn waiting(inspect: &Inspect, queues: &[String]) -> u32 {
    let mut n = 0;
    for q in queues {
        n += inspect.ready_or_zero(q).await;
    }
    n
}

/// Each queue's type on the default vhost, as `rabbitmqctl` lists them.
async fn queue_types() -> HashMap<String, String> {
    let out = tokio::process::Command::new("rabbitmqctl")
        .args([
            "list_queues",
            "--quiet",
            "--no-table-headers",
            "name",
            "type",
        ])
        .output()
        .await
        .expect("rabbitmqctl runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let (name, kind) = line.split_once('\t')?;
            Some((name.to_owned(), kind.trim().to_owned()))
        })
        .collect()
}
