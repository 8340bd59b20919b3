//! The store: its shared state, and the `Store` contract
//! (docs/contract.md §2) on Redis.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem_core::layer::{Checked, StoreWrapper};
use idem_core::{
    Begin, BeginItem, CompleteItem, DEFAULT_ABANDONED_RETENTION, Entry, Fenced, FencingToken,
    Fingerprint, Key, Lease, Limits, Record, ScanQuery, Store, StoreError, Timestamp,
};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Value};

use crate::builder::RedisStoreBuilder;
use crate::cluster::slot;
use crate::conn::{Conn, ConnectError};
use crate::layout::{key_in, millis, namespace_prefix, record_key};
use crate::lock::{self, Lock};
use crate::reply::{corrupt, fenced, number, parse_begin, parse_record, unavailable};
use crate::script::{ScriptItem, Scripts};
use idem_core::coalesce::{Batched, StoreBatches};

/// The Redis store; see the [crate docs](crate). Clones share one
/// multiplexed connection, which reconnects by itself after a Redis restart.
///
/// Limits are checked before a call reaches Redis (idem-core's `Checked`
/// layer), so a refused call sends nothing.
///
/// # Cancel safety
///
/// Every operation takes full effect or none when its future is dropped,
/// and leaves its key usable. Per operation:
///
/// - **`begin`**: one script call, alone or in a batch with the single
///   calls made at the same time. A call dropped while queued for the next
///   batch is not sent. One dropped after its batch was sent: if it claimed
///   the key, the claim is released as soon as the answer comes back, so a
///   redelivery acquires at once. One dropped after it went straight out
///   (nothing else was in flight): the script ran in full or not at all,
///   and a claim it made holds the key until its lease ends, then a
///   redelivery takes over.
/// - **`complete`**: one script call, alone or in a batch with the single
///   calls made at the same time; sent again by the token that completed
///   the record, it answers `Ok` and changes nothing. A call dropped while
///   queued for the next batch is not sent; one already sent takes full
///   effect. Either way the holder may send it again and learns the
///   outcome: `Ok` if it is (now) completed by its token.
/// - **`release`**: one script call, which ran in full or not at all. Sent
///   again after a dropped call that did run, it answers `Stale`, and the
///   key is free either way.
/// - **`extend`**: one script call, which ran in full or not at all;
///   sending it again extends again.
/// - **`get`**: one `GET`. Cancel safe: it changes nothing.
/// - **`begin_many`**: one script call per hash slot and lease, all in one
///   round trip; when some items fail, it answers the error and releases
///   the claims the call did make. Each item takes full effect or none.
///   Dropped after it was sent, the claims it made hold their keys until
///   their leases end, then redeliveries take over.
/// - **`complete_many`**: one script call per hash slot and retention, all
///   in one round trip; when some items fail, it answers the error, and
///   the items that were done stay done. Each item takes full effect or
///   none; sending the same items again answers `Ok` for those that were
///   done.
/// - **`scan`**: `SCAN` on each master, then the records in pipelined
///   `GET`s. Cancel safe: it changes nothing.
/// - **`import_many`** ([`Tier`](idem_core::tier::Tier)): the high-water
///   mark is raised first, then one script call per hash slot, all in one
///   round trip. Each item takes full effect or none. Dropped in between,
///   the mark stays raised with no record written, which is harmless (it
///   only bounds tokens from above); importing the same records again
///   keeps those already written.
/// - **`raise_token_floor`**: dropped, the floor is stored or not, and the
///   wait for Redis's clock may not have ended: raise it again before
///   relying on it.
/// - **`token_high_water`**, **`completed_keys`**: cancel safe: they change
///   nothing.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) store: Checked<Records>,
}

/// The store's operations, behind the limit checks [`Checked`] makes.
#[derive(Clone)]
pub struct Records {
    pub(crate) inner: Arc<Inner>,
    /// Sends single `begin`s and `complete`s, gathering concurrent ones
    /// into batches.
    pub(crate) batches: Arc<StoreBatches>,
}

/// A token is at least Redis's time in ms × this (`scripts/begin_first.lua`).
pub(crate) const TOKENS_PER_MS: u64 = 1024;

pub(crate) struct Inner {
    pub(crate) conn: Conn,
    /// Completions' own connection when they `WAIT` for replicas.
    pub(crate) waiting: Option<Conn>,
    /// For connections of their own (a lock waiter's `BLPOP`): the
    /// standalone Redis; on a cluster, the first seed node, whose settings
    /// serve for connecting to the others.
    pub(crate) client: Option<redis::Client>,
    pub(crate) scripts: Scripts,
    pub(crate) lock_scripts: lock::Scripts,
    pub(crate) limits: Limits,
    pub(crate) abandoned_ms: u64,
    pub(crate) tombstone_ms: u64,
    /// `WAIT` after completions: replicas, and how long to wait for them.
    pub(crate) replicas: Option<(u32, Duration)>,
    /// Whether Redis takes `SET` with both `NX` and `GET` (7.0 and later).
    pub(crate) nx_get: bool,
    /// The limit on connecting.
    pub(crate) timeout: Duration,
}

impl RedisStore {
    /// Connects to `url` (`redis://HOST:PORT[/DB]`) with default settings.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call leaves nothing behind but the
    /// connections it opened, which close.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::builder(url).connect().await
    }

    /// A distributed lock named `name` on this store's Redis; see [`Lock`].
    pub fn lock(&self, name: &str) -> Lock {
        Lock::new(self.state().clone(), name)
    }

    /// The store's shared state.
    pub(crate) fn state(&self) -> &Arc<Inner> {
        &self.store.inner().inner
    }

    /// Configures a store for the standalone Redis at `url`.
    pub fn builder(url: &str) -> RedisStoreBuilder {
        Self::configure(vec![url.to_owned()], false)
    }

    /// Configures a store for the Redis Cluster that `nodes` (URLs of some
    /// of its masters) belong to.
    pub fn cluster_builder(nodes: &[&str]) -> RedisStoreBuilder {
        Self::configure(nodes.iter().map(|n| (*n).to_owned()).collect(), true)
    }

    fn configure(nodes: Vec<String>, cluster: bool) -> RedisStoreBuilder {
        RedisStoreBuilder {
            nodes,
            cluster,
            limits: Limits::default(),
            abandoned_retention: DEFAULT_ABANDONED_RETENTION,
            tombstone_ttl: Duration::from_secs(3600),
            replicas: None,
            timeout: Duration::from_secs(2),
            coalesce: true,
            plain_commands: false,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

impl StoreWrapper for RedisStore {
    type Inner = Checked<Records>;

    fn inner(&self) -> &Checked<Records> {
        &self.store
    }
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
    pub(crate) fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// `begin` for `items`, in as few script calls as slots and leases
    /// allow; each item's answer on its own.
    pub(crate) async fn begin_items(&self, items: &[BeginItem]) -> Vec<Result<Begin, StoreError>> {
        let lease_of = |i: usize| millis(items[i].lease.duration());
        let calls = items
            .iter()
            .enumerate()
            .map(|(n, i)| ScriptItem {
                key: record_key(&i.key),
                group: lease_of(n),
            })
            .collect();
        let shared = |chunk: &[usize], cmd: &mut Cmd| {
            let lease = lease_of(chunk[0]);
            let life = lease.saturating_add(self.abandoned_ms).saturating_add(1);
            cmd.arg(if self.nx_get { "1" } else { "0" })
                .arg(lease)
                .arg(life);
        };
        let own = |i: usize, cmd: &mut Cmd| {
            match items[i].fingerprint {
                Some(f) => cmd.arg(&f.to_bytes()[..]),
                None => cmd.arg(""),
            };
        };
        let replies = self
            .run_script(&self.conn, &self.scripts.begin, calls, shared, own, 1)
            .await;
        replies
            .into_iter()
            .enumerate()
            .map(|(i, reply)| {
                let (head, v) = &reply?;
                // A lone first claim comes back as its token alone, which
                // is Redis's time × 1024.
                let now = match (head, v) {
                    (Value::Nil, Value::Int(token)) => {
                        u64::try_from(*token).ok().map(|t| t / TOKENS_PER_MS)
                    }
                    _ => number(head),
                };
                parse_begin(v, now.ok_or_else(|| corrupt("begin", head))?, lease_of(i))
            })
            .collect()
    }

    /// `complete` for `items`, in as few script calls as slots and
    /// retentions allow; each item's answer on its own.
    pub(crate) async fn complete_items(
        &self,
        items: &[CompleteItem],
    ) -> Vec<Result<Fenced, StoreError>> {
        let calls = items
            .iter()
            .map(|i| ScriptItem {
                key: record_key(&i.key),
                group: millis(i.retention),
            })
            .collect();
        let shared = |chunk: &[usize], cmd: &mut Cmd| {
            let retention = millis(items[chunk[0]].retention);
            let has_outcome: Vec<u8> = chunk
                .iter()
                .map(|&i| {
                    if items[i].outcome.is_some() {
                        b'1'
                    } else {
                        b'0'
                    }
                })
                .collect();
            cmd.arg(retention)
                .arg(retention.saturating_add(1))
                .arg(has_outcome);
        };
        let own = |i: usize, cmd: &mut Cmd| {
            let item = &items[i];
            cmd.arg(&item.token.get().to_le_bytes()[..])
                .arg(item.outcome.as_deref().unwrap_or(b""));
        };
        let conn = self.waiting.as_ref().unwrap_or(&self.conn);
        let replies = self
            .run_script(conn, &self.scripts.complete, calls, shared, own, 0)
            .await;
        let answers: Vec<Result<Fenced, StoreError>> = replies
            .into_iter()
            .map(|reply| fenced("complete", &reply?.1))
            .collect();
        if let Some((replicas, timeout)) = self.replicas {
            let done: Vec<&CompleteItem> = items
                .iter()
                .zip(&answers)
                .filter(|(_, a)| matches!(a, Ok(Fenced::Ok(()))))
                .map(|(i, _)| i)
                .collect();
            if !done.is_empty() {
                self.wait_for_replicas(conn, &done, replicas, timeout).await;
            }
        }
        answers
    }

    /// `release`, of a key already checked.
    pub(crate) async fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> Result<Fenced, StoreError> {
        self.tombstone(&self.scripts.release, "release", key, token)
            .await
    }

    /// `reopen`, of a key already checked.
    pub(crate) async fn reopen(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> Result<Fenced, StoreError> {
        self.tombstone(&self.scripts.reopen, "reopen", key, token)
            .await
    }

    /// Runs `script` (`release` or `reopen`), which turns the record
    /// `token` owns into a tombstone.
    async fn tombstone(
        &self,
        script: &redis::Script,
        name: &str,
        key: &Key,
        token: FencingToken,
    ) -> Result<Fenced, StoreError> {
        let v: Value = script
            .key(record_key(key))
            .arg(token.get().to_string())
            .arg(self.tombstone_ms)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        fenced(name, &v)
    }

    /// `WAIT` on the node of each item's key (all of them on a standalone
    /// Redis); too few replicas in time is logged, not an error.
    async fn wait_for_replicas(
        &self,
        conn: &Conn,
        items: &[&CompleteItem],
        replicas: u32,
        timeout: Duration,
    ) {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(replicas).arg(millis(timeout));
        let routes: Vec<Option<u16>> = match conn {
            Conn::Single(_) => vec![None],
            Conn::Cluster(_) => {
                let slots: std::collections::BTreeSet<u16> =
                    items.iter().map(|i| slot(&record_key(&i.key))).collect();
                slots.into_iter().map(Some).collect()
            }
        };
        for route in routes {
            let acked: Result<Value, _> = match (conn, route) {
                (Conn::Cluster(c), Some(slot)) => {
                    let target = redis::cluster_routing::Route::new(
                        slot,
                        redis::cluster_routing::SlotAddr::Master,
                    );
                    c.clone()
                        .route_command(
                            cmd.clone(),
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(target)),
                        )
                        .await
                }
                _ => cmd.query_async(&mut conn.clone()).await,
            };
            match acked.as_ref().ok().and_then(number) {
                Some(n) if n >= u64::from(replicas) => {}
                _ => tracing::warn!(
                    wanted = replicas,
                    answer = ?acked,
                    "fewer replicas than asked acknowledged a completion in time; it stands on the primary"
                ),
            }
        }
    }
}

/// The store contract on Redis; the limits are checked in front of it, and
/// what each operation sends is described on [`RedisStore`].
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
        let v: Value = self
            .inner
            .scripts
            .extend
            .key(record_key(key))
            .arg(token.get().to_string())
            .arg(millis(lease.duration()))
            .arg(self.inner.abandoned_ms)
            .invoke_async(&mut self.inner.conn())
            .await
            .map_err(unavailable)?;
        match number(&v) {
            Some(0) => Ok(Fenced::Stale),
            Some(t) => Ok(Fenced::Ok(Timestamp::from_millis(t))),
            None => Err(corrupt("extend", &v)),
        }
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let v: Value = redis::cmd("GET")
            .arg(record_key(key))
            .query_async(&mut self.inner.conn())
            .await
            .map_err(unavailable)?;
        parse_record(&v)
    }

    async fn begin_many(&self, items: &[BeginItem]) -> Result<Vec<Begin>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let answers = self.inner.begin_items(items).await;
        if answers.iter().all(Result::is_ok) {
            return answers.into_iter().collect();
        }
        // Some items failed (their node down, say): the caller gets an
        // error and no tokens, so the claims this call did make are
        // released rather than left to block their keys for a lease.
        let made = items.iter().zip(&answers).filter_map(|(item, a)| match a {
            Ok(Begin::Acquired(claim)) => Some(self.inner.release(&item.key, claim.token)),
            _ => None,
        });
        for undone in futures_util::future::join_all(made).await {
            if let Err(e) = undone {
                tracing::warn!(error = %e, "a claim of a failed begin_many stays until its lease ends");
            }
        }
        answers.into_iter().collect()
    }

    async fn complete_many(&self, items: &[CompleteItem]) -> Result<Vec<Fenced>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        // On an error, the items that were done stay done: sent again by
        // their tokens, they answer Ok.
        self.inner.complete_items(items).await.into_iter().collect()
    }

    async fn scan(&self, query: &ScanQuery) -> Result<Vec<Entry>, StoreError> {
        let (prefix, pattern) = namespace_prefix(query.namespace.as_str());
        let keys = self.inner.scan_keys(&pattern).await?;
        let mut found: Vec<(Vec<u8>, Vec<u8>)> = keys
            .into_iter()
            .filter_map(|k| {
                let inner = key_in(&k, &prefix)?.to_vec();
                let after = query.after.as_deref().is_none_or(|a| &inner[..] > a);
                after.then_some((inner, k))
            })
            .collect();
        found.sort();
        found.dedup();
        let mut entries = Vec::new();
        for chunk in found.chunks(256) {
            let keys: Vec<Vec<u8>> = chunk.iter().map(|(_, k)| k.clone()).collect();
            let cmds: Vec<Cmd> = keys
                .iter()
                .map(|k| redis::cmd("GET").arg(k).clone())
                .collect();
            let records = self
                .inner
                .pipelined(&self.inner.conn, &cmds, &keys)
                .await
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
                .map_err(unavailable)?;
            for ((inner, _), v) in chunk.iter().zip(&records) {
                // Gone (expired) between SCAN and GET: absent.
                let Some(record) = parse_record(v)? else {
                    continue;
                };
                if query.admits(&record) {
                    let key =
                        Key::in_namespace(query.namespace.clone(), Bytes::copy_from_slice(inner))
                            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    entries.push(Entry { key, record });
                    if entries.len() == query.limit {
                        return Ok(entries);
                    }
                }
            }
        }
        Ok(entries)
    }

    fn limits(&self) -> &Limits {
        &self.inner.limits
    }
}
