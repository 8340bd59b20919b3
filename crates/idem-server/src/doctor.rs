//! `idem doctor --store URL [--from BROKER_URL]`: whether idem can work
//! here, checked as `idem serve` and `idem consume` would use the store and
//! the broker: reachability, round-trip time, a claim taken and released,
//! the skew between this host's clock and the store's, the schema, and the
//! store's own settings that bear on idem's promises, each problem with a
//! one-line fix. Exits 1 when a check fails, 0 otherwise (warnings too).

use std::time::{Duration, Instant, SystemTime};

use clap::Args;
use idem_core::admin::{Finding, Purge, Severity};
use idem_core::{Begin, Clock as _, Fenced, Key, Lease, Store as _, SystemClock};
use serde_json::json;

use crate::config::{StoreArgs, read_file, resolve_store};
use crate::ops::shown;
use crate::run::Failure;
use crate::store::{self, OpenStore, StoreSpec};

/// Reads the round trip is the median of.
const READS: usize = 5;

/// A round trip slower than this is worth a warning.
const SLOW_ROUND_TRIP: Duration = Duration::from_millis(50);

/// A skew between the clocks larger than this is worth a warning.
const LARGE_SKEW: Duration = Duration::from_secs(1);

/// `idem doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Also check the broker `idem consume --from` would read (its
    /// dead-letter destination is reached; on Kafka and RocketMQ the topic
    /// recording replays is created when missing).
    #[arg(
        long,
        env = "IDEM_FROM",
        value_name = "BROKER_URL",
        hide_env_values = true
    )]
    pub from: Option<String>,
    /// Print JSON (one check a line) instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Runs every check and prints each as it completes.
pub async fn run(args: DoctorArgs) -> Result<(), Failure> {
    let file = read_file(args.store.config.as_deref())?;
    let settings = resolve_store(args.store, &file)?;
    crate::run::init_logging("error")?;
    let mut report = Report {
        json: args.json,
        failed: false,
    };
    if let Some(store) = open(&settings, &mut report).await {
        check_store(&store, &mut report).await;
        check_settings(&store, &mut report).await;
        store.close().await;
    }
    if let Some(from) = &args.from {
        check_broker(from, &mut report).await;
    }
    if report.failed {
        return Err(Failure::Run("a check failed: see its fix above".into()));
    }
    Ok(())
}

struct Report {
    json: bool,
    failed: bool,
}

impl Report {
    /// Prints one check. Its text may quote what a server answered (an
    /// error, a setting): control characters are escaped.
    fn say(&mut self, mut finding: Finding) {
        finding.detail = shown(finding.detail.as_bytes());
        finding.fix = finding.fix.map(|f| shown(f.as_bytes()));
        self.failed |= finding.severity == Severity::Fail;
        let status = match finding.severity {
            Severity::Ok => "ok",
            Severity::Warn => "warn",
            Severity::Fail => "FAIL",
        };
        if self.json {
            println!(
                "{}",
                json!({"check": finding.check, "status": status.to_lowercase(),
                       "detail": finding.detail, "fix": finding.fix})
            );
            return;
        }
        println!("{status:<4}  {:<12} {}", finding.check, finding.detail);
        if let Some(fix) = finding.fix {
            println!("      {:<12} fix: {fix}", "");
        }
    }

    fn ok(&mut self, check: &str, detail: impl Into<String>) {
        self.say(Finding::new(Severity::Ok, check, detail, None));
    }
}

/// Opens the store as `idem serve` would, except that an SQL store's
/// tables are only checked, never migrated.
async fn open(settings: &crate::config::StoreSettings, report: &mut Report) -> Option<OpenStore> {
    let started = Instant::now();
    let opened = match StoreSpec::parse(settings) {
        Ok(StoreSpec::Memory) => {
            report.ok(
                "store",
                "memory:// lives inside one process: nothing to reach, and its records end with it",
            );
            return None;
        }
        Ok(spec) => open_unmigrated(&spec, settings).await,
        Err(e) => Err(e.into()),
    };
    match opened {
        Ok(store) => {
            report.ok(
                "store",
                format!(
                    "{} reached in {}",
                    store.description,
                    millis(started.elapsed())
                ),
            );
            Some(store)
        }
        Err(e) => {
            let why = match e {
                Failure::Config(c) => c.to_string(),
                Failure::Run(r) | Failure::Exit(_, r) => r,
            };
            let fix = if why.contains("idem migrate") || why.contains("schema version") {
                "idem migrate --store URL (with the URL given here)".to_owned()
            } else {
                "see the error: the address, the credentials, and whether the store runs there"
                    .to_owned()
            };
            report.say(Finding::new(Severity::Fail, "store", why, Some(fix)));
            None
        }
    }
}

async fn open_unmigrated(
    spec: &StoreSpec,
    settings: &crate::config::StoreSettings,
) -> Result<OpenStore, Failure> {
    #[cfg(feature = "sql")]
    if let StoreSpec::Sql(sql) = spec {
        let store = store::sql(sql, settings, |b| b.migrate(false).sweep_interval(None)).await?;
        return Ok(OpenStore::sql(store));
    }
    store::open_spec(spec, settings).await
}

/// Removes what the probe left (a released claim is kept as abandoned),
/// so that its namespace shows nowhere (`idem stats`, the status page):
/// the probe's namespace is purged when it holds the probe's record alone
/// (another doctor's probe running at once is left alone, and expires).
async fn clean_up(store: &OpenStore, probe: &Key) {
    let Some(admin) = &store.admin else {
        return;
    };
    let ns = probe.namespace();
    let alone = admin
        .stats(ns)
        .await
        .is_ok_and(|s| s.in_progress + s.abandoned + s.completed + s.expired <= 1);
    if alone && let Err(e) = admin.purge(ns, Purge::All, &|_| {}).await {
        tracing::debug!(error = %e, "removing the probe's record");
    }
}

async fn check_store(store: &OpenStore, report: &mut Report) {
    let probe = Key::new(
        "idem-doctor",
        format!(
            "probe-{}-{}",
            std::process::id(),
            SystemClock.now().as_millis()
        ),
    )
    .expect("a valid probe key");

    // Round trip: reads of a key nobody has.
    let mut times = Vec::with_capacity(READS);
    for _ in 0..READS {
        let started = Instant::now();
        if let Err(e) = store.store.get(&probe).await {
            report.say(Finding::new(
                Severity::Fail,
                "round trip",
                format!("reading a record failed: {e}"),
                Some("see the error; the store answered the connection but not a read".into()),
            ));
            return;
        }
        times.push(started.elapsed());
    }
    times.sort();
    let median = times[READS / 2];
    report.say(Finding::new(
        if median > SLOW_ROUND_TRIP {
            Severity::Warn
        } else {
            Severity::Ok
        },
        "round trip",
        format!("{} (median of {READS} reads)", millis(median)),
        (median > SLOW_ROUND_TRIP).then(|| {
            "run idem close to its store: every message or request costs at least two round trips"
                .to_owned()
        }),
    ));

    // A claim taken and released; the lease's end dates the store's clock.
    let lease = Duration::from_secs(10);
    let before = SystemTime::now();
    let began = store.store.begin(&probe, None, Lease::new(lease)).await;
    let after = SystemTime::now();
    let claim = match began {
        Ok(Begin::Acquired(c)) => c,
        Ok(other) => {
            report.say(Finding::new(
                Severity::Fail,
                "claims",
                format!("a fresh probe key answered {other:?} instead of being acquired"),
                Some(
                    "the store's records are not what idem wrote: check what else writes to it"
                        .into(),
                ),
            ));
            return;
        }
        Err(e) => {
            report.say(Finding::new(
                Severity::Fail,
                "claims",
                format!("taking a claim failed: {e}"),
                Some("check that idem's user may write to the store".into()),
            ));
            return;
        }
    };
    match store.store.release(&probe, claim.token).await {
        Ok(Fenced::Ok(())) => {
            report.ok(
                "claims",
                format!("a claim was taken and released (key {probe})"),
            );
            clean_up(store, &probe).await;
        }
        Ok(Fenced::Stale) => report.say(Finding::new(
            Severity::Fail,
            "claims",
            "a claim taken a moment ago was stale when released",
            Some("the store's clock jumps, or something else wrote the key".into()),
        )),
        Err(e) => report.say(Finding::new(
            Severity::Fail,
            "claims",
            format!("releasing the probe's claim failed: {e}"),
            Some("check that idem's user may write to the store".into()),
        )),
    }
    if store.file.is_some() {
        report.ok("clock", "the file store keeps this host's time");
    } else {
        let middle = before + after.duration_since(before).unwrap_or_default() / 2;
        let host_ms = middle
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as i128;
        let store_ms = claim.lease_expires_at.as_millis() as i128 - lease.as_millis() as i128;
        let skew = store_ms - host_ms;
        let size = Duration::from_millis(skew.unsigned_abs() as u64);
        let how = if skew >= 0 { "ahead of" } else { "behind" };
        let half_trip = after.duration_since(before).unwrap_or_default() / 2;
        report.say(Finding::new(
            if size > LARGE_SKEW {
                Severity::Warn
            } else {
                Severity::Ok
            },
            "clock",
            format!(
                "the store's clock is {} {how} this host's (± {})",
                millis(size),
                millis(half_trip)
            ),
            (size > LARGE_SKEW).then(|| {
                "leases follow the store's clock and stay safe, but ages and retry times printed on this host are off by as much: run NTP (chrony) on both".to_owned()
            }),
        ));
    }
}

/// What the store finds in its own settings (a Redis that may evict, a
/// cluster with slots no master serves), checked even when the probe
/// failed: it may say why.
async fn check_settings(store: &OpenStore, report: &mut Report) {
    if let Some(admin) = &store.admin {
        match admin.findings().await {
            Ok(found) => {
                for f in found {
                    report.say(f);
                }
            }
            Err(e) => report.say(Finding::new(
                Severity::Warn,
                "settings",
                format!("the store's settings could not be read: {e}"),
                None,
            )),
        }
    }
}

async fn check_broker(from: &str, report: &mut Report) {
    let started = Instant::now();
    match crate::dlq::connect_url(from, None, false).await {
        Ok(q) => report.ok(
            "broker",
            format!(
                "reached in {}; dead letters go to {}",
                millis(started.elapsed()),
                shown(q.name().as_bytes())
            ),
        ),
        Err(e) => {
            let why = match e {
                Failure::Config(c) => c.to_string(),
                Failure::Run(r) | Failure::Exit(_, r) => r,
            };
            report.say(Finding::new(
                Severity::Fail,
                "broker",
                why,
                Some("check the URL, the credentials, and that the broker runs there".into()),
            ));
        }
    }
}

fn millis(d: Duration) -> String {
    if d < Duration::from_millis(10) {
        format!("{:.1} ms", d.as_secs_f64() * 1000.0)
    } else {
        format!("{} ms", d.as_millis())
    }
}
