//! `--store tiered`: a hot tier in front of a cold one, with a key filter
//! in front of the cold tier (docs/high-volume.md).

use std::hash::{BuildHasher, Hasher};
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use idem_core::layer::{Measured, Traced};
use idem_core::tier::Tier;
use idem_core::{SharedClock, SharedStore, SystemClock};
use idem_file::FileStore;
use idem_tiered::filter::{Fed, FilterConfig, FilterSeed, KeyFilter, maintain};
use idem_tiered::{Acknowledgement, TieredStore};

use super::single;
use super::spec::{ColdTier, HotTier};
use crate::config::{StoreSettings, TieredSettings, bad};
use crate::run::Failure;

/// An open tiered store.
pub struct OpenTiered {
    pub store: SharedStore,
    pub description: String,
    /// Moves what it can to the cold tier, stops the filter's upkeep and
    /// makes the cold tier durable.
    pub shutdown: BoxFuture<'static, ()>,
}

/// Opens `hot` in front of `cold`, each tier measured and traced apart.
pub async fn open(
    hot: &HotTier,
    cold: &ColdTier,
    settings: &StoreSettings,
) -> Result<OpenTiered, Failure> {
    match hot {
        HotTier::Memory => {
            let store = instrumented(single::memory(settings), hot.kind(), "hot");
            with_cold(store, "memory", cold, settings).await
        }
        #[cfg(feature = "redis")]
        HotTier::Redis(redis) => {
            let (store, description) = single::redis(redis, settings).await?;
            let store = instrumented(store, hot.kind(), "hot");
            with_cold(store, &description, cold, settings).await
        }
    }
}

/// A tier counted, timed and traced apart from the other one: labelled
/// with its kind and `tier="hot"` or `tier="cold"`, its tier operations
/// (imports into the cold tier, say) included.
fn instrumented<T: Tier>(tier: T, kind: &str, place: &str) -> Traced<Measured<T>> {
    Traced::in_tier(Measured::in_tier(tier, kind, place), place)
}

async fn with_cold<H: Tier + Clone>(
    hot: H,
    hot_description: &str,
    cold: &ColdTier,
    settings: &StoreSettings,
) -> Result<OpenTiered, Failure> {
    let t = &settings.tiered;
    match cold {
        ColdTier::File { path } => {
            let store = single::file(path, settings)?;
            let description = single::file_description(path);
            let measured = instrumented(store.clone(), cold.kind(), "cold");
            assemble(hot, measured, hot_description, &description, Some(store), t).await
        }
        #[cfg(feature = "sql")]
        ColdTier::Sql(sql) => {
            let store = single::sql(sql, settings, |b| b).await?;
            let description = store.description().to_owned();
            let measured = instrumented(store, cold.kind(), "cold");
            assemble(hot, measured, hot_description, &description, None, t).await
        }
    }
}

async fn assemble<H: Tier + Clone, C: Tier + Clone>(
    hot: H,
    cold: C,
    hot_description: &str,
    cold_description: &str,
    file: Option<FileStore>,
    t: &TieredSettings,
) -> Result<OpenTiered, Failure> {
    let clock: SharedClock = Arc::new(SystemClock);
    // A hot tier every process shares (Redis) keeps the filter too, so that
    // no process calls new a key another one moved to the cold tier; a
    // memory hot tier, this process's alone, keeps it in memory.
    let shared = H::SHARES_FILTER;
    let filter = match t.filter_items {
        Some(items) if !shared => Some(Arc::new(filter(items, t, clock.now())?)),
        _ => None,
    };
    if shared && t.filter_items.is_some() && t.filter_snapshot.is_some() {
        tracing::warn!(
            "--filter-snapshot is not used: with a Redis hot tier the key filter lives in Redis, shared by every process"
        );
    }
    // One list of handovers per cold tier: stores sharing a Redis in front
    // of different cold tiers never move each other's records.
    let mut builder = TieredStore::builder(hot, cold.clone())
        .hot_retention(t.hot_retention)
        .write_through(t.write_through)
        .ack_before_cold(t.ack_before_cold)
        .handover_list(cold_description)
        .handover_grace(t.handover_grace)
        .sweep_handovers(t.sweep_handovers);
    if let Some(f) = &filter {
        builder = builder.filter(f.clone());
    }
    if let Some(items) = t.filter_items.filter(|_| shared) {
        builder = builder.shared_filter(filter_config(items, t));
    }
    let store = builder.open().await.map_err(|e| {
        Failure::Run(format!(
            "opening the tiered store failed: {e}; check that both --hot-store and --cold-store are reachable"
        ))
    })?;
    let upkeep = filter.map(|f| upkeep(f, cold, t, clock));
    let acknowledgement = store.acknowledgement();
    let flushed = store.clone();
    let flush_timeout = t.flush_timeout;
    let shutdown = async move {
        // Completions first, so the last snapshot holds their keys.
        let left = flushed.flush_within(flush_timeout).await;
        if left > 0 {
            left_at_shutdown(left, acknowledgement, flush_timeout);
        }
        if let Some(stop) = upkeep {
            stop.await;
        }
        if let Some(file) = file
            && let Err(e) = file.flush()
        {
            tracing::error!(error = %e, "flushing the cold tier at shutdown failed");
        }
    };
    Ok(OpenTiered {
        description: format!(
            "tiered store: {hot_description} in front of {cold_description}, hot retention {} s, key filter {}, {}",
            t.hot_retention.as_secs(),
            match (t.filter_items, store.shared_filter()) {
                (None, _) => "off".to_owned(),
                (Some(_), Some(f)) => format!(
                    "shared in the hot tier ({} bits a generation, {} generations of {} s)",
                    f.bits,
                    f.generations,
                    f.window.as_secs()
                ),
                (Some(n), None) => format!("in memory, for {n} keys"),
            },
            match acknowledgement {
                Acknowledgement::AfterCold => "completions answered once the cold tier has them",
                Acknowledgement::AfterHot =>
                    "completions answered once the hot tier has them listed for the cold tier",
                _ =>
                    "completions answered BEFORE the cold tier has them (--ack-before-cold: a crash loses those on their way)",
            },
        ),
        store: Arc::new(store),
        shutdown: shutdown.boxed(),
    })
}

/// Says what becomes of the completions a graceful stop could not move to
/// the cold tier within `waited`.
fn left_at_shutdown(left: u64, acknowledgement: Acknowledgement, waited: Duration) {
    let waited = waited.as_millis();
    match acknowledgement {
        Acknowledgement::AfterHot => tracing::warn!(
            left,
            "{left} completions had not reached the cold tier after {waited} ms (--flush-timeout-ms); \
             the hot tier keeps them, listed, and the next process to open the store moves them"
        ),
        Acknowledgement::AfterCold => tracing::warn!(
            left,
            "{left} completions had not reached the cold tier after {waited} ms (--flush-timeout-ms); \
             none was answered as done, so their holders retry or their redeliveries run again"
        ),
        _ => tracing::error!(
            left,
            "{left} acknowledged completions had not reached the cold tier after {waited} ms \
             (--flush-timeout-ms) and are lost with this process (--ack-before-cold): their \
             redeliveries run again"
        ),
    }
}

/// The filter's settings: for a shared filter, what the first process to
/// open it proposes (a random seed unless --filter-seed is given; later
/// processes use the one kept).
fn filter_config(items: u64, t: &TieredSettings) -> FilterConfig {
    let seed = FilterSeed::new(t.filter_seed.unwrap_or_else(random_seed));
    FilterConfig::new(seed, items, t.filter_retention)
}

/// The filter in memory: from its snapshot when there is a good one, else
/// empty.
fn filter(items: u64, t: &TieredSettings, now: idem_core::Timestamp) -> Result<KeyFilter, Failure> {
    let config = filter_config(items, t);
    if let Some(path) = &t.filter_snapshot
        && path.exists()
    {
        match KeyFilter::load_snapshot(path, &config, now) {
            Ok(filter) => return Ok(filter),
            Err(e) => {
                tracing::warn!(error = %e, path = %path.display(), "the key filter's snapshot cannot be used; rebuilding from the cold tier")
            }
        }
    }
    KeyFilter::new(&config, now).map_err(|e| bad("filter_items", e.to_string()).into())
}

/// 128 bits from the operating system's randomness, by way of the standard
/// library's randomly keyed hasher.
fn random_seed() -> u128 {
    let half = || {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    };
    (u128::from(half()) << 64) | u128::from(half())
}

/// Starts the filter's rebuild from the cold tier and its upkeep (rotation,
/// snapshots); the future it returns stops the upkeep, after a last
/// snapshot.
fn upkeep<C: Tier + Clone>(
    filter: Arc<KeyFilter>,
    cold: C,
    t: &TieredSettings,
    clock: SharedClock,
) -> BoxFuture<'static, ()> {
    tokio::spawn(rebuild(filter.clone(), cold));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopped = async {
        let _ = stopped.await;
    };
    let every = (filter.sizing().window / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let task = match t.filter_snapshot.clone() {
        Some(path) => tokio::spawn(async move {
            if let Err(e) = maintain(filter, path, every, clock, stopped).await {
                tracing::error!(error = %e, "the key filter's last snapshot failed; the next start rebuilds it from the cold tier");
            }
        }),
        None => tokio::spawn(async move {
            let mut stopped = std::pin::pin!(stopped);
            let mut ticks = tokio::time::interval(every);
            loop {
                tokio::select! {
                    () = &mut stopped => break,
                    _ = ticks.tick() => {
                        filter.rotate(clock.now());
                        // Reads every bit of the filter: off the runtime.
                        let estimate = filter.clone();
                        let _ = tokio::task::spawn_blocking(move || {
                            estimate.estimated_false_positive_rate()
                        })
                        .await;
                    }
                }
            }
        }),
    };
    async move {
        let _ = stop.send(());
        let _ = task.await;
    }
    .boxed()
}

/// Makes the filter ready from the cold tier: the keys completed since its
/// snapshot when it was loaded from one, else every completed key; until
/// then the filter answers "maybe" and every new key is checked in the
/// cold tier. Progress goes to stderr: a counter on a terminal, log lines
/// otherwise.
async fn rebuild<C: Tier + Clone>(filter: Arc<KeyFilter>, cold: C) {
    let started = Instant::now();
    let terminal = std::io::stderr().is_terminal();
    let mut last_line = Instant::now();
    let fed = filter
        .rebuild_from_tier(&cold, |done, _| {
            if terminal || last_line.elapsed() >= Duration::from_secs(10) {
                progress(done, started, terminal);
                last_line = Instant::now();
            }
        })
        .await;
    if terminal {
        eprintln!();
    }
    match fed {
        Ok(Fed::CaughtUp { keys }) => tracing::info!(
            keys,
            seconds = started.elapsed().as_secs_f64(),
            "key filter loaded from its snapshot and caught up from the cold tier"
        ),
        Ok(Fed::Rebuilt { keys }) => tracing::info!(
            keys,
            seconds = started.elapsed().as_secs_f64(),
            "key filter rebuilt from the cold tier"
        ),
        Err(e) => {
            tracing::error!(error = %e, "rebuilding the key filter failed; it keeps answering \"maybe\", so every new key is checked in the cold tier; restart to retry")
        }
    }
}

fn progress(done: u64, started: Instant, terminal: bool) {
    let rate = done as f64 / started.elapsed().as_secs_f64().max(0.001);
    let line =
        format!("rebuilding the key filter from the cold tier: {done} keys, {rate:.0} keys/s");
    if terminal {
        let mut err = std::io::stderr();
        let _ = write!(err, "\r{line}");
        let _ = err.flush();
    } else {
        tracing::info!("{line}");
    }
}
