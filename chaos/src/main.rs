//! `idem-chaos`: idem's promise checked under failure. Each run starts a
//! real broker's queue, several `idem consume` processes on one store, a
//! producer and a recording sink (the consumers' HTTP handler), injects one
//! kind of fault while the messages flow, and checks the history: nothing
//! lost, every double effect explained by one fault inside the claim it
//! cut, no stale write taken by the fenced sink, tokens increasing per
//! key, never two live holders. See RELIABILITY.md.
//!
//! The parts, as in Jepsen: [`record`] holds what a run saw (the history
//! and the fault ledger), [`judge`] reads only that, [`scenario`] (with
//! [`gateway`] and [`serve`]) drives a run, [`report`] prints.
//!
//! ```text
//! idem-chaos run --broker amqp --store postgres --fault kill-after-effect
//! idem-chaos suite [--long] [--write RELIABILITY.md]
//! ```

mod broker;
mod fault;
mod fleet;
mod gateway;
mod inbox;
mod judge;
mod kafka;
mod kept;
mod record;
mod report;
mod rocketmq;
mod scenario;
mod serve;
mod sink;
mod spec;
mod store;
mod toxic;
mod versions;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use broker::Broker;
use fault::Fault;
use judge::Outcome;
use kept::Kept;
use spec::{RunnerKind, Spec};
use store::StoreKind;

#[derive(Parser)]
#[command(
    name = "idem-chaos",
    about = "Runs idem consume under faults against real brokers and stores, and checks the history"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The idem binary the consumers run [default: `idem` beside this
    /// program].
    #[arg(long, global = true, env = "IDEM_CHAOS_IDEM", value_name = "PATH")]
    idem: Option<PathBuf>,
    /// Print each row as a JSON line on stdout.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// One broker, one store, one fault.
    Run {
        /// The broker; `proxy` is HTTP clients through `idem proxy`
        /// instead, with the faults client-cuts and proxy-kill.
        #[arg(long, value_enum)]
        broker: Broker,
        /// The consumer processes.
        #[arg(long, value_enum, default_value_t = RunnerKind::Sidecar)]
        runner: RunnerKind,
        /// The store: redis is a server of the run's own without
        /// persistence, redis-aof one with appendfsync always.
        #[arg(long, value_enum)]
        store: StoreKind,
        /// The fault (RELIABILITY.md says what each does).
        #[arg(long, value_enum, default_value_t = Fault::None)]
        fault: Fault,
        /// Distinct messages published.
        #[arg(long, default_value_t = 500)]
        messages: usize,
        /// Consumer processes (1 on the memory, file and tiered stores).
        #[arg(long, default_value_t = 3)]
        consumers: usize,
        /// The lease each claim takes, in ms.
        #[arg(long, default_value_t = 2000)]
        lease_ms: u64,
        /// How many times the fault is injected.
        #[arg(long, default_value_t = 3)]
        times: usize,
        /// Give up waiting for the messages after this many seconds.
        #[arg(long, default_value_t = 120)]
        deadline_s: u64,
        /// With `--fault nemesis`: what its faults, their order and
        /// moments are drawn from; the same seed draws the same schedule.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// One consumer process on the library's runner (started by a run).
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
    /// A matrix of runs: the short one (a few minutes, what CI runs) or,
    /// with --long, every broker, store and fault that fit together.
    Suite {
        #[arg(long, conflicts_with = "size")]
        long: bool,
        /// Instead: a few heavy rows (a kill, a stop, ended sessions, a
        /// slow store, a broker restart, the service, poison, a crashed
        /// database) with this
        /// many messages each, and a deadline to match.
        #[arg(long, value_name = "MESSAGES", value_parser = clap::value_parser!(u64).range(100..))]
        size: Option<u64>,
        /// Write the table into this file, between its chaos markers.
        #[arg(long, value_name = "FILE")]
        write: Option<PathBuf>,
        /// Print the rows the suite would run (their commands) and those
        /// that do not fit, and run nothing.
        #[arg(long, conflicts_with = "write")]
        list: bool,
        /// Keep each finished row in this file (a JSON line with the
        /// commit it ran at) and run only the rows it does not hold yet:
        /// a suite of hours can stop and go on later. A failed row stays
        /// failed; delete its line to run it again. `scripts/chaos --long`
        /// resumes only while idem's code is unchanged.
        #[arg(long, value_name = "FILE")]
        resume: Option<PathBuf>,
        /// Start no row after this many minutes; with rows left, write no
        /// table and exit with status 3 (go on later with `--resume`).
        #[arg(long, value_name = "MINUTES", requires = "resume")]
        stop_after: Option<u64>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Worker(args) = cli.command {
        // Warnings (a failed handler, a lost lease, a store error) go to
        // the consumer's log, which a failed run keeps.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a Tokio runtime");
        return match rt.block_on(worker::run(args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("idem-chaos worker: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let idem = match cli.idem.clone().map_or_else(beside_this_program, Ok) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("idem-chaos: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let specs = match specs(&cli.command) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("idem-chaos: {e}");
            return ExitCode::from(2);
        }
    };
    if let Command::Suite { list: true, .. } = cli.command {
        let mut unfit = 0;
        for spec in &specs {
            match spec.unfit() {
                Some(why) => {
                    unfit += 1;
                    println!("# does not fit: {}: {why}", spec.command());
                }
                None => println!("{}", spec.command()),
            }
        }
        eprintln!("{} rows, {unfit} of which do not fit", specs.len());
        return ExitCode::SUCCESS;
    }
    let mut resume = match &cli.command {
        Command::Suite {
            resume: Some(path), ..
        } => match Kept::open(path, rt.block_on(versions::commit())) {
            Ok(kept) => Some(kept),
            Err(e) => {
                eprintln!("idem-chaos: {e}");
                return ExitCode::from(2);
            }
        },
        _ => None,
    };
    let stop_after = match cli.command {
        Command::Suite { stop_after, .. } => stop_after,
        _ => None,
    };
    let stop_at = stop_after.map(|m| std::time::Instant::now() + Duration::from_secs(m * 60));
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    let mut left = 0;
    for spec in &specs {
        if let Some(row) = resume.as_ref().and_then(|k| k.row(spec)) {
            rows.push(row);
            continue;
        }
        if stop_at.is_some_and(|at| std::time::Instant::now() >= at) {
            left += usize::from(spec.unfit().is_none());
            continue;
        }
        if let Some(why) = spec.unfit() {
            skipped.push(format!(
                "{} / {} / {}: {why}",
                spec.broker.title(),
                spec.store.title(),
                spec.fault
            ));
            continue;
        }
        eprintln!("run: {}", spec.command());
        // A step that hangs (a broker that never answers, a process that
        // never exits) fails its run rather than the whole suite.
        let bound = spec.deadline + Duration::from_secs(90);
        let result = rt.block_on(async {
            tokio::time::timeout(bound, scenario::run(spec, &idem))
                .await
                .unwrap_or_else(|_| {
                    Err(format!(
                        "did not finish within {bound:?}; it hung at: {}",
                        spec::stage()
                    ))
                })
        });
        let mut keep = |o: &Outcome| match &mut resume {
            Some(kept) => kept.keep(o),
            None => Ok(()),
        };
        match result {
            Ok(o) => {
                eprintln!("  {}", summary(&o));
                if cli.json {
                    println!(
                        "{}",
                        serde_json::to_string(&o).expect("an outcome serialises")
                    );
                }
                if let Err(e) = keep(&o) {
                    eprintln!("idem-chaos: {e}");
                    return ExitCode::FAILURE;
                }
                rows.push(o);
            }
            Err(e) if !idem_testkit::services::required() && spec::setting_up() => {
                // A service absent on a developer's machine: said, not run.
                eprintln!("  skipped: {e} (start the service, or set its IDEM_TEST_*_URL)");
                skipped.push(format!(
                    "{} / {} / {}: could not start: {e}",
                    spec.broker.title(),
                    spec.store.title(),
                    spec.fault
                ));
            }
            Err(e) => {
                // A run that could not finish is a failed row with its
                // reason, never a row that vanishes.
                eprintln!("  could not run: {e}");
                let o = Outcome::failed(spec.names(), e);
                if cli.json {
                    println!(
                        "{}",
                        serde_json::to_string(&o).expect("an outcome serialises")
                    );
                }
                if let Err(e) = keep(&o) {
                    eprintln!("idem-chaos: {e}");
                    return ExitCode::FAILURE;
                }
                rows.push(o);
            }
        }
    }
    if left > 0 {
        let failed = rows.iter().filter(|o| !o.passed()).count();
        eprintln!(
            "stopped after {} min: {} rows ran or were kept ({failed} failed), {left} left; \
             run the same command again to go on",
            stop_after.unwrap_or(0),
            rows.len()
        );
        return ExitCode::from(3);
    }
    if let Command::Suite {
        write: Some(path),
        long,
        size,
        ..
    } = &cli.command
    {
        let (command, section) = match (long, size) {
            (true, _) => ("idem-chaos suite --long".to_owned(), "chaos-long"),
            (_, Some(n)) => (format!("idem-chaos suite --size {n}"), "chaos-size"),
            _ => ("idem-chaos suite".to_owned(), "chaos"),
        };
        let machine = format!(
            "{} cores, load average {}",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split(' ')
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        );
        let mut stamp = rt.block_on(versions::stamp());
        if let Some(kept) = &resume {
            stamp.insert(1, ("rows ran at", kept.commits().join(", ")));
        }
        let table = report::markdown(&rows, &skipped, &command, &machine, &stamp, section);
        let uncovered = report::uncovered(&every_combination(), "chaos-uncovered");
        if let Err(e) = report::write(path, &table, section)
            .and_then(|()| report::write(path, &uncovered, "chaos-uncovered"))
        {
            eprintln!("idem-chaos: {e}");
            return ExitCode::FAILURE;
        }
    }
    let failed = rows.iter().filter(|o| !o.passed()).count();
    // The failed rows again at the end, so the last lines of a long log
    // name them.
    for o in rows.iter().filter(|o| !o.passed()) {
        eprintln!("failed: {}\n  {}", o.names.command, summary(o));
    }
    eprintln!(
        "{} runs: {} passed, {failed} failed, {} do not fit",
        rows.len(),
        rows.len() - failed,
        skipped.len()
    );
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `idem` in this program's directory (`target/debug/idem` beside
/// `target/debug/idem-chaos`).
fn beside_this_program() -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let idem = me.with_file_name("idem");
    if idem.is_file() {
        Ok(idem)
    } else {
        Err(format!(
            "no idem binary at {}: build it (cargo build -p idem-server) or pass --idem PATH",
            idem.display()
        ))
    }
}

fn specs(command: &Command) -> Result<Vec<Spec>, String> {
    match command {
        Command::Run {
            broker,
            runner,
            store,
            fault,
            messages,
            consumers,
            lease_ms,
            times,
            deadline_s,
            seed,
        } => Ok(vec![Spec {
            broker: *broker,
            runner: *runner,
            store: *store,
            fault: *fault,
            messages: *messages,
            consumers: *consumers,
            lease: Duration::from_millis(*lease_ms),
            times: *times,
            deadline: Duration::from_secs(*deadline_s),
            seed: *seed,
        }]),
        Command::Suite { size: Some(n), .. } => Ok(at_size(*n as usize)),
        Command::Suite { long: false, .. } => Ok(short()),
        Command::Suite { long: true, .. } => Ok(long()),
        Command::Worker(_) => Ok(Vec::new()),
    }
}

fn spec(broker: Broker, store: StoreKind, fault: Fault, messages: usize) -> Spec {
    Spec {
        broker,
        runner: RunnerKind::Sidecar,
        store,
        fault,
        messages,
        consumers: 3,
        lease: Duration::from_secs(2),
        times: 3,
        deadline: Duration::from_secs(120),
        seed: 1,
    }
}

/// CI's matrix: every fault on Redis Streams with the Redis store (a full
/// disk on the stores that keep files), and a few on the other brokers
/// and stores; three injections a run, two of a fault that lasts two
/// leases.
fn short() -> Vec<Spec> {
    use Broker::*;
    use Fault::*;
    use StoreKind::*;
    let n = 300;
    let mut specs: Vec<Spec> = Fault::value_variants()
        .iter()
        .copied()
        .filter(|f| !matches!(f, ClientCuts | ProxyKill | ServeKill | DiskFull))
        .map(|f| spec(RedisStreams, Redis, f, n))
        .collect();
    let seeded = |broker, store, seed| Spec {
        seed,
        ..spec(broker, store, Nemesis, n)
    };
    specs.extend([
        spec(RedisStreams, File, DiskFull, n),
        spec(Nats, RedisAof, DiskFull, n),
        spec(Nats, RedisAof, KillAfterAnswer, n),
        spec(Nats, RedisAof, StoreRestart, n),
        spec(Nats, MariaDb, KillInRetry, n),
        spec(Kafka, Redis, Duplicates, n),
        spec(RocketMq, Redis, KillAfterEffect, n),
        spec(RedisStreams, File, KillAfterEffect, n),
        spec(Amqp, Tiered, KillAfterEffect, n),
        spec(Amqp, RedisOverPostgres, KillAfterAnswer, n),
        spec(Nats, RedisOverPostgres, StoreCut, n),
        spec(RedisStreams, RedisOverPostgres, StoreRestart, n),
        spec(Amqp, Memory, Duplicates, n),
        spec(RedisStreams, Redis, KillAfterEffect, n).by(RunnerKind::Mixed),
        spec(Nats, Redis, Zombie, n).by(RunnerKind::Library),
        spec(Amqp, RedisAof, StoreSlow, n).by(RunnerKind::Mixed),
        spec(Amqp, Postgres, DbCut, n).by(RunnerKind::Inbox),
        spec(RedisStreams, Postgres, KillAfterEffect, n).by(RunnerKind::Inbox),
        spec(Nats, MariaDb, DbCut, n).by(RunnerKind::Inbox),
        spec(Amqp, Postgres, Zombie, n).by(RunnerKind::Inbox),
        spec(Amqp, Postgres, StoreRestart, n),
        spec(Amqp, MariaDb, StoreRestart, n),
        spec(Amqp, Postgres, DbCut, n),
        spec(Amqp, Redis, BrokerRestart, n),
        spec(Nats, RedisAof, BrokerRestart, n),
        spec(RedisStreams, RedisCluster, StoreRestart, n),
        spec(Amqp, RedisCluster, KillAfterEffect, n),
        spec(Kafka, Redis, BrokerRestart, n),
        spec(Kafka, Redis, KillAfterEffect, n),
        spec(Kafka, Postgres, KillInRetry, n),
        spec(RocketMq, Redis, BrokerRestart, n),
        spec(Amqp, Postgres, Poison, n),
        spec(Nats, Redis, Poison, n),
        spec(Kafka, Redis, Poison, n),
        spec(RocketMq, Redis, Poison, n),
        spec(Amqp, Redis, Poison, n).by(RunnerKind::Library),
        spec(Proxy, Memory, ClientCuts, n),
        spec(Proxy, File, ProxyKill, n),
        spec(Proxy, Postgres, ProxyKill, n),
        spec(Serve, Memory, ClientCuts, n),
        spec(Serve, File, ServeKill, n),
        spec(Serve, Redis, ServeKill, n),
        spec(Amqp, Postgres, SlowHandler, n),
        spec(Nats, RedisOverPostgres, KillAfterEffect, n),
        spec(Nats, Redis, StorePartition, n),
        spec(Amqp, Postgres, BrokerPartition, n),
        seeded(RedisStreams, Postgres, 2),
        seeded(Nats, RedisAof, 3),
    ]);
    // Twice is enough for a fault that holds the run up for two leases
    // each time (a zombie's two variants alternate, so both still run),
    // and it keeps the suite within CI's twenty minutes.
    for s in &mut specs {
        if s.fault.lasts_two_leases() {
            s.times = 2;
        }
    }
    specs
}

/// The heavy rows, each with `messages` messages and ten minutes.
fn at_size(messages: usize) -> Vec<Spec> {
    use Broker::*;
    use Fault::*;
    use StoreKind::*;
    let at = |broker, store, fault| Spec {
        deadline: Duration::from_secs(600),
        ..spec(broker, store, fault, messages)
    };
    vec![
        at(Amqp, Postgres, KillAfterEffect),
        at(RedisStreams, Redis, Zombie).by(RunnerKind::Mixed),
        at(Nats, MariaDb, DbCut),
        at(RedisStreams, Redis, StoreSlow),
        at(Amqp, RedisAof, BrokerRestart),
        at(Serve, File, ServeKill),
        at(Amqp, Redis, Poison),
        at(Amqp, Postgres, StoreRestart),
    ]
}

/// Every broker, runner, store and fault, with three nemesis seeds each,
/// at 2 000 messages and ten minutes a run (one consumer, its handler slow
/// on a tenth of the calls, takes over three minutes): what "Not covered
/// yet" is drawn from.
fn every_combination() -> Vec<Spec> {
    let mut specs = Vec::new();
    for &broker in Broker::value_variants() {
        for &runner in RunnerKind::value_variants() {
            for &store in StoreKind::value_variants() {
                for &fault in Fault::value_variants() {
                    let seeds = if fault == Fault::Nemesis {
                        1..=3
                    } else {
                        1..=1
                    };
                    for seed in seeds {
                        specs.push(Spec {
                            runner,
                            seed,
                            deadline: Duration::from_secs(600),
                            ..spec(broker, store, fault, 2000)
                        });
                    }
                }
            }
        }
    }
    specs
}

/// The long matrix: every broker × store × fault that fits under `idem
/// consume` and the HTTP runs, three nemesis seeds each, and each other
/// runner with every fault on one broker and store (the inbox on both SQL
/// stores). The other runners read through the same broker sources and
/// stores as `idem consume`, whose rows cover every pair; crossing each
/// with every pair again would make a suite of hours one of a day.
fn long() -> Vec<Spec> {
    use Broker::*;
    use StoreKind::*;
    every_combination()
        .into_iter()
        .filter(|s| match s.runner {
            RunnerKind::Sidecar => true,
            RunnerKind::Library => (s.broker, s.store) == (Nats, Redis),
            RunnerKind::Mixed => (s.broker, s.store) == (RedisStreams, Redis),
            RunnerKind::Inbox => s.broker == Amqp && matches!(s.store, Postgres | MariaDb),
        })
        .collect()
}

fn summary(o: &Outcome) -> String {
    let figures: Vec<String> = report::figures(o)
        .into_iter()
        .map(|(label, v)| format!("{label} {v}"))
        .collect();
    let mut s = format!(
        "{}: {} calls, {}",
        if o.passed() { "pass" } else { "FAIL" },
        o.calls,
        figures.join(", ")
    );
    for p in &o.problems {
        s.push_str("\n    ");
        s.push_str(p);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the long matrix does not run is listed by reason, each gap
    /// once, short enough to read.
    #[test]
    fn the_uncovered_list_names_each_gap_once() {
        let text = report::uncovered(&every_combination(), "chaos-uncovered");
        assert!(text.len() < 20_000, "{} bytes:\n{text}", text.len());
        assert!(
            text.contains("`zombie` on kafka / "),
            "a stopped Kafka consumer is a gap:\n{text}"
        );
        assert!(!text.contains("proxy / memory (library"), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        let mut unique = lines.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), lines.len(), "{text}");
    }
}
