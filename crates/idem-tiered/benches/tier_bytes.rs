//! Bytes a completed record takes in each store that can be a tier.
//!
//! `cargo bench -p idem-tiered --bench tier_bytes` imports
//! `IDEM_BENCH_RECORDS` (default 1 000 000) completed records (16-byte keys
//! `order-0000000001` in namespace `tier-bytes`, an xxh3 fingerprint, the
//! outcome `"ok"`) into each store, 10 000 an import, and prints what the
//! store then holds per record:
//!
//! - the file store: bytes on disk under its directory once it is closed
//!   (journal, tables and index included);
//! - Redis (`IDEM_TEST_REDIS_URL`): growth of `used_memory` (so run it
//!   where nothing else writes to that Redis); the records are deleted
//!   afterwards;
//! - PostgreSQL (`IDEM_TEST_POSTGRES_URL`): `pg_total_relation_size` of the
//!   table after `VACUUM ANALYZE` (heap, primary key, expiry index, TOAST);
//! - MariaDB (`IDEM_TEST_MYSQL_URL`): the table's `.ibd` file size from
//!   `information_schema.innodb_sys_tablespaces`, and InnoDB's own
//!   `data_length + index_length` after `ANALYZE TABLE`.
//!
//! Names given as arguments pick stores (`file`, `redis`, `postgres`,
//! `mysql`). The memory store's figure is `cargo bench -p idem-core --bench
//! memory_per_record`; the key filter's is `tests/filter_sizing.rs`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use idem_core::tier::{ImportItem, Tier};
use idem_core::{Completed, FencingToken, Fingerprint, Key, Timestamp};
use idem_file::FileStore;
use idem_redis::RedisStore;
use idem_sql::SqlStore;

const BATCH: usize = 10_000;

/// The namespace of the bench's records.
const NS: &str = "tier-bytes";

fn records() -> usize {
    std::env::var("IDEM_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

fn url(var: &str, default: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The `n` records, in imports of [`BATCH`].
fn batches(n: usize) -> impl Iterator<Item = Vec<ImportItem>> {
    let now = now_ms();
    (0..n).step_by(BATCH).map(move |start| {
        (start..(start + BATCH).min(n))
            .map(|i| {
                let id = format!("order-{i:010}");
                ImportItem {
                    key: Key::new(NS, Bytes::from(id.clone())).expect("a valid key"),
                    record: Completed {
                        token: FencingToken::new(1_000 + i as u64),
                        fingerprint: Some(Fingerprint::xxh3(id.as_bytes())),
                        outcome: Some(Bytes::from_static(b"ok")),
                        completed_at: Timestamp::from_millis(now),
                        expires_at: Timestamp::from_millis(now + 24 * 3_600_000),
                    },
                }
            })
            .collect()
    })
}

/// Imports the records into `store`, printing the rate.
async fn fill<T: Tier>(name: &str, store: &T, n: usize) -> Result<(), String> {
    let started = Instant::now();
    for batch in batches(n) {
        store
            .import_many(&batch)
            .await
            .map_err(|e| format!("{name}: import: {e}"))?;
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!("{name}: {n} records imported in {secs:.1} s");
    Ok(())
}

fn report(name: &str, what: &str, bytes: u64, n: usize) {
    println!(
        "{name:<12} {what:<58} {bytes:>13} B  {:>7.1} B a record",
        bytes as f64 / n as f64
    );
}

fn dir_bytes(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Runs `program args…` and answers its standard output, trimmed.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

async fn file(n: usize) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    {
        let store = FileStore::open(dir.path()).map_err(|e| e.to_string())?;
        fill("file", &store, n).await?;
        store.flush().map_err(|e| e.to_string())?;
    }
    // fjall flushes its memtables in the background; give it a moment
    // after the store is closed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    report(
        "file",
        "on disk, the store closed",
        dir_bytes(dir.path()),
        n,
    );
    let mut parts: Vec<_> = std::fs::read_dir(dir.path())
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    parts.sort();
    for (name, path) in parts {
        let bytes = if path.is_dir() {
            dir_bytes(&path)
        } else {
            std::fs::metadata(&path).map_or(0, |m| m.len())
        };
        report("file", &format!("  of it {name}"), bytes, n);
    }
    Ok(())
}

async fn redis(n: usize) -> Result<(), String> {
    let url = url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let used = || -> Result<u64, String> {
        run("redis-cli", &["-u", &url, "INFO", "memory"])?
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| "redis-cli INFO memory: no used_memory".to_owned())
    };
    let before = used()?;
    let store = RedisStore::connect(&url)
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    fill("redis", &store, n).await?;
    let after = used()?;
    report(
        "redis",
        "used_memory growth",
        after.saturating_sub(before),
        n,
    );
    // Leave the server as it was: the bench's namespace only.
    run(
        "sh",
        &[
            "-c",
            &format!(
                "redis-cli -u '{url}' --scan --pattern 'idem:{{{NS}:*' \\
                 | xargs -r -n 1000 redis-cli -u '{url}' UNLINK >/dev/null"
            ),
        ],
    )?;
    Ok(())
}

/// A new table of the SQL store at `url` holding the `n` records; answers
/// its name.
async fn sql_filled(name: &str, url: &str, n: usize) -> Result<String, String> {
    let table = format!("idem_bytes_{}", now_ms());
    let store = SqlStore::builder(url)
        .table(&table)
        .connect()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    fill(name, &store, n).await?;
    Ok(table)
}

async fn postgres(n: usize) -> Result<(), String> {
    let url = url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let table = sql_filled("postgres", &url, n).await?;
    run("psql", &[&url, "-qc", &format!("VACUUM ANALYZE {table}")])?;
    let size = |what: &str| -> Result<u64, String> {
        run(
            "psql",
            &[&url, "-tAc", &format!("SELECT {what}('{table}')")],
        )?
        .parse()
        .map_err(|e| format!("{what}: {e}"))
    };
    report(
        "postgres",
        "pg_total_relation_size (heap, indexes, TOAST)",
        size("pg_total_relation_size")?,
        n,
    );
    report("postgres", "  of it the heap", size("pg_relation_size")?, n);
    report(
        "postgres",
        "  of it the indexes",
        size("pg_indexes_size")?,
        n,
    );
    run(
        "psql",
        &[
            &url,
            "-qc",
            &format!("DROP TABLE {table}; DROP TABLE IF EXISTS {table}_tokens"),
        ],
    )?;
    Ok(())
}

async fn mysql(n: usize) -> Result<(), String> {
    let url = url("IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
    let table = sql_filled("mysql", &url, n).await?;
    // The CLI takes the server from its own flags: the bench's default URL.
    let sql = |q: &str| {
        run(
            "mariadb",
            &["-h", "127.0.0.1", "-u", "root", "test", "-N", "-e", q],
        )
    };
    sql(&format!("ANALYZE TABLE {table}"))?;
    let number =
        |q: &str| -> Result<u64, String> { sql(q)?.parse().map_err(|e| format!("{q}: {e}")) };
    report(
        "mysql",
        "the table's .ibd file",
        number(&format!(
            "SELECT file_size FROM information_schema.innodb_sys_tablespaces \
             WHERE name = 'test/{table}'"
        ))?,
        n,
    );
    report(
        "mysql",
        "  InnoDB's data_length + index_length",
        number(&format!(
            "SELECT data_length + index_length FROM information_schema.tables \
             WHERE table_schema = 'test' AND table_name = '{table}'"
        ))?,
        n,
    );
    sql(&format!(
        "DROP TABLE {table}; DROP TABLE IF EXISTS {table}_tokens"
    ))?;
    Ok(())
}

fn main() {
    let n = records();
    let words: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| words.is_empty() || words.iter().any(|w| w == name);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        println!("{n} completed records, 16-byte keys, a 16-byte fingerprint, outcome \"ok\"");
        for name in ["file", "redis", "postgres", "mysql"] {
            if !wanted(name) {
                continue;
            }
            let measured = match name {
                "file" => file(n).await,
                "redis" => redis(n).await,
                "postgres" => postgres(n).await,
                _ => mysql(n).await,
            };
            if let Err(e) = measured {
                println!("{name}: {e}");
            }
        }
    });
}
