//! Opening a store from its URL.

use std::sync::Arc;

use idem_core::{Limits, MemoryStore, SharedStore};
use idem_file::{Durability, FileStore};

use crate::Failure;
use crate::config::{DurabilityArg, bad};

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

/// Opens the store at `url`. A URL idem cannot read is a bad setting; a
/// store that will not open (a directory in use, Redis unreachable) is a
/// failure to start, with what to check.
pub async fn open(
    url: &str,
    durability: DurabilityArg,
    limits: Limits,
) -> Result<OpenStore, Failure> {
    if let Some(path) = url.strip_prefix("file://") {
        if path.is_empty() {
            return Err(bad("store", "file:// needs a path, e.g. file://./idem-data").into());
        }
        let store = FileStore::builder(path)
            .durability(match durability {
                DurabilityArg::Group => Durability::GroupCommit,
                DurabilityArg::Immediate => Durability::Immediate,
                DurabilityArg::Buffered => Durability::Buffered,
            })
            .limits(limits)
            .open()
            .map_err(|e| Failure::Run(e.to_string()))?;
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
            .map_err(unreachable_redis)?;
        let shown: Vec<String> = nodes.iter().map(|n| idem_redis::redacted(n)).collect();
        return Ok(OpenStore {
            store: Arc::new(store),
            file: None,
            description: format!("Redis Cluster store at {}", shown.join(",")),
        });
    }
    #[cfg(feature = "redis")]
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        let store = idem_redis::RedisStore::builder(url)
            .limits(limits)
            .connect()
            .await
            .map_err(unreachable_redis)?;
        return Ok(OpenStore {
            store: Arc::new(store),
            file: None,
            description: format!("Redis store at {}", idem_redis::redacted(url)),
        });
    }
    let scheme = url.split_once("://").map_or(url, |(s, _)| s);
    Err(bad(
        "store",
        format!(
            "{scheme:?} stores are not supported by this build; use file://PATH, memory://, redis://HOST:PORT or redis+cluster://HOST:PORT,HOST:PORT"
        ),
    )
    .into())
}

/// A Redis store that would not connect: what failed, and what to check.
#[cfg(feature = "redis")]
fn unreachable_redis(e: idem_redis::ConnectError) -> Failure {
    Failure::Run(format!(
        "{e}; check that Redis is running there and that the address and credentials in --store (IDEM_STORE) are right"
    ))
}
