//! What a store offers to serve as a tier of a tiered store
//! (docs/contract.md §2, "Tiers"): taking completed records with their
//! own tokens and times, issuing tokens above a floor, and listing the
//! keys it holds.

use std::future::Future;
use std::time::Duration;

use crate::{Completed, FencingToken, Key, Store, StoreError, Timestamp};

/// A completed record, moved from one store to another with its own token
/// and timestamps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportItem {
    /// The record's key.
    pub key: Key,
    /// The record as the store it comes from holds it.
    pub record: Completed,
}

/// What an import did with one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Imported {
    /// The record is now the key's record.
    Written,
    /// The store kept what it had: a live completed record (whatever its
    /// token), or nothing when the imported record had already expired.
    Kept,
}

/// A completed record on its way from one tier to another: its key and
/// the token that completed it, which tells this completion from a later
/// one of the same key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Handover {
    /// The record's key.
    pub key: Key,
    /// The token that completed it.
    pub token: FencingToken,
}

/// A Bloom filter a hot tier keeps for a tiered store, shared by every
/// process that uses that tier ([`Tier::SHARES_FILTER`]): the keys of the
/// cold tier, so that a key none of them has seen is known new without
/// asking it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedFilter {
    /// Its name: one per cold tier.
    pub name: String,
    /// The keyed hash seed every process derives positions with.
    pub seed: u128,
    /// Bits of one generation, all of the store's parts together.
    pub bits: u64,
    /// Bits set per key.
    pub hashes: u32,
    /// How long one generation receives keys.
    pub window: Duration,
    /// Generations live at once: a key is kept at least `generations - 1`
    /// windows after its insert.
    pub generations: u32,
    /// Drawn by the process that first kept these settings: the filter's
    /// bits are kept under it, so settings kept anew (the old ones deleted
    /// by an operator) start from an empty filter that is not ready, never
    /// from bits set under other settings.
    pub epoch: u64,
}

/// A key and the 64-bit keyed hash its filter positions come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterProbe {
    /// The key.
    pub key: Key,
    /// Its hash under the filter's seed.
    pub hash: u64,
}

/// A completed key and when it was completed: one entry of
/// [`Tier::completed_since`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletedKey {
    /// When the record was completed (its `completed_at`).
    pub at: Timestamp,
    /// Its key.
    pub key: Key,
}

/// A store held as the cold tier of one process's volatile hot tier, for
/// as long as this lives (see [`Tier::hold_sole_front`]).
pub struct SoleFront(Option<Box<dyn std::any::Any + Send + Sync>>);

impl SoleFront {
    /// Nothing to hold: a store one process alone can open.
    pub fn nothing() -> Self {
        Self(None)
    }

    /// Holds `hold` (a connection holding a lock, say) until dropped.
    pub fn holding(hold: impl std::any::Any + Send + Sync) -> Self {
        Self(Some(Box::new(hold)))
    }
}

impl std::fmt::Debug for SoleFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "SoleFront(held)"
        } else {
            "SoleFront(nothing to hold)"
        })
    }
}

/// A store that can be a tier: the hot tier in front (every in-progress and
/// recent record) or the cold tier behind (completed history).
///
/// # Cancel safety
///
/// As for [`Store`]: each item of an `import_many` takes full effect or
/// none, and importing the same records again is harmless (a live
/// completed record is kept).
pub trait Tier: Store {
    /// Whether the store forgets everything, the tokens it issued included,
    /// when the process ends (the memory store). A tiered store reserves
    /// such a hot tier's tokens in its cold tier.
    const VOLATILE: bool = false;

    /// Writes each completed record as given (token, fingerprint, outcome,
    /// `completed_at`, `expires_at`), in one round trip where the store
    /// can. A key's live completed record is kept; a record in progress,
    /// an expired one or none is replaced; a record that has already
    /// expired is not written. Every token the store issues for the key
    /// afterwards exceeds the imported one, and
    /// [`token_high_water`](Tier::token_high_water) counts it.
    fn import_many(
        &self,
        items: &[ImportItem],
    ) -> impl Future<Output = Result<Vec<Imported>, StoreError>> + Send;

    /// Makes every token the store issues from now on exceed `floor`, and
    /// [`token_high_water`](Tier::token_high_water) at least `floor` (a
    /// durable store keeps it across restarts: a tiered store reserves
    /// blocks of its hot tier's tokens this way). A store whose tokens
    /// follow a server's clock waits up to a second for that clock to pass
    /// the floor, then fails saying so.
    fn raise_token_floor(
        &self,
        floor: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Keeps `token` in the [`token_high_water`](Tier::token_high_water)
    /// mark (durably, in a durable store) without waiting for anything: a
    /// tiered store reserves its hot tier's tokens in its cold tier this
    /// way. By default [`raise_token_floor`](Tier::raise_token_floor),
    /// which does that and more; a store whose tokens follow a server's
    /// clock only stores the mark, since raising its floor may wait.
    fn record_high_water(
        &self,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.raise_token_floor(token)
    }

    /// A token at least as large as every token the store holds, has
    /// issued or imported, every floor raised and every mark recorded;
    /// kept across restarts by a durable store.
    fn token_high_water(&self) -> impl Future<Output = Result<FencingToken, StoreError>> + Send;

    /// Whether the store keeps a list of [`Handover`]s
    /// ([`list_handovers`](Tier::list_handovers)) as durably as its
    /// records, outliving the process (Redis). A tiered store in front of
    /// such a hot tier acknowledges a completion once the hot tier holds it
    /// and has it listed: a process that opens the store later moves to
    /// the cold tier what a crashed one left on the list.
    const KEEPS_HANDOVERS: bool = false;

    /// Keeps each completed record of `items` (the key's record completed
    /// by that token) at most `keep` past its `completed_at`: a tiered
    /// store shortens its hot copy this way once the cold tier holds the
    /// record. A record of another token, in progress, or gone is left
    /// alone. By default nothing changes: the record is kept for its
    /// whole retention, which is never wrong, only larger.
    fn shorten(
        &self,
        items: &[Handover],
        keep: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (items, keep);
        async { Ok(()) }
    }

    /// Adds `items` to the list of handovers named `list` (one per cold
    /// tier the store is in front of), each listed now (a handover listed
    /// again is listed anew). Only a store that
    /// [keeps handovers](Tier::KEEPS_HANDOVERS) does; others answer an
    /// error.
    fn list_handovers(
        &self,
        list: &str,
        items: &[Handover],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (list, items);
        async {
            Err(StoreError::unavailable(
                "this store keeps no list of handovers (Tier::KEEPS_HANDOVERS is false)",
            ))
        }
    }

    /// Up to `limit` handovers of `list` listed longer than `listed_for`
    /// ago, each
    /// listed anew as it is answered, so that of several processes
    /// sweeping the list one takes a handover at a time (until it too has
    /// been listed `listed_for`). Empty for a store that keeps no list.
    fn due_handovers(
        &self,
        list: &str,
        listed_for: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Handover>, StoreError>> + Send {
        let _ = (list, listed_for, limit);
        async { Ok(Vec::new()) }
    }

    /// Removes `items` from `list` (those not on it are ignored). Nothing
    /// to do for a store that keeps no list.
    fn unlist_handovers(
        &self,
        list: &str,
        items: &[Handover],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (list, items);
        async { Ok(()) }
    }

    /// Whether the store keeps [`SharedFilter`]s: every process that uses
    /// it sees one filter, so none calls new a key another one moved to
    /// the cold tier.
    const SHARES_FILTER: bool = false;

    /// The filter named `proposed.name` as the store keeps it: `proposed`
    /// when the store had none of that name (it is kept from then on),
    /// else the one kept first, which every process then uses alike.
    fn agree_filter(
        &self,
        proposed: &SharedFilter,
    ) -> impl Future<Output = Result<SharedFilter, StoreError>> + Send {
        let _ = proposed;
        async {
            Err(StoreError::unavailable(
                "this store keeps no shared key filter (Tier::SHARES_FILTER is false)",
            ))
        }
    }

    /// Adds `probes` to the generation of `filter` receiving keys now.
    fn filter_insert(
        &self,
        filter: &SharedFilter,
        probes: &[FilterProbe],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (filter, probes);
        async {
            Err(StoreError::unavailable(
                "this store keeps no shared key filter",
            ))
        }
    }

    /// For each probe, whether its key may have been inserted into a live
    /// generation (`true`, "maybe") or certainly was not (`false`). Every
    /// answer is "maybe" where the filter is not ready.
    fn filter_check(
        &self,
        filter: &SharedFilter,
        probes: &[FilterProbe],
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send {
        let _ = filter;
        let all = vec![true; probes.len()];
        async move { Ok(all) }
    }

    /// Whether `filter` is ready everywhere in the store (rebuilt, and not
    /// lost since).
    fn filter_ready(
        &self,
        filter: &SharedFilter,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = filter;
        async { Ok(false) }
    }

    /// Marks `filter` ready: every key of the cold tier was inserted.
    fn filter_mark_ready(
        &self,
        filter: &SharedFilter,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = filter;
        async {
            Err(StoreError::unavailable(
                "this store keeps no shared key filter",
            ))
        }
    }

    /// Takes, or renews when `holder` has it, the right to rebuild
    /// `filter` for `hold`; whether `holder` has it now.
    fn filter_rebuild_lease(
        &self,
        filter: &SharedFilter,
        holder: &str,
        hold: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = (filter, holder, hold);
        async { Ok(false) }
    }

    /// Holds the store, for as long as the answer lives, as the cold tier
    /// of this process alone. Two processes, each with a memory hot tier
    /// in front of one cold tier, would share no claims: each could hold
    /// the same key at once. A second process asking fails, saying so. By
    /// default nothing is held: right for a store one process alone can
    /// open (the file store locks its directory; memory).
    fn hold_sole_front(&self) -> impl Future<Output = Result<SoleFront, StoreError>> + Send {
        async { Ok(SoleFront::nothing()) }
    }

    /// The latest `expires_at` of any completed record the store holds
    /// (`None`: none, or the store cannot tell cheaply), or later: a
    /// tiered store refuses a key filter that would forget keys the cold
    /// tier still holds. An index lookup where the store has one.
    fn latest_expiry(&self) -> impl Future<Output = Result<Option<Timestamp>, StoreError>> + Send {
        async { Ok(None) }
    }

    /// Up to `limit` live completed records completed at or after `since`,
    /// each after `after` (the last entry of the page before), in an order
    /// the store chooses; `None` when the store cannot list its records by
    /// completion time (then read every key with
    /// [`completed_keys`](Tier::completed_keys)). A key filter loaded from
    /// a snapshot is caught up with these: the keys written since. An
    /// index range where the store has one.
    fn completed_since(
        &self,
        since: Timestamp,
        after: Option<&CompletedKey>,
        limit: usize,
    ) -> impl Future<Output = Result<Option<Vec<CompletedKey>>, StoreError>> + Send {
        let _ = (since, after, limit);
        async { Ok(None) }
    }

    /// Up to `limit` keys of live completed records, in [`Key::encode`]
    /// order, after `after` (exclusive): a page of every namespace's
    /// completed keys, to rebuild a pre-filter from.
    fn completed_keys(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Key>, StoreError>> + Send;
}
