//! What a store offers to serve as a tier of a tiered store
//! (docs/contract.md §2, "Tiers"): taking completed records with their
//! own tokens and times, issuing tokens above a floor, and listing the
//! keys it holds.

use std::future::Future;

use crate::{Completed, FencingToken, Key, Store, StoreError};

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

    /// Up to `limit` keys of live completed records, in [`Key::encode`]
    /// order, after `after` (exclusive): a page of every namespace's
    /// completed keys, to rebuild a pre-filter from.
    fn completed_keys(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Key>, StoreError>> + Send;
}
