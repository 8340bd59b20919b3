//! The operator's view of a file store (docs/contract.md §2, "Operations
//! for operators").
//!
//! Claims in progress live in this process's memory, so `stats` and
//! `purge` see them only in the process that holds the store open (the
//! `idem serve` using it); opened from outside, a store has none.

use std::collections::HashSet;

use fjall::Slice;
use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use idem_core::admin::{Admin, NamespaceStats, Purge, StoreSize};
use idem_core::{Key, Namespace, StoreError, Timestamp};

use crate::codec::decode_completed;
use crate::commit::Job;
use crate::failure::WriteFailed;
use crate::{FileStore, Inner, corrupt, off_workers, read_failed};

/// Records one purge batch deletes.
const PURGE_BATCH: usize = 4096;

impl Admin for FileStore {
    fn namespaces(&self) -> BoxFuture<'_, Result<Vec<Namespace>, StoreError>> {
        let inner = self.records().clone();
        async move { off_workers(&inner, namespaces).await? }.boxed()
    }

    fn stats<'a>(
        &'a self,
        namespace: &'a Namespace,
    ) -> BoxFuture<'a, Result<NamespaceStats, StoreError>> {
        let inner = self.records().clone();
        let namespace = namespace.clone();
        async move { off_workers(&inner, move |inner| stats(inner, &namespace)).await? }.boxed()
    }

    fn size(&self) -> BoxFuture<'_, Result<Option<StoreSize>, StoreError>> {
        let inner = self.records().clone();
        async move {
            let bytes = inner.db.disk_space().map_err(StoreError::unavailable)?;
            Ok(Some(StoreSize {
                bytes,
                what: "on disk (journals and tables)".into(),
            }))
        }
        .boxed()
    }

    fn purge<'a>(
        &'a self,
        namespace: &'a Namespace,
        what: Purge,
        progress: &'a (dyn Fn(u64) + Send + Sync),
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        let inner = self.records().clone();
        async move {
            inner.check_healthy()?;
            let prefix = Key::encode_namespace(namespace);
            let mut removed = 0u64;
            if what == Purge::All {
                for shard in inner.claims.shards() {
                    let mut shard = shard.lock();
                    let before = shard.claims.len();
                    shard
                        .claims
                        .retain(|k, c| c.completing || !k.starts_with(&prefix));
                    removed += (before - shard.claims.len()) as u64;
                }
            }
            progress(removed);
            let expired_by = (what == Purge::Expired).then(|| inner.clock.now());
            let mut after: Option<Slice> = None;
            loop {
                let (p, a) = (prefix.clone(), after.clone());
                let keys = off_workers(&inner, move |inner| {
                    next_keys(inner, &p, a.as_ref(), expired_by)
                })
                .await??;
                let Some(last) = keys.last().cloned() else {
                    return Ok(removed);
                };
                let (done, answer) = std::sync::mpsc::sync_channel(1);
                inner.send(Job::Purge {
                    keys,
                    expired_by,
                    done,
                })?;
                let inner2 = inner.clone();
                let went = off_workers(&inner, move |_| answer.recv())
                    .await?
                    .map_err(|_| inner2.engine_failed(WriteFailed::committer_stopped()))?
                    .map_err(|e| inner2.engine_failed(e))?;
                removed += went as u64;
                progress(removed);
                after = Some(last);
            }
        }
        .boxed()
    }
}

/// The next [`PURGE_BATCH`] keys under `prefix` after `after`, all of them
/// or only those expired by `expired_by`.
fn next_keys(
    inner: &Inner,
    prefix: &[u8],
    after: Option<&Slice>,
    expired_by: Option<Timestamp>,
) -> Result<Vec<Slice>, StoreError> {
    let start: Vec<u8> = match after {
        Some(a) => [&a[..], &[0]].concat(),
        None => prefix.to_vec(),
    };
    let mut keys = Vec::new();
    for item in inner.records.range(start..) {
        let (k, v) = item.into_inner().map_err(read_failed)?;
        if !k.starts_with(prefix) || keys.len() == PURGE_BATCH {
            break;
        }
        if let Some(by) = expired_by {
            let r = decode_completed(&v).map_err(|e| corrupt(&k, e))?;
            if r.expires_at > by {
                continue;
            }
        }
        keys.push(k);
    }
    Ok(keys)
}

/// A namespace's claims (this process's) and stored records, counted.
fn stats(inner: &Inner, namespace: &Namespace) -> Result<NamespaceStats, StoreError> {
    inner.check_healthy()?;
    let prefix = Key::encode_namespace(namespace);
    let now = inner.clock.now();
    let mut out = NamespaceStats::default();
    let mut claimed = HashSet::new();
    for shard in inner.claims.shards() {
        for (k, c) in shard.lock().claims.iter() {
            if !k.starts_with(&prefix) {
                continue;
            }
            claimed.insert(k.clone());
            out.count_claim(c.completing || c.lease_expires_at > now, c.started_at);
        }
    }
    for item in inner.records.prefix(&prefix) {
        let (k, v) = item.into_inner().map_err(read_failed)?;
        if claimed.contains(&k[..]) {
            continue;
        }
        let r = decode_completed(&v).map_err(|e| corrupt(&k, e))?;
        if r.expires_at > now {
            out.completed += 1;
        } else {
            out.expired += 1;
        }
    }
    Ok(out)
}

/// Every namespace with a claim here or a stored record, in order. The
/// records are visited one namespace at a time: one seek each.
fn namespaces(inner: &Inner) -> Result<Vec<Namespace>, StoreError> {
    inner.check_healthy()?;
    let mut found = std::collections::BTreeSet::new();
    for shard in inner.claims.shards() {
        for k in shard.lock().claims.keys() {
            if let Ok(key) = Key::decode(k) {
                found.insert(key.namespace().clone());
            }
        }
    }
    let mut from: Vec<u8> = Vec::new();
    loop {
        let Some(item) = inner.records.range(from.clone()..).next() else {
            break;
        };
        let k = item.key().map_err(read_failed)?;
        let key = Key::decode(&k).map_err(|e| corrupt(&k, e))?;
        let mut prefix = Key::encode_namespace(key.namespace());
        found.insert(key.namespace().clone());
        // Namespaces are ASCII: the last byte can always be raised.
        *prefix.last_mut().expect("a namespace is never empty") += 1;
        from = prefix;
    }
    Ok(found.into_iter().collect())
}
