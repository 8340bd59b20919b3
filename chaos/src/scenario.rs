//! One run: a broker, a store, a fault; the consumers, the producer and the
//! sink started, the faults injected, the history judged.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::broker::{Broker, Channel};
use crate::fault::{Fault, Plan, Poison};
use crate::fleet::{Fleet, Procs};
use crate::history::{self, Outcome, Run};
use crate::inbox::Tables;
use crate::sink::{Event, Sink};
use crate::store::{Store, StoreKind};
use crate::toxic::Toxic;

/// Which consumer processes a run starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RunnerKind {
    /// `idem consume` with the sink as its HTTP handler.
    Sidecar,
    /// `idem-chaos worker`: the library's `Runner` with a Rust handler
    /// (Redis Streams, RabbitMQ and NATS; the memory and Redis stores).
    Library,
    /// The first consumer the library's, the others `idem consume`, on one
    /// store and one queue.
    Mixed,
    /// `idem-chaos worker` with the transactional sink: each effect a row
    /// written by the transaction that records the key in idem-sql's
    /// inbox, on the SQL store's database (PostgreSQL, MariaDB), with the
    /// sink called inside it.
    Inbox,
}

impl RunnerKind {
    pub fn title(self) -> &'static str {
        match self {
            RunnerKind::Sidecar => "idem consume",
            RunnerKind::Library => "library runner",
            RunnerKind::Mixed => "library runner + idem consume",
            RunnerKind::Inbox => "library runner, inbox",
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Spec {
    pub broker: Broker,
    pub runner: RunnerKind,
    pub store: StoreKind,
    pub fault: Fault,
    pub messages: usize,
    /// Consumer processes (one for a store that belongs to one process).
    pub consumers: usize,
    pub lease: Duration,
    /// How many times the fault is injected.
    pub times: usize,
    /// The run gives up waiting for its messages after this.
    pub deadline: Duration,
}

impl Spec {
    /// The command that runs this spec again.
    pub fn command(&self) -> String {
        let runner = match self.runner {
            RunnerKind::Sidecar => String::new(),
            other => format!(
                " --runner {}",
                other.to_possible_value().expect("named").get_name()
            ),
        };
        format!(
            "idem-chaos run --broker {}{runner} --store {} --fault {} --messages {} --consumers {} --lease-ms {} --times {}",
            self.broker,
            self.store,
            self.fault,
            self.messages,
            self.consumers,
            self.lease.as_millis(),
            self.times
        )
    }

    /// This spec with `runner`'s consumers.
    pub fn by(self, runner: RunnerKind) -> Self {
        Self { runner, ..self }
    }

    /// Why this spec cannot run, if it cannot.
    pub fn unfit(&self) -> Option<&'static str> {
        let http = matches!(self.broker, Broker::Proxy | Broker::Serve);
        let http_fault = matches!(
            self.fault,
            Fault::ClientCuts | Fault::ProxyKill | Fault::ServeKill
        );
        if http != http_fault {
            return Some(
                "client-cuts, proxy-kill and serve-kill are the HTTP runs' faults \
                 (--broker proxy or serve), and only they",
            );
        }
        if (self.broker == Broker::Proxy && self.fault == Fault::ServeKill)
            || (self.broker == Broker::Serve && self.fault == Fault::ProxyKill)
        {
            return Some("proxy-kill is the gateway's, serve-kill the service's");
        }
        if self.store == StoreKind::Memory
            && matches!(self.fault, Fault::ProxyKill | Fault::ServeKill)
        {
            return Some("a killed server takes the memory store with it");
        }
        if http {
            return (self.runner != RunnerKind::Sidecar)
                .then_some("the HTTP runs have no consumers");
        }
        if self.runner != RunnerKind::Sidecar {
            if !matches!(
                self.broker,
                Broker::RedisStreams | Broker::Amqp | Broker::Nats
            ) {
                return Some("the library worker reads Redis Streams, RabbitMQ and NATS");
            }
            let sql = matches!(self.store, StoreKind::Postgres | StoreKind::MariaDb);
            if self.runner == RunnerKind::Inbox && !sql {
                return Some("the inbox lives in the SQL store's database: PostgreSQL or MariaDB");
            }
            if !sql
                && !matches!(
                    self.store,
                    StoreKind::Memory | StoreKind::Redis | StoreKind::RedisAof
                )
            {
                return Some("the library worker runs on the memory, Redis and SQL stores");
            }
        }
        if self.broker == Broker::Kafka && self.fault == Fault::Zombie {
            return Some(
                "tansu never gives a stopped member's partitions to another member: no one \
                 can take the key over",
            );
        }
        if matches!(self.fault, Fault::BrokerCut | Fault::BrokerSlow)
            && let Some(why) = self.broker.unproxied()
        {
            return Some(why);
        }
        if matches!(self.fault, Fault::BrokerRestart)
            && let Some(why) = self.broker.unrestartable()
        {
            return Some(why);
        }
        self.fault.unfit(self.store)
    }
}

/// The step the current run is at, for the report when one hangs.
static STAGE: std::sync::Mutex<&str> = std::sync::Mutex::new("starting");

/// Records the step the run is at.
pub fn at(stage: &'static str) {
    *STAGE.lock().unwrap_or_else(|e| e.into_inner()) = stage;
}

/// The step the current run is at.
pub fn stage() -> &'static str {
    *STAGE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Handler calls a message gets before it is dead-lettered.
pub const MAX_ATTEMPTS: u32 = 10;

/// How long the run waits with nothing happening before it calls the
/// messages settled.
const QUIET: Duration = Duration::from_millis(1500);

/// Runs `spec` with the `idem` binary at `idem`. Consumer logs go to a
/// directory that is kept (and named in the outcome's problems) when the
/// run fails.
pub async fn run(spec: &Spec, idem: &Path) -> Result<Outcome, String> {
    if let Some(why) = spec.unfit() {
        return Err(format!("{} cannot run: {why}", spec.command()));
    }
    if spec.broker == Broker::Proxy {
        return crate::gateway::run(spec, idem).await;
    }
    if spec.broker == Broker::Serve {
        return crate::serve::run(spec, idem).await;
    }
    let consumers = if spec.store.shared() {
        spec.consumers.max(1)
    } else {
        1
    };
    let name = unique(spec);
    let dir = tempfile::Builder::new()
        .prefix("idem-chaos-")
        .tempdir()
        .map_err(|e| format!("a temporary directory: {e}"))?;
    at("starting the store");
    let mut store = Store::start(spec.store, &name, dir.path()).await?;

    let inbox = if spec.runner == RunnerKind::Inbox {
        at("creating the inbox tables");
        let tables = Tables::open(store.url(), &inbox_table(&name), None).await?;
        tables.create().await?;
        Some(tables)
    } else {
        None
    };

    let (events_tx, mut events) = mpsc::unbounded_channel();
    let procs = Procs::default();
    let plan = Plan::new(spec.fault, spec.messages, spec.times);
    at("starting the sink");
    let sink = Sink::start(plan, spec.lease, procs.clone(), events_tx).await?;
    at("opening the broker's queue");
    let mut channel = Channel::open(spec.broker, &name, spec.fault == Fault::BrokerRestart).await?;
    // The links a fault proxy stands in.
    let store_link = match spec.fault {
        Fault::StoreCut | Fault::StoreSlow => Some(store.through_proxy().await?),
        _ => None,
    };
    let broker_link = match spec.fault {
        Fault::BrokerCut | Fault::BrokerSlow => Some(channel.through_proxy(spec.broker).await?),
        _ => None,
    };
    let channel = Arc::new(channel);

    let inbox_name = inbox.as_ref().map(|_| inbox_table(&name));
    let commands = commands(
        spec,
        idem,
        consumers,
        &channel.from,
        &store.args,
        inbox_name.as_deref(),
    )?;
    let mut fleet = Fleet::new(commands, sink.url(), dir.path(), procs);
    at("starting the consumers");
    fleet.start().await?;
    at("waiting for the messages");

    let started = Instant::now();
    let keys: Vec<String> = (0..spec.messages).map(|i| format!("k-{i}")).collect();
    let duplicates = Arc::new(AtomicU64::new(0));
    let produced = Arc::new(AtomicBool::new(false));
    // A stopped consumer holds up its key for a lease or two, and one stop
    // waits for the last: spread the messages over enough time for them all.
    let spread = if spec.fault == Fault::Zombie {
        (spec.lease * 2 + Duration::from_secs(2)) * spec.times as u32
    } else {
        Duration::ZERO
    };
    let producer = tokio::spawn(produce(
        channel.clone(),
        keys.clone(),
        spec.fault == Fault::Duplicates,
        spread,
        duplicates.clone(),
        produced.clone(),
    ));

    let mut restarted = spec.fault != Fault::StoreRestart;
    // Timed faults go in as these many messages have had their effect.
    let thresholds: Vec<usize> = if spec.fault.timed() {
        (1..=spec.times)
            .map(|k| keys.len() * k / (spec.times + 1))
            .collect()
    } else {
        Vec::new()
    };
    // Poison messages, and the calls each gets before it is dead-lettered.
    let poison: Vec<(String, usize)> = if spec.fault == Fault::Poison {
        keys.iter()
            .filter_map(|k| {
                Poison::of(k).map(|p| match p {
                    Poison::Refused => (k.clone(), 1),
                    Poison::Failing => (k.clone(), MAX_ATTEMPTS as usize),
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut timed = 0;
    let mut after_copies: Option<Instant> = None;
    let mut failure = None;
    let mut timed_out = None;
    loop {
        if started.elapsed() > spec.deadline {
            timed_out = Some(sink.with(|l| (l.applied, l.in_flight)));
            break;
        }
        tokio::select! {
            Some(event) = events.recv() => match event {
                Event::Killed(slot) => {
                    // An orchestrator's restart, a moment later.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    at("restarting a killed consumer");
                    if let Err(e) = fleet.restart(slot).await {
                        failure = Some(e);
                        break;
                    }
                    at("waiting for the messages");
                }
                Event::Duplicate(key) => {
                    let channel = channel.clone();
                    let duplicates = duplicates.clone();
                    tokio::spawn(async move {
                        // Copy 3: the producer's own copies are 1 (early)
                        // and 2 (late), and NATS would drop a repeated id.
                        if channel.publish(&key, 3).await.is_ok() {
                            duplicates.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            },
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        let (applied, in_flight, last_call, last_fault, poison_done) = sink.with(|l| {
            (
                l.applied,
                l.in_flight,
                l.last_call,
                l.last_fault,
                poison
                    .iter()
                    .all(|(key, wanted)| l.keys.get(key).map_or(0, Vec::len) >= *wanted),
            )
        });
        if !restarted && applied * 10 >= keys.len() * 4 {
            restarted = true;
            at("restarting the store");
            let from = sink.now();
            match store.restart().await {
                Ok(true) => sink.wiped(),
                Ok(false) => sink.restarted(),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
            sink.disrupted(from, sink.now());
            // Copies of messages completed before the restart: a store
            // that kept its records answers them without a call; one that
            // lost them runs them again.
            let done: Vec<String> = sink.with(|l| {
                l.keys
                    .iter()
                    .filter(|(_, calls)| calls.iter().any(|c| c.effect))
                    .map(|(k, _)| k.clone())
                    .take(20)
                    .collect()
            });
            at("publishing copies of completed messages");
            for key in done {
                if channel.publish(&key, 4).await.is_ok() {
                    duplicates.fetch_add(1, Ordering::Relaxed);
                }
            }
            at("waiting for the messages");
        }
        if timed < thresholds.len() && applied >= thresholds[timed] {
            timed += 1;
            at("injecting a fault");
            let links = (store_link.as_ref(), broker_link.as_ref());
            if let Err(e) = inject(spec, &store, links, &sink).await {
                failure = Some(e);
                break;
            }
            at("waiting for the messages");
        }
        let now = sink.now();
        let quiet = last_call.is_none_or(|t| now.saturating_sub(t) > QUIET);
        // What a kill or a stop left behind comes back after its lease
        // (and the broker's redelivery): wait for it.
        let recovered =
            last_fault.is_none_or(|t| now.saturating_sub(t) > spec.lease * 2 + QUIET * 2);
        let settled = applied == keys.len() - poison.len()
            && poison_done
            && in_flight == 0
            && quiet
            && recovered
            && produced.load(Ordering::Relaxed)
            && restarted
            && timed == thresholds.len();
        if !settled {
            continue;
        }
        // A sink call whose transaction then failed is redelivered: wait
        // until every key has its committed effect.
        if let Some(tables) = &inbox
            && tables
                .effects()
                .await
                .map_or(true, |rows| rows.len() < keys.len() - poison.len())
        {
            continue;
        }
        match after_copies {
            // Duplicates of completed messages: they must be acked
            // without a call.
            None if spec.fault == Fault::Duplicates => {
                at("publishing copies of completed messages");
                for key in keys.iter().step_by(20) {
                    if channel.publish(key, 2).await.is_ok() {
                        duplicates.fetch_add(1, Ordering::Relaxed);
                    }
                }
                after_copies = Some(Instant::now());
                at("waiting for the copies");
            }
            Some(at) if at.elapsed() < QUIET * 2 => {}
            _ => break,
        }
    }
    let elapsed = started.elapsed();
    producer.abort();
    // Read before the consumers stop, so that a dead letter written after
    // its message's last call is waited for.
    let dead = if spec.fault == Fault::Poison && failure.is_none() && timed_out.is_none() {
        at("reading the dead letters");
        Some(
            channel
                .dead_letters(spec.broker, poison.len(), Duration::from_secs(30))
                .await,
        )
    } else {
        None
    };
    at("stopping the consumers");
    let forced_stops = fleet.stop(Duration::from_secs(15)).await;
    let ledger = sink.finish();
    let committed = match &inbox {
        Some(tables) => {
            at("reading the effects table");
            Some(tables.effects().await)
        }
        None => None,
    };
    if let Some(tables) = inbox {
        tables.drop_all().await;
    }
    at("stopping the store");
    store.stop().await;
    at("closing the broker's connection");
    if let Ok(channel) = Arc::try_unwrap(channel) {
        channel.close().await;
    }
    at("judging the history");
    if let Some(e) = failure {
        return Err(keep(dir, &e));
    }
    let run = Run {
        broker: spec.broker,
        store: spec.store,
        fault: spec.fault,
        runner: spec.runner,
        consumers,
        keys,
        duplicates: duplicates.load(Ordering::Relaxed),
        lease: spec.lease,
        forced_stops,
        elapsed,
        command: spec.command(),
    };
    let mut outcome = history::judge(&run, &ledger);
    match dead {
        Some(Ok(dead)) => {
            history::judge_dead_letters(&mut outcome, &run.keys, &ledger, &dead, MAX_ATTEMPTS);
        }
        Some(Err(e)) => outcome.problem(e),
        None => {}
    }
    match committed {
        Some(Ok(rows)) => history::judge_inbox(&mut outcome, &run, &ledger, &rows),
        Some(Err(e)) => outcome.problem(e),
        None => {}
    }
    if let Some((applied, in_flight)) = timed_out {
        outcome.problems.push(format!(
            "did not settle within {:?}: {applied} of {} messages had their effect, {in_flight} calls still open",
            spec.deadline,
            run.keys.len()
        ));
    }
    if !outcome.passed() {
        let logs = keep(dir, "the consumers' logs");
        outcome.problems.push(logs);
    }
    Ok(outcome)
}

/// Injects one timed fault and notes its window in the sink.
async fn inject(
    spec: &Spec,
    store: &Store,
    (store_link, broker_link): (Option<&Toxic>, Option<&Toxic>),
    sink: &Sink,
) -> Result<(), String> {
    let from = sink.now();
    match spec.fault {
        Fault::StoreCut => store_link.expect("the store is proxied").cut(),
        Fault::BrokerCut => broker_link.expect("the broker is proxied").cut(),
        Fault::StoreSlow => {
            let link = store_link.expect("the store is proxied");
            link.slow(spec.lease);
            tokio::time::sleep(spec.lease * 2).await;
            link.slow(Duration::ZERO);
        }
        Fault::BrokerSlow => {
            let link = broker_link.expect("the broker is proxied");
            link.slow(Duration::from_millis(200));
            link.limit(64 * 1024);
            tokio::time::sleep(spec.lease * 2).await;
            link.slow(Duration::ZERO);
            link.limit(0);
        }
        Fault::DbCut => {
            store.end_sessions().await?;
        }
        Fault::BrokerRestart => spec.broker.restart().await?,
        _ => {}
    }
    sink.disrupted(from, sink.now());
    sink.with(|l| l.injected += 1);
    Ok(())
}

/// Keeps `dir` and says where it is.
fn keep(dir: tempfile::TempDir, what: &str) -> String {
    let path: PathBuf = dir.keep();
    format!("{what} (consumer logs kept in {})", path.display())
}

/// A name for the run's queue, stream, topic, table and namespace.
fn unique(spec: &Spec) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() % 1_000_000_000);
    format!(
        "chaos_{}_{}_{}",
        spec.fault.to_string().replace('-', "_"),
        std::process::id(),
        nanos
    )
}

/// The inbox table of run `name` (`chaos_{fault}_{pid}_{nanos}`): short
/// enough for the inbox's 40 characters with its effects table's suffix.
fn inbox_table(name: &str) -> String {
    let mut tail = name.rsplit('_');
    let nanos = tail.next().unwrap_or_default();
    let pid = tail.next().unwrap_or_default();
    format!("inbox_{pid}_{nanos}")
}

/// The program and arguments of each consumer.
fn commands(
    spec: &Spec,
    idem: &Path,
    consumers: usize,
    from: &str,
    store: &[String],
    inbox: Option<&str>,
) -> Result<Vec<(PathBuf, Vec<String>)>, String> {
    let sidecar = (idem.to_owned(), consumer_args(spec, from, store));
    let me = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let url = store
        .iter()
        .skip_while(|a| *a != "--store")
        .nth(1)
        .cloned()
        .unwrap_or_default();
    let mut worker: Vec<String> = [
        "worker",
        "--broker",
        &spec.broker.to_string(),
        "--from",
        from,
        "--store",
        &url,
        "--lease-ms",
        &spec.lease.as_millis().to_string(),
    ]
    .map(String::from)
    .to_vec();
    if let Some(table) = inbox {
        worker.extend(["--inbox".to_owned(), table.to_owned()]);
    }
    let library = (me, worker);
    Ok((0..consumers)
        .map(|slot| match spec.runner {
            // Static membership: a killed consumer's restart joins as the
            // same member and takes its partitions back.
            RunnerKind::Sidecar if spec.broker == Broker::Kafka => {
                let from = format!("{from}&group.instance.id=consumer-{slot}");
                (idem.to_owned(), consumer_args(spec, &from, store))
            }
            RunnerKind::Sidecar => sidecar.clone(),
            RunnerKind::Library | RunnerKind::Inbox => library.clone(),
            RunnerKind::Mixed if slot == 0 => library.clone(),
            RunnerKind::Mixed => sidecar.clone(),
        })
        .collect())
}

/// `idem consume` arguments for one consumer.
fn consumer_args(spec: &Spec, from: &str, store: &[String]) -> Vec<String> {
    let max_attempts = MAX_ATTEMPTS.to_string();
    let mut args: Vec<String> = [
        "consume",
        "--from",
        from,
        "--key",
        "json:/key",
        "--concurrency",
        "4",
        "--max-attempts",
        &max_attempts,
        "--retry-initial-ms",
        "200",
        "--retry-max-ms",
        "1000",
        "--timeout-ms",
        "60000",
        "--shutdown-grace-ms",
        "5000",
        "--log",
        "warn",
    ]
    .map(String::from)
    .to_vec();
    args.push("--default-lease-ms".into());
    args.push(spec.lease.as_millis().to_string());
    args.extend(store.iter().cloned());
    args
}

/// Publishes every key once (and, with `duplicates`, a copy of the key half
/// way back after every tenth), over at least `spread`.
async fn produce(
    channel: Arc<Channel>,
    keys: Vec<String>,
    duplicates: bool,
    spread: Duration,
    copies: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
) {
    let start = tokio::time::Instant::now();
    let every = spread / keys.len().max(1) as u32;
    let sends = keys.iter().enumerate().flat_map(|(i, key)| {
        let copy = (duplicates && i % 10 == 9).then(|| keys[i / 2].clone());
        std::iter::once((key.clone(), 0)).chain(copy.map(|k| (k, 1)))
    });
    futures_util::stream::iter(sends.enumerate())
        .for_each_concurrent(16, |(n, (key, copy))| {
            let (channel, copies) = (&channel, &copies);
            async move {
                tokio::time::sleep_until(start + every * n as u32).await;
                // A publish the broker refused is tried again: the run
                // needs every message sent.
                for _ in 0..50 {
                    if channel.publish(&key, copy).await.is_ok() {
                        if copy > 0 {
                            copies.fetch_add(1, Ordering::Relaxed);
                        }
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        })
        .await;
    done.store(true, Ordering::Relaxed);
}
