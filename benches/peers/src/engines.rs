//! The two embedded engines the file store could stand on, on its write
//! pattern: random keys, one durable commit per batch (256 keys, and 1).
//!   cargo run --release --manifest-path benches/peers/Cargo.toml --bin engines

use std::time::{Duration, Instant};

use fjall::{Database, KeyspaceCreateOptions, PersistMode};
use redb::{Durability, TableDefinition};

const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
const VALUE: [u8; 28] = [7; 28];

fn key(i: u64) -> Vec<u8> {
    format!("\x06orders{:020}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).into_bytes()
}

fn fjall_rate(per_commit: u64, budget: Duration) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::builder(dir.path())
        .manual_journal_persist(true)
        .open()
        .unwrap();
    let ks = db
        .keyspace("records", || {
            KeyspaceCreateOptions::default().max_memtable_size(8 << 20)
        })
        .unwrap();
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed() < budget {
        let mut batch = db.batch();
        for _ in 0..per_commit {
            batch.insert(&ks, key(n), &VALUE[..]);
            n += 1;
        }
        batch.commit().unwrap();
        db.persist(PersistMode::SyncData).unwrap();
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn redb_rate(per_commit: u64, budget: Duration) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("redb")).unwrap();
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed() < budget {
        let mut tx = db.begin_write().unwrap();
        tx.set_durability(Durability::Immediate).unwrap();
        {
            let mut table = tx.open_table(TABLE).unwrap();
            for _ in 0..per_commit {
                table.insert(&key(n)[..], &VALUE[..]).unwrap();
                n += 1;
            }
        }
        tx.commit().unwrap();
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let budget = Duration::from_secs(5);
    for per_commit in [256, 1] {
        for round in 0..2 {
            let f = fjall_rate(per_commit, budget);
            let r = redb_rate(per_commit, budget);
            println!(
                "{per_commit:>3} keys per durable commit, round {round}: fjall {:>9.0} inserts/s   redb {:>9.0} inserts/s   ratio {:.1}",
                f,
                r,
                f / r
            );
        }
    }
}
