//! idem's Redis store.
//!
//! Every operation of the store contract is one atomic Lua script call
//! (`EVALSHA`, reloaded on `NOSCRIPT`), on Redis's clock (`TIME`), with
//! Redis's own key expiry for leases and retention. Batches are one
//! pipelined round trip, and single `begin`s and `complete`s made at the
//! same time are sent together as one many-item call (see
//! [`RedisStoreBuilder::coalesce`]). Needs Redis 6.2 or later (or Valkey);
//! on 7.0 and later a first claim is a single `SET … NX GET`. `rediss://`
//! URLs speak TLS (feature `tls`, on by default), with the system's roots
//! or a CA of your own, and a client certificate where Redis asks for one
//! ([`RedisStoreBuilder::tls_ca`],
//! [`RedisStoreBuilder::tls_client_certificate`]).
//!
//! ```no_run
//! use idem_core::{Guard, Key};
//! use idem_redis::RedisStore;
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let guard = Guard::new(store);
//! let key = Key::new("orders", "o-1")?;
//! let n: u32 = guard.run(&key, None, |_| async { Ok::<_, std::io::Error>(1) }).await?;
//! # Ok(()) }
//! ```
//!
//! # Keys
//!
//! For key `K` in namespace `N`: one string at `idem:{N:K}:r`, the record
//! packed in 30 bytes plus fingerprint and outcome (layout in
//! `scripts/record.lua`), expiring with the lease (plus
//! `abandoned_retention`) or the retention. One key per record: nothing else
//! to leak or to pay memory for.
//!
//! # Fencing tokens
//!
//! A token is the last token the record remembers plus one, raised to at
//! least `TIME in ms × 1024`. So tokens keep increasing after a record
//! expired or was released, and after Redis lost its data (a restart without
//! persistence): the clock has moved on, and with it the floor. This holds
//! as long as Redis's clock does not step backwards and one key is not
//! acquired more than 1 024 times in a millisecond. A released key keeps its
//! token for `tombstone_ttl` (1 hour by default), which covers small clock
//! steps between a release and the next acquisition.
#![deny(missing_docs)]

mod coalesce;
mod lock;

pub use self::lock::{Lock, LockGuard};

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem_core::{
    Begin, BeginItem, Claim, CompleteItem, Completed, DEFAULT_ABANDONED_RETENTION, Entry, Fenced,
    FencingToken, Fingerprint, InProgress, Key, Lease, Limits, Record, ScanQuery, Store,
    StoreError, Timestamp,
};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, Script, Value};

use crate::coalesce::Coalescer;

/// Why [`RedisStore::connect`] failed. Shows the address with any password
/// hidden.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to Redis at {url}: {source}")]
pub struct ConnectError {
    url: String,
    #[source]
    source: redis::RedisError,
}

/// `url` with its credentials hidden, for messages and logs:
/// `redis://user:secret@host:6379/0` reads `redis://user:***@host:6379/0`.
/// Everything before the last `@` counts as credentials, so a password
/// with a stray `@` or `/` in it stays hidden too.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((credentials, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match credentials.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => format!("{scheme}://***@{host}"),
    }
}

/// The Redis store; see the [crate docs](crate). Clones share one
/// multiplexed connection, which reconnects by itself after a Redis restart.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
    /// Sends single `begin`s and `complete`s, gathering concurrent ones
    /// into batches.
    batches: Arc<Batches>,
}

struct Batches {
    begin: Coalescer<BeginItem, Begin>,
    complete: Coalescer<CompleteItem, Fenced>,
}

/// A standalone Redis (reconnecting, multiplexed) or a Redis Cluster.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

struct Inner {
    conn: Conn,
    /// Completions' own connection when they `WAIT` for replicas.
    waiting: Option<Conn>,
    /// For connections of their own (a lock waiter's `BLPOP`): the
    /// standalone Redis; on a cluster, the first seed node, whose settings
    /// serve for connecting to the others.
    client: Option<redis::Client>,
    scripts: Scripts,
    limits: Limits,
    abandoned_ms: u64,
    tombstone_ms: u64,
    /// `WAIT` after completions: replicas, and how long to wait for them.
    replicas: Option<(u32, Duration)>,
    /// Whether Redis takes `SET` with both `NX` and `GET` (7.0 and later).
    nx_get: bool,
    /// The limit on connecting.
    timeout: Duration,
}

struct Scripts {
    begin: Script,
    complete: Script,
    release: Script,
    extend: Script,
    lock_acquire: Script,
    lock_release: Script,
    lock_renew: Script,
    lock_leave: Script,
}

/// A script from `scripts/`, its parts in order: the shared ones it needs
/// (`time.lua`, `record.lua`) and its own. Each part up to the point where a
/// call returns is run on that call, so a script takes only what it uses,
/// and `begin` reads `record.lua` after its common case.
macro_rules! script {
    ($($file:literal),+) => {
        Script::new(concat!($(include_str!(concat!("scripts/", $file))),+))
    };
}

/// Configures a [`RedisStore`].
#[derive(Debug)]
pub struct RedisStoreBuilder {
    /// One URL for a standalone Redis; the seed nodes for a cluster.
    nodes: Vec<String>,
    cluster: bool,
    limits: Limits,
    abandoned_retention: Duration,
    tombstone_ttl: Duration,
    timeout: Duration,
    replicas: Option<(u32, Duration)>,
    coalesce: bool,
    /// Use `GET` then `SET` even where `SET … NX GET` is known.
    plain_commands: bool,
    /// Certificates for `rediss://` beyond the system's trust store.
    #[cfg(feature = "tls")]
    tls: Option<redis::TlsCertificates>,
}

impl RedisStoreBuilder {
    /// The limits to enforce.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// How long an in-progress record whose lease ran out is kept so a
    /// takeover counts its attempts (default 1 hour).
    pub fn abandoned_retention(mut self, d: Duration) -> Self {
        self.abandoned_retention = d;
        self
    }

    /// How long a released key remembers its last token (default 1 hour).
    pub fn tombstone_ttl(mut self, d: Duration) -> Self {
        self.tombstone_ttl = d;
        self
    }

    /// After each `complete`, wait until `replicas` replicas have the write
    /// (`WAIT`), for at most `timeout`. This narrows, and cannot close, the
    /// window in which a failover loses an acknowledged completion: Redis
    /// replication stays asynchronous, a replica that acknowledged can still
    /// lose the write, and when fewer replicas answer in time the
    /// completion stands anyway (it is logged). Completions then travel on
    /// a connection of their own (`WAIT` holds the connection it is sent
    /// on), answered within the call timeout plus `timeout`, so a slow or
    /// missing replica holds up completions only. Off by default.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = (replicas > 0).then_some((replicas, timeout));
        self
    }

    /// For `rediss://` URLs: trust the certificate authorities in `pem`
    /// (one or more PEM certificates) instead of the system's trust store,
    /// as for a Redis whose certificate a private CA signed. Without it,
    /// `rediss://` checks the server against the system's roots.
    #[cfg(feature = "tls")]
    pub fn tls_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.get_or_insert_with(no_certificates).root_cert = Some(pem.into());
        self
    }

    /// For `rediss://` URLs: present this client certificate chain and
    /// private key (PEM), for a Redis that asks for them
    /// (`tls-auth-clients yes`, Redis's default once TLS is on).
    #[cfg(feature = "tls")]
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.get_or_insert_with(no_certificates).client_tls = Some(redis::ClientTlsConfig {
            client_cert: cert_pem.into(),
            client_key: key_pem.into(),
        });
        self
    }

    /// A connection to the standalone Redis (`seed`) or to the cluster,
    /// each call answered within `answer_within`.
    async fn open(
        &self,
        seed: redis::RedisResult<redis::Client>,
        answer_within: Duration,
    ) -> redis::RedisResult<Conn> {
        if self.cluster {
            let builder = redis::cluster::ClusterClientBuilder::new(self.nodes.clone())
                .connection_timeout(self.timeout)
                .response_timeout(answer_within);
            #[cfg(feature = "tls")]
            let builder = match &self.tls {
                Some(certs) => builder.certs(certs.clone()),
                None => builder,
            };
            return Ok(Conn::Cluster(
                builder.build()?.get_async_connection().await?,
            ));
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(answer_within))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        Ok(Conn::Single(
            ConnectionManager::new_with_config(seed?, config).await?,
        ))
    }

    /// A client for `url`, with the configured certificates.
    fn client(&self, url: &str) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(certs) = &self.tls {
            return redis::Client::build_with_tls(url, certs.clone());
        }
        redis::Client::open(url)
    }

    /// Whether single `begin`s and `complete`s issued at the same time are
    /// sent together as one many-item script call (default on). A call that
    /// finds nothing in flight always goes straight out, so this costs a
    /// lone caller nothing; under concurrency it saves Redis most of its
    /// per-call work.
    pub fn coalesce(mut self, on: bool) -> Self {
        self.coalesce = on;
        self
    }

    /// Claims fresh keys with `GET` then `SET`, as on a Redis before 7.0,
    /// even where `SET … NX GET` is known: lets the tests run that path on
    /// a current Redis.
    #[doc(hidden)]
    pub fn plain_commands(mut self) -> Self {
        self.plain_commands = true;
        self
    }

    /// The limit on connecting and on each call (default 2 s).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// Connects.
    pub async fn connect(self) -> Result<RedisStore, ConnectError> {
        let fail = |source| ConnectError {
            url: self
                .nodes
                .iter()
                .map(|n| redacted(n))
                .collect::<Vec<_>>()
                .join(","),
            source,
        };
        // The first node's client: the standalone Redis, or the seed whose
        // settings serve for a lock waiter's connection to any master.
        let seed = self.client(&self.nodes[0]);
        let client_for_waiters = seed.as_ref().ok().cloned();
        let conn = self.open(seed, self.timeout).await.map_err(fail)?;
        // `WAIT` holds the connection it is sent on until the replicas
        // answer: completions that wait get a connection of their own, so
        // everything else goes on meanwhile.
        let waiting = match self.replicas {
            Some((_, wait)) => {
                let seed = self.client(&self.nodes[0]);
                Some(self.open(seed, self.timeout + wait).await.map_err(fail)?)
            }
            None => None,
        };
        let nx_get = !self.plain_commands && supports_nx_get(&conn).await;
        let inner = Arc::new(Inner {
            conn,
            waiting,
            client: client_for_waiters,
            scripts: Scripts {
                begin: script!("time.lua", "begin_first.lua", "record.lua", "begin.lua"),
                complete: script!("time.lua", "complete.lua"),
                release: script!("time.lua", "record.lua", "release.lua"),
                extend: script!("time.lua", "record.lua", "extend.lua"),
                lock_acquire: script!("time.lua", "lock_acquire.lua"),
                lock_release: script!("lock_release.lua"),
                lock_renew: script!("lock_renew.lua"),
                lock_leave: script!("lock_leave.lua"),
            },
            limits: self.limits,
            abandoned_ms: millis(self.abandoned_retention),
            tombstone_ms: millis(self.tombstone_ttl).max(1),
            replicas: self.replicas,
            nx_get,
            timeout: self.timeout,
        });
        let (b, c) = (inner.clone(), inner.clone());
        let batches = Arc::new(Batches {
            begin: Coalescer::start(
                move |items: Vec<BeginItem>| {
                    let inner = b.clone();
                    async move { inner.begin_items(&items).await }
                },
                self.coalesce,
            ),
            complete: Coalescer::start(
                move |items: Vec<CompleteItem>| {
                    let inner = c.clone();
                    async move { inner.complete_items(&items).await }
                },
                self.coalesce,
            ),
        });
        Ok(RedisStore { inner, batches })
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://HOST:PORT[/DB]`) with default settings.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::builder(url).connect().await
    }

    /// A distributed lock named `name` on this store's Redis; see [`Lock`].
    pub fn lock(&self, name: &str) -> Lock {
        Lock::new(self.inner.clone(), name)
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

#[cfg(feature = "tls")]
fn no_certificates() -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: None,
    }
}

/// One item of a many-item script call.
struct ScriptItem {
    /// Its record's key.
    key: Vec<u8>,
    /// Items of one group share a call (they share what the script takes
    /// once a call).
    group: u64,
}

/// Most items in one script call, so one call never holds Redis for long.
const ITEMS_PER_CALL: usize = 256;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn redis_key(key: &Key, suffix: &[u8]) -> Vec<u8> {
    let ns = key.namespace().as_str().as_bytes();
    let k = key.bytes();
    let mut out = Vec::with_capacity(8 + ns.len() + k.len() + suffix.len());
    out.extend_from_slice(b"idem:{");
    out.extend_from_slice(ns);
    out.push(b':');
    out.extend_from_slice(k);
    out.extend_from_slice(suffix);
    out
}

fn record_key(key: &Key) -> Vec<u8> {
    redis_key(key, b"}:r")
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::unavailable(e)
}

fn corrupt(what: &str, v: &Value) -> StoreError {
    StoreError::Corrupt(format!("unexpected reply from Redis for {what}: {v:?}"))
}

/// A reply element as a number (Lua numbers arrive as integers, our
/// formatted numbers as strings).
fn number(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn bytes(v: &Value) -> Option<Bytes> {
    match v {
        Value::BulkString(b) => Some(Bytes::copy_from_slice(b)),
        _ => None,
    }
}

/// One item's answer from the begin script, which ran at `now` (ms); a
/// lease it granted lasts `lease_ms`.
fn parse_begin(v: &Value, now: u64, lease_ms: u64) -> Result<Begin, StoreError> {
    let bad = || corrupt("begin", v);
    let lease_expires_at = Timestamp::from_millis(now.saturating_add(lease_ms));
    let items = match v {
        Value::Array(items) => items,
        Value::Int(_) => {
            return Ok(Begin::Acquired(Claim {
                token: FencingToken::new(number(v).ok_or_else(bad)?),
                lease_expires_at,
                attempt: 1,
            }));
        }
        _ => return Err(bad()),
    };
    let tag = items.first().and_then(bytes).ok_or_else(bad)?;
    let num = |i: usize| items.get(i).and_then(number).ok_or_else(bad);
    Ok(match &tag[..] {
        b"a" => Begin::Acquired(Claim {
            token: FencingToken::new(num(1)?),
            lease_expires_at,
            attempt: u32::try_from(num(2)?).unwrap_or(u32::MAX),
        }),
        b"i" => Begin::InProgress {
            retry_after: Duration::from_millis(num(1)?.max(1)),
        },
        b"c" => Begin::Completed {
            completed_at: Timestamp::from_millis(num(1)?),
            outcome: items.get(2).and_then(bytes),
        },
        b"m" => Begin::Mismatch,
        _ => return Err(bad()),
    })
}

fn fenced(what: &str, v: &Value) -> Result<Fenced, StoreError> {
    match number(v) {
        Some(1) => Ok(Fenced::Ok(())),
        Some(0) => Ok(Fenced::Stale),
        _ => Err(corrupt(what, v)),
    }
}

/// A record from its packed value (`GET`), `None` when there is none (or
/// only a released key's tombstone). Layout: see `scripts/record.lua`.
fn parse_record(v: &Value) -> Result<Option<Record>, StoreError> {
    let bytes = match v {
        Value::Nil => return Ok(None),
        Value::BulkString(b) => &b[..],
        _ => return Err(corrupt("a record", v)),
    };
    let bad = || corrupt("a record", v);
    if bytes.len() < HEAD {
        return Err(bad());
    }
    let int = |at: usize, n: usize| {
        let mut buf = [0u8; 8];
        buf[..n].copy_from_slice(&bytes[at..at + n]);
        u64::from_le_bytes(buf)
    };
    let (state, flags) = (bytes[0], bytes[1]);
    let until = Timestamp::from_millis(int(2, 8));
    let since = Timestamp::from_millis(int(10, 8));
    let token = FencingToken::new(int(18, 8));
    let attempts = u32::try_from(int(26, 4)).unwrap_or(u32::MAX);
    let mut rest = &bytes[HEAD..];
    let fingerprint = if flags & 1 != 0 {
        let (fp, tail) = rest.split_at_checked(16).ok_or_else(bad)?;
        rest = tail;
        Some(Fingerprint::from_bytes(fp.try_into().expect("16 bytes")))
    } else {
        None
    };
    let outcome = (flags & 2 != 0).then(|| Bytes::copy_from_slice(rest));
    Ok(Some(match state {
        b'p' => Record::InProgress(InProgress {
            token,
            fingerprint,
            lease_expires_at: until,
            attempts,
            started_at: since,
        }),
        b'c' => Record::Completed(Completed {
            token,
            fingerprint,
            outcome,
            completed_at: since,
            expires_at: until,
        }),
        // A released key's tombstone: absent to readers.
        b'r' => return Ok(None),
        _ => return Err(bad()),
    }))
}

/// The packed header's length: state, flags, end, since, token, attempts.
const HEAD: usize = 1 + 1 + 8 + 8 + 8 + 4;

impl Inner {
    fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// `begin` for `items`, in as few script calls as slots and leases
    /// allow.
    async fn begin_items(&self, items: &[BeginItem]) -> Result<Vec<Begin>, StoreError> {
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
            .await?;
        replies
            .iter()
            .enumerate()
            .map(|(i, (head, v))| {
                // A lone first claim comes back as its token alone, which
                // is Redis's time × 1024.
                let now = match (head, v) {
                    (Value::Nil, Value::Int(token)) => u64::try_from(*token).ok().map(|t| t / 1024),
                    _ => number(head),
                };
                parse_begin(v, now.ok_or_else(|| corrupt("begin", head))?, lease_of(i))
            })
            .collect()
    }

    /// `complete` for `items`, in as few script calls as slots and
    /// retentions allow.
    async fn complete_items(&self, items: &[CompleteItem]) -> Result<Vec<Fenced>, StoreError> {
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
            .await?;
        let answers: Vec<Fenced> = replies
            .iter()
            .map(|(_, v)| fenced("complete", v))
            .collect::<Result<_, _>>()?;
        if let Some((replicas, timeout)) = self.replicas
            && answers.iter().any(|a| !a.is_stale())
        {
            self.wait_for_replicas(conn, items, replicas, timeout).await;
        }
        Ok(answers)
    }

    /// `WAIT` on the node of each item's key (all of them on a standalone
    /// Redis); too few replicas in time is logged, not an error.
    async fn wait_for_replicas(
        &self,
        conn: &Conn,
        items: &[CompleteItem],
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

    /// Runs a many-item `script` over `items`: items are grouped by hash
    /// slot and by their `group` (what the script takes once a call: a
    /// lease, say), cut into calls of at most [`ITEMS_PER_CALL`], and all
    /// calls go out in one pipelined round trip (one per slot on a
    /// cluster). A call's arguments are what `shared(its items)` writes,
    /// then what `own(item)` writes for each item. Each call's reply starts
    /// with `lead` values of its own (Redis's time, say), then answers its
    /// items; a call of one item may instead answer with a value that is not
    /// an array, the item's answer alone. Answers each item, in order, with
    /// the first of its call's own values (nil when `lead` is 0 or the call
    /// answered alone).
    async fn run_script(
        &self,
        conn: &Conn,
        script: &Script,
        items: Vec<ScriptItem>,
        shared: impl Fn(&[usize], &mut Cmd),
        own: impl Fn(usize, &mut Cmd),
        lead: usize,
    ) -> Result<Vec<(Value, Value)>, StoreError> {
        let groups: Vec<Vec<usize>> = if items.len() == 1 {
            vec![vec![0]]
        } else {
            let cluster = matches!(conn, Conn::Cluster(_));
            let mut groups: std::collections::BTreeMap<(u16, u64), Vec<usize>> = Default::default();
            for (i, item) in items.iter().enumerate() {
                let slot = if cluster { slot(&item.key) } else { 0 };
                groups.entry((slot, item.group)).or_default().push(i);
            }
            groups.into_values().collect()
        };
        let mut cmds = Vec::new();
        let mut first_keys = Vec::new();
        let mut members = Vec::new();
        for idx in &groups {
            for chunk in idx.chunks(ITEMS_PER_CALL) {
                // Sized for the usual arguments, so it is written without
                // growing: keys, a few shared, two or so of each item's.
                let keys: usize = chunk.iter().map(|&i| items[i].key.len()).sum();
                let mut cmd = Cmd::with_capacity(6 + 3 * chunk.len(), 96 + keys + 32 * chunk.len());
                cmd.arg("EVALSHA").arg(script.get_hash()).arg(chunk.len());
                for &i in chunk {
                    cmd.arg(&items[i].key);
                }
                shared(chunk, &mut cmd);
                for &i in chunk {
                    own(i, &mut cmd);
                }
                cmds.push(cmd);
                first_keys.push(&items[chunk[0]].key[..]);
                members.push(chunk);
            }
        }
        let replies = self.pipelined(conn, &cmds, &first_keys).await?;
        let mut answers = vec![(Value::Nil, Value::Nil); items.len()];
        for (chunk, reply) in members.into_iter().zip(replies) {
            let mut per_item = match reply {
                Value::Array(per_item) => per_item,
                alone if chunk.len() == 1 => {
                    answers[chunk[0]] = (Value::Nil, alone);
                    continue;
                }
                _ => return Err(corrupt("a script call", &reply)),
            };
            if per_item.len() != lead + chunk.len() {
                return Err(corrupt("a script call", &Value::Array(per_item)));
            }
            let head = per_item.first().filter(|_| lead > 0).cloned();
            for (&i, v) in chunk.iter().zip(per_item.drain(lead..)) {
                answers[i] = (head.clone().unwrap_or(Value::Nil), v);
            }
        }
        Ok(answers)
    }

    /// Runs `cmds`, whose keys are `keys` (one each; may be empty for a
    /// single command), in one pipelined round trip: on a cluster, one
    /// pipeline per hash slot, all at once. Answers in order.
    async fn pipelined(
        &self,
        conn: &Conn,
        cmds: &[Cmd],
        keys: &[impl AsRef<[u8]>],
    ) -> Result<Vec<Value>, StoreError> {
        if matches!(conn, Conn::Single(_)) || cmds.len() == 1 {
            return self.pipeline(conn, cmds.iter()).await;
        }
        let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
        for (i, k) in keys.iter().enumerate() {
            by_slot.entry(slot(k.as_ref())).or_default().push(i);
        }
        let groups = futures_util::future::try_join_all(
            by_slot
                .values()
                .map(|idx| self.pipeline(conn, idx.iter().map(|&i| &cmds[i]))),
        )
        .await?;
        let mut answers = vec![Value::Nil; cmds.len()];
        for (idx, replies) in by_slot.values().zip(groups) {
            for (&i, v) in idx.iter().zip(replies) {
                answers[i] = v;
            }
        }
        Ok(answers)
    }

    /// Runs `cmds` as one pipeline; loads the scripts and tries again once
    /// if Redis does not know them (after a restart or flush).
    async fn pipeline<'c>(
        &self,
        conn: &Conn,
        cmds: impl Iterator<Item = &'c Cmd>,
    ) -> Result<Vec<Value>, StoreError> {
        let cmds: Vec<&Cmd> = cmds.collect();
        let mut conn = conn.clone();
        let no_script = |e: &redis::RedisError| {
            e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        };
        // One command goes out as itself: a pipeline of one costs more.
        if let [cmd] = cmds[..] {
            let once = match cmd.query_async::<Value>(&mut conn).await {
                Err(e) if no_script(&e) => {
                    self.load_scripts(&mut conn).await?;
                    cmd.query_async(&mut conn).await
                }
                r => r,
            };
            return once.map(|v| vec![v]).map_err(unavailable);
        }
        let mut pipe = redis::pipe();
        for c in cmds {
            pipe.add_command(c.clone());
        }
        match pipe.query_async::<Vec<Value>>(&mut conn).await {
            Err(e) if no_script(&e) => {
                self.load_scripts(&mut conn).await?;
                pipe.query_async(&mut conn).await.map_err(unavailable)
            }
            r => r.map_err(unavailable),
        }
    }

    /// A connection of its own, without a response limit (for `BLPOP`), to
    /// the node that holds `key`: the standalone Redis, or the cluster
    /// master serving its slot. `None` when that node is not known.
    async fn blocking_connection(&self, key: &[u8]) -> Option<redis::aio::MultiplexedConnection> {
        let seed = self.client.as_ref()?;
        let client = match &self.conn {
            Conn::Single(_) => seed.clone(),
            Conn::Cluster(c) => {
                let nodes = cluster_nodes(c).await.ok()?;
                let (host, port) = master_of(&nodes, slot(key), self.seed_host())?;
                let info = seed.get_connection_info().clone();
                // The master's address, reached as the seed is (plain TCP or
                // TLS with the same certificates).
                let addr = match info.addr() {
                    redis::ConnectionAddr::Tcp(..) => redis::ConnectionAddr::Tcp(host, port),
                    redis::ConnectionAddr::TcpTls {
                        insecure,
                        tls_params,
                        ..
                    } => redis::ConnectionAddr::TcpTls {
                        host,
                        port,
                        insecure: *insecure,
                        tls_params: tls_params.clone(),
                    },
                    _ => return None,
                };
                redis::Client::open(info.set_addr(addr)).ok()?
            }
        };
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(None);
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .ok()
    }

    /// The host of the first seed node: on a one-node cluster, where
    /// `CLUSTER NODES` leaves the node's own address empty, that is its
    /// address.
    fn seed_host(&self) -> &str {
        match self.client.as_ref().map(|c| c.get_connection_info().addr()) {
            Some(redis::ConnectionAddr::Tcp(host, _))
            | Some(redis::ConnectionAddr::TcpTls { host, .. }) => host,
            _ => "",
        }
    }

    /// Every key matching `pattern`: one SCAN, or one per cluster master.
    async fn scan_keys(&self, pattern: &str) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut keys = Vec::new();
        let nodes = match &self.conn {
            Conn::Single(_) => vec![None],
            Conn::Cluster(c) => masters(&cluster_nodes(c).await?, self.seed_host())
                .into_iter()
                .map(Some)
                .collect(),
        };
        for node in nodes {
            let mut cursor: u64 = 0;
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000);
                let reply: Value = match (&node, &self.conn) {
                    (Some((host, port)), Conn::Cluster(c)) => {
                        c.clone()
                            .route_command(
                                cmd,
                                RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                                    host: host.clone(),
                                    port: *port,
                                }),
                            )
                            .await
                    }
                    _ => cmd.query_async(&mut self.conn()).await,
                }
                .map_err(unavailable)?;
                let (next, batch): (u64, Vec<Vec<u8>>) = redis::from_redis_value(reply)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                keys.extend(batch);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(keys)
    }

    async fn load_scripts(&self, conn: &mut impl ConnectionLike) -> Result<(), StoreError> {
        for s in [
            &self.scripts.begin,
            &self.scripts.complete,
            &self.scripts.release,
            &self.scripts.extend,
        ] {
            s.prepare_invoke()
                .load_async(conn)
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }
}

/// Whether the Redis behind `conn` takes `SET key value NX GET` (Redis and
/// Valkey 7.0 and later); when it cannot tell, the store uses `GET` and
/// `SET`, which every version takes.
async fn supports_nx_get(conn: &Conn) -> bool {
    let mut info = redis::cmd("INFO");
    info.arg("server");
    let reply: Result<Value, _> = match conn {
        Conn::Single(c) => info.query_async(&mut c.clone()).await,
        Conn::Cluster(c) => {
            c.clone()
                .route_command(info, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
                .await
        }
    };
    let Some(text) = reply
        .ok()
        .and_then(|v| redis::from_redis_value::<String>(v).ok())
    else {
        return false;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .and_then(|v| v.trim().split('.').next()?.parse::<u32>().ok())
        .is_some_and(|major| major >= 7)
}

/// The cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag, the text
/// between the first `{` and the next `}` when not empty, else of the key.
fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % 16384
}

/// `CLUSTER NODES`, asked of any node.
async fn cluster_nodes(c: &ClusterConnection) -> Result<String, StoreError> {
    let reply = c
        .clone()
        .route_command(
            redis::cmd("CLUSTER").arg("NODES").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .map_err(unavailable)?;
    redis::from_redis_value(reply).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// The masters' addresses in `CLUSTER NODES` output.
fn masters(nodes: &str, seed_host: &str) -> Vec<(String, u16)> {
    cluster_masters(nodes, seed_host)
        .into_iter()
        .map(|(addr, _)| addr)
        .collect()
}

/// The address of the master serving `slot`, from `CLUSTER NODES` output.
fn master_of(nodes: &str, slot: u16, seed_host: &str) -> Option<(String, u16)> {
    cluster_masters(nodes, seed_host)
        .into_iter()
        .find(|(_, ranges)| ranges.iter().any(|r| r.contains(&slot)))
        .map(|(addr, _)| addr)
}

/// A master's address and the slot ranges it serves.
type MasterSlots = ((String, u16), Vec<std::ops::RangeInclusive<u16>>);

/// The masters that are up in `CLUSTER NODES` output, with the slots each
/// serves (slots being moved, `[…]`, are left out). A node that has not
/// learnt its own address (a cluster of one) is at `seed_host`.
fn cluster_masters(nodes: &str, seed_host: &str) -> Vec<MasterSlots> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                return None;
            }
            let addr = fields.get(1)?.split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            let host = if host.is_empty() { seed_host } else { host };
            let ranges = fields
                .iter()
                .skip(8)
                .filter_map(|r| {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    Some(a.parse().ok()?..=b.parse().ok()?)
                })
                .collect();
            Some(((host.to_owned(), port.parse().ok()?), ranges))
        })
        .collect()
}

impl Store for RedisStore {
    async fn begin(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> Result<Begin, StoreError> {
        self.inner.limits.check_begin(key, lease)?;
        let item = BeginItem {
            key: key.clone(),
            fingerprint,
            lease,
        };
        self.batches.begin.call(item).await
    }

    async fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> Result<Fenced, StoreError> {
        self.inner
            .limits
            .check_complete(key, outcome.as_ref(), retention)?;
        let item = CompleteItem {
            key: key.clone(),
            token,
            outcome,
            retention,
        };
        self.batches.complete.call(item).await
    }

    async fn release(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        self.inner.limits.check_key(key)?;
        let v: Value = self
            .inner
            .scripts
            .release
            .key(record_key(key))
            .arg(token.get().to_string())
            .arg(self.inner.tombstone_ms)
            .invoke_async(&mut self.inner.conn())
            .await
            .map_err(unavailable)?;
        fenced("release", &v)
    }

    async fn extend(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Lease,
    ) -> Result<Fenced<Timestamp>, StoreError> {
        self.inner.limits.check_begin(key, lease)?;
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
        self.inner.limits.check_key(key)?;
        let v: Value = redis::cmd("GET")
            .arg(record_key(key))
            .query_async(&mut self.inner.conn())
            .await
            .map_err(unavailable)?;
        parse_record(&v)
    }

    async fn begin_many(&self, items: &[BeginItem]) -> Result<Vec<Begin>, StoreError> {
        self.inner.limits.check_begin_items(items)?;
        if items.is_empty() {
            return Ok(Vec::new());
        }
        self.inner.begin_items(items).await
    }

    async fn complete_many(&self, items: &[CompleteItem]) -> Result<Vec<Fenced>, StoreError> {
        self.inner.limits.check_complete_items(items)?;
        if items.is_empty() {
            return Ok(Vec::new());
        }
        self.inner.complete_items(items).await
    }

    async fn scan(&self, query: &ScanQuery) -> Result<Vec<Entry>, StoreError> {
        let ns = query.namespace.as_str();
        let prefix = format!("idem:{{{ns}:");
        let pattern = format!("{prefix}*}}:r");
        let keys = self.inner.scan_keys(&pattern).await?;
        let mut found: Vec<(Vec<u8>, Vec<u8>)> = keys
            .into_iter()
            .filter_map(|k| {
                let inner = k
                    .strip_prefix(prefix.as_bytes())?
                    .strip_suffix(b"}:r")?
                    .to_vec();
                let after = query.after.as_deref().is_none_or(|a| &inner[..] > a);
                after.then_some((inner, k))
            })
            .collect();
        found.sort();
        let mut entries = Vec::new();
        for chunk in found.chunks(256) {
            let keys: Vec<Vec<u8>> = chunk.iter().map(|(_, k)| k.clone()).collect();
            let cmds: Vec<Cmd> = keys
                .iter()
                .map(|k| redis::cmd("GET").arg(k).clone())
                .collect();
            let records = self.inner.pipelined(&self.inner.conn, &cmds, &keys).await?;
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

#[cfg(test)]
mod tests {
    use super::{master_of, masters, redacted, slot};

    #[test]
    fn slots_follow_the_hash_tag() {
        // Known values from the Redis Cluster specification.
        assert_eq!(slot(b"123456789"), 0x31C3);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }

    #[test]
    fn the_master_of_a_slot_comes_from_cluster_nodes() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922 [10923->-c3]
c3 127.0.0.1:7002@17002 master - 0 0 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 0 1 connected
e5 127.0.0.1:7004@17004 master,fail - 0 0 5 disconnected 12000
";
        let at = |port| Some(("127.0.0.1".to_owned(), port));
        assert_eq!(master_of(nodes, 0, "seed"), at(7000));
        assert_eq!(master_of(nodes, 5461, "seed"), at(7001));
        assert_eq!(master_of(nodes, 10923, "seed"), at(7002));
        assert_eq!(master_of(nodes, 12000, "seed"), at(7002));
        assert_eq!(masters(nodes, "seed").len(), 3);
        // A cluster of one does not know its own address.
        let alone = "a1 :7000@17000 myself,master - 0 0 0 connected 0-16383\n";
        assert_eq!(
            master_of(alone, 9000, "10.0.0.5"),
            Some(("10.0.0.5".to_owned(), 7000))
        );
    }

    #[test]
    fn credentials_are_hidden_in_shown_addresses() {
        let cases = [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://:secret@h:6379/0", "redis://:***@h:6379/0"),
            ("rediss://app:secret@h:6380", "rediss://app:***@h:6380"),
            ("redis://secret@h", "redis://***@h"),
            ("redis://app:se@c/r@et@h:1", "redis://app:***@h:1"),
            ("not a url", "not a url"),
        ];
        for (url, shown) in cases {
            assert_eq!(redacted(url), shown, "{url}");
        }
    }
}
