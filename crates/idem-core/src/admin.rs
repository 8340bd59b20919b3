//! What an operator does to a store from outside the services that use it
//! (docs/contract.md §2, "Operations for operators"): list its namespaces,
//! count a namespace's records, say how big the store is, and remove
//! records.

use futures_util::future::BoxFuture;

use crate::{Namespace, StoreError, Timestamp};

/// A namespace's records, counted by state at one moment (the store's
/// clock).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceStats {
    /// Claims whose lease is live: work running now.
    pub in_progress: u64,
    /// Claims whose lease has ended without a completion: the holder gave
    /// up or died, and the next delivery takes the key over.
    pub abandoned: u64,
    /// Completed records within their retention.
    pub completed: u64,
    /// Records past their retention that are still stored (swept later);
    /// no operation sees them. Zero on stores that expire records
    /// themselves (Redis).
    pub expired: u64,
    /// When the oldest claim still in progress (live or abandoned) started.
    pub oldest_in_progress: Option<Timestamp>,
}

impl NamespaceStats {
    /// Counts one claim in progress: live or abandoned, started at
    /// `started_at`.
    pub fn count_claim(&mut self, live: bool, started_at: Timestamp) {
        if live {
            self.in_progress += 1;
        } else {
            self.abandoned += 1;
        }
        self.oldest_in_progress = Some(
            self.oldest_in_progress
                .map_or(started_at, |o| o.min(started_at)),
        );
    }
}

/// How much room a store takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreSize {
    /// Bytes, as the store counts them.
    pub bytes: u64,
    /// What the bytes are, for a person: "on disk in ./idem-data",
    /// "used_memory of the whole Redis server", "tables and indexes".
    pub what: String,
}

/// Which records [`Admin::purge`] removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purge {
    /// Records past their retention that are still stored: nothing any
    /// caller can see changes. Claims whose lease ended stay (their attempt
    /// count is what dead-letters a message that keeps failing).
    Expired,
    /// Every record of the namespace, claims in progress too: their
    /// holders' tokens go stale, and every key runs again on its next
    /// delivery.
    All,
}

/// How a [`Finding`] of [`Admin::findings`] weighs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Checked and fine.
    Ok,
    /// Works, with a risk the operator should know of.
    Warn,
    /// Breaks a promise of idem's (records can be lost, work can run
    /// twice) until fixed.
    Fail,
}

/// What a store found in its own configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// How it weighs.
    pub severity: Severity,
    /// What was checked, in a word or two: `eviction`, `persistence`.
    pub check: String,
    /// What was found.
    pub detail: String,
    /// The one-line fix, where there is something to fix.
    pub fix: Option<String>,
}

impl Finding {
    /// A finding with its fix.
    pub fn new(
        severity: Severity,
        check: &str,
        detail: impl Into<String>,
        fix: Option<String>,
    ) -> Self {
        Self {
            severity,
            check: check.to_owned(),
            detail: detail.into(),
            fix,
        }
    }
}

/// An operator's view of a store.
///
/// Fencing survives a purge: the next acquisition of a purged key gets a
/// token larger than every token the key had (the memory and file stores
/// draw tokens from one store-wide sequence; the Redis and SQL stores start
/// a key with no record at the time in milliseconds × 1 024), so a holder
/// whose claim was purged can never write with its old token.
///
/// # Cancel safety
///
/// `namespaces`, the `stats` methods and `size` only read. `purge` deletes in batches,
/// each atomic: dropped part way, it has removed some batches and not
/// others, and every key stays usable; running it again finishes the job.
pub trait Admin: Send + Sync + 'static {
    /// The namespaces holding at least one record, in order.
    fn namespaces(&self) -> BoxFuture<'_, Result<Vec<Namespace>, StoreError>>;

    /// A namespace's records, counted.
    fn stats<'a>(
        &'a self,
        namespace: &'a Namespace,
    ) -> BoxFuture<'a, Result<NamespaceStats, StoreError>>;

    /// Every namespace's records, counted, in namespace order: one pass
    /// over the store where it can make one (Redis reads the head of each
    /// record once, every namespace together). By default
    /// [`namespaces`](Admin::namespaces), then [`stats`](Admin::stats) of
    /// each.
    fn stats_all(&self) -> BoxFuture<'_, Result<Vec<(Namespace, NamespaceStats)>, StoreError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for ns in self.namespaces().await? {
                let stats = self.stats(&ns).await?;
                out.push((ns, stats));
            }
            Ok(out)
        })
    }

    /// [`stats`](Admin::stats), with the store told to give up after
    /// `within` where it can stop its own work (a statement timeout on the
    /// SQL stores), so that a caller who stops waiting leaves no count
    /// running on the server. By default [`stats`](Admin::stats): the
    /// memory and file stores count in this process, and Redis's counting
    /// is many short commands that stop when the caller does.
    fn stats_within<'a>(
        &'a self,
        namespace: &'a Namespace,
        within: std::time::Duration,
    ) -> BoxFuture<'a, Result<NamespaceStats, StoreError>> {
        let _ = within;
        self.stats(namespace)
    }

    /// How much room the store takes, where it can tell.
    fn size(&self) -> BoxFuture<'_, Result<Option<StoreSize>, StoreError>>;

    /// What the store finds in its own configuration that bears on idem's
    /// promises (a Redis that may evict records, a database that may lose
    /// committed transactions), each with its fix. None by default.
    fn findings(&self) -> BoxFuture<'_, Result<Vec<Finding>, StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Removes `what` from a namespace; answers how many records went.
    /// `progress` hears the running count after each batch.
    fn purge<'a>(
        &'a self,
        namespace: &'a Namespace,
        what: Purge,
        progress: &'a (dyn Fn(u64) + Send + Sync),
    ) -> BoxFuture<'a, Result<u64, StoreError>>;
}
