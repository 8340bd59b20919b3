//! The operator's view of a Redis store (docs/contract.md §2, "Operations
//! for operators"). Every operation walks the namespace's keys with `SCAN`
//! on each master and reads or deletes them in pipelines; nothing blocks
//! the server for long.

use std::collections::{BTreeMap, BTreeSet};

use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use idem_core::admin::{Admin, Finding, NamespaceStats, Purge, Severity, StoreSize};
use idem_core::{Namespace, StoreError, Timestamp};
use redis::{Cmd, Value};

use idem_core::layer::StoreWrapper as _;

use crate::RedisStore;
use crate::layout::{RECORD_PATTERN, key_of, namespace_prefix};
use crate::reply::{COUNTED, Counted, parse_counted, unavailable};
use crate::store::Inner;

/// Keys one pipeline reads or deletes.
const BATCH: usize = 1000;

impl Admin for RedisStore {
    fn namespaces(&self) -> BoxFuture<'_, Result<Vec<Namespace>, StoreError>> {
        async move {
            let keys = &self.store.inner().inner.scan_keys(RECORD_PATTERN).await?;
            let found: BTreeSet<Namespace> = keys
                .iter()
                .filter_map(|k| key_of(k))
                .map(|k| k.namespace().clone())
                .collect();
            Ok(found.into_iter().collect())
        }
        .boxed()
    }

    fn stats<'a>(
        &'a self,
        namespace: &'a Namespace,
    ) -> BoxFuture<'a, Result<NamespaceStats, StoreError>> {
        async move {
            let inner = &*self.store.inner().inner;
            let keys = namespace_keys(inner, namespace).await?;
            let now = Timestamp::from_millis(server_time(inner).await?);
            let mut out = NamespaceStats::default();
            count_heads(inner, &keys, |_, head| tally(&mut out, head, now)).await?;
            Ok(out)
        }
        .boxed()
    }

    /// One `SCAN` of the whole keyspace, and the head of each record
    /// (`GETRANGE`, the 18 bytes that say its state and times) read once,
    /// every namespace together.
    fn stats_all(&self) -> BoxFuture<'_, Result<Vec<(Namespace, NamespaceStats)>, StoreError>> {
        async move {
            let inner = &*self.store.inner().inner;
            let mut keys = inner.scan_keys(RECORD_PATTERN).await?;
            keys.sort();
            keys.dedup();
            let now = Timestamp::from_millis(server_time(inner).await?);
            let mut by_namespace: BTreeMap<Namespace, NamespaceStats> = BTreeMap::new();
            count_heads(inner, &keys, |k, head| {
                if let Some(key) = key_of(k) {
                    let stats = by_namespace.entry(key.namespace().clone()).or_default();
                    tally(stats, head, now);
                }
            })
            .await?;
            // A namespace holding only released keys' tombstones has no
            // records, and is not listed.
            Ok(by_namespace.into_iter().collect())
        }
        .boxed()
    }

    fn size(&self) -> BoxFuture<'_, Result<Option<StoreSize>, StoreError>> {
        async move {
            let inner = &*self.store.inner().inner;
            let masters = inner.masters().await?;
            let mut bytes = 0u64;
            for m in &masters {
                let info = inner
                    .query_node(m, redis::cmd("INFO").arg("memory").clone())
                    .await?;
                let text: String = redis::from_redis_value(info)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                bytes += text
                    .lines()
                    .find_map(|l| l.strip_prefix("used_memory:"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| {
                        StoreError::Corrupt("INFO memory has no used_memory line".into())
                    })?;
            }
            let what = if masters.len() > 1 {
                format!(
                    "used_memory of the cluster's {} masters (everything they hold, not only idem's)",
                    masters.len()
                )
            } else {
                "used_memory of the Redis server (everything it holds, not only idem's)".into()
            };
            Ok(Some(StoreSize { bytes, what }))
        }
        .boxed()
    }

    fn findings(&self) -> BoxFuture<'_, Result<Vec<Finding>, StoreError>> {
        async move {
            let inner = &*self.store.inner().inner;
            let mut out = Vec::new();
            let masters = match inner.masters().await {
                Ok(masters) => masters,
                // Slots without a master that is up.
                Err(e) => {
                    out.push(Finding::new(
                        Severity::Fail,
                        "cluster",
                        e.to_string(),
                        Some("fail the master over to a replica (CLUSTER FAILOVER on it), or bring it back".into()),
                    ));
                    return Ok(out);
                }
            };
            for node in masters {
                let at = node
                    .as_ref()
                    .map_or(String::new(), |(h, p)| format!(" on {h}:{p}"));
                match config(inner, &node).await {
                    Ok(settings) => out.extend(judge(&settings, &at)),
                    Err(e) => out.push(Finding::new(
                        Severity::Warn,
                        "settings",
                        format!("CONFIG GET was refused{at} ({e}), so eviction and persistence were not checked"),
                        Some("check yourself that maxmemory-policy is noeviction and that appendonly is yes".into()),
                    )),
                }
            }
            Ok(out)
        }
        .boxed()
    }

    fn purge<'a>(
        &'a self,
        namespace: &'a Namespace,
        what: Purge,
        progress: &'a (dyn Fn(u64) + Send + Sync),
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        async move {
            // Redis drops a completed record when its retention ends (its
            // key expires), so nothing expired is ever left to remove.
            if what == Purge::Expired {
                progress(0);
                return Ok(0);
            }
            let inner = &*self.store.inner().inner;
            let keys = namespace_keys(inner, namespace).await?;
            let mut removed = 0u64;
            for chunk in keys.chunks(BATCH) {
                let cmds: Vec<Cmd> = chunk
                    .iter()
                    .map(|k| redis::cmd("DEL").arg(k).clone())
                    .collect();
                for answer in inner.pipelined(&inner.conn, &cmds, chunk).await {
                    if matches!(answer.map_err(unavailable)?, Value::Int(1)) {
                        removed += 1;
                    }
                }
                progress(removed);
            }
            Ok(removed)
        }
        .boxed()
    }
}

/// The settings idem's promises depend on, from `CONFIG GET`.
async fn config(
    inner: &Inner,
    node: &Option<crate::cluster::Node>,
) -> Result<Vec<(String, String)>, StoreError> {
    let mut out = Vec::new();
    for name in ["maxmemory", "maxmemory-policy", "appendonly", "save"] {
        let reply = inner
            .query_node(node, redis::cmd("CONFIG").arg("GET").arg(name).clone())
            .await?;
        let pairs: Vec<String> =
            redis::from_redis_value(reply).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        out.extend(
            pairs
                .chunks_exact(2)
                .map(|kv| (kv[0].clone(), kv[1].clone())),
        );
    }
    Ok(out)
}

/// What `settings` mean for idem's records.
fn judge(settings: &[(String, String)], at: &str) -> Vec<Finding> {
    let get = |name: &str| {
        settings
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    };
    let mut out = Vec::new();
    let policy = get("maxmemory-policy");
    let limited = !matches!(get("maxmemory"), "" | "0");
    out.push(if policy == "noeviction" || !limited {
        Finding::new(
            Severity::Ok,
            "eviction",
            format!("Redis never evicts a record{at} (maxmemory-policy {policy}, maxmemory {})", get("maxmemory")),
            None,
        )
    } else {
        Finding::new(
            Severity::Fail,
            "eviction",
            format!(
                "maxmemory-policy is {policy}{at} with maxmemory {}: under memory pressure Redis evicts records, and the work of an evicted key runs again",
                get("maxmemory")
            ),
            Some("redis-cli CONFIG SET maxmemory-policy noeviction (and CONFIG REWRITE)".into()),
        )
    });
    let aof = get("appendonly") == "yes";
    let snapshots = !get("save").trim().is_empty();
    out.push(if aof {
        Finding::new(Severity::Ok, "persistence", format!("append-only file on{at}"), None)
    } else if snapshots {
        Finding::new(
            Severity::Warn,
            "persistence",
            format!(
                "snapshots only{at} (save {}): a crash loses the records written since the last one",
                get("save")
            ),
            Some("redis-cli CONFIG SET appendonly yes (and CONFIG REWRITE)".into()),
        )
    } else {
        Finding::new(
            Severity::Warn,
            "persistence",
            format!("Redis keeps nothing on disk{at}: a restart forgets every record"),
            Some("redis-cli CONFIG SET appendonly yes (and CONFIG REWRITE)".into()),
        )
    });
    out
}

/// Reads the head of each record at `keys` (the bytes that say its state
/// and times, no more) and hands it to `each` with its key; tombstones and
/// keys gone meanwhile are left out.
async fn count_heads(
    inner: &Inner,
    keys: &[Vec<u8>],
    mut each: impl FnMut(&[u8], Counted),
) -> Result<(), StoreError> {
    for chunk in keys.chunks(BATCH) {
        let cmds: Vec<Cmd> = chunk
            .iter()
            .map(|k| {
                redis::cmd("GETRANGE")
                    .arg(k)
                    .arg(0)
                    .arg(COUNTED - 1)
                    .clone()
            })
            .collect();
        let values = inner.pipelined(&inner.conn, &cmds, chunk).await;
        for (k, v) in chunk.iter().zip(values) {
            if let Some(head) = parse_counted(&v.map_err(unavailable)?)? {
                each(k, head);
            }
        }
    }
    Ok(())
}

/// Counts one record, as of `now`.
fn tally(out: &mut NamespaceStats, head: Counted, now: Timestamp) {
    match head {
        Counted::InProgress { until, since } => out.count_claim(until > now, since),
        Counted::Completed { until } if until > now => out.completed += 1,
        // Expiring this millisecond; Redis drops it itself.
        Counted::Completed { .. } => out.expired += 1,
    }
}

/// Every record key of `namespace`, once each, in order.
async fn namespace_keys(inner: &Inner, namespace: &Namespace) -> Result<Vec<Vec<u8>>, StoreError> {
    let (prefix, pattern) = namespace_prefix(namespace.as_str());
    let mut keys: Vec<Vec<u8>> = inner
        .scan_keys(&pattern)
        .await?
        .into_iter()
        .filter(|k| k.starts_with(prefix.as_bytes()))
        .collect();
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// The server's clock in milliseconds (a master's, on a cluster).
async fn server_time(inner: &Inner) -> Result<u64, StoreError> {
    let node = inner.masters().await?.into_iter().next().flatten();
    let v = inner.query_node(&node, redis::cmd("TIME")).await?;
    crate::tier::time_ms(&v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn an_evicting_redis_fails_and_one_without_disk_warns() {
        let evicting = settings(&[
            ("maxmemory", "104857600"),
            ("maxmemory-policy", "allkeys-lru"),
            ("appendonly", "no"),
            ("save", ""),
        ]);
        let found = judge(&evicting, "");
        assert_eq!(found[0].severity, Severity::Fail);
        assert!(found[0].fix.as_deref().unwrap().contains("noeviction"));
        assert_eq!(found[1].severity, Severity::Warn);
        assert!(found[1].detail.contains("nothing on disk"));
        let safe = settings(&[
            ("maxmemory", "0"),
            ("maxmemory-policy", "volatile-lru"),
            ("appendonly", "yes"),
            ("save", "3600 1"),
        ]);
        assert!(judge(&safe, "").iter().all(|f| f.severity == Severity::Ok));
    }
}
