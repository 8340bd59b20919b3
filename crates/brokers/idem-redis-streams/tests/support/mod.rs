//! What the Redis Streams tests share: a stream of their own on the test
//! Redis (deleted at the end), publishing, and looking at what is left.
// Each test binary uses some of what is here.
#![allow(dead_code, unused_imports)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idem_consumer::Message;
use idem_core::{Bytes, Guard, Lease, MemoryStore};
use idem_redis_streams::{
    Backlog, ConnectError, RedisStreamConfig, RedisStreamPublisher, RedisStreamSource,
};
use idem_testkit::services::{absent, url};
use parking_lot::Mutex;
use redis::Commands;
use tokio::sync::OnceCell;

/// A stream, its group and side keys, named for one test.
pub struct Fixture {
    pub server: String,
    pub stream: String,
    client: redis::Client,
    observer: OnceCell<Result<RedisStreamSource, ConnectError>>,
}

impl Fixture {
    /// A fresh stream for `test`, or `None` (skipped) when Redis is away.
    pub fn new(test: &str) -> Option<Self> {
        let server = url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
        let client = match redis::Client::open(server.as_str()) {
            Ok(c) => c,
            Err(e) => return absent("Redis", &server, e),
        };
        if let Err(e) = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        {
            return absent("Redis", &server, e);
        }
        let stream = format!("idem-test.{test}.{:016x}", fastrand::u64(..));
        Some(Self {
            server,
            stream,
            client,
            observer: OnceCell::new(),
        })
    }

    /// The consumer URL for this stream and group `idem`.
    pub fn url(&self) -> String {
        let sep = if self.server.contains('?') { '&' } else { '?' };
        format!("{}{sep}stream={}&group=idem", self.server, self.stream)
    }

    /// The configuration tests start from: claim after 500 ms idle.
    pub fn config(&self) -> RedisStreamConfig {
        RedisStreamConfig::from_url(&self.url())
            .expect("the test URL parses")
            .claim_idle(Duration::from_millis(500))
    }

    pub async fn source(&self) -> RedisStreamSource {
        self.source_with(self.config()).await
    }

    pub async fn source_with(&self, config: RedisStreamConfig) -> RedisStreamSource {
        RedisStreamSource::connect(config)
            .await
            .expect("connects to the test Redis")
    }

    pub async fn publisher(&self) -> RedisStreamPublisher {
        RedisStreamPublisher::connect(&self.config())
            .await
            .expect("connects to the test Redis")
    }

    fn conn(&self) -> redis::Connection {
        self.client
            .get_connection()
            .expect("the test Redis answers")
    }

    /// What the group has left, seen by a source that reads nothing.
    pub async fn backlog(&self) -> Backlog {
        let observer = self
            .observer
            .get_or_init(|| RedisStreamSource::connect(self.config()))
            .await
            .as_ref()
            .expect("connects to the test Redis");
        observer.backlog().await.expect("the backlog reads")
    }

    /// The dead-letter stream's entries, as field maps.
    pub fn dead_letters(&self) -> Vec<HashMap<String, String>> {
        let reply: redis::streams::StreamRangeReply = self
            .conn()
            .xrange_all(format!("{}.dead-letter", self.stream))
            .expect("XRANGE answers");
        reply
            .ids
            .into_iter()
            .map(|e| {
                e.map
                    .into_iter()
                    .map(|(k, v)| (k, redis::from_redis_value::<String>(v).unwrap()))
                    .collect()
            })
            .collect()
    }
}

impl Fixture {
    /// The dead-letter stream's entries, as field lists in the entry's
    /// order, a repeated field repeated.
    pub fn dead_letter_fields(&self) -> Vec<Vec<(String, String)>> {
        let reply: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
            .arg(format!("{}.dead-letter", self.stream))
            .arg("-")
            .arg("+")
            .query(&mut self.conn())
            .expect("XRANGE answers");
        reply
            .into_iter()
            .map(|(_, flat)| {
                flat.chunks_exact(2)
                    .map(|pair| (pair[0].clone(), pair[1].clone()))
                    .collect()
            })
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let keys = [
            self.stream.clone(),
            format!("{}.retry", self.stream),
            format!("{}.dead-letter", self.stream),
        ];
        if let Ok(mut c) = self.client.get_connection() {
            let _: Result<(), _> = c.del(&keys[..]);
        }
    }
}

/// A message keyed by `id` with a body naming it.
pub fn message(id: &str) -> Message {
    let mut m = Message::new(Bytes::from(format!("body of {id}")));
    m.id = Some(id.to_owned());
    m
}

/// Which attempts the handler saw, per message id: an effect is an entry.
#[derive(Clone, Default)]
pub struct Effects(Arc<Mutex<HashMap<String, Vec<u32>>>>);

impl Effects {
    pub fn record(&self, message: &Message) {
        self.0
            .lock()
            .entry(message.id.clone().unwrap_or_default())
            .or_default()
            .push(message.attempt);
    }

    pub fn of(&self, id: &str) -> Vec<u32> {
        self.0.lock().get(id).cloned().unwrap_or_default()
    }

    pub fn all(&self) -> HashMap<String, Vec<u32>> {
        self.0.lock().clone()
    }

    pub fn total(&self) -> usize {
        self.0.lock().values().map(Vec::len).sum()
    }
}

/// A guard on a memory store with a lease of `lease_ms`.
pub fn guard(lease_ms: u64) -> Guard<MemoryStore> {
    Guard::new(MemoryStore::new()).lease(Lease::from_millis(lease_ms))
}

/// A runner started in a task (`Running::start`), stopped for its report.
pub use idem_consumer::testing::Running;

/// Waits until a check holds, for at most a limit.
pub use idem_consumer::testing::wait_until as eventually;
