//! The committer: one thread that writes completed records and fsyncs them
//! in groups.
//!
//! Callers hand over their writes and wait. The thread takes everything that
//! is waiting (up to a limit), writes it as one atomic batch, makes it durable
//! with one fsync, and answers every caller. While it syncs, the next group
//! fills up, so the number of operations per fsync grows with the load.

use std::sync::mpsc;
use std::thread::JoinHandle;

use fjall::{Database, Keyspace, PersistMode, Slice};
use tokio::sync::oneshot;

/// How an acknowledged `complete` is made durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// Concurrent operations share one fsync; each is acknowledged only after
    /// the fsync that covers it. The default.
    #[default]
    GroupCommit,
    /// One fsync per operation: the slowest, for comparison and for disks
    /// where a group's latency matters more than throughput.
    Immediate,
    /// No fsync: writes reach the operating system before they are
    /// acknowledged, so they survive the process being killed, but not a
    /// power loss or kernel crash.
    Buffered,
}

/// One completed record to write, with its expiry index entry. Built by the
/// caller as engine slices, so the committer thread only moves them.
pub struct Put {
    pub key: Slice,
    pub value: Slice,
    pub expiry: Slice,
}

pub struct Job {
    pub puts: Vec<Put>,
    pub done: oneshot::Sender<Result<(), String>>,
}

const MAX_GROUP_PUTS: usize = 16 * 1024;

pub fn spawn(
    db: Database,
    records: Keyspace,
    expiry: Keyspace,
    durability: Durability,
) -> std::io::Result<(mpsc::Sender<Job>, JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel::<Job>();
    let thread = std::thread::Builder::new()
        .name("idem-file-committer".into())
        .spawn(move || {
            let max_puts = match durability {
                Durability::Immediate => 1,
                _ => MAX_GROUP_PUTS,
            };
            // Ends when every sender is gone, after answering what it took.
            while let Ok(first) = rx.recv() {
                let mut puts = first.puts.len();
                let mut group = vec![first];
                while puts < max_puts {
                    match rx.try_recv() {
                        Ok(job) => {
                            puts += job.puts.len();
                            group.push(job);
                        }
                        Err(_) => break,
                    }
                }
                let result = write_group(&db, &records, &expiry, &mut group, durability)
                    .map_err(|e| e.to_string());
                for job in group {
                    let _ = job.done.send(result.clone());
                }
            }
        })?;
    Ok((tx, thread))
}

fn write_group(
    db: &Database,
    records: &Keyspace,
    expiry: &Keyspace,
    group: &mut [Job],
    durability: Durability,
) -> fjall::Result<()> {
    let mut batch = db.batch();
    for put in group.iter_mut().flat_map(|j| j.puts.drain(..)) {
        batch.insert(records, put.key, put.value);
        batch.insert(expiry, put.expiry, Slice::empty());
    }
    batch.commit()?;
    // The journal is persisted by hand (`manual_journal_persist`): even the
    // buffered mode must hand the batch to the operating system before it
    // acknowledges, or a killed process would lose it.
    db.persist(match durability {
        Durability::Buffered => PersistMode::Buffer,
        Durability::GroupCommit | Durability::Immediate => PersistMode::SyncData,
    })
}
