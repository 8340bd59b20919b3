//! The file store as a tier (docs/contract.md §2, "Tiers"): imported
//! records are written as `complete` writes its own, through the committer,
//! a whole batch with one durable commit.

use std::ops::Bound;
use std::sync::Arc;

use fjall::Slice;
use idem_core::tier::{CompletedKey, ImportItem, Imported, Tier};
use idem_core::{FencingToken, Key, StoreError, Timestamp};
use tokio::sync::oneshot;

use crate::claims::{self, Claim, encoded};
use crate::codec::{completed_key, decode_completed, expires_at_of, split_expiry_key};
use crate::commit::{Job, Put};
use crate::failure::WriteFailed;
use crate::{FileStore, Inner, corrupt, off_workers, read_failed};

impl Inner {
    /// When the completed record stored for `encoded` expires, if there is
    /// one: what an import decides on, without copying the outcome.
    fn read_expiry(&self, encoded: &[u8]) -> Result<Option<Timestamp>, StoreError> {
        let value = self.records.get(encoded).map_err(read_failed)?;
        value
            .map(|v| expires_at_of(&v).map_err(|e| corrupt(encoded, e)))
            .transpose()
    }

    /// `import_many`, its items already checked against the limits.
    ///
    /// Reads every stored record first, off the async workers and outside
    /// the shards' locks. Then, with no await in between, decides each item
    /// under its shard's lock and hands the records to the committer: a key
    /// it writes gets a claim that is already completing, so until the
    /// record is durable the key answers `InProgress`, and a holder it
    /// replaces is stale (its claim is gone).
    async fn import_many(
        self: &Arc<Self>,
        items: &[ImportItem],
    ) -> Result<Vec<Imported>, StoreError> {
        self.check_healthy()?;
        let keys: Vec<Box<[u8]>> = items.iter().map(|i| encoded(&i.key)).collect();
        // Each shard's count of finished completions before the reads: an
        // item whose shard finished one meanwhile is read again.
        let finished: Vec<u64> = keys.iter().map(|k| self.claims.lock(k).finished).collect();
        let (keys, stored) = off_workers(self, move |inner| {
            let stored: Result<Vec<_>, _> = keys.iter().map(|k| inner.read_expiry(k)).collect();
            (keys, stored)
        })
        .await?;
        let mut stored = stored?;

        let now = self.clock.now();
        let mut answers = Vec::with_capacity(items.len());
        let mut puts = Vec::new();
        let mut high_water = None;
        let mut failed = None;
        for (i, (item, enc)) in items.iter().zip(keys).enumerate() {
            let record = &item.record;
            if record.expires_at <= now {
                answers.push(Imported::Kept);
                continue;
            }
            let mut shard = self.claims.lock(&enc);
            let write = match shard.claims.get(&enc) {
                // A completion (or an import) in flight is a live completed
                // record as soon as it is durable, and a failed one fails
                // the store: keep it.
                Some(claim) => !claim.completing,
                None => {
                    let current = if shard.finished == finished[i] {
                        stored[i].take()
                    } else {
                        // Rare: read again, under the lock, so the decision
                        // is made on what is stored now.
                        match self.read_expiry(&enc) {
                            Ok(current) => current,
                            Err(e) => {
                                // The items decided so far are still
                                // handed over below, so no claim is left
                                // completing.
                                failed = Some(e);
                                break;
                            }
                        }
                    };
                    current.is_none_or(|expires_at| expires_at <= now)
                }
            };
            if !write {
                answers.push(Imported::Kept);
                continue;
            }
            let token = record.token.get();
            shard.claims.insert(
                enc.clone(),
                Claim {
                    token,
                    fingerprint: record.fingerprint,
                    lease_expires_at: now,
                    attempts: 1,
                    started_at: now,
                    completing: true,
                    waiters: Vec::new(),
                },
            );
            drop(shard);
            puts.push(Put::new(enc, record, token));
            high_water = high_water.max(Some(token));
            answers.push(Imported::Written);
        }
        if let Some(high_water) = high_water {
            self.tokens.lift_above(high_water);
            let owned: Vec<(Slice, u64)> = puts.iter().map(|p| (p.key.clone(), p.token)).collect();
            let (done, answer) = oneshot::channel();
            self.send(Job::Put {
                puts,
                high_water: Some(high_water),
                done,
            })?;
            match claims::Finishing::new(&self.claims, owned, answer)
                .wait()
                .await
            {
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(self.engine_failed(e)),
                None => return Err(self.engine_failed(WriteFailed::committer_stopped())),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(answers),
        }
    }

    /// Makes every later token exceed `floor`: in memory at once, and
    /// durably as the high-water mark unless the durable token ceiling is
    /// above it already.
    async fn raise_token_floor(&self, floor: u64) -> Result<(), StoreError> {
        self.check_healthy()?;
        self.tokens.lift_above(floor);
        if self.tokens.durably_above(floor) {
            return Ok(());
        }
        let (done, answer) = oneshot::channel();
        self.send(Job::Put {
            puts: Vec::new(),
            high_water: Some(floor),
            done,
        })?;
        match answer.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.engine_failed(e)),
            Err(_) => Err(self.engine_failed(WriteFailed::committer_stopped())),
        }
    }

    /// Up to `limit` keys of live completed records after `after`, in
    /// encoded order: a range read of `records`, which holds completed
    /// records only, reading each record's expiry from its header.
    fn latest_expiry(&self) -> Result<Option<Timestamp>, StoreError> {
        self.check_healthy()?;
        let Some(last) = self.expiry.last_key_value() else {
            return Ok(None);
        };
        let key = last.key().map_err(read_failed)?;
        Ok(split_expiry_key(&key).map(|(at, _)| at))
    }

    /// Live completed records completed at or after `since`, after
    /// `after`, in completion index order; `None` when the index starts
    /// after `since`.
    fn completed_since(
        &self,
        since: Timestamp,
        after: Option<&CompletedKey>,
        limit: usize,
    ) -> Result<Option<Vec<CompletedKey>>, StoreError> {
        self.check_healthy()?;
        if since < self.completed_from {
            return Ok(None);
        }
        let now = self.clock.now();
        let start = match after {
            Some(a) => Bound::Excluded(completed_key(a.at, &a.key.encode())),
            None => Bound::Included(completed_key(since, &[])),
        };
        let mut found = Vec::new();
        if limit == 0 {
            return Ok(Some(found));
        }
        for item in self
            .completed
            .range::<Vec<u8>, _>((start, Bound::Unbounded))
        {
            let index_key = item.key().map_err(read_failed)?;
            let Some((at, enc)) = split_expiry_key(&index_key) else {
                return Err(corrupt(
                    &index_key,
                    "a completion index key shorter than 8 bytes",
                ));
            };
            // An entry names the record as it was written; one written over
            // since, or expired, is left out.
            let Some(v) = self.records.get(enc).map_err(read_failed)? else {
                continue;
            };
            let record = decode_completed(&v).map_err(|e| corrupt(enc, e))?;
            if record.completed_at != at || record.expires_at <= now {
                continue;
            }
            let key = Key::decode(enc).map_err(|e| corrupt(enc, e))?;
            found.push(CompletedKey { at, key });
            if found.len() == limit {
                break;
            }
        }
        Ok(Some(found))
    }

    fn completed_keys(&self, after: Option<&[u8]>, limit: usize) -> Result<Vec<Key>, StoreError> {
        self.check_healthy()?;
        let now = self.clock.now();
        let start = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        let mut keys = Vec::new();
        if limit == 0 {
            return Ok(keys);
        }
        for item in self.records.range::<&[u8], _>((start, Bound::Unbounded)) {
            let (k, v) = item.into_inner().map_err(read_failed)?;
            if expires_at_of(&v).map_err(|e| corrupt(&k, e))? > now {
                keys.push(Key::decode(&k).map_err(|e| corrupt(&k, e))?);
                if keys.len() == limit {
                    break;
                }
            }
        }
        Ok(keys)
    }
}

/// The file store as a tier, usually the cold one behind a memory store:
/// its tokens come from the store-wide sequence, which imports and raised
/// floors only ever lift, and the largest of those is kept in the `meta`
/// keyspace, written in the same batch as the records that raise it.
impl Tier for FileStore {
    async fn import_many(&self, items: &[ImportItem]) -> Result<Vec<Imported>, StoreError> {
        let inner = self.records();
        inner.limits.check_import_items(items)?;
        inner.import_many(items).await
    }

    async fn raise_token_floor(&self, floor: FencingToken) -> Result<(), StoreError> {
        self.records().raise_token_floor(floor.get()).await
    }

    async fn token_high_water(&self) -> Result<FencingToken, StoreError> {
        let inner = self.records();
        inner.check_healthy()?;
        Ok(FencingToken::new(inner.tokens.high_water()))
    }

    /// The last entry of the expiry index (which may still name a record
    /// replaced since: later, never earlier).
    async fn latest_expiry(&self) -> Result<Option<Timestamp>, StoreError> {
        off_workers(self.records(), |inner| inner.latest_expiry()).await?
    }

    async fn completed_since(
        &self,
        since: Timestamp,
        after: Option<&CompletedKey>,
        limit: usize,
    ) -> Result<Option<Vec<CompletedKey>>, StoreError> {
        let after = after.cloned();
        off_workers(self.records(), move |inner| {
            inner.completed_since(since, after.as_ref(), limit)
        })
        .await?
    }

    async fn completed_keys(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        let after = after.map(Key::encode);
        off_workers(self.records(), move |inner| {
            inner.completed_keys(after.as_deref(), limit)
        })
        .await?
    }
}
