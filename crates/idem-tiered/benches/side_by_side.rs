//! idem's stores on the side-by-side workload: N keys, every tenth key
//! followed by a duplicate of an earlier key (10 % more deliveries), 64 tasks.
//! A delivery is a `begin`, and a `complete` storing "ok" when acquired; a
//! duplicate finds the key completed (in the "claims only" rows a delivery
//! is a `begin` alone, and a duplicate finds the key in progress). Each row
//! prints one JSON line:
//!   {"name":"…","cycles_per_s":…,"p99_ms":…,"n":…}
//! or {"name":"…","error":"…"} when its store could not be used.
//!
//! `scripts/side-by-side` runs this beside raw Redis, pgbench and AWS
//! Powertools, and writes the table in BENCHMARKS.md. Alone:
//!   IDEM_SBS_KEYS=200000 cargo bench -p idem-tiered --bench side_by_side [-- ROW-WORD...]
//! Words after `--` keep only the rows whose name contains one of them.
//! Redis and PostgreSQL come from `IDEM_TEST_REDIS_URL` and
//! `IDEM_TEST_POSTGRES_URL` (loopback defaults). Each row writes a
//! namespace of its own; the PostgreSQL store writes the table
//! `idem_sbs_$IDEM_SBS_RUN`, made when missing (the script makes it first
//! and fills it with records the planner has read, as in a table in use);
//! Redis records expire after ten minutes. With `IDEM_SBS_DURABLE_REDIS_URL`
//! set, the Redis store also runs against that server (the script's own,
//! with `appendfsync always`).

use std::collections::HashMap;
use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_core::tier::Tier;
use idem_core::{
    Begin, BeginItem, Clock, CompleteItem, Key, Lease, MemoryStore, Namespace, SharedStore, Store,
    SystemClock,
};
use idem_file::FileStore;
use idem_redis::RedisStore;
use idem_sql::SqlStore;
use idem_tiered::TieredStore;
use idem_tiered::filter::{FilterConfig, FilterSeed, KeyFilter};

const TASKS: usize = 64;
const BATCH: usize = 256;
const LEASE: Lease = Lease::from_secs(60);
// Short, so that a run leaves nothing behind in a shared Redis for long.
const RETENTION: Duration = Duration::from_secs(600);

/// The deliveries, already dealt to the tasks.
struct Workload {
    /// Run id: names the namespace and the table of this run.
    run: String,
    /// Rows measured so far.
    rows: AtomicUsize,
    /// Keys in the stream, each to be acquired once.
    distinct: usize,
    /// Key strings (without namespace) a task delivers, in order.
    parts: Vec<Vec<String>>,
}

impl Workload {
    /// `n` distinct keys; after every tenth, a duplicate of the key half way
    /// back in the stream (the stream of `idem-core`'s memory_store bench,
    /// and of `benches/side-by-side/powertools.py`).
    fn new(run: String, n: usize) -> Self {
        let mut stream: Vec<String> = Vec::with_capacity(n + n / 10);
        for i in 0..n {
            stream.push(format!("order-{i:010}"));
            if i % 10 == 9 {
                stream.push(stream[i / 2].clone());
            }
        }
        Self {
            run,
            rows: AtomicUsize::new(0),
            distinct: n,
            parts: deal(&stream, TASKS),
        }
    }

    /// The keys of each task, in a namespace no other row of any run used.
    fn keys(&self) -> Vec<Vec<Key>> {
        let row = self.rows.fetch_add(1, Ordering::Relaxed);
        let ns = Namespace::new(&format!("sbs-{}-{}-{row}", self.run, std::process::id()))
            .expect("namespace");
        self.parts
            .iter()
            .map(|part| {
                part.iter()
                    .map(|k| Key::in_namespace(ns.clone(), k.clone()).expect("key"))
                    .collect()
            })
            .collect()
    }
}

/// Deals `stream` round robin to `tasks`, so that all of them stay busy to
/// the end; a duplicate goes to the task of its original, so it meets a
/// completed record rather than a claim still in flight.
fn deal(stream: &[String], tasks: usize) -> Vec<Vec<String>> {
    let mut parts = vec![Vec::with_capacity(stream.len() / tasks + 1); tasks];
    let mut owner: HashMap<&str, usize> = HashMap::with_capacity(stream.len());
    for k in stream {
        let next = owner.len() % tasks;
        let task = *owner.entry(k.as_str()).or_insert(next);
        parts[task].push(k.clone());
    }
    parts
}

/// What one task saw: each delivery's time, and how its claims went.
#[derive(Default)]
struct Seen {
    nanos: Vec<u64>,
    acquired: usize,
    completed: usize,
    in_progress: usize,
}

impl Seen {
    fn with_capacity(deliveries: usize) -> Self {
        Seen {
            nanos: Vec::with_capacity(deliveries),
            ..Seen::default()
        }
    }

    fn add(&mut self, b: &Begin) -> Result<(), String> {
        match b {
            Begin::Acquired(_) => self.acquired += 1,
            Begin::Completed { outcome, .. } if outcome.as_deref() == Some(b"ok".as_slice()) => {
                self.completed += 1
            }
            Begin::Completed { .. } => return Err("a duplicate got another outcome".into()),
            Begin::InProgress { .. } => self.in_progress += 1,
            Begin::Mismatch => return Err("a claim without fingerprint answered Mismatch".into()),
        }
        Ok(())
    }

    fn merge(&mut self, other: Seen) {
        self.nanos.extend(other.nanos);
        self.acquired += other.acquired;
        self.completed += other.completed;
        self.in_progress += other.in_progress;
    }
}

/// One line of the table.
enum Row {
    Measured {
        name: String,
        cycles_per_s: f64,
        p99_ms: f64,
        n: usize,
        acquired: usize,
        duplicates: usize,
    },
    Failed {
        name: String,
        error: String,
    },
}

impl Row {
    fn failed(name: &str, error: impl Display) -> Self {
        Row::Failed {
            name: name.to_owned(),
            error: error.to_string(),
        }
    }

    fn measured(name: &str, elapsed: Duration, mut seen: Seen) -> Self {
        seen.nanos.sort_unstable();
        let n = seen.nanos.len();
        let p99 = seen.nanos[(n * 99).div_ceil(100) - 1];
        Row::Measured {
            name: name.to_owned(),
            cycles_per_s: n as f64 / elapsed.as_secs_f64(),
            p99_ms: p99 as f64 / 1e6,
            n,
            acquired: seen.acquired,
            duplicates: seen.completed + seen.in_progress,
        }
    }

    fn json(&self) -> String {
        match self {
            Row::Measured {
                name,
                cycles_per_s,
                p99_ms,
                n,
                acquired,
                duplicates,
            } => format!(
                r#"{{"name":{},"cycles_per_s":{cycles_per_s:.0},"p99_ms":{p99_ms:.3},"n":{n},"acquired":{acquired},"duplicates":{duplicates}}}"#,
                quoted(name)
            ),
            Row::Failed { name, error } => {
                format!(r#"{{"name":{},"error":{}}}"#, quoted(name), quoted(error))
            }
        }
    }
}

/// `s` as a JSON string.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c < ' ' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A row for any store: each task delivers its keys one at a time, a
/// `begin` and, when acquired, a `complete`. A new kind of store (a tiered
/// store, say) gets its row by one call of this in [`rows`].
async fn one_by_one<S: Store + Clone>(name: &str, store: S, w: &Workload) -> Row {
    drive(name, store, w, |store, keys| async move {
        let mut seen = Seen::with_capacity(keys.len());
        for key in keys {
            let t = Instant::now();
            let begun = store
                .begin(&key, None, LEASE)
                .await
                .map_err(|e| e.to_string())?;
            seen.add(&begun)?;
            if let Begin::Acquired(claim) = begun {
                let done = store
                    .complete(&key, claim.token, Some("ok".into()), RETENTION)
                    .await
                    .map_err(|e| e.to_string())?;
                if done.is_stale() {
                    return Err("a completion within the lease was refused".into());
                }
            }
            seen.nanos.push(t.elapsed().as_nanos() as u64);
        }
        Ok(seen)
    })
    .await
}

/// A row for any store: each task delivers its keys `BATCH` at a time, one
/// `begin_many` and one `complete_many` for those acquired (with
/// `Claims::Only`, none: every delivery is a claim, and a duplicate finds
/// its original in progress). Each delivery takes its batch's time. A
/// duplicate that lands in the batch of its original finds it in progress.
async fn batched<S: Store + Clone>(name: &str, store: S, w: &Workload, claims: Claims) -> Row {
    drive(name, store, w, move |store, keys| async move {
        let mut seen = Seen::with_capacity(keys.len());
        for chunk in keys.chunks(BATCH) {
            let t = Instant::now();
            let items: Vec<BeginItem> = chunk
                .iter()
                .map(|key| BeginItem {
                    key: key.clone(),
                    fingerprint: None,
                    lease: LEASE,
                })
                .collect();
            let begun = store.begin_many(&items).await.map_err(|e| e.to_string())?;
            let mut completes = Vec::with_capacity(items.len());
            for (item, b) in items.into_iter().zip(begun) {
                seen.add(&b)?;
                if let (Begin::Acquired(claim), Claims::Completed) = (b, claims) {
                    completes.push(CompleteItem {
                        key: item.key,
                        token: claim.token,
                        outcome: Some("ok".into()),
                        retention: RETENTION,
                    });
                }
            }
            let done = store
                .complete_many(&completes)
                .await
                .map_err(|e| e.to_string())?;
            if done.iter().any(|d| d.is_stale()) {
                return Err("a completion within the lease was refused".into());
            }
            let spent = t.elapsed().as_nanos() as u64;
            seen.nanos.extend(std::iter::repeat_n(spent, chunk.len()));
        }
        Ok(seen)
    })
    .await
}

/// Whether a batched row completes what it claims.
#[derive(Clone, Copy)]
enum Claims {
    Completed,
    Only,
}

/// Runs `deliver` on each task's keys, all tasks at once, and makes the
/// row from what they saw.
async fn drive<S, F, Fut>(name: &str, store: S, w: &Workload, deliver: F) -> Row
where
    S: Store + Clone,
    F: Fn(S, Vec<Key>) -> Fut,
    Fut: Future<Output = Result<Seen, String>> + Send + 'static,
{
    let start = Instant::now();
    let tasks: Vec<_> = w
        .keys()
        .into_iter()
        .map(|keys| tokio::spawn(deliver(store.clone(), keys)))
        .collect();
    finish(name, start, tasks, w).await
}

/// Waits for the tasks and checks that every key was acquired once.
async fn finish(
    name: &str,
    start: Instant,
    tasks: Vec<tokio::task::JoinHandle<Result<Seen, String>>>,
    w: &Workload,
) -> Row {
    let mut all = Seen::default();
    for t in tasks {
        match t.await {
            Ok(Ok(seen)) => all.merge(seen),
            Ok(Err(e)) => return Row::failed(name, e),
            Err(e) => return Row::failed(name, format!("a task panicked: {e}")),
        }
    }
    let elapsed = start.elapsed();
    if all.acquired != w.distinct || all.nanos.is_empty() {
        return Row::failed(
            name,
            format!("{} keys acquired, {} expected", all.acquired, w.distinct),
        );
    }
    Row::measured(name, elapsed, all)
}

/// The rows, each printed as soon as it is measured. `wanted` says whether
/// a row's name was asked for.
async fn rows(w: &Workload, wanted: impl Fn(&str) -> bool) {
    let emit = |row: Row| println!("{}", row.json());
    let env = |var: &str, default: &str| std::env::var(var).unwrap_or_else(|_| default.into());

    let name = "idem memory store";
    if wanted(name) {
        emit(one_by_one(name, MemoryStore::new(), w).await);
    }
    for (name, claims) in [
        ("idem memory store, batched 256", Claims::Completed),
        ("idem memory store, claims only, batched 256", Claims::Only),
    ] {
        if wanted(name) {
            emit(batched(name, MemoryStore::new(), w, claims).await);
        }
    }

    let name = "idem file store (group commit)";
    if wanted(name) {
        emit(match tempfile::tempdir() {
            Ok(dir) => match FileStore::open(dir.path()) {
                Ok(store) => one_by_one(name, store, w).await,
                Err(e) => Row::failed(name, e),
            },
            Err(e) => Row::failed(name, e),
        });
    }

    // A memory hot tier over the file store, a ready key filter, and a hot
    // retention shorter than the records': every completion also goes to
    // the cold tier by write-behind, whose imports share the two cores with
    // the row (the queue is flushed after the row's clock stops).
    // The last row keeps the default hot retention (3 h), which covers the
    // records: the usual case, where the cold tier is never written and a
    // claim costs the hot tier and one filter lookup.
    // The claims-only row is the first half of that row's cycle alone:
    // `begin_many` against the hot tier and the filter.
    let covered = idem_tiered::DEFAULT_HOT_RETENTION;
    let minute = Duration::from_secs(60);
    for (name, many, hot) in [
        ("idem tiered store (memory over file)", None, minute),
        (
            "idem tiered store (memory over file), batched 256",
            Some(Claims::Completed),
            minute,
        ),
        (
            "idem tiered store (memory over file), hot tier keeps the records, batched 256",
            Some(Claims::Completed),
            covered,
        ),
        (
            "idem tiered store (memory over file), hot tier keeps the records, claims only, batched 256",
            Some(Claims::Only),
            covered,
        ),
    ] {
        if !wanted(name) {
            continue;
        }
        emit(match tiered(&w.run, hot).await {
            Ok((store, _dir)) => {
                let row = match many {
                    Some(claims) => batched(name, store.clone(), w, claims).await,
                    None => one_by_one(name, store.clone(), w).await,
                };
                store.flush().await;
                row
            }
            Err(e) => Row::failed(name, e),
        });
    }

    let redis = env("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let mut servers = vec![(redis, "")];
    if let Ok(url) = std::env::var("IDEM_SBS_DURABLE_REDIS_URL") {
        servers.push((url, ", appendfsync always"));
    }
    for (url, durability) in &servers {
        let one = format!("idem Redis store{durability}");
        let many = format!("idem Redis store{durability}, batched 256");
        if !wanted(&one) && !wanted(&many) {
            continue;
        }
        match RedisStore::connect(url).await {
            Ok(store) => {
                if wanted(&one) {
                    emit(one_by_one(&one, store.clone(), w).await);
                }
                if wanted(&many) {
                    emit(batched(&many, store, w, Claims::Completed).await);
                }
            }
            Err(e) => {
                for name in [one, many].iter().filter(|n| wanted(n)) {
                    emit(Row::failed(name, format!("{url}: {e}")));
                }
            }
        }
    }

    // Two stores in front of one Redis and one PostgreSQL table, used in
    // turn: every completion moves to PostgreSQL behind the answer (hot
    // retention 1 min, records 10 min), and the key filter both share lives
    // in Redis.
    for (name, many) in [
        (
            "idem tiered store (Redis over PostgreSQL, two stores)",
            None,
        ),
        (
            "idem tiered store (Redis over PostgreSQL, two stores), batched 256",
            Some(Claims::Completed),
        ),
    ] {
        if !wanted(name) {
            continue;
        }
        let redis = env("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
        let postgres = env(
            "IDEM_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        let table = format!("idem_sbs_tiered_{}", w.run.replace('-', "_"));
        emit(match redis_over_postgres(&redis, &postgres, &table).await {
            Ok(stores) => {
                let store = InTurn {
                    stores: Arc::new(stores),
                    turn: Arc::default(),
                };
                let row = match many {
                    Some(claims) => batched(name, store.clone(), w, claims).await,
                    None => one_by_one(name, store.clone(), w).await,
                };
                for s in store.stores.iter() {
                    s.flush().await;
                }
                row
            }
            Err(e) => Row::failed(name, e),
        });
    }

    let name = "idem PostgreSQL store";
    if wanted(name) {
        let url = env(
            "IDEM_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        let table = format!("idem_sbs_{}", w.run.replace('-', "_"));
        emit(
            match SqlStore::builder(&url).table(&table).connect().await {
                Ok(store) => {
                    // Through `SharedStore`, as a store chosen at run time is used.
                    let store: SharedStore = Arc::new(store);
                    one_by_one(name, store, w).await
                }
                Err(e) => Row::failed(name, e),
            },
        );
    }
}

/// Two stores used in turn, call by call: a `begin` may go to one and its
/// `complete` to the other, as when two processes share the work.
#[derive(Clone)]
struct InTurn<S> {
    stores: Arc<[S; 2]>,
    turn: Arc<AtomicUsize>,
}

impl<S: Store> idem_core::layer::StoreWrapper for InTurn<S> {
    type Inner = S;
    fn inner(&self) -> &S {
        &self.stores[self.turn.fetch_add(1, Ordering::Relaxed) % 2]
    }
}

/// Two stores on one Redis and one PostgreSQL table, each with its own
/// connections, write-behind queue and handover sweep, as two processes
/// hold them, sharing the key filter kept in Redis; answers once the
/// filter is ready.
async fn redis_over_postgres(
    redis: &str,
    postgres: &str,
    table: &str,
) -> Result<[TieredStore<RedisStore, SqlStore>; 2], String> {
    let seed = FilterSeed::new(0x5eed_0002);
    let mut stores = Vec::new();
    for _ in 0..2 {
        let hot = RedisStore::connect(redis)
            .await
            .map_err(|e| e.to_string())?;
        let cold = SqlStore::builder(postgres)
            .table(table)
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let filter = FilterConfig::new(seed, 10_000_000, Duration::from_secs(24 * 3600));
        let store = TieredStore::builder(hot, cold)
            .hot_retention(Duration::from_secs(60))
            .handover_list(table)
            .shared_filter(filter)
            .open()
            .await
            .map_err(|e| e.to_string())?;
        stores.push(store);
    }
    let started = Instant::now();
    loop {
        let store = &stores[0];
        let shared = store.shared_filter().ok_or("no shared filter")?;
        if store
            .hot()
            .filter_ready(shared)
            .await
            .map_err(|e| e.to_string())?
        {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err("the shared filter was not ready after 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let [a, b]: [_; 2] = stores.try_into().map_err(|_| "two stores")?;
    Ok([a, b])
}

/// A tiered store for the rows above, and the directory its cold tier lives
/// in (removed when dropped).
async fn tiered(
    run: &str,
    hot_retention: Duration,
) -> Result<(TieredStore<MemoryStore, FileStore>, tempfile::TempDir), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let cold = FileStore::open(dir.path()).map_err(|e| e.to_string())?;
    let seed = FilterSeed::new(u128::from(run.len() as u64) ^ 0x5eed);
    let config = FilterConfig::new(seed, 10_000_000, Duration::from_secs(24 * 3600));
    let filter = KeyFilter::new(&config, SystemClock.now()).map_err(|e| e.to_string())?;
    filter
        .rebuild(
            std::iter::empty::<Result<idem_core::Key, std::io::Error>>(),
            Some(0),
            |_, _| {},
        )
        .map_err(|e| e.to_string())?;
    let store = TieredStore::builder(MemoryStore::new(), cold)
        .hot_retention(hot_retention)
        .filter(Arc::new(filter))
        .open()
        .await
        .map_err(|e| e.to_string())?;
    Ok((store, dir))
}

fn main() {
    let keys: usize = match std::env::var("IDEM_SBS_KEYS") {
        Ok(v) => v.parse().expect("IDEM_SBS_KEYS: a number of keys"),
        Err(_) => 200_000,
    };
    let run = std::env::var("IDEM_SBS_RUN").unwrap_or_else(|_| {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        format!("{}", secs.as_secs())
    });
    // `cargo bench` passes `--bench`; other words pick rows.
    let words: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| words.is_empty() || words.iter().any(|w| name.contains(w.as_str()));
    let w = Workload::new(run, keys);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(rows(&w, wanted));
}
