//! Redis away for a while only pauses the consumer: nothing is lost and
//! nothing takes effect twice.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem_consumer::{HandlerError, Message, Runner};
use idem_core::{Bytes, ClaimHandle};
use idem_redis_streams::RedisStreamConfig;
use parking_lot::Mutex;
use support::{Effects, Fixture, Running, eventually, guard, message};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A TCP relay to Redis that can drop every connection and refuse new ones
/// for a while: Redis going away, for this test's connections only.
struct Relay {
    port: u16,
    up: Arc<AtomicBool>,
    cut: Arc<Mutex<CancellationToken>>,
}

impl Relay {
    async fn to(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let cut = Arc::new(Mutex::new(CancellationToken::new()));
        let (up2, cut2) = (up.clone(), cut.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    continue; // dropped: connection refused, in effect
                }
                let cut = cut2.lock().clone();
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        () = cut.cancelled() => {}
                    }
                });
            }
        });
        Self { port, up, cut }
    }

    fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        let mut cut = self.cut.lock();
        cut.cancel();
        *cut = CancellationToken::new();
    }

    fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_away_for_a_while_pauses_the_consumer_and_loses_nothing() {
    let Some(fx) = Fixture::new("outage") else {
        return;
    };
    let Some(target) = fx
        .server
        .strip_prefix("redis://")
        .map(|rest| rest.split(['/', '?']).next().unwrap_or(rest).to_owned())
        .filter(|t| !t.contains('@'))
    else {
        eprintln!("skipping: the relay handles plain redis://HOST:PORT URLs only");
        return;
    };
    let relay = Relay::to(target).await;
    let config = RedisStreamConfig::from_url(&format!(
        "redis://127.0.0.1:{}?stream={}&group=idem",
        relay.port, fx.stream
    ))
    .unwrap()
    .claim_idle(Duration::from_millis(500));
    let publisher = fx.publisher().await;
    for i in 0..50 {
        publisher
            .publish(&message(&format!("o-{i}")))
            .await
            .unwrap();
    }
    let effects = Effects::default();
    let handler = {
        let effects = effects.clone();
        move |m: Message, _: ClaimHandle| {
            let effects = effects.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                effects.record(&m);
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    let source = fx.source_with(config).await;
    let running = Running::start(Runner::new(guard(10_000), source, handler).concurrency(8));
    eventually(Duration::from_secs(10), "some handled", || async {
        effects.total() >= 10
    })
    .await;

    relay.down();
    // Published while the consumer cannot reach Redis.
    for i in 50..100 {
        publisher
            .publish(&message(&format!("o-{i}")))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    relay.up();

    eventually(
        Duration::from_secs(20),
        "all handled and drained",
        || async { effects.total() >= 100 && fx.backlog().await.is_drained() },
    )
    .await;
    let report = running.stop().await;

    let all = effects.all();
    assert_eq!(all.len(), 100, "every message took effect");
    assert!(
        all.values().all(|attempts| attempts.len() == 1),
        "none took effect twice"
    );
    assert!(
        report.fetch_errors + report.source_errors > 0,
        "the consumer did see Redis go away: {report:?}"
    );
}
