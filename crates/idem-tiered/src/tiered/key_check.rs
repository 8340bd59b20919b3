//! Which keys may be in the cold tier: asked before a new key is looked up
//! there, told of each key before it is moved there.
//!
//! - No filter: every new key is looked up.
//! - A local filter ([`KeyFilter`]): in this process's memory, for a hot
//!   tier only this process uses (memory).
//! - A shared filter ([`SharedFilter`]): kept in a hot tier every process
//!   shares (Redis), so a key one process moved is never called new by
//!   another. It is rebuilt from the cold tier by one process at a time
//!   whenever the hot tier says it is not ready (new, or lost).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::tier::{FilterProbe, SharedFilter, Tier};
use idem_core::{Key, StoreError};

use crate::filter::{FilterSeed, KeyFilter};

/// Keys asked of the cold tier at a time while a shared filter is rebuilt.
const REBUILD_PAGE: usize = 10_000;

/// How long the right to rebuild a shared filter is held between renewals.
const REBUILD_LEASE: Duration = Duration::from_secs(30);

/// How often a shared filter's readiness is checked.
const READY_CHECK_EVERY: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub(crate) enum KeyCheck {
    Off,
    Local(Arc<KeyFilter>),
    Shared(Arc<Shared>),
}

/// How the keys the hot tier did not know were settled since the store
/// opened: the filter's work, whichever filter it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ColdChecks {
    /// Looked up in the cold tier ("maybe", or no filter).
    pub asked: u64,
    /// Certainly new: the cold tier was spared.
    pub skipped: u64,
}

#[derive(Default)]
pub(crate) struct ColdCheckCounts {
    asked: AtomicU64,
    skipped: AtomicU64,
}

impl ColdCheckCounts {
    pub fn get(&self) -> ColdChecks {
        ColdChecks {
            asked: self.asked.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
        }
    }

    fn count(&self, maybe: bool) {
        let (n, answer) = if maybe {
            (&self.asked, "asked")
        } else {
            (&self.skipped, "skipped")
        };
        n.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("idem_tiered_cold_checks_total", "answer" => answer).increment(1);
    }
}

pub(crate) struct Shared {
    pub filter: SharedFilter,
    seed: FilterSeed,
}

impl Shared {
    pub fn new(filter: SharedFilter) -> Self {
        let seed = FilterSeed::new(filter.seed);
        Self { filter, seed }
    }

    fn probes<'a>(&self, keys: impl IntoIterator<Item = &'a Key>) -> Vec<FilterProbe> {
        keys.into_iter()
            .map(|key| FilterProbe {
                key: key.clone(),
                hash: self.seed.hash_key(key),
            })
            .collect()
    }
}

impl KeyCheck {
    /// For each key, whether it may be in the cold tier (`false`: certainly
    /// new). A shared filter that cannot answer answers "maybe".
    pub async fn may_be_cold<H: Tier>(
        &self,
        hot: &H,
        keys: &[&Key],
        counts: &ColdCheckCounts,
    ) -> Vec<bool> {
        let answers = match self {
            KeyCheck::Off => vec![true; keys.len()],
            KeyCheck::Local(f) => keys.iter().map(|k| !f.check(k).is_absent()).collect(),
            KeyCheck::Shared(s) => {
                let probes = s.probes(keys.iter().copied());
                match hot.filter_check(&s.filter, &probes).await {
                    Ok(maybe) => maybe,
                    Err(e) => {
                        tracing::debug!(error = %e, "the shared key filter cannot answer; asking the cold tier");
                        vec![true; keys.len()]
                    }
                }
            }
        };
        for maybe in &answers {
            counts.count(*maybe);
        }
        answers
    }

    /// Adds `keys` to the filter: done before they can be seen in the cold
    /// tier.
    pub async fn insert<H: Tier>(&self, hot: &H, keys: &[&Key]) -> Result<(), StoreError> {
        match self {
            KeyCheck::Off => Ok(()),
            KeyCheck::Local(f) => {
                for key in keys {
                    f.insert(key);
                }
                Ok(())
            }
            KeyCheck::Shared(s) => s.insert(hot, keys).await,
        }
    }
}

impl Shared {
    async fn insert<H: Tier>(&self, hot: &H, keys: &[&Key]) -> Result<(), StoreError> {
        hot.filter_insert(&self.filter, &self.probes(keys.iter().copied()))
            .await
    }
}

/// Keeps a shared filter ready while `alive` says the store is open:
/// every [`READY_CHECK_EVERY`], when the hot tier says it is not ready and
/// no other process is rebuilding it, feeds it every completed key of the
/// cold tier and marks it ready.
pub(crate) async fn keep_ready<H: Tier, C: Tier>(
    shared: Arc<Shared>,
    hot: H,
    cold: C,
    alive: impl Fn() -> bool,
) {
    let holder = format!("{}-{:x}", std::process::id(), random());
    let mut ticks = tokio::time::interval(READY_CHECK_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if !alive() {
            return;
        }
        match hot.filter_ready(&shared.filter).await {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell whether the shared key filter is ready; checking again soon");
                continue;
            }
        }
        match hot
            .filter_rebuild_lease(&shared.filter, &holder, REBUILD_LEASE)
            .await
        {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "cannot take the right to rebuild the shared key filter; trying again soon");
                continue;
            }
        }
        match rebuild(&shared, &hot, &cold, &holder).await {
            Ok(n) => tracing::info!(keys = n, "shared key filter rebuilt from the cold tier"),
            Err(e) => {
                tracing::error!(error = %e, "rebuilding the shared key filter failed; until it is rebuilt every new key is looked up in the cold tier; retrying soon")
            }
        }
    }
}

/// 64 bits from the operating system's randomness, by way of the standard
/// library's randomly keyed hasher: a holder name that differs per start.
pub(crate) fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

async fn rebuild<H: Tier, C: Tier>(
    shared: &Shared,
    hot: &H,
    cold: &C,
    holder: &str,
) -> Result<u64, StoreError> {
    tracing::info!("rebuilding the shared key filter from the cold tier");
    let mut after: Option<Key> = None;
    let mut fed = 0u64;
    loop {
        let page = cold.completed_keys(after.as_ref(), REBUILD_PAGE).await?;
        if page.is_empty() {
            break;
        }
        for chunk in page.chunks(1_024) {
            let keys: Vec<&Key> = chunk.iter().collect();
            shared.insert(hot, &keys).await?;
        }
        fed += page.len() as u64;
        after = page.last().cloned();
        if !hot
            .filter_rebuild_lease(&shared.filter, holder, REBUILD_LEASE)
            .await?
        {
            return Err(StoreError::unavailable(
                "another process took over the rebuild of the shared key filter",
            ));
        }
    }
    hot.filter_mark_ready(&shared.filter).await?;
    Ok(fed)
}
