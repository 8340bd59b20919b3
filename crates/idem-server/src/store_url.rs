//! Opening a store from its URL.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use idem_core::admin::Admin;
use idem_core::layer::{Measured, Traced};
use idem_core::tier::Tier;
use idem_core::{MemoryStore, SharedStore};
use idem_file::{Durability, FileStore};

use crate::Failure;
use crate::config::{DurabilityArg, StoreSettings, bad};

/// An open store, and what must happen to it at shutdown.
pub struct OpenStore {
    pub store: SharedStore,
    pub file: Option<FileStore>,
    pub description: String,
    /// The operator's view of the store (`idem stats`, `idem purge`), where
    /// it has one.
    pub admin: Option<Arc<dyn Admin>>,
    /// What else must finish first (a tiered store's write-behind queue and
    /// key filter snapshot).
    pub shutdown: Option<BoxFuture<'static, ()>>,
}

impl OpenStore {
    /// Makes everything durable before the process exits.
    pub async fn close(self) {
        if let Some(shutdown) = self.shutdown {
            shutdown.await;
        }
        if let Some(file) = self.file
            && let Err(e) = file.flush()
        {
            tracing::error!(error = %e, "flushing the store at shutdown failed");
        }
    }
}

/// Opens the store `common` names, measured and traced: every call counted
/// and timed (`idem_store_calls_total`, `idem_store_call_seconds`, labelled
/// with the store's kind) and run in a debug-level `store` span. A URL idem
/// cannot read is a bad setting; a store that will not open (a directory in
/// use, Redis unreachable) is a failure to start, with what to check.
pub async fn open(common: &StoreSettings) -> Result<OpenStore, Failure> {
    let mut open = open_plain(common).await?;
    open.store = instrumented(open.store, kind(&common.store));
    Ok(open)
}

/// `store` counted, timed and traced (see [`open`]).
pub fn instrumented(store: SharedStore, kind: &str) -> SharedStore {
    Arc::new(Traced::new(Measured::new(store, kind)))
}

/// A tier of a tiered store counted, timed and traced apart from the other
/// one: labelled with its kind and `tier="hot"` or `tier="cold"`, its tier
/// operations (imports into the cold tier, say) included.
pub fn instrumented_tier<T: Tier>(tier: T, kind: &str, place: &str) -> Traced<Measured<T>> {
    Traced::in_tier(Measured::in_tier(tier, kind, place), place)
}

/// The `store` label of a store URL: its kind, never its address.
pub fn kind(url: &str) -> &'static str {
    match url.split_once("://").map_or(url, |(s, _)| s) {
        "file" => "file",
        "memory" | "memory:" => "memory",
        "redis" | "rediss" => "redis",
        "redis+cluster" | "rediss+cluster" => "redis-cluster",
        "postgres" | "postgresql" => "postgres",
        "mysql" | "mariadb" => "mysql",
        "tiered" => "tiered",
        _ => "other",
    }
}

async fn open_plain(common: &StoreSettings) -> Result<OpenStore, Failure> {
    let url = common.store.as_str();
    let tls = &common.redis_tls;
    if (tls.ca.is_some() || tls.client.is_some()) && !url.starts_with("rediss") {
        let field = if tls.ca.is_some() {
            "redis_ca_cert"
        } else {
            "redis_client_cert"
        };
        return Err(bad(
            field,
            "is for a TLS Redis store: give --store rediss://HOST:PORT or rediss+cluster://HOST:PORT,…",
        )
        .into());
    }
    if url == "tiered" || url == "tiered://" {
        return crate::tiered::open(common).await;
    }
    if let Some(path) = url.strip_prefix("file://") {
        let store = open_file(path, common)?;
        return Ok(OpenStore {
            store: Arc::new(store.clone()),
            admin: Some(Arc::new(store.clone())),
            file: Some(store),
            description: format!("file store in {path}"),
            shutdown: None,
        });
    }
    if url == "memory://" || url == "memory:" {
        return Ok(OpenStore {
            store: Arc::new(MemoryStore::builder().limits(common.limits.clone()).build()),
            admin: None,
            file: None,
            description: "memory store (records are lost when the process ends)".into(),
            shutdown: None,
        });
    }
    #[cfg(feature = "redis")]
    if let Some(redis) = open_redis(url, common).await? {
        return Ok(redis);
    }
    #[cfg(feature = "sql")]
    if is_sql(url) {
        let store = open_sql(url, common, |b| b).await?;
        return Ok(OpenStore {
            description: store.description().to_owned(),
            admin: Some(Arc::new(store.clone())),
            store: Arc::new(store),
            file: None,
            shutdown: None,
        });
    }
    let scheme = url.split_once("://").map_or(url, |(s, _)| s);
    Err(bad(
        "store",
        format!(
            "{scheme:?} stores are not supported by this build; use file://PATH, memory://, redis://HOST:PORT or redis+cluster://HOST:PORT,HOST:PORT (rediss:// and rediss+cluster:// for TLS), postgres://USER@HOST:PORT/DB, mysql://USER@HOST:PORT/DB, or tiered (with --hot-store and --cold-store)"
        ),
    )
    .into())
}

/// A file store in `path`.
pub fn open_file(path: &str, common: &StoreSettings) -> Result<FileStore, Failure> {
    if path.is_empty() {
        return Err(bad("store", "file:// needs a path, e.g. file://./idem-data").into());
    }
    FileStore::builder(path)
        .durability(match common.durability {
            DurabilityArg::Group => Durability::GroupCommit,
            DurabilityArg::Immediate => Durability::Immediate,
            DurabilityArg::Buffered => Durability::Buffered,
        })
        .limits(common.limits.clone())
        .open()
        .map_err(|e| Failure::Run(e.to_string()))
}

/// A Redis store, for `redis://`, `rediss://`, `redis+cluster://` and
/// `rediss+cluster://` URLs; `None` for other schemes.
#[cfg(feature = "redis")]
async fn open_redis(url: &str, common: &StoreSettings) -> Result<Option<OpenStore>, Failure> {
    Ok(connect_redis(url, common)
        .await?
        .map(|(store, description)| OpenStore {
            admin: Some(Arc::new(store.clone())),
            store: Arc::new(store),
            file: None,
            description,
            shutdown: None,
        }))
}

/// A connected Redis store and its description (credentials hidden), for
/// Redis URLs; `None` for other schemes.
#[cfg(feature = "redis")]
pub async fn connect_redis(
    url: &str,
    common: &StoreSettings,
) -> Result<Option<(idem_redis::RedisStore, String)>, Failure> {
    use idem_redis::{RedisStore, redacted};

    let (builder, description) = if let Some((scheme, nodes)) = url
        .split_once("+cluster://")
        .filter(|(scheme, _)| matches!(*scheme, "redis" | "rediss"))
    {
        let nodes: Vec<String> = nodes
            .split(',')
            .map(|n| format!("{scheme}://{n}"))
            .collect();
        let refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let shown: Vec<String> = nodes.iter().map(|n| redacted(n)).collect();
        (
            RedisStore::cluster_builder(&refs),
            format!("Redis Cluster store at {}", shown.join(",")),
        )
    } else if url.starts_with("redis://") || url.starts_with("rediss://") {
        (
            RedisStore::builder(url),
            format!("Redis store at {}", redacted(url)),
        )
    } else {
        return Ok(None);
    };
    let mut builder = builder.limits(common.limits.clone());
    let tls = &common.redis_tls;
    if let Some(ca) = &tls.ca {
        builder = builder.tls_ca(read("redis_ca_cert", ca)?);
    }
    if let Some((cert, key)) = &tls.client {
        builder = builder.tls_client_certificate(
            read("redis_client_cert", cert)?,
            read("redis_client_key", key)?,
        );
    }
    let store = builder.connect().await.map_err(|e| {
        Failure::Run(format!(
            "{e}; check that Redis is running there and that the address, credentials and certificates given in --store (IDEM_STORE) and --redis-* are right"
        ))
    })?;
    Ok(Some((store, description)))
}

/// The contents of the file a setting names.
#[cfg(feature = "redis")]
fn read(field: &'static str, path: &std::path::Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path)
        .map_err(|e| bad(field, format!("cannot read {}: {e}", path.display())).into())
}

/// Whether `url` names an SQL store.
#[cfg(feature = "sql")]
pub fn is_sql(url: &str) -> bool {
    ["postgres://", "postgresql://", "mysql://", "mariadb://"]
        .iter()
        .any(|s| url.starts_with(s))
}

/// An SQL store, for `postgres://` and `mysql://` URLs, configured further
/// by `configure`. A URL idem cannot read is a bad setting; a database that
/// cannot be reached or refuses is a failure to start.
#[cfg(feature = "sql")]
pub async fn open_sql(
    url: &str,
    common: &StoreSettings,
    configure: impl FnOnce(idem_sql::SqlStoreBuilder) -> idem_sql::SqlStoreBuilder,
) -> Result<idem_sql::SqlStore, Failure> {
    let builder = configure(idem_sql::SqlStore::builder(url).limits(common.limits.clone()));
    builder.connect().await.map_err(sql_failure)
}

/// How an SQL store's open error is reported: bad settings exit 2, the
/// rest 1.
#[cfg(feature = "sql")]
pub fn sql_failure(e: idem_sql::OpenError) -> Failure {
    match e {
        idem_sql::OpenError::Config(m) => bad("store", m).into(),
        idem_sql::OpenError::Table(t) => bad("store", t.to_string()).into(),
        other => Failure::Run(other.to_string()),
    }
}
