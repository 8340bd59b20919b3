//! `idem stats` (a namespace's records counted by state, the oldest claim
//! in progress, the store's size) and `idem purge` (remove a namespace's
//! expired records, or all of them).

use std::sync::Arc;

use clap::{ArgGroup, Args};
use idem_core::admin::{Admin, NamespaceStats, Purge};
use idem_core::{Clock as _, Namespace, SystemClock};
use serde_json::{Value, json};

use super::{age, failed, namespace_of, open, spinner};
use crate::config::{StoreArgs, bad};
use crate::run::Failure;
use crate::store::OpenStore;

/// `idem stats`.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// The namespace [default: every namespace in the store].
    pub namespace: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// `idem purge`.
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("what").required(true).args(["expired", "all"])))]
pub struct PurgeArgs {
    /// The namespace.
    pub namespace: String,
    /// Remove the records past their retention that are still stored
    /// (nothing a caller can see changes).
    #[arg(long)]
    pub expired: bool,
    /// Remove every record of the namespace, claims in progress too: each
    /// key runs again on its next delivery. Needs --yes.
    #[arg(long)]
    pub all: bool,
    /// Confirm --all.
    #[arg(long)]
    pub yes: bool,
    /// Count what would be removed, and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// The operator's view of `store`, or why it has none.
fn admin_of(store: &OpenStore) -> Result<Arc<dyn Admin>, Failure> {
    store.admin.clone().ok_or_else(|| {
        Failure::Run(format!(
            "the {} has no operator's view as a whole: run the command on each tier's own \
             URL (--store with the --hot-store or --cold-store URL)",
            store.description
        ))
    })
}

/// Counts each namespace's records.
pub async fn stats(args: StatsArgs) -> Result<(), Failure> {
    let only = args.namespace.as_deref().map(namespace_of).transpose()?;
    let store = open(args.store).await?;
    let result = stats_of(&store, only, args.json).await;
    store.close().await;
    result
}

async fn stats_of(store: &OpenStore, only: Option<Namespace>, json: bool) -> Result<(), Failure> {
    let admin = admin_of(store)?;
    let bar = spinner("counting records".into());
    let rows = match only {
        Some(ns) => {
            bar.set_message(format!("counting the records of {ns}"));
            let stats = admin
                .stats(&ns)
                .await
                .map_err(|e| failed(store, &format!("counting the records of {ns}"), e))?;
            vec![(ns, stats)]
        }
        // One pass over the store where it can make one.
        None => admin
            .stats_all()
            .await
            .map_err(|e| failed(store, "counting the records of every namespace", e))?,
    };
    bar.finish_and_clear();
    let size = admin
        .size()
        .await
        .map_err(|e| failed(store, "measuring the store", e))?;
    let now = SystemClock.now();
    let oldest = |s: &NamespaceStats| s.oldest_in_progress.map(|t| now.since(t));
    if json {
        let namespaces: Vec<Value> = rows
            .iter()
            .map(|(ns, s)| {
                json!({
                    "namespace": ns.as_str(),
                    "in_progress": s.in_progress,
                    "abandoned": s.abandoned,
                    "completed": s.completed,
                    "expired": s.expired,
                    "oldest_in_progress_ms": oldest(s).map(|d| d.as_millis() as u64),
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "store": store.description,
                "size_bytes": size.as_ref().map(|s| s.bytes),
                "size_of": size.as_ref().map(|s| s.what.as_str()),
                "namespaces": namespaces,
            })
        );
        return Ok(());
    }
    let head = [
        "NAMESPACE",
        "IN PROGRESS",
        "ABANDONED",
        "COMPLETED",
        "EXPIRED",
        "OLDEST IN PROGRESS",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|(ns, s)| {
            vec![
                ns.to_string(),
                s.in_progress.to_string(),
                s.abandoned.to_string(),
                s.completed.to_string(),
                s.expired.to_string(),
                oldest(s).map_or(String::new(), |d| format!("started {} ago", age(d))),
            ]
        })
        .collect();
    print!("{}", super::columns(&head, &cells));
    if rows.is_empty() {
        println!("(no namespaces: the store holds no records)");
    }
    println!("store: {}", store.description);
    if let Some(size) = size {
        println!("size: {}, {}", bytes(size.bytes), size.what);
    }
    if store.file.is_some() {
        println!(
            "claims in progress live in the memory of the idem serve using a file store: \
             opened here, it has none"
        );
    }
    Ok(())
}

/// Removes a namespace's expired records, or all of them.
pub async fn purge(args: PurgeArgs) -> Result<(), Failure> {
    let ns = namespace_of(&args.namespace)?;
    if args.all && !args.yes && !args.dry_run {
        return Err(bad(
            "yes",
            format!(
                "purge --all removes every record of {ns}, claims in progress too, so every \
                 key runs again on its next delivery: pass --yes to confirm"
            ),
        )
        .into());
    }
    let what = if args.all { Purge::All } else { Purge::Expired };
    let store = open(args.store).await?;
    if args.dry_run {
        let counted = match admin_of(&store) {
            Ok(admin) => admin
                .stats(&ns)
                .await
                .map_err(|e| failed(&store, &format!("counting the records of {ns}"), e)),
            Err(e) => Err(e),
        };
        store.close().await;
        let s = counted?;
        let would = match what {
            Purge::All => s.in_progress + s.abandoned + s.completed + s.expired,
            Purge::Expired => s.expired,
        };
        if args.json {
            println!(
                "{}",
                json!({"namespace": ns.as_str(), "dry_run": true, "would_remove": would,
                       "in_progress": s.in_progress + s.abandoned})
            );
        } else {
            println!(
                "{ns}: would remove {} ({} in progress among them); nothing was removed",
                records(would),
                if what == Purge::All {
                    s.in_progress + s.abandoned
                } else {
                    0
                }
            );
        }
        return Ok(());
    }
    let result = purge_in(&store, &ns, what).await;
    store.close().await;
    let removed = result?;
    let kind = match what {
        Purge::All => "all",
        Purge::Expired => "expired",
    };
    tracing::warn!(namespace = %ns, removed, what = kind, "purged by an operator");
    if args.json {
        println!(
            "{}",
            json!({"namespace": ns.as_str(), "purged": kind, "removed": removed})
        );
    } else {
        match what {
            Purge::All => println!("{ns}: removed {} (all of them)", records(removed)),
            Purge::Expired => println!("{ns}: removed {} past retention", records(removed)),
        }
    }
    Ok(())
}

async fn purge_in(store: &OpenStore, ns: &Namespace, what: Purge) -> Result<u64, Failure> {
    let admin = admin_of(store)?;
    let bar = spinner(format!("removing records of {ns}:"));
    let progress = |n: u64| bar.set_position(n);
    let removed = admin
        .purge(ns, what, &progress)
        .await
        .map_err(|e| failed(store, &format!("purging {ns}"), e));
    bar.finish_and_clear();
    removed
}

/// `n records`, or `1 record`.
fn records(n: u64) -> String {
    if n == 1 {
        "1 record".into()
    } else {
        format!("{n} records")
    }
}

/// Bytes as people read them.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::bytes;

    #[test]
    fn sizes_read_as_people_say_them() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(2048), "2.0 KiB");
        assert_eq!(bytes(5 * 1024 * 1024 + 512 * 1024), "5.5 MiB");
    }
}
