//! The store: its shared state, and the `Store` contract
//! (docs/contract.md §2) on either database.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use idem_core::coalesce::{Batched, StoreBatches};
use idem_core::layer::{Checked, StoreWrapper};
use idem_core::{
    Begin, BeginItem, CompleteItem, Entry, Fenced, FencingToken, Fingerprint, Key, Lease, Limits,
    Record, ScanQuery, Store, StoreError, Timestamp,
};

use crate::builder::{ITEMS_PER_STATEMENT, SqlStoreBuilder};
use crate::error::retryable;
#[cfg(feature = "mysql")]
use crate::mysql::MySql;
use crate::pg::Postgres;
use crate::sweep::Sweeper;
use crate::table::Tables;

/// How often a statement the server rolled back for a deadlock, or whose
/// rows changed under it, is tried before the call gives up.
const TRIES: usize = 8;

/// A store whose records live in PostgreSQL or MySQL/MariaDB tables; see
/// the [crate docs](crate). Clones share one connection pool. It is also a
/// [`Tier`](idem_core::tier::Tier), usually the cold one: `import_many`
/// writes a batch as one statement per table.
///
/// Each operation's write is one statement in autocommit, so the server
/// applies it whole or not at all. On PostgreSQL that statement also reads
/// what the operation answers; on MySQL, which returns no rows from a
/// write, a second statement reads them (`begin` and `extend` send theirs
/// in the same round trip; `complete` reads only when an item was not
/// taken). `begin_many` sends one statement per shard and 512 items; when
/// some statements fail, it answers the error and releases the claims the
/// others made, since the caller gets no tokens to complete them.
///
/// # Cancel safety
///
/// Cancel safe. A dropped call either never reached the server or runs to
/// its end there, as if only its answer were lost:
///
/// - `begin`, `begin_many`: a claim whose caller left is released when the
///   store learns of it (a claim made in a batch), or otherwise ends with
///   its lease.
/// - `complete`, `complete_many`: a completion stands, and its holder's
///   retried `complete` answers `Ok`.
/// - `release`, `extend`: the update is applied or not.
/// - `get`, `scan`, `token_high_water`, `completed_keys` read only.
/// - `import_many`: each table's part of the batch (one statement, or a
///   few when it is larger than a statement carries; on MySQL each in a
///   transaction with the read that tells what it wrote) is applied whole
///   or not at all; importing the same records again keeps what was
///   written.
/// - `raise_token_floor`, `record_high_water`: the mark is written or not;
///   a call that returned `Ok` has written it.
///
/// The pool reads what the server still had to say on a dropped call's
/// connection before lending it again.
#[derive(Clone)]
pub struct SqlStore {
    store: Checked<Records>,
}

/// A SQL store's operations, behind the limit checks [`Checked`] makes; its
/// cancel safety is documented on [`SqlStore`].
#[derive(Clone)]
pub struct Records {
    pub(crate) inner: Arc<Inner>,
    pub(crate) batches: Arc<StoreBatches>,
    pub(crate) _sweeper: Option<Arc<Sweeper>>,
}

pub(crate) enum Db {
    Postgres(Postgres),
    #[cfg(feature = "mysql")]
    MySql(MySql),
}

pub(crate) struct Inner {
    pub(crate) db: Db,
    pub(crate) tables: Tables,
    pub(crate) limits: Limits,
    pub(crate) abandoned_ms: i64,
    pub(crate) tombstone_ms: i64,
    pub(crate) sweep_batch: i64,
    pub(crate) description: String,
}

impl SqlStore {
    pub(crate) fn new(records: Records) -> Self {
        Self {
            store: Checked::new(records),
        }
    }

    /// The store's shared state.
    pub(crate) fn records(&self) -> &Arc<Inner> {
        &self.store.inner().inner
    }

    /// Configures a store for the database at `url`:
    /// `postgres://USER[:PASSWORD]@HOST:PORT/DB` or
    /// `mysql://USER[:PASSWORD]@HOST:PORT/DB`, optionally with
    /// `?shards=N&table=PREFIX&pool_size=N` and the driver's own settings
    /// (`sslmode=require`, `ssl-mode=REQUIRED`, …).
    pub fn builder(url: &str) -> SqlStoreBuilder {
        SqlStoreBuilder::new(url)
    }

    /// Connects to `url` with default settings; see [`SqlStore::builder`].
    ///
    /// # Cancel safety
    ///
    /// As [`SqlStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, crate::OpenError> {
        Self::builder(url).connect().await
    }

    /// Deletes every expired row now, a bounded batch per statement;
    /// returns how many. Live records are never deleted.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: each statement deletes its batch or nothing.
    pub async fn sweep(&self) -> Result<u64, StoreError> {
        self.records().sweep().await
    }

    /// The tables, for operations.
    pub fn tables(&self) -> &Tables {
        &self.records().tables
    }

    /// Which server and URL this store uses, without the password.
    pub fn description(&self) -> &str {
        &self.records().description
    }
}

impl StoreWrapper for SqlStore {
    type Inner = Checked<Records>;

    fn inner(&self) -> &Checked<Records> {
        &self.store
    }
}

/// Runs `op` again while it fails with a deadlock or serialization
/// failure, which the server rolled back whole.
pub(crate) async fn retrying<T, F, Fut>(op: F) -> Result<T, StoreError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut tries = 1;
    loop {
        match op().await {
            Err(e) if retryable(&e) && tries < TRIES => tries += 1,
            other => return other,
        }
    }
}

/// Most bytes of values one batch statement carries, so that a batch of
/// large outcomes goes as several statements: a MySQL server refuses a
/// statement over its `max_allowed_packet` (4 MiB in old defaults, 16 MiB
/// in MariaDB's, 64 MiB in MySQL 8's), and smaller statements hold their
/// rows' locks for less time.
pub(crate) const OUTCOME_BYTES_PER_STATEMENT: usize = 1 << 20;

/// Cuts `idx` into statements of at most `items` items and `budget` bytes
/// (a larger item goes alone).
pub(crate) fn statements(
    idx: &[usize],
    items: usize,
    budget: usize,
    item_bytes: impl Fn(usize) -> usize,
) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0;
    for &i in idx {
        let size = item_bytes(i);
        match out.last_mut() {
            Some(last) if last.len() < items && bytes + size <= budget => {
                last.push(i);
                bytes += size;
            }
            _ => {
                out.push(vec![i]);
                bytes = size;
            }
        }
    }
    out
}

/// A key's bytes in a statement: its namespace and key.
pub(crate) fn key_bytes(key: &Key) -> usize {
    key.namespace().as_str().len() + key.bytes().len()
}

impl Db {
    /// Most bytes of values one batch statement carries.
    fn statement_bytes(&self) -> usize {
        match self {
            Db::Postgres(_) => OUTCOME_BYTES_PER_STATEMENT,
            #[cfg(feature = "mysql")]
            Db::MySql(my) => my.statement_bytes,
        }
    }

    /// The bytes one `begin` item takes in a statement: on MySQL its key
    /// goes as hexadecimal text, twice (the upsert and the read back).
    fn begin_bytes(&self, key: &Key) -> usize {
        match self {
            Db::Postgres(_) => key_bytes(key),
            #[cfg(feature = "mysql")]
            Db::MySql(_) => 4 * key_bytes(key) + 200,
        }
    }
}

/// The order of the tables' primary key: namespace, then key, bytewise.
pub(crate) fn in_row_order(a: &Key, b: &Key) -> std::cmp::Ordering {
    (a.namespace().as_str().as_bytes(), &a.bytes()[..])
        .cmp(&(b.namespace().as_str().as_bytes(), &b.bytes()[..]))
}

/// Splits `n` items into rounds in which no key appears twice: an item
/// goes in the round after its key's previous appearance, so the rounds,
/// run in order, answer as if the items ran one after another.
pub(crate) fn rounds<'a>(keys: impl Iterator<Item = &'a Key>) -> Vec<Vec<usize>> {
    let mut seen: HashMap<&Key, usize> = HashMap::new();
    let mut out: Vec<Vec<usize>> = Vec::new();
    for (i, key) in keys.enumerate() {
        let round = seen.entry(key).and_modify(|r| *r += 1).or_insert(0);
        if out.len() <= *round {
            out.push(Vec::new());
        }
        out[*round].push(i);
    }
    out
}

/// What `forget` turns into a tombstone: a live claim (`release`) or a
/// live completion (`reopen`), owned by the token given.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Forget {
    Claim,
    Completion,
}

/// The many-item calls the store's single calls are gathered into.
impl Batched for Inner {
    fn begin_items(
        &self,
        items: &[BeginItem],
    ) -> impl Future<Output = Vec<Result<Begin, StoreError>>> + Send {
        Inner::begin_items(self, items)
    }
    fn complete_items(
        &self,
        items: &[CompleteItem],
    ) -> impl Future<Output = Vec<Result<Fenced, StoreError>>> + Send {
        Inner::complete_items(self, items)
    }
    fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        Inner::release(self, key, token)
    }
}

impl Inner {
    pub(crate) fn shard(&self, key: &Key) -> u16 {
        self.tables.shard_of(key)
    }

    /// `begin` for each item, each answered on its own.
    pub(crate) async fn begin_items(&self, items: &[BeginItem]) -> Vec<Result<Begin, StoreError>> {
        let mut answers: Vec<Option<Result<Begin, StoreError>>> =
            std::iter::repeat_with(|| None).take(items.len()).collect();
        for round in rounds(items.iter().map(|i| &i.key)) {
            let mut pending = round;
            for _ in 0..TRIES {
                let mut by_shard: HashMap<u16, Vec<usize>> = HashMap::new();
                for &i in &pending {
                    by_shard
                        .entry(self.shard(&items[i].key))
                        .or_default()
                        .push(i);
                }
                let calls = by_shard.into_iter().flat_map(|(shard, mut idx)| {
                    // Rows locked in one order by every statement cannot
                    // deadlock each other.
                    idx.sort_by(|&a, &b| in_row_order(&items[a].key, &items[b].key));
                    statements(&idx, ITEMS_PER_STATEMENT, self.db.statement_bytes(), |i| {
                        self.db.begin_bytes(&items[i].key)
                    })
                    .into_iter()
                    .map(|chunk| {
                        let refs: Vec<&BeginItem> = chunk.iter().map(|&i| &items[i]).collect();
                        async move {
                            let answer = match &self.db {
                                Db::Postgres(pg) => pg.begin(shard, &refs, self.abandoned_ms).await,
                                #[cfg(feature = "mysql")]
                                Db::MySql(my) => my.begin(shard, &refs, self.abandoned_ms).await,
                            };
                            (chunk, answer)
                        }
                    })
                    .collect::<Vec<_>>()
                });
                pending = Vec::new();
                for (chunk, answer) in join_all(calls).await {
                    match answer {
                        Ok(found) => {
                            for (i, a) in chunk.into_iter().zip(found) {
                                match a {
                                    Some(a) => answers[i] = Some(Ok(a)),
                                    None => pending.push(i),
                                }
                            }
                        }
                        Err(e) if retryable(&e) => pending.extend(chunk),
                        Err(e) => {
                            for i in chunk {
                                answers[i] = Some(Err(e.copied()));
                            }
                        }
                    }
                }
                if pending.is_empty() {
                    break;
                }
            }
        }
        answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| {
                    Err(StoreError::unavailable(
                        "the record kept changing under begin; try again",
                    ))
                })
            })
            .collect()
    }

    /// `complete` for each item, each answered on its own.
    pub(crate) async fn complete_items(
        &self,
        items: &[CompleteItem],
    ) -> Vec<Result<Fenced, StoreError>> {
        let mut answers: Vec<Option<Result<Fenced, StoreError>>> =
            std::iter::repeat_with(|| None).take(items.len()).collect();
        for round in rounds(items.iter().map(|i| &i.key)) {
            let mut by_shard: HashMap<u16, Vec<usize>> = HashMap::new();
            for i in round {
                by_shard
                    .entry(self.shard(&items[i].key))
                    .or_default()
                    .push(i);
            }
            let calls = by_shard.into_iter().flat_map(|(shard, mut idx)| {
                idx.sort_by(|&a, &b| in_row_order(&items[a].key, &items[b].key));
                statements(&idx, ITEMS_PER_STATEMENT, self.db.statement_bytes(), |i| {
                    let item = &items[i];
                    item.outcome.as_ref().map_or(0, |o| o.len()) + key_bytes(&item.key)
                })
                .into_iter()
                .map(|chunk| async move {
                    let refs: Vec<&CompleteItem> = chunk.iter().map(|&i| &items[i]).collect();
                    let answer = retrying(|| async {
                        match &self.db {
                            Db::Postgres(pg) => pg.complete(shard, &refs).await,
                            #[cfg(feature = "mysql")]
                            Db::MySql(my) => my.complete(shard, &refs).await,
                        }
                    })
                    .await;
                    (chunk, answer)
                })
                .collect::<Vec<_>>()
            });
            for (chunk, answer) in join_all(calls).await {
                match answer {
                    Ok(done) => {
                        for (i, a) in chunk.into_iter().zip(done) {
                            answers[i] = Some(Ok(a));
                        }
                    }
                    Err(e) => {
                        for i in chunk {
                            answers[i] = Some(Err(e.copied()));
                        }
                    }
                }
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or(Ok(Fenced::Stale)))
            .collect()
    }

    pub(crate) async fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> Result<Fenced, StoreError> {
        self.forget(key, token, Forget::Claim).await
    }

    pub(crate) async fn reopen(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> Result<Fenced, StoreError> {
        self.forget(key, token, Forget::Completion).await
    }

    async fn forget(
        &self,
        key: &Key,
        token: FencingToken,
        what: Forget,
    ) -> Result<Fenced, StoreError> {
        let shard = self.shard(key);
        retrying(|| async {
            match &self.db {
                Db::Postgres(pg) => pg.forget(shard, key, token, what, self.tombstone_ms).await,
                #[cfg(feature = "mysql")]
                Db::MySql(my) => my.forget(shard, key, token, what, self.tombstone_ms).await,
            }
        })
        .await
    }

    pub(crate) async fn sweep(&self) -> Result<u64, StoreError> {
        let mut total = 0;
        for shard in 0..self.tables.shards() {
            loop {
                let n = retrying(|| async {
                    match &self.db {
                        Db::Postgres(pg) => pg.sweep(shard, self.sweep_batch).await,
                        #[cfg(feature = "mysql")]
                        Db::MySql(my) => my.sweep(shard, self.sweep_batch).await,
                    }
                })
                .await?;
                total += n;
                if n < u64::try_from(self.sweep_batch).unwrap_or(u64::MAX) {
                    break;
                }
            }
        }
        Ok(total)
    }
}

impl Store for Records {
    async fn begin(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> Result<Begin, StoreError> {
        let item = BeginItem {
            key: key.clone(),
            fingerprint,
            lease,
        };
        self.batches.begin(item).await
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
        self.batches.complete(item).await
    }

    async fn release(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        self.inner.release(key, token).await
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
        let inner = &self.inner;
        let shard = inner.shard(key);
        retrying(|| async {
            match &inner.db {
                Db::Postgres(pg) => {
                    pg.extend(shard, key, token, lease, inner.abandoned_ms)
                        .await
                }
                #[cfg(feature = "mysql")]
                Db::MySql(my) => {
                    my.extend(shard, key, token, lease, inner.abandoned_ms)
                        .await
                }
            }
        })
        .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let shard = self.inner.shard(key);
        retrying(|| async {
            match &self.inner.db {
                Db::Postgres(pg) => pg.get(shard, key).await,
                #[cfg(feature = "mysql")]
                Db::MySql(my) => my.get(shard, key).await,
            }
        })
        .await
    }

    async fn begin_many(&self, items: &[BeginItem]) -> Result<Vec<Begin>, StoreError> {
        let answers = self.inner.begin_items(items).await;
        if answers.iter().all(Result::is_ok) {
            return answers.into_iter().collect();
        }
        let made = items.iter().zip(&answers).filter_map(|(item, a)| match a {
            Ok(Begin::Acquired(claim)) => Some(self.inner.release(&item.key, claim.token)),
            _ => None,
        });
        for undone in join_all(made).await {
            if let Err(e) = undone {
                tracing::warn!(error = %e, "a claim of a failed begin_many stays until its lease ends");
            }
        }
        answers.into_iter().collect()
    }

    async fn complete_many(&self, items: &[CompleteItem]) -> Result<Vec<Fenced>, StoreError> {
        self.inner.complete_items(items).await.into_iter().collect()
    }

    async fn scan(&self, query: &ScanQuery) -> Result<Vec<Entry>, StoreError> {
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        let inner = &self.inner;
        let parts = join_all((0..inner.tables.shards()).map(|shard| {
            retrying(move || async move {
                match &inner.db {
                    Db::Postgres(pg) => pg.scan(shard, query).await,
                    #[cfg(feature = "mysql")]
                    Db::MySql(my) => my.scan(shard, query).await,
                }
            })
        }))
        .await;
        let mut all = Vec::new();
        for part in parts {
            all.extend(part?);
        }
        all.sort_by(|a, b| a.key.bytes().cmp(b.key.bytes()));
        all.truncate(query.limit);
        Ok(all)
    }

    fn limits(&self) -> &Limits {
        &self.inner.limits
    }
}
