//! `idem consume --from nats://…` against the real JetStream server: the
//! shared scenarios (crash and duplicates, retries and dead letters, busy
//! keys, SIGTERM).

mod support;
// The JetStream crate's own test fixture: a stream of the test's own,
// deleted on drop.
#[path = "../../brokers/idem-jetstream/tests/support/mod.rs"]
mod jetstream_support;

use std::collections::HashMap;

use idem_jetstream::{JetStreamConfig, JetStreamSource};
use jetstream_support::Fixture;
use support::consume::{self, Broker};

struct Nats(Fixture);

impl Nats {
    async fn new(test: &str) -> Option<Self> {
        let f = Fixture::new(&format!("consume_{test}")).await?;
        f.create_stream(format!("{}.>", f.prefix)).await;
        Some(Self(f))
    }
}

impl Broker for Nats {
    type Source = JetStreamSource;

    fn source_url(&self) -> String {
        // AckWait above the 2 s lease the crash scenario uses, and short
        // enough that the killed process's messages come back soon.
        format!(
            "{}?stream={}&consumer={}&subject={}.%3E&ack_wait=5s",
            self.0.url, self.0.stream, self.0.consumer, self.0.prefix
        )
    }

    fn name(&self) -> String {
        self.0.stream.clone()
    }

    async fn library_source(&self) -> JetStreamSource {
        let config = JetStreamConfig::from_url(&self.source_url())
            .unwrap()
            .concurrency(16);
        JetStreamSource::connect(config)
            .await
            .expect("the source connects")
    }

    async fn publish(&self, messages: &[(String, Vec<u8>)]) {
        let subject = format!("{}.orders", self.0.prefix);
        for (id, body) in messages {
            // A copy with the same id inside the duplicate window is
            // dropped by the stream itself (`duplicate` in the answer).
            self.0
                .publisher
                .publish(&subject, id, &[], body.clone())
                .await
                .expect("the stream acknowledges the message");
        }
    }

    async fn dead_letters(&self) -> Vec<(HashMap<String, String>, Vec<u8>)> {
        let Ok(mut stream) = self
            .0
            .js
            .get_stream(format!("{}_dead-letter", self.0.stream))
            .await
        else {
            return Vec::new();
        };
        let count = stream.info().await.unwrap().state.messages;
        let mut out = Vec::new();
        for seq in 1..=count {
            let m = stream.get_raw_message(seq).await.unwrap();
            let headers = m
                .headers
                .iter()
                .filter_map(|(name, values)| {
                    Some((name.to_string().to_lowercase(), values.last()?.to_string()))
                })
                .collect();
            out.push((headers, m.payload.to_vec()));
        }
        out
    }

    async fn drained(&self) -> bool {
        let Ok(stream) = self.0.js.get_stream(&self.0.stream).await else {
            return false;
        };
        match stream.consumer_info(&self.0.consumer).await {
            Ok(info) => info.num_pending == 0 && info.num_ack_pending == 0,
            Err(_) => false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_crash_and_duplicates_take_effect_once() {
    let Some(nats) = Nats::new("crash").await else {
        return;
    };
    consume::crash_and_duplicates(nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_retries_then_dead_letters_with_headers() {
    let Some(nats) = Nats::new("dead").await else {
        return;
    };
    consume::retries_and_dead_letters(nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_lag_counts_waiting_messages() {
    let Some(nats) = Nats::new("lag").await else {
        return;
    };
    consume::lag_counts_waiting_messages(nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_dead_letters_replay_after_a_fix() {
    let Some(nats) = Nats::new("dlq").await else {
        return;
    };
    consume::dead_letters_replay_after_a_fix(nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replays_at_once_each_move_their_share_and_neither_fails() {
    const N: usize = 200;
    let Some(nats) = Nats::new("dlq-twice").await else {
        return;
    };
    let Some(dlq) = consume::park(&nats, N).await else {
        return;
    };
    let dlq = std::sync::Arc::new(dlq);
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let dlq = dlq.clone();
            std::thread::spawn(move || {
                dlq(&["replay", "--all", "--yes", "--no-store-check", "--json"])
            })
        })
        .collect();
    let mut replayed = 0;
    for run in runs {
        let (code, out, err) = run.join().unwrap();
        // 0, or 3 when the other run took every letter first.
        assert!(code == 0 || code == 3, "exit {code}: {err}");
        replayed += out.lines().filter(|l| l.contains("\"replayed\"")).count();
    }
    assert_eq!(replayed, N, "each letter replayed by one run");
    let (code, out, _) = dlq(&["ls", "--json"]);
    assert_eq!((code, out.lines().count()), (0, 0), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_busy_keys_are_retried_after_the_lease() {
    let Some(nats) = Nats::new("busy").await else {
        return;
    };
    consume::busy_keys_are_retried_later(nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_sigterm_finishes_work_in_flight() {
    let Some(nats) = Nats::new("sigterm").await else {
        return;
    };
    consume::sigterm_finishes_work_in_flight(nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_handler_answers_late_bodies_problems_and_refusals() {
    let Some(nats) = Nats::new("answers").await else {
        return;
    };
    consume::handler_answers(nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_batches_settle_each_message_by_its_own_result() {
    let Some(nats) = Nats::new("batches").await else {
        return;
    };
    consume::batches(nats).await;
}
