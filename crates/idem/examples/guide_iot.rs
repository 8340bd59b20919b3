//! IoT telemetry (docs/guide.md): readings that devices resend and the
//! broker redelivers are stored once each.
//!
//! 50 devices publish 40 readings each into a Redis stream; one reading in
//! seven is sent twice (the device never saw the broker's answer). Each
//! entry carries the device's own message id in its `message-id` field,
//! which is the idempotency key. A first gateway reads 200 entries, stores
//! their readings and dies before acknowledging them; the consumer runner
//! (`idem::consumer::Runner` on `idem::redis_streams`) then takes the
//! stream, claims the entries the dead gateway left once they have been
//! idle for half a second, and acks them as duplicates. The runner is
//! stopped with its cancellation token once the group has nothing left.
//!
//! ```sh
//! cargo run -p idem --example guide_iot --features redis,redis-streams
//! ```
//!
//! Redis from `IDEM_TEST_REDIS_URL` (default `redis://127.0.0.1:6379`): the
//! stream is named for this run and deleted at the end, the records (in
//! the stream's namespace) expire after an hour. Exits non-zero when a
//! reading was stored twice or not at all.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::consumer::{HandlerError, Message, Runner, Source};
use idem::redis_streams::{RedisStreamConfig, RedisStreamSource};
use idem::{Bytes, ClaimHandle, Guard, Key, Raw, RedisStore};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

type Error = Box<dyn std::error::Error + Send + Sync>;

const DEVICES: usize = 50;
const READINGS_PER_DEVICE: usize = 40;
/// Entries the first gateway takes before it dies.
const TAKEN_BY_THE_DEAD_GATEWAY: usize = 200;

/// The readings database: how often each reading was written.
type Readings = Arc<Mutex<HashMap<String, u32>>>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let server = std::env::var("IDEM_TEST_REDIS_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let redis = redis::Client::open(server.as_str())?;
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("cannot reach Redis at {server} ({e}); set IDEM_TEST_REDIS_URL"))?;
    let stream = format!("guide-readings-{}", run_suffix());
    let sep = if server.contains('?') { '&' } else { '?' };
    let config =
        RedisStreamConfig::from_url(&format!("{server}{sep}stream={stream}&group=ingest"))?
            .concurrency(64)
            // A gateway's entries go to another once idle this long: how soon
            // a dead gateway's readings are redelivered.
            .claim_idle(Duration::from_millis(500));

    // The devices: XADD with the device's message id, as any producer in
    // any language would.
    let mut published = 0;
    let mut distinct = 0;
    for seq in 0..READINGS_PER_DEVICE {
        for device in 0..DEVICES {
            let id = format!("sensor-{device:03}:{seq:06}");
            let body = format!(
                r#"{{"device":"sensor-{device:03}","seq":{seq},"celsius":{:.1}}}"#,
                18.0 + (device * 7 + seq) as f64 % 90.0 / 10.0
            );
            let copies = if (device + seq) % 7 == 0 { 2 } else { 1 };
            for _ in 0..copies {
                let _: String = redis::cmd("XADD")
                    .arg(&stream)
                    .arg("*")
                    .arg("message-id")
                    .arg(&id)
                    .arg("content-type")
                    .arg("application/json")
                    .arg("body")
                    .arg(&body)
                    .query_async(&mut conn)
                    .await?;
                published += 1;
            }
            distinct += 1;
        }
    }

    let guard = Guard::new(RedisStore::builder(&server).connect().await?)
        .retention(Duration::from_secs(3600));
    let readings = Readings::default();

    // A gateway that stores readings and dies before its acks.
    let stored_by_dead_gateway = {
        let dead = RedisStreamSource::connect(config.clone().consumer("gateway-a")).await?;
        let mut stored = 0;
        let mut taken = 0;
        while taken < TAKEN_BY_THE_DEAD_GATEWAY {
            for delivery in dead.fetch(TAKEN_BY_THE_DEAD_GATEWAY - taken).await? {
                taken += 1;
                let message = delivery.message;
                let id = message.id.clone().ok_or("an entry without a message-id")?;
                // The key the runner takes: the stream's name as namespace,
                // the message id as key.
                let key = Key::new(&stream, id)?;
                let before = readings.lock().await.len();
                guard
                    .run_with(
                        &Raw,
                        &key,
                        None,
                        |claim| store_reading(readings.clone(), message, claim),
                        |_| async {},
                    )
                    .await?;
                stored += readings.lock().await.len() - before;
                // No ack: the gateway dies here.
            }
        }
        stored
    };

    // The consumer that stays.
    let source = RedisStreamSource::connect(config.consumer("gateway-b")).await?;
    let observer = source.clone();
    let handler = {
        let readings = readings.clone();
        move |message: Message, claim: ClaimHandle| store_reading(readings.clone(), message, claim)
    };
    let stop = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(
        Runner::new(guard, source, handler)
            .concurrency(64)
            .run(stop.clone()),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let backlog = observer.backlog().await?;
        if backlog.is_drained() && readings.lock().await.len() == distinct {
            break;
        }
        if Instant::now() > deadline {
            stop.cancel();
            return Err(format!("the stream did not drain within a minute: {backlog:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    let report = running.await??;
    let took = started.elapsed();

    let readings = readings.lock().await;
    let stored: u64 = readings.values().map(|&n| u64::from(n)).sum();
    let twice = readings.values().filter(|&&n| n > 1).count();
    println!(
        "published: {published} entries for {distinct} readings from {DEVICES} devices ({} resent)",
        published - distinct
    );
    println!(
        "a gateway stored {stored_by_dead_gateway} readings from {TAKEN_BY_THE_DEAD_GATEWAY} entries and died before acking them"
    );
    println!(
        "the runner, in {:.2} s: {} handled, {} acked as duplicates (resends and the dead gateway's entries), {} retried, {} dead-lettered",
        took.as_secs_f64(),
        report.handled,
        report.duplicates,
        report.retried_busy + report.retried_failed + report.retried_unavailable,
        report.dead_lettered
    );
    println!("readings stored: {stored} for {distinct} distinct readings, {twice} stored twice");

    assert_eq!(readings.len(), distinct, "every reading stored");
    assert_eq!(twice, 0, "no reading stored twice");
    assert_eq!(stored, distinct as u64, "readings stored == distinct");
    assert_eq!(
        report.handled as usize + stored_by_dead_gateway,
        distinct,
        "the runner handled what the dead gateway had not"
    );
    assert_eq!(
        (report.handled + report.duplicates) as usize,
        published,
        "every entry acked once"
    );
    assert_eq!(report.dead_lettered, 0);

    let _: u64 = redis::cmd("DEL")
        .arg(&stream)
        .arg(format!("{stream}.retry"))
        .arg(format!("{stream}.dead-letter"))
        .query_async(&mut conn)
        .await?;
    println!("ok: {distinct} readings stored once each from {published} entries");
    Ok(())
}

/// The handler: write the reading. A real one writes to the time-series
/// database, and may pass `claim.token()` to a sink that keeps the highest
/// token per key.
async fn store_reading(
    readings: Readings,
    message: Message,
    _claim: ClaimHandle,
) -> Result<Bytes, HandlerError> {
    let id = message
        .id
        .ok_or_else(|| HandlerError::permanent("a reading without a message-id"))?;
    *readings.lock().await.entry(id).or_default() += 1;
    Ok(Bytes::new())
}

/// A suffix no other run uses at the same time: the process id and the
/// clock.
fn run_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:x}-{nanos:x}", std::process::id())
}
