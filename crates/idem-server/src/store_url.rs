//! Opening a store from its URL.

use std::sync::Arc;

use idem_core::{Limits, MemoryStore, SharedStore};
use idem_file::{Durability, FileStore};

use crate::config::{ConfigError, DurabilityArg, bad};

/// An open store, and what must happen to it at shutdown.
pub struct OpenStore {
    pub store: SharedStore,
    pub file: Option<FileStore>,
    pub description: String,
}

impl OpenStore {
    /// Makes everything durable before the process exits.
    pub fn close(self) {
        if let Some(file) = self.file
            && let Err(e) = file.flush()
        {
            tracing::error!(error = %e, "flushing the store at shutdown failed");
        }
    }
}

pub async fn open(
    url: &str,
    durability: DurabilityArg,
    limits: Limits,
) -> Result<OpenStore, ConfigError> {
    if let Some(path) = url.strip_prefix("file://") {
        if path.is_empty() {
            return Err(bad(
                "store",
                "file:// needs a path, e.g. file://./idem-data",
            ));
        }
        let store = FileStore::builder(path)
            .durability(match durability {
                DurabilityArg::Group => Durability::GroupCommit,
                DurabilityArg::Immediate => Durability::Immediate,
                DurabilityArg::Buffered => Durability::Buffered,
            })
            .limits(limits)
            .open()
            .map_err(|e| bad("store", e.to_string()))?;
        return Ok(OpenStore {
            store: Arc::new(store.clone()),
            file: Some(store),
            description: format!("file store in {path}"),
        });
    }
    if url == "memory://" || url == "memory:" {
        return Ok(OpenStore {
            store: Arc::new(MemoryStore::builder().limits(limits).build()),
            file: None,
            description: "memory store (records are lost when the process ends)".into(),
        });
    }
    #[cfg(feature = "redis")]
    if let Some(nodes) = url.strip_prefix("redis+cluster://") {
        let nodes: Vec<String> = nodes.split(',').map(|n| format!("redis://{n}")).collect();
        let refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let store = idem_redis::RedisStore::cluster_builder(&refs)
            .limits(limits)
            .connect()
            .await
            .map_err(|e| bad("store", e.to_string()))?;
        return Ok(OpenStore {
            store: Arc::new(store),
            file: None,
            description: format!("Redis Cluster store at {}", redact_password(url)),
        });
    }
    #[cfg(feature = "redis")]
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        let store = idem_redis::RedisStore::builder(url)
            .limits(limits)
            .connect()
            .await
            .map_err(|e| bad("store", e.to_string()))?;
        let shown = redact_password(url);
        return Ok(OpenStore {
            store: Arc::new(store),
            file: None,
            description: format!("Redis store at {shown}"),
        });
    }
    let scheme = url.split_once("://").map_or(url, |(s, _)| s);
    Err(bad(
        "store",
        format!(
            "{scheme:?} stores are not supported by this build; use file://PATH, memory://, redis://HOST:PORT or redis+cluster://HOST:PORT,HOST:PORT"
        ),
    ))
}

/// `url` with any password replaced, for logs.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
fn redact_password(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, rest)), Some(_)) => {
            let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
            format!("{scheme}://***@{host}")
        }
        _ => url.to_owned(),
    }
}
