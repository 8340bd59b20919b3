//! One run: a broker, a store, a fault; the consumers, the producer and the
//! sink started, the faults injected, the history judged.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::broker::{Broker, Channel};
use crate::fault::{Fault, Plan, Poison};
use crate::fleet::{Fleet, Procs};
use crate::inbox::Tables;
use crate::judge::{self, Facts, Outcome};
use crate::record::{Injected, Link, Lost};
use crate::sink::{Event, Sink};
use crate::spec::{CONCURRENCY, MAX_ATTEMPTS, RunnerKind, Spec, at};
use crate::store::{Restarted, Store, StoreKind};
use crate::toxic::Toxic;

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
    let schedule = spec.schedule();
    at("starting the store");
    let on_small_disk = schedule.has(Fault::DiskFull);
    let mut store = Store::start(spec.store, &name, dir.path(), on_small_disk).await?;

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
    if spec.fault == Fault::Nemesis {
        eprintln!("  nemesis {}: {schedule}", spec.seed);
    }
    let plan = Plan::new(spec.fault, &schedule);
    at("starting the sink");
    let sink = Sink::start(plan, spec.lease, procs.clone(), events_tx).await?;
    at("opening the broker's queue");
    let mut channel = Channel::open(spec.broker, &name, schedule.has(Fault::BrokerRestart)).await?;
    // The links a fault proxy stands in.
    let store_link = if [Fault::StoreCut, Fault::StoreSlow, Fault::StorePartition]
        .iter()
        .any(|&f| schedule.has(f))
    {
        Some(store.through_proxy().await?)
    } else {
        None
    };
    let broker_link = if [Fault::BrokerCut, Fault::BrokerSlow, Fault::BrokerPartition]
        .iter()
        .any(|&f| schedule.has(f))
    {
        Some(channel.through_proxy(spec.broker).await?)
    } else {
        None
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
    let spread = (spec.lease * 2 + Duration::from_secs(2)) * schedule.count(Fault::Zombie) as u32;
    let producer = tokio::spawn(produce(
        channel.clone(),
        keys.clone(),
        spec.fault == Fault::Duplicates,
        spread,
        duplicates.clone(),
        produced.clone(),
    ));

    // Timed faults go in as these many messages have had their effect.
    let thresholds: Vec<(usize, Fault)> = schedule
        .timed
        .iter()
        .map(|&(per_mille, fault)| (keys.len() * per_mille / 1000, fault))
        .collect();
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
                    .all(|(key, wanted)| l.record.keys.get(key).map_or(0, Vec::len) >= *wanted),
            )
        });
        if let Some(&(_, fault)) = thresholds.get(timed).filter(|(n, _)| applied >= *n) {
            timed += 1;
            at("injecting a fault");
            let links = (store_link.as_ref(), broker_link.as_ref());
            let injected = match fault {
                Fault::StoreRestart => {
                    restart(&mut store, spec.lease, &sink, &channel, &duplicates).await
                }
                Fault::DiskFull => fill_the_disk(spec.lease, &mut store, &sink, dir.path()).await,
                _ => inject(spec, fault, &store, links, &sink).await,
            };
            if let Err(e) = injected {
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
    let settled = failure.is_none() && timed_out.is_none();
    // The final copy of every key: a completed record answers each
    // without a call, so any call now shows a record the store forgot,
    // whatever the explanations say. The poison keys too: the runner
    // records a key it dead-lettered as such, so their copies are acked
    // as duplicates, neither run nor parked again (docs/contract.md §2).
    // Not with the inbox runner, which claims nothing: a copy runs its
    // handler, which refuses it again.
    let replayed = if settled {
        // First every delivery the broker still holds is settled (a
        // killed consumer's messages come back after the broker's
        // redelivery time), so that every key has its record completed:
        // a final copy then finds it.
        at("waiting for the broker to settle");
        let _ = leftovers(&channel, spec.broker).await;
        at("publishing the final copy of every key");
        let claims = spec.runner != RunnerKind::Inbox;
        let done: Vec<String> = keys
            .iter()
            .filter(|k| claims || !poison.iter().any(|(p, _)| p == *k))
            .cloned()
            .collect();
        Some(replay(&channel, spec.broker, &done, &sink).await)
    } else {
        None
    };
    // Read before the consumers stop, so that a dead letter written after
    // its message's last call is waited for.
    let dead = if settled {
        at("reading the dead letters");
        Some(
            channel
                .dead_letters(spec.broker, poison.len(), Duration::from_secs(30))
                .await,
        )
    } else {
        None
    };
    // Before the consumers stop (a closing consumer hands its deliveries
    // back): what the broker says is left.
    let leftovers = if settled {
        at("reading what the broker has left");
        Some(leftovers(&channel, spec.broker).await)
    } else {
        None
    };
    at("stopping the consumers");
    let forced_stops = fleet.stop(Duration::from_secs(15)).await;
    let record = sink.finish();
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
    let facts = Facts {
        names: spec.names(),
        consumers,
        concurrency: CONCURRENCY,
        keys,
        poison: poison.into_iter().collect(),
        copies: duplicates.load(Ordering::Relaxed),
        lease: spec.lease,
        committed: match &committed {
            Some(Ok(rows)) => Some(rows.clone()),
            _ => None,
        },
        forced_stops,
        elapsed,
    };
    let mut outcome = judge::judge(&facts, &record);
    match dead {
        Some(Ok(dead)) => judge::judge_dead_letters(&mut outcome, &facts, &record, &dead),
        Some(Err(e)) => outcome.problem(e),
        None => {}
    }
    if let Some(replayed) = replayed {
        judge::judge_replay(&mut outcome, &record, &replayed.calls, &[]);
        if let Some((key, error)) = replayed.unpublished.first() {
            outcome.problem(format!(
                "{} final copies could not be published, so they checked nothing (the first, \
                 of {key}: {error})",
                replayed.unpublished.len()
            ));
        }
    }
    match leftovers {
        Some(Ok(Some(problems))) => problems.into_iter().for_each(|p| outcome.problem(p)),
        Some(Err(e)) => outcome.problem(format!("reading what the broker has left: {e}")),
        _ => {}
    }
    match committed {
        Some(Ok(rows)) => judge::judge_inbox(&mut outcome, &facts, &record, &rows),
        Some(Err(e)) => outcome.problem(e),
        None => {}
    }
    if let Some((applied, in_flight)) = timed_out {
        outcome.problems.push(format!(
            "did not settle within {:?}: {applied} of {} messages had their effect, {in_flight} calls still open",
            spec.deadline,
            facts.keys.len()
        ));
    }
    if !outcome.passed() {
        let logs = keep(dir, "the consumers' logs");
        outcome.problems.push(logs);
    }
    Ok(outcome)
}

/// How long a delivery whose ack was lost (to a broker restart, a cut
/// link) may stay unacknowledged before the broker delivers it again: the
/// longest of the brokers' redelivery times (JetStream's default ack wait;
/// the runs set 5 s, so this leaves room), waited for only while the
/// broker still holds something.
const REDELIVERY: Duration = Duration::from_secs(30);

/// What the broker has left once every delivery whose ack was lost has
/// had its redelivery time to come back and be acked as a duplicate
/// ([`REDELIVERY`], and the quiet time after it).
async fn leftovers(channel: &Channel, broker: Broker) -> Result<Option<Vec<String>>, String> {
    let deadline = Instant::now() + REDELIVERY + QUIET * 2;
    loop {
        let left = channel.leftovers(broker).await;
        match &left {
            Ok(Some(problems)) if !problems.is_empty() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            _ => return left,
        }
    }
}

/// What the final copies showed.
struct Replayed {
    /// The handler calls per key the copies caused.
    calls: HashMap<String, u64>,
    /// The keys whose copy the broker never took, each with the last
    /// error: the check did not run for them.
    unpublished: Vec<(String, String)>,
}

/// Publishes one more copy of every key and waits until the consumers
/// have been quiet a while, or, on a broker that says at once what it
/// holds, until they have been quiet a little and it holds nothing.
async fn replay(channel: &Channel, broker: Broker, keys: &[String], sink: &Sink) -> Replayed {
    let before: HashMap<String, usize> = sink.with(|l| {
        l.record
            .keys
            .iter()
            .map(|(k, calls)| (k.clone(), calls.len()))
            .collect()
    });
    let unpublished: Vec<(String, String)> = futures_util::stream::iter(keys)
        .map(|key| async move {
            // Copy 5: the others are 0 to 4, and NATS drops a repeated id.
            let mut last = String::new();
            for _ in 0..50 {
                match channel.publish(key, 5).await {
                    Ok(()) => return None,
                    Err(e) => last = e,
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some((key.clone(), last))
        })
        .buffer_unordered(16)
        .filter_map(std::future::ready)
        .collect()
        .await;
    let published = Instant::now();
    // Where the broker answers at once what it still holds, the wait ends
    // as soon as it holds nothing: every copy has been acked, and a copy
    // acks only after any call it caused has ended.
    let prompt = matches!(broker, Broker::RedisStreams | Broker::Nats | Broker::Amqp);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (quiet_for, open) = sink.with(|l| {
            let now = sink.now();
            (
                l.last_call.map_or(Duration::MAX, |t| now.saturating_sub(t)),
                l.in_flight,
            )
        });
        let quiet = |d: Duration| open == 0 && quiet_for > d && published.elapsed() > d;
        if quiet(QUIET * 2) || published.elapsed() > Duration::from_secs(60) {
            break;
        }
        if prompt
            && quiet(QUIET)
            && matches!(channel.leftovers(broker).await, Ok(Some(left)) if left.is_empty())
        {
            break;
        }
    }
    let calls = sink.with(|l| {
        l.record
            .keys
            .iter()
            .filter_map(|(k, calls)| {
                let new = calls.len() - before.get(k).copied().unwrap_or(0);
                (new > 0).then(|| (k.clone(), new as u64))
            })
            .collect()
    });
    Replayed { calls, unpublished }
}

/// Crashes the store and starts it again, notes what it lost, and
/// publishes copies of 20 messages completed before: a store that kept
/// their records answers them without a call; one that lost them runs
/// them again.
async fn restart(
    store: &mut Store,
    lease: Duration,
    sink: &Sink,
    channel: &Channel,
    duplicates: &AtomicU64,
) -> Result<(), String> {
    at("restarting the store");
    let from = sink.now();
    let touched = || sink.with(|l| l.record.keys.keys().cloned().collect());
    let restarted = store.restart(&touched).await?;
    // A crash recovery or a failover longer than a lease is an outage as a
    // partition is: leases ran out under running handlers.
    let outage = sink.now() - from > lease;
    match restarted {
        Restarted::Kept => sink.disrupted(Link::StoreRestart, from),
        Restarted::LostAll => sink.lost(Lost::Everything),
        Restarted::Lost(keys) => sink.lost(Lost::Keys(keys)),
    }
    if outage {
        sink.note(Injected::SlowStore {
            from,
            to: sink.now(),
        });
    }
    let done: Vec<String> = sink.with(|l| {
        l.record
            .keys
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
    Ok(())
}

/// What the file store says when its disk is full (idem-file's
/// `failure.rs`), in a consumer's log.
const FILE_STORE_DISK_FULL: &str = "the disk holding the store at";

/// The consumers' logs in `dir`, each with what it holds so far.
fn consumer_logs(dir: &Path) -> HashMap<PathBuf, String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("consumer-"))
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            (e.path(), text)
        })
        .collect()
}

/// The longest a run keeps the store's disk full waiting for the store to
/// refuse a write (the handler's outcomes, heavy meanwhile, need more room
/// than the last page of each of the store's files still has, so the first
/// completion is refused).
const DISK_FULL_LONGEST: Duration = Duration::from_secs(30);

/// Fills the disk under the store until the store has refused a write (the
/// file store's consumer logs it; Redis exits) and for at least two leases,
/// frees it, and restarts the store: the consumer for the file store, which
/// stays stopped until it is opened again; `redis-server`. Fails if the
/// store refused nothing within [`DISK_FULL_LONGEST`]: a fill that nothing
/// noticed tests nothing.
async fn fill_the_disk(
    lease: Duration,
    store: &mut Store,
    sink: &Sink,
    logs: &Path,
) -> Result<(), String> {
    at("filling the store's disk");
    let before = consumer_logs(logs);
    let from = sink.now();
    let applied_before = sink.with(|l| l.applied);
    store.fill_disk()?;
    // Outcomes larger than the room left in the last page of the store's
    // files: the next completion needs room the disk no longer has.
    sink.heavy_answers(true);
    let filled = Instant::now();
    let mut prodded = false;
    let refused = loop {
        // Whatever the store frees meanwhile (a failed append-only rewrite
        // deletes its temporary file; a file store compaction, its old
        // tables) goes to the ballast at once: the disk stays full.
        store.fill_disk()?;
        let refused = match store.kind {
            StoreKind::File => consumer_logs(logs).into_iter().any(|(path, text)| {
                let seen = before.get(&path).map_or(0, String::len);
                text.get(seen..)
                    .is_some_and(|new| new.contains(FILE_STORE_DISK_FULL))
            }),
            _ => store.server_exited()?,
        };
        if (refused && filled.elapsed() >= lease * 2) || filled.elapsed() >= DISK_FULL_LONGEST {
            break refused;
        }
        if !refused && !prodded && filled.elapsed() >= lease {
            // The consumers may have nothing to write for a while (every
            // message in flight waiting out a redelivery): a write of the
            // run's own makes Redis meet its full disk all the same.
            store.write_a_page().await;
            prodded = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let report = store.disk_report().await;
    at("freeing the store's disk");
    sink.heavy_answers(false);
    store.free_disk().await?;
    if store.kind == StoreKind::File {
        // The stopped store takes no more operations until the process
        // opens it again.
        sink.kill_every_consumer();
    }
    sink.disk_freed(from);
    if !refused {
        let applied = sink.with(|l| l.applied) - applied_before;
        return Err(format!(
            "the disk under the {} store was full for {DISK_FULL_LONGEST:?}, but the store never \
             refused a write (no consumer logged that its disk is full, or redis-server did not \
             exit); {applied} messages had their effect meanwhile; at the end, {report}",
            store.kind
        ));
    }
    Ok(())
}

/// Injects one timed fault and notes its window in the sink.
async fn inject(
    spec: &Spec,
    fault: Fault,
    store: &Store,
    (store_link, broker_link): (Option<&Toxic>, Option<&Toxic>),
    sink: &Sink,
) -> Result<(), String> {
    let from = sink.now();
    match fault {
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
        Fault::StorePartition | Fault::BrokerPartition => {
            let link = if fault == Fault::StorePartition {
                store_link.expect("the store is proxied")
            } else {
                broker_link.expect("the broker is proxied")
            };
            link.partition();
            tokio::time::sleep(spec.lease * 2).await;
            link.heal();
        }
        Fault::StorePause => store.pause(spec.lease * 2).await?,
        Fault::DbCut => {
            store.end_sessions().await?;
        }
        Fault::BrokerRestart => spec.broker.restart().await?,
        _ => {}
    }
    match fault {
        Fault::StoreSlow | Fault::StorePartition | Fault::StorePause => sink.slowed(from),
        Fault::BrokerPartition => sink.disrupted(Link::BrokerPartition, from),
        Fault::StoreCut => sink.disrupted(Link::StoreCut, from),
        Fault::DbCut => sink.disrupted(Link::SessionsEnded, from),
        Fault::BrokerCut => sink.disrupted(Link::BrokerCut, from),
        Fault::BrokerSlow => sink.disrupted(Link::BrokerSlow, from),
        Fault::BrokerRestart => sink.disrupted(Link::BrokerRestart, from),
        other => return Err(format!("{other} is not a timed fault")),
    }
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

/// The consumers' log filter: warnings, or `IDEM_CHAOS_LOG` (for example
/// `warn,idem_amqp=debug,lapin=debug` to see what a failed run's broker
/// client did).
fn consumer_log_filter() -> String {
    std::env::var("IDEM_CHAOS_LOG").unwrap_or_else(|_| "warn".to_owned())
}

/// `idem consume` arguments for one consumer.
fn consumer_args(spec: &Spec, from: &str, store: &[String]) -> Vec<String> {
    let max_attempts = MAX_ATTEMPTS.to_string();
    let concurrency = CONCURRENCY.to_string();
    let mut args: Vec<String> = [
        "consume",
        "--from",
        from,
        "--key",
        "json:/key",
        "--concurrency",
        &concurrency,
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
    ]
    .map(String::from)
    .to_vec();
    args.extend(["--log".into(), consumer_log_filter()]);
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
