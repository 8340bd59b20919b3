//! Each kind of store opened as its own type, from its spec: as the store
//! itself, or as one tier of a tiered store.

use idem_core::MemoryStore;
use idem_file::{Durability, FileStore};

#[cfg(feature = "redis")]
use super::spec::RedisSpec;
#[cfg(feature = "sql")]
use super::spec::SqlSpec;
#[cfg(any(feature = "redis", feature = "sql"))]
use crate::config::bad;
use crate::config::{DurabilityArg, StoreSettings};
use crate::run::Failure;

/// A memory store under the configured limits.
pub fn memory(settings: &StoreSettings) -> MemoryStore {
    MemoryStore::builder()
        .limits(settings.limits.clone())
        .build()
}

/// A file store in `path`.
pub fn file(path: &str, settings: &StoreSettings) -> Result<FileStore, Failure> {
    FileStore::builder(path)
        .durability(match settings.durability {
            DurabilityArg::Group => Durability::GroupCommit,
            DurabilityArg::Immediate => Durability::Immediate,
            DurabilityArg::Buffered => Durability::Buffered,
        })
        .limits(settings.limits.clone())
        .open()
        .map_err(|e| Failure::Run(e.to_string()))
}

/// The description of a file store in `path`.
pub fn file_description(path: &str) -> String {
    format!("file store in {path}")
}

/// A connected Redis store and its description (credentials hidden).
#[cfg(feature = "redis")]
pub async fn redis(
    spec: &RedisSpec,
    settings: &StoreSettings,
) -> Result<(idem_redis::RedisStore, String), Failure> {
    use idem_redis::{RedisStore, redacted};

    let shown: Vec<String> = spec.nodes.iter().map(|n| redacted(n)).collect();
    let (builder, description) = if spec.cluster {
        let nodes: Vec<&str> = spec.nodes.iter().map(String::as_str).collect();
        (
            RedisStore::cluster_builder(&nodes),
            format!("Redis Cluster store at {}", shown.join(",")),
        )
    } else {
        (
            RedisStore::builder(&spec.nodes[0]),
            format!("Redis store at {}", shown.join(",")),
        )
    };
    let mut builder = builder.limits(settings.limits.clone());
    let tls = &settings.redis_tls;
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
    Ok((store, description))
}

/// The contents of the file a setting names.
#[cfg(feature = "redis")]
fn read(field: &'static str, path: &std::path::Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path)
        .map_err(|e| bad(field, format!("cannot read {}: {e}", path.display())).into())
}

/// An SQL store, configured further by `configure`. A URL idem cannot read
/// is a bad setting; a database that cannot be reached or refuses is a
/// failure to start.
#[cfg(feature = "sql")]
pub async fn sql(
    spec: &SqlSpec,
    settings: &StoreSettings,
    configure: impl FnOnce(idem_sql::SqlStoreBuilder) -> idem_sql::SqlStoreBuilder,
) -> Result<idem_sql::SqlStore, Failure> {
    let builder = configure(idem_sql::SqlStore::builder(&spec.url).limits(settings.limits.clone()));
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
