//! The store's own operations, behind the limit checks that
//! [`Checked`](idem_core::layer::Checked) makes in front of them.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem_core::{
    Begin, BeginItem, CompleteItem, Entry, Fenced, FencingToken, Fingerprint, Key, Lease, Limits,
    Record, ScanQuery, Store, StoreError, Timestamp,
};

use crate::{Inner, off_workers};

/// A file store's records and claims; its cancel safety is documented on
/// [`FileStore`](crate::FileStore).
#[derive(Clone)]
pub struct Records {
    pub(crate) inner: Arc<Inner>,
}

impl Store for Records {
    async fn begin(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> Result<Begin, StoreError> {
        self.inner.begin(key, fingerprint, lease)
    }

    async fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> Result<Fenced, StoreError> {
        let item = CompleteItem {
            key: key.clone(),
            token,
            outcome,
            retention,
        };
        let mut answers = self
            .inner
            .complete_many(std::slice::from_ref(&item))
            .await?;
        Ok(answers.pop().expect("one answer per item"))
    }

    async fn release(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        self.inner.with_owned(key, token, |shard, enc, _| {
            shard.claims.remove(&enc);
        })
    }

    async fn reopen(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        self.inner.reopen(key, token).await
    }

    async fn extend(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Lease,
    ) -> Result<Fenced<Timestamp>, StoreError> {
        self.inner.with_owned(key, token, |shard, enc, now| {
            let claim = shard.claims.get_mut(&enc).expect("the claim is owned");
            claim.lease_expires_at = now.after(lease.duration());
            claim.lease_expires_at
        })
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key)
    }

    async fn begin_many(&self, items: &[BeginItem]) -> Result<Vec<Begin>, StoreError> {
        let items = items.to_vec();
        off_workers(&self.inner, move |inner| {
            items
                .iter()
                .map(|i| inner.begin(&i.key, i.fingerprint, i.lease))
                .collect()
        })
        .await?
    }

    async fn complete_many(&self, items: &[CompleteItem]) -> Result<Vec<Fenced>, StoreError> {
        self.inner.complete_many(items).await
    }

    async fn scan(&self, query: &ScanQuery) -> Result<Vec<Entry>, StoreError> {
        let query = query.clone();
        off_workers(&self.inner, move |inner| inner.scan(&query)).await?
    }

    fn limits(&self) -> &Limits {
        &self.inner.limits
    }
}
