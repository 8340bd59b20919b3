//! `idem consume --from rocketmq://…` against the real broker: the shared
//! scenarios (crash and duplicates, retries and dead letters, busy keys,
//! SIGTERM).
#![cfg(feature = "rocketmq")]

mod support;
// The RocketMQ crate's own test fixture: a topic and a group of the test's
// own, a publisher, the group's backlog and a dead-letter reader.
#[path = "../../brokers/idem-rocketmq/tests/support/mod.rs"]
mod rocketmq_support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_rocketmq::{RocketMqConfig, RocketMqSource};
use rocketmq_support::{DeadLetters, Fixture};
use support::consume::{self, Broker};
use tokio::sync::OnceCell;

struct RocketMq {
    fixture: Arc<Fixture>,
    dead: OnceCell<DeadLetters>,
}

impl RocketMq {
    async fn new(test: &str) -> Option<Self> {
        let fixture = Fixture::new(&format!("consume_{test}")).await?;
        Some(Self {
            fixture: Arc::new(fixture),
            dead: OnceCell::new(),
        })
    }
}

impl Broker for RocketMq {
    type Source = RocketMqSource;

    fn source_url(&self) -> String {
        self.fixture.consume_url()
    }

    fn name(&self) -> String {
        self.fixture.topic.clone()
    }

    async fn library_source(&self) -> RocketMqSource {
        let config = RocketMqConfig::from_url(&self.source_url())
            .unwrap()
            .concurrency(16);
        RocketMqSource::connect(config)
            .await
            .expect("the source connects")
    }

    async fn publish(&self, messages: &[(String, Vec<u8>)]) {
        // Sixteen publishes at a time: one at a time, 11 000 take a while.
        let messages: Arc<Vec<(String, Vec<u8>)>> = Arc::new(messages.to_vec());
        let next = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (f, messages, next) = (self.fixture.clone(), messages.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((id, body)) = messages.get(i) else {
                        return;
                    };
                    f.publisher
                        .publish(&f.topic, id, &[], body.clone())
                        .await
                        .expect("the broker stores the message");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }

    async fn dead_letters(&self) -> Vec<(HashMap<String, String>, Vec<u8>)> {
        let reader = self
            .dead
            .get_or_init(|| self.fixture.dead_letter_reader())
            .await;
        reader
            .read()
            .into_iter()
            .map(|m| {
                let headers = m
                    .headers
                    .iter()
                    .map(|(k, v)| (k.to_lowercase(), String::from_utf8_lossy(v).into_owned()))
                    .collect();
                (headers, m.body.to_vec())
            })
            .collect()
    }

    async fn drained(&self) -> bool {
        self.fixture.backlog().await == 0
    }

    fn busy_lease(&self) -> Duration {
        // The sidecar's consumer joins the group and is assigned its queues
        // before its first pull; then a retry waits a 1 s delay level.
        Duration::from_secs(3)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocketmq_crash_and_duplicates_take_effect_once() {
    let Some(broker) = RocketMq::new("crash").await else {
        return;
    };
    consume::crash_and_duplicates(broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocketmq_retries_then_dead_letters_with_headers() {
    let Some(broker) = RocketMq::new("dead").await else {
        return;
    };
    consume::retries_and_dead_letters(broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocketmq_lag_counts_waiting_messages() {
    let Some(broker) = RocketMq::new("lag").await else {
        return;
    };
    consume::lag_counts_waiting_messages(broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocketmq_dead_letters_replay_after_a_fix() {
    let Some(broker) = RocketMq::new("dlq").await else {
        return;
    };
    consume::dead_letters_replay_after_a_fix(broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocketmq_busy_keys_are_retried_after_the_lease() {
    let Some(broker) = RocketMq::new("busy").await else {
        return;
    };
    consume::busy_keys_are_retried_later(broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocketmq_sigterm_finishes_work_in_flight() {
    let Some(broker) = RocketMq::new("sigterm").await else {
        return;
    };
    consume::sigterm_finishes_work_in_flight(broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocketmq_handler_answers_late_bodies_problems_and_refusals() {
    let Some(broker) = RocketMq::new("answers").await else {
        return;
    };
    consume::handler_answers(broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_settle_each_message_by_its_own_result() {
    let Some(broker) = RocketMq::new("batches").await else {
        return;
    };
    consume::batches(broker).await;
}

/// `idem dlq ls` reads with no right to write: listing the dead letters
/// again and again creates no topic (the replay log is made by the first
/// replay), and what a replay settles is listed no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocketmq_listing_dead_letters_creates_no_topic() {
    let Some(broker) = RocketMq::new("dlq_topics").await else {
        return;
    };
    let Some(dlq) = consume::park(&broker, 3).await else {
        return;
    };
    let log = format!("idem-replayed-{}", broker.fixture.group);
    let topics = || async { broker.fixture.monitor.topics().await.unwrap() };
    for _ in 0..3 {
        let (code, out, err) = dlq(&["ls", "--json"]);
        assert_eq!((code, out.lines().count()), (0, 3), "{err}");
    }
    let (code, _, err) = dlq(&["show", "--json", "nope:0:0"]);
    assert_ne!(code, 0, "{err}");
    let before = topics().await;
    assert!(!before.contains(&log), "reading created {log}: {before:?}");
    let (code, out, err) = dlq(&["replay", "--all", "--yes", "--no-store-check"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        topics().await.contains(&log),
        "the replay records itself in {log}"
    );
    let (code, out, _) = dlq(&["ls", "--json"]);
    assert_eq!((code, out.lines().count()), (0, 0), "{out}");
}
