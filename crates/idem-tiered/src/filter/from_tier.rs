//! Feeding a filter the keys a tier holds: every completed key for a new
//! filter, only those completed since its snapshot for a loaded one.

use std::time::Duration;

use futures_util::{Stream, StreamExt, stream};
use idem_core::tier::{CompletedKey, Tier};
use idem_core::{Key, StoreError, Timestamp};

use super::{KeyFilter, Readiness, RebuildError};

/// Keys asked of the tier at a time.
pub const FEED_PAGE: usize = 10_000;

/// How far before a snapshot's time its catch-up starts: the most the
/// clock that stamped the records may have run behind the one that took
/// the snapshot (a completion stamped just before the snapshot and
/// inserted just after, a small step of the clock between two starts).
pub const SNAPSHOT_CLOCK_MARGIN: Duration = Duration::from_secs(5);

/// How a filter was made ready by [`KeyFilter::rebuild_from_tier`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fed {
    /// Loaded from a snapshot, then fed the keys completed since it.
    CaughtUp {
        /// Keys fed.
        keys: u64,
    },
    /// Fed every completed key of the tier.
    Rebuilt {
        /// Keys fed.
        keys: u64,
    },
}

impl Fed {
    /// Keys fed.
    pub fn keys(self) -> u64 {
        match self {
            Fed::CaughtUp { keys } | Fed::Rebuilt { keys } => keys,
        }
    }
}

impl KeyFilter {
    /// Makes the filter ready from what `tier` holds (a tiered store's
    /// cold tier): a filter loaded from a snapshot is fed the keys
    /// completed since the snapshot (less [`SNAPSHOT_CLOCK_MARGIN`]) where
    /// the tier can list them by completion time
    /// ([`Tier::completed_since`]), a few pages at most; otherwise, and for
    /// a new filter, every completed key. `progress` is as for
    /// [`rebuild`](KeyFilter::rebuild). Sets the gauge `idem_filter_ready`
    /// and counts the keys fed in `idem_filter_fed_keys_total{how}`
    /// (`catch_up` or `rebuild`).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops the feed and leaves the filter needing
    /// one, answering "maybe": nothing is lost, a later call starts over.
    pub async fn rebuild_from_tier<T: Tier>(
        &self,
        tier: &T,
        progress: impl FnMut(u64, Option<u64>),
    ) -> Result<Fed, RebuildError<StoreError>> {
        let since = match self.readiness() {
            Readiness::NeedsRebuild { since: Some(at) } => Some(Timestamp::from_millis(
                at.as_millis()
                    .saturating_sub(SNAPSHOT_CLOCK_MARGIN.as_millis() as u64),
            )),
            _ => None,
        };
        if let Some(since) = since {
            match tier.completed_since(since, None, FEED_PAGE).await {
                Ok(Some(first)) => {
                    let keys = since_pages(tier, since, first);
                    let keys = self.rebuild_from_stream(keys, None, progress).await?;
                    metrics::counter!("idem_filter_fed_keys_total", "how" => "catch_up")
                        .increment(keys);
                    tracing::info!(
                        keys,
                        since = since.as_millis(),
                        "key filter caught up from its snapshot with the keys completed since"
                    );
                    return Ok(Fed::CaughtUp { keys });
                }
                Ok(None) => tracing::info!(
                    "the cold tier cannot list what was completed since the filter's snapshot; feeding the filter every key"
                ),
                Err(source) => return Err(RebuildError::Source { done: 0, source }),
            }
        }
        let keys = self
            .rebuild_from_stream(every_page(tier), None, progress)
            .await?;
        metrics::counter!("idem_filter_fed_keys_total", "how" => "rebuild").increment(keys);
        Ok(Fed::Rebuilt { keys })
    }
}

/// Every key completed since `since`, page after page from `first`.
fn since_pages<T: Tier>(
    tier: &T,
    since: Timestamp,
    first: Vec<CompletedKey>,
) -> impl Stream<Item = Result<Key, StoreError>> + '_ {
    let pages = stream::unfold(Some(first), move |page| async move {
        let page = page?;
        if page.is_empty() {
            return None;
        }
        let next = match tier.completed_since(since, page.last(), FEED_PAGE).await {
            Ok(Some(next)) => Some(next),
            Ok(None) => Some(Vec::new()),
            Err(e) => return Some((vec![Err(e)], None)),
        };
        Some((page.into_iter().map(|c| Ok(c.key)).collect(), next))
    });
    pages.flat_map(stream::iter)
}

/// Every completed key of `tier`, page after page.
fn every_page<T: Tier>(tier: &T) -> impl Stream<Item = Result<Key, StoreError>> + '_ {
    let pages = stream::unfold(Some(None::<Key>), move |after| async move {
        let after = after?;
        match tier.completed_keys(after.as_ref(), FEED_PAGE).await {
            Ok(page) if page.is_empty() => None,
            Ok(page) => {
                let next = page.last().cloned();
                Some((page.into_iter().map(Ok).collect::<Vec<_>>(), Some(next)))
            }
            Err(e) => Some((vec![Err(e)], None)),
        }
    });
    pages.flat_map(stream::iter)
}
