//! Flash sale (docs/guide.md): a burst of order requests, a fifth of them
//! client retries, places each order once.
//!
//! 20 000 requests for 16 000 orders arrive 256 at a time at a [`Guard`]
//! on a tiered store: Redis in front (every claim, every recent record), a
//! file store behind (the completed history, written behind in batches),
//! and a key filter that answers "certainly new" for a new order without
//! asking the file store. A retry that comes while its first request runs
//! is answered busy and tries again shortly; one that comes after gets the
//! first request's receipt.
//!
//! ```sh
//! cargo run -p idem --example guide_flash_sale --features redis,tiered
//! ```
//!
//! Redis from `IDEM_TEST_REDIS_URL` (default `redis://127.0.0.1:6379`),
//! in a namespace of this run's own (its records leave Redis after the
//! one-minute hot retention); the file store in a temporary directory.
//! Exits non-zero when an order was placed twice, not at all, or a retry
//! got another receipt.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use idem::tier::Tier;
use idem::tiered::TieredStore;
use idem::tiered::filter::{FilterConfig, FilterSeed};
use idem::{Disposition, FileStore, Fingerprint, Guard, GuardError, Key, Lease, RedisStore};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

type Error = Box<dyn std::error::Error + Send + Sync>;

const REQUESTS: usize = 20_000;
/// Requests in flight at once: clients hitting the order API together.
const IN_FLIGHT: usize = 256;
/// Orders the key filter is sized for, per retention: a sale's day.
const FILTER_KEYS_PER_DAY: u64 = 1_000_000;
const DAY: Duration = Duration::from_secs(24 * 3600);

/// What each order's requests saw.
struct Orders {
    /// How often each order's effect (reserve stock, create the order) ran.
    placed: Vec<AtomicU32>,
    /// The receipt each order's first request got.
    receipts: Vec<OnceLock<String>>,
    /// Requests answered with the stored receipt, the effect not run.
    replayed: AtomicUsize,
    /// Busy answers (the first request still running) before a retry.
    busy: AtomicUsize,
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let redis_url = std::env::var("IDEM_TEST_REDIS_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let hot = RedisStore::builder(&redis_url)
        .connect()
        .await
        .map_err(|e| format!("cannot reach Redis at {redis_url} ({e}); set IDEM_TEST_REDIS_URL"))?;
    let cold_dir = tempfile::tempdir()?;
    let cold = FileStore::open(cold_dir.path())?;

    // The filter: sized for a million orders a day at 0.1 % false
    // positives, keyed with a secret seed (`--filter-seed` for `idem serve`;
    // here a fresh one), kept in Redis beside the records and shared by
    // every process in front of this cold tier.
    let config = FilterConfig::new(FilterSeed::new(secret_seed()), FILTER_KEYS_PER_DAY, DAY);
    let sizing = config.sizing()?;
    // Completions on their way to the file store are listed in Redis, by
    // the name of this cold tier, until they get there; the filter goes by
    // the same name.
    let store = TieredStore::builder(hot, cold)
        .handover_list(cold_dir.path().display().to_string())
        .shared_filter(config)
        .hot_retention(Duration::from_secs(60))
        .open()
        .await?;
    // Until it has seen every key the cold tier holds, the filter answers
    // "maybe" and every new key is checked in the cold tier: one process
    // rebuilds it in the background.
    let filter = store.shared_filter().expect("a shared filter").clone();
    while !store.hot().filter_ready(&filter).await? {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let guard = Guard::new(store.clone())
        .lease(Lease::from_secs(10))
        .retention(DAY);

    let namespace = format!("flash-sale-{}", run_suffix());
    let requests = requests();
    let distinct = REQUESTS - REQUESTS / 5;
    let orders = Arc::new(Orders {
        placed: (0..distinct).map(|_| AtomicU32::new(0)).collect(),
        receipts: (0..distinct).map(|_| OnceLock::new()).collect(),
        replayed: AtomicUsize::new(0),
        busy: AtomicUsize::new(0),
    });

    let started = Instant::now();
    let room = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut tasks = JoinSet::new();
    for order in requests {
        let (guard, orders, namespace) = (guard.clone(), orders.clone(), namespace.clone());
        let place = room.clone().acquire_owned().await?;
        tasks.spawn(async move {
            let answer = place_order(&guard, &namespace, order, &orders).await;
            drop(place);
            answer
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let took = started.elapsed();
    // Completions reach the file store in batches; a graceful shutdown
    // waits for them as here.
    store.flush().await;

    let placed: u64 = orders
        .placed
        .iter()
        .map(|n| u64::from(n.load(Ordering::Relaxed)))
        .sum();
    let placed_once = orders
        .placed
        .iter()
        .filter(|n| n.load(Ordering::Relaxed) == 1)
        .count();
    let replayed = orders.replayed.load(Ordering::Relaxed);
    let busy = orders.busy.load(Ordering::Relaxed);
    let checks = store.cold_checks();
    let behind = store.write_behind();
    let filter_bytes = filter.bits / 8 * u64::from(filter.generations);

    println!(
        "requests: {REQUESTS} for {distinct} orders ({} client retries), {IN_FLIGHT} in flight, in {:.2} s ({:.0} requests/s)",
        REQUESTS - distinct,
        took.as_secs_f64(),
        REQUESTS as f64 / took.as_secs_f64()
    );
    println!(
        "effects applied: {placed} for {distinct} orders; duplicates answered with the first receipt: {replayed} ({busy} busy answers retried first)"
    );
    println!(
        "key filter: {} cold-tier lookups skipped (certainly new), {} asked the cold tier; {filter_bytes} bytes ({:.1} MiB) in Redis for {FILTER_KEYS_PER_DAY} keys a day at 0.1 %, {} generations",
        checks.skipped,
        checks.asked,
        filter_bytes as f64 / (1024.0 * 1024.0),
        sizing.generations
    );
    println!(
        "write-behind: {} records in the file store, {} pending, {} lost, {} refused",
        behind.imported, behind.pending, behind.lost, behind.refused
    );

    assert_eq!(
        placed, distinct as u64,
        "effects applied == distinct orders"
    );
    assert_eq!(placed_once, distinct, "each order placed exactly once");
    assert_eq!(replayed, REQUESTS - distinct, "every retry got the receipt");
    assert_eq!(
        checks.skipped + checks.asked,
        distinct as u64,
        "one filter lookup per new order"
    );
    assert!(
        checks.asked <= distinct as u64 / 100,
        "the filter spared the cold tier: {checks:?}"
    );
    assert_eq!(sizing.total_bytes(), filter_bytes);
    assert_eq!(
        (behind.imported, behind.pending, behind.lost),
        (distinct as u64, 0, 0),
        "every completion reached the cold tier"
    );
    println!(
        "ok: {distinct} orders placed once each from {REQUESTS} requests; {} cold-tier lookups skipped",
        checks.skipped
    );
    Ok(())
}

/// One request: place `order` once. A retry that finds the first request
/// running waits a little and asks again, as a client told "busy" would;
/// one that finds it done gets its receipt.
async fn place_order(
    guard: &Guard<TieredStore<RedisStore, FileStore>>,
    namespace: &str,
    order: usize,
    orders: &Orders,
) -> Result<(), Error> {
    let key = Key::new(namespace, format!("order-{order:06}"))?;
    let body = format!(r#"{{"order":{order},"sku":"tee-42","quantity":1}}"#);
    // The same key with another body is refused (`GuardError::Mismatch`),
    // never answered with this order's receipt.
    let fingerprint = Fingerprint::sha256(body.as_bytes());
    let mut store_retries = 0;
    loop {
        let ran = AtomicBool::new(false);
        let answer = guard
            .run(&key, Some(fingerprint), |claim| {
                let ran = &ran;
                async move {
                    // The effect: reserve the stock and create the order.
                    ran.store(true, Ordering::Relaxed);
                    orders.placed[order].fetch_add(1, Ordering::Relaxed);
                    let token = claim.token().map_or(0, |t| t.get());
                    let receipt = format!("receipt-{order}-{token}");
                    let _ = orders.receipts[order].set(receipt.clone());
                    Ok::<_, std::convert::Infallible>(receipt)
                }
            })
            .await;
        match answer {
            Ok(receipt) => {
                if orders.receipts[order].get() != Some(&receipt) {
                    return Err(format!("order {order} answered {receipt}, not its own").into());
                }
                if !ran.load(Ordering::Relaxed) {
                    orders.replayed.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(());
            }
            // The first request is still running: retry soon. (`retry_after`
            // is when its lease would end, an upper bound.)
            Err(GuardError::InProgress { retry_after }) => {
                orders.busy.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(retry_after.min(Duration::from_millis(5))).await;
            }
            // The store did not answer in time (a loaded machine): the
            // client retries, and learns what became of its first try.
            Err(e)
                if matches!(e.disposition(), Disposition::RetryLater { .. })
                    && store_retries < 100 =>
            {
                store_retries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("order {order}: {e}").into()),
        }
    }
}

/// The burst: every fifth request is a client's retry of the order two
/// requests before it, so that many arrive while the first still runs.
fn requests() -> Vec<usize> {
    let mut requests = Vec::with_capacity(REQUESTS);
    let mut next = 0;
    for n in 0..REQUESTS {
        if n % 5 == 4 {
            requests.push(requests[n - 2]);
        } else {
            requests.push(next);
            next += 1;
        }
    }
    requests
}

/// 128 bits that differ per run. A deployment keeps one secret seed (32 hex
/// digits), given to every process.
fn secret_seed() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let half = || {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    };
    (u128::from(half()) << 64) | u128::from(half())
}

/// A suffix no other run uses at the same time: the process id and the
/// clock.
fn run_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:x}-{nanos:x}", std::process::id())
}
