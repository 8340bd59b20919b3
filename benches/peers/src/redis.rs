//! idem's Redis store beside the `idempotent` crate's Valkey store (0.3.0),
//! on one Redis, one workload: N keys plus 10 % duplicates, a delivery is a
//! claim (with a fingerprint, on both sides) and a completion when claimed,
//! with 1 and 64 tasks. Then idem's batches, and bytes per record. Run by
//! `benches/redis/run`, against a Redis of its own (this FLUSHALLs it).
//!   cargo run --release --manifest-path benches/peers/Cargo.toml --bin redis -- redis://127.0.0.1:6399
//! With `-- URL N --one idem|idempotent TASKS`, one run of one side only
//! (`benches/redis/client-instructions` counts its instructions).

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{Begin, BeginItem, CompleteItem, Fingerprint, Key, Lease, Namespace, Store};
use idem_redis::RedisStore;
use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
use idempotent::store::valkey::ValkeyStore;
use idempotent::store::{IdempotencyStore, InsertResult};
use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey, Metadata};

fn stream(run: &str, n: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(n + n / 10);
    for i in 0..n {
        out.push(format!("{run}-order-{i:010}"));
        if i % 10 == 9 {
            out.push(out[i / 2].clone());
        }
    }
    out
}

/// Splits `keys` evenly among `tasks`, round robin, so that all of them
/// stay busy to the end; each duplicate goes to the task of its original
/// (it then meets a completed record, not a live claim).
fn split(keys: &[String], tasks: usize) -> Vec<Vec<String>> {
    let mut parts = vec![Vec::new(); tasks];
    let mut owner = std::collections::HashMap::new();
    for k in keys {
        let next = owner.len() % tasks;
        let task = *owner.entry(k.clone()).or_insert(next);
        parts[task].push(k.clone());
    }
    parts
}

/// Deliveries per second, and each delivery's time (µs).
async fn idem_run(store: &RedisStore, keys: &[String], tasks: usize) -> (f64, Vec<f64>) {
    let ns = Namespace::new("bench").unwrap();
    let parts = split(keys, tasks);
    let start = Instant::now();
    let handles: Vec<_> = parts
        .into_iter()
        .map(|part| {
            let (store, ns) = (store.clone(), ns.clone());
            tokio::spawn(async move {
                // A fingerprint on every claim, as the peer keeps one.
                let fingerprint = Some(Fingerprint::sha256(b"POST /orders"));
                let mut times = Vec::with_capacity(part.len());
                for k in part {
                    let t = Instant::now();
                    let key = Key::in_namespace(ns.clone(), k).unwrap();
                    if let Begin::Acquired(c) = store
                        .begin(&key, fingerprint, Lease::from_secs(60))
                        .await
                        .unwrap()
                    {
                        let done = store
                            .complete(&key, c.token, Some("ok".into()), Duration::from_secs(600))
                            .await
                            .unwrap();
                        assert!(!done.is_stale());
                    }
                    times.push(t.elapsed().as_secs_f64() * 1e6);
                }
                times
            })
        })
        .collect();
    let mut times = Vec::with_capacity(keys.len());
    for h in handles {
        times.extend(h.await.unwrap());
    }
    (keys.len() as f64 / start.elapsed().as_secs_f64(), times)
}

/// Deliveries per second, and each delivery's time (µs).
async fn peer_run(store: &Arc<ValkeyStore>, keys: &[String], tasks: usize) -> (f64, Vec<f64>) {
    let parts = split(keys, tasks);
    let start = Instant::now();
    let handles: Vec<_> = parts
        .into_iter()
        .map(|part| {
            let store = store.clone();
            tokio::spawn(async move {
                let fingerprint = DefaultFingerprintStrategy.compute("POST /orders", b"");
                let mut times = Vec::with_capacity(part.len());
                for k in part {
                    let t = Instant::now();
                    let key = IdempotencyKey::new(k).unwrap();
                    let entry = IdempotencyEntry::new(fingerprint, Duration::from_secs(600));
                    if let InsertResult::Claimed { fencing_token } =
                        store.try_insert(&key, entry.clone()).await.unwrap()
                    {
                        let response = CachedResponse {
                            status_code: 200,
                            metadata: Metadata::default(),
                            body: b"ok".to_vec().into(),
                        };
                        store
                            .complete(&key, entry.complete(response), fencing_token)
                            .await
                            .unwrap();
                    }
                    times.push(t.elapsed().as_secs_f64() * 1e6);
                }
                times
            })
        })
        .collect();
    let mut times = Vec::with_capacity(keys.len());
    for h in handles {
        times.extend(h.await.unwrap());
    }
    (keys.len() as f64 / start.elapsed().as_secs_f64(), times)
}

/// Fresh keys through `begin_many` + `complete_many`, `batch` a call, with
/// `tasks` tasks: keys per second.
async fn idem_batched(store: &RedisStore, run: &str, n: usize, batch: usize, tasks: usize) -> f64 {
    let ns = Namespace::new("bench").unwrap();
    let keys: Vec<Key> = (0..n)
        .map(|i| Key::in_namespace(ns.clone(), format!("{run}-b-{i:010}")).unwrap())
        .collect();
    let chunks: Vec<Vec<Key>> = keys.chunks(batch).map(<[Key]>::to_vec).collect();
    let per_task = chunks.len().div_ceil(tasks);
    let start = Instant::now();
    let handles: Vec<_> = chunks
        .chunks(per_task)
        .map(|mine| {
            let (store, mine) = (store.clone(), mine.to_vec());
            tokio::spawn(async move {
                for chunk in mine {
                    let items: Vec<BeginItem> = chunk
                        .iter()
                        .map(|k| BeginItem {
                            key: k.clone(),
                            fingerprint: None,
                            lease: Lease::from_secs(60),
                        })
                        .collect();
                    let begun = store.begin_many(&items).await.unwrap();
                    let completes: Vec<CompleteItem> = chunk
                        .iter()
                        .zip(begun)
                        .filter_map(|(k, b)| match b {
                            Begin::Acquired(c) => Some(CompleteItem {
                                key: k.clone(),
                                token: c.token,
                                outcome: Some("ok".into()),
                                retention: Duration::from_secs(600),
                            }),
                            _ => None,
                        })
                        .collect();
                    store.complete_many(&completes).await.unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// One side's runs at one concurrency.
#[derive(Default)]
struct Side {
    /// Deliveries per second, a run each.
    rates: Vec<f64>,
    /// Microseconds of Redis and of client CPU per delivery, a run each.
    cpus: Vec<(f64, f64)>,
    /// Each delivery's time (µs).
    times: Vec<f64>,
    /// Script calls Redis ran, and deliveries made, in all runs.
    calls: f64,
    deliveries: f64,
}

impl Side {
    /// Records `run`, a run of `deliveries` deliveries that answers its
    /// rate and each delivery's time.
    async fn record(
        &mut self,
        admin: &mut redis::Connection,
        deliveries: usize,
        run: impl std::future::Future<Output = (f64, Vec<f64>)>,
    ) {
        let calls = script_calls(admin);
        let before = Cpu::now(admin);
        let (rate, times) = run.await;
        self.cpus.push(before.per_delivery(admin, deliveries));
        self.calls += script_calls(admin) - calls;
        self.deliveries += deliveries as f64;
        self.rates.push(rate);
        self.times.extend(times);
    }

    /// Median CPU a delivery, Redis's and the client's.
    fn cpu(&self) -> String {
        let redis: Vec<f64> = self.cpus.iter().map(|c| c.0).collect();
        let client: Vec<f64> = self.cpus.iter().map(|c| c.1).collect();
        format!(
            "Redis {:.1} µs, client {:.1} µs",
            median(&redis),
            median(&client)
        )
    }
}

/// Script calls Redis has run so far (`EVALSHA` in `INFO commandstats`).
fn script_calls(admin: &mut redis::Connection) -> f64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(admin).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0.0, |n| n.parse().unwrap())
}

/// CPU time used so far: Redis's main thread (`INFO cpu`) and this process
/// (`/proc/self/stat`), in seconds.
struct Cpu {
    redis: f64,
    client: f64,
}

impl Cpu {
    fn now(admin: &mut redis::Connection) -> Self {
        let info: String = redis::cmd("INFO").arg("cpu").query(admin).unwrap();
        let field = |name: &str| -> f64 {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        // utime and stime, in clock ticks (100 a second), after the
        // parenthesised command name.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<f64> = after
            .split_whitespace()
            .skip(11)
            .take(2)
            .map(|f| f.parse().unwrap())
            .collect();
        Cpu {
            redis: field("used_cpu_user_main_thread:") + field("used_cpu_sys_main_thread:"),
            client: (fields[0] + fields[1]) / 100.0,
        }
    }

    /// Microseconds of Redis and of client CPU per delivery since `self`.
    fn per_delivery(&self, admin: &mut redis::Connection, deliveries: usize) -> (f64, f64) {
        let now = Cpu::now(admin);
        let per = |a: f64, b: f64| (b - a) * 1e6 / deliveries as f64;
        (per(self.redis, now.redis), per(self.client, now.client))
    }
}

/// Alternating runs per side.
const ROUNDS: usize = 6;

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

/// The 10th, 50th and 90th percentiles of `v` (µs).
fn percentiles(v: &mut [f64]) -> String {
    v.sort_by(f64::total_cmp);
    let at = |p: usize| v[(v.len() * p / 100).min(v.len() - 1)];
    format!("{:.0} / {:.0} / {:.0} µs", at(10), at(50), at(90))
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

fn used_memory(conn: &mut redis::Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").query(conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6399".into());
    let n: usize = std::env::args()
        .nth(2)
        .map_or(50_000, |a| a.parse().unwrap());
    let client = redis::Client::open(url.as_str()).unwrap();
    // Blocking and without a time limit: FLUSHALL of millions of keys is slow.
    let mut admin = client.get_connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut admin).unwrap();
    let idem = RedisStore::connect(&url).await.unwrap();
    let peer = Arc::new(ValkeyStore::new(client.clone()).await.unwrap());
    // `--one idem|idempotent TASKS`: one run of one side and nothing else,
    // for counting the client's instructions under callgrind.
    if std::env::args().nth(3).as_deref() == Some("--one") {
        let side = std::env::args().nth(4).unwrap();
        let tasks: usize = std::env::args().nth(5).unwrap().parse().unwrap();
        let run = stream("one", n);
        let (rate, _) = match side.as_str() {
            "idem" => idem_run(&idem, &run, tasks).await,
            _ => peer_run(&peer, &run, tasks).await,
        };
        println!(
            "{side}, {tasks} task(s): {} deliveries, {rate:.0}/s",
            run.len()
        );
        return;
    }

    println!("N keys + 10 % duplicates per run; deliveries/s (claim, and complete when claimed)");
    // Short runs, alternating, on an emptied Redis each: this machine's
    // speed drifts over seconds, and a growing keyspace costs Redis
    // rehashing; both then fall on the two sides alike.
    let flush = |admin: &mut redis::Connection| {
        let _: () = redis::cmd("FLUSHALL").query(admin).unwrap();
    };
    for tasks in [1usize, 64] {
        // One task runs slowly: more, shorter runs, so that each pair of
        // runs sees the same machine.
        let (rounds, keys_per_run) = if tasks == 1 {
            (3 * ROUNDS, n / 30)
        } else {
            (ROUNDS, n)
        };
        // A short run of each side first, not counted: connections, scripts
        // and caches warm on both sides alike.
        let warm = stream(&format!("w{tasks}"), keys_per_run / 4);
        idem_run(&idem, &warm, tasks).await;
        peer_run(&peer, &warm, tasks).await;
        let (mut ours, mut theirs) = (Side::default(), Side::default());
        for round in 0..rounds {
            // Each side goes first in every other pair, so that neither
            // always meets the machine as the other left it.
            for idem_now in [round % 2 == 0, round % 2 == 1] {
                flush(&mut admin);
                if idem_now {
                    let run = stream(&format!("i{tasks}{round}"), keys_per_run);
                    ours.record(&mut admin, run.len(), idem_run(&idem, &run, tasks))
                        .await;
                } else {
                    let run = stream(&format!("p{tasks}{round}"), keys_per_run);
                    theirs
                        .record(&mut admin, run.len(), peer_run(&peer, &run, tasks))
                        .await;
                }
            }
        }
        let ratios: Vec<f64> = ours
            .rates
            .iter()
            .zip(&theirs.rates)
            .map(|(a, b)| a / b)
            .collect();
        println!(
            "{tasks:>2} task(s), {rounds} alternating runs of {keys_per_run} keys: idem median {:.0}/s ({:.0}-{:.0}); idempotent 0.3.0 (Valkey store) median {:.0}/s ({:.0}-{:.0}); ratio of medians {:.2}; per pair of runs: median {:.2}, {:.2}-{:.2}",
            median(&ours.rates),
            min(&ours.rates),
            max(&ours.rates),
            median(&theirs.rates),
            min(&theirs.rates),
            max(&theirs.rates),
            median(&ours.rates) / median(&theirs.rates),
            median(&ratios),
            min(&ratios),
            max(&ratios),
        );
        println!(
            "   CPU a delivery (medians): idem {}; idempotent {}",
            ours.cpu(),
            theirs.cpu()
        );
        println!(
            "   script calls a delivery: idem {:.2}; idempotent {:.2}",
            ours.calls / ours.deliveries,
            theirs.calls / theirs.deliveries
        );
        println!(
            "   time a delivery, p10 / p50 / p90: idem {}; idempotent {}",
            percentiles(&mut ours.times),
            percentiles(&mut theirs.times)
        );
    }
    flush(&mut admin);
    for (batch, tasks) in [(256usize, 1usize), (256, 8), (256, 64)] {
        let r = idem_batched(&idem, &format!("b{batch}{tasks}"), n * 2, batch, tasks).await;
        println!(
            "idem begin_many + complete_many, {batch} keys a call, {tasks} task(s): {r:.0} keys/s"
        );
    }

    // The lock: acquire + release pairs per second, 1 and 16 tasks on one lock.
    for tasks in [1usize, 16] {
        let lock = idem
            .lock(&format!("bench-{tasks}"))
            .lease(Duration::from_secs(10));
        let deadline = Instant::now() + Duration::from_secs(3);
        let pairs = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (lock, pairs) = (lock.clone(), pairs.clone());
                tokio::spawn(async move {
                    while Instant::now() < deadline {
                        if let Some(g) = lock.try_lock(Duration::from_secs(5)).await.unwrap() {
                            g.release().await.unwrap();
                            pairs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
        println!(
            "lock, {tasks} task(s) contending: {:.0} acquire+release pairs/s",
            pairs.load(std::sync::atomic::Ordering::Relaxed) as f64 / 3.0
        );
    }

    // Bytes per record: 1 M completed records (2-byte outcome, 14-byte keys).
    let _: () = redis::cmd("FLUSHALL").query(&mut admin).unwrap();
    let before = used_memory(&mut admin);
    let records = 1_000_000usize;
    let rate = idem_batched(&idem, "m", records, 1000, 8).await;
    let after = used_memory(&mut admin);
    let per = (after - before) as f64 / records as f64;
    let sample = "idem:{bench:m-b-0000000001}:r";
    let rec: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(sample)
        .query(&mut admin)
        .unwrap();
    let keys: i64 = redis::cmd("DBSIZE").query(&mut admin).unwrap();
    println!(
        "memory: {records} completed records written at {rate:.0}/s: {per:.0} bytes each in used_memory; {keys} keys; MEMORY USAGE of one record: {rec} B"
    );
}
