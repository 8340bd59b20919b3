//! The committer: one thread that writes completed records and fsyncs them
//! in groups.
//!
//! Callers hand over their writes and wait. The thread takes everything that
//! is waiting (up to a limit), writes it as one atomic batch, makes it durable
//! with one fsync, finishes their claims and answers every caller. While it
//! syncs, the next group fills up, so the number of operations per fsync
//! grows with the load. It also deletes expired records for the sweeper, so
//! that every write to `records` happens on this one thread, and keeps the
//! token high-water mark (see `tokens`), written in the batch of the
//! records that raise it.

use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use fjall::{Database, Keyspace, PersistMode, Slice};
use idem_core::{Completed, Timestamp};
use tokio::sync::oneshot;

use crate::claims::Claims;
use crate::codec::{
    completed_key, decode_completed, encode_completed, expiry_key, split_expiry_key,
};
use crate::failure::WriteFailed;
use crate::tokens::HIGH_WATER;

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

/// One completed record to write, with its expiry and completion index
/// entries and the token whose claim it finishes. Built by the caller as
/// engine slices, so the committer thread only moves them.
pub struct Put {
    pub key: Slice,
    pub value: Slice,
    pub expiry: Slice,
    pub completed: Slice,
    pub token: u64,
}

impl Put {
    /// `record` under the encoded key `enc`, finishing the claim `token`.
    pub fn new(enc: Box<[u8]>, record: &Completed, token: u64) -> Self {
        Self {
            expiry: expiry_key(record.expires_at, &enc).into(),
            completed: completed_key(record.completed_at, &enc).into(),
            value: encode_completed(record).into(),
            key: enc.into_vec().into(),
            token,
        }
    }
}

/// What the committer thread does, in the order it receives them.
pub enum Job {
    /// Write completed records durably, then answer. The caller finishes
    /// its claims when it hears back; when it has stopped waiting (its
    /// future dropped), the committer finishes them, so no claim is left
    /// behind (see `claims::Finishing`).
    Put {
        puts: Vec<Put>,
        /// A token the high-water mark must reach, written in the same
        /// batch as `puts` (imported records, a raised floor).
        high_water: Option<u64>,
        done: oneshot::Sender<Result<(), WriteFailed>>,
    },
    /// Delete the records these expiry index entries name, where the record
    /// still carries the indexed expiry, and the entries themselves. Done by
    /// the only thread that writes records, so a record written after the
    /// sweeper read the index is never deleted by an old entry.
    Sweep {
        due: Vec<Slice>,
        done: std::sync::mpsc::SyncSender<Result<usize, WriteFailed>>,
    },
    /// Delete these records (encoded keys) and their expiry index entries:
    /// every one, or with `expired_by` only those whose retention ended by
    /// then. An operator's purge.
    Purge {
        keys: Vec<Slice>,
        expired_by: Option<Timestamp>,
        done: std::sync::mpsc::SyncSender<Result<usize, WriteFailed>>,
    },
    /// Delete the record of this encoded key, with its index entries, if
    /// it is completed by `token` and still live at `now`; synced. Answers
    /// whether it went. Done here so that no completion of the key can be
    /// written between the check and the delete.
    Reopen {
        key: Slice,
        token: u64,
        now: Timestamp,
        done: oneshot::Sender<Result<bool, WriteFailed>>,
    },
}

/// One caller's puts and where its answer goes.
type Written = (Vec<Put>, oneshot::Sender<Result<(), WriteFailed>>);

const MAX_GROUP_PUTS: usize = 16 * 1024;

/// The committer's view of the store.
pub struct Engine {
    pub db: Database,
    pub records: Keyspace,
    pub expiry: Keyspace,
    pub completed: Keyspace,
    pub meta: Keyspace,
    pub claims: Arc<Claims>,
    pub durability: Durability,
    /// The durable high-water mark: what the committer last wrote.
    pub high_water: u64,
}

pub fn spawn(mut engine: Engine) -> std::io::Result<(mpsc::Sender<Job>, JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel::<Job>();
    let thread = std::thread::Builder::new()
        .name("idem-file-committer".into())
        .spawn(move || {
            let max_puts = match engine.durability {
                Durability::Immediate => 1,
                _ => MAX_GROUP_PUTS,
            };
            let mut later = None;
            // Ends when every sender is gone, after answering what it took.
            while let Some(first) = later.take().or_else(|| rx.recv().ok()) {
                let (puts, mut high_water, done) = match first {
                    Job::Put {
                        puts,
                        high_water,
                        done,
                    } => (puts, high_water, done),
                    Job::Sweep { due, done } => {
                        let _ = done.send(engine.sweep(&due).map_err(WriteFailed::from));
                        continue;
                    }
                    Job::Purge {
                        keys,
                        expired_by,
                        done,
                    } => {
                        let removed = engine.purge(&keys, expired_by);
                        let _ = done.send(removed.map_err(WriteFailed::from));
                        continue;
                    }
                    Job::Reopen {
                        key,
                        token,
                        now,
                        done,
                    } => {
                        let went = engine.reopen(&key, token, now);
                        let _ = done.send(went.map_err(WriteFailed::from));
                        continue;
                    }
                };
                let mut count = puts.len();
                let mut group = vec![(puts, done)];
                while count < max_puts {
                    match rx.try_recv() {
                        Ok(Job::Put {
                            puts,
                            high_water: more,
                            done,
                        }) => {
                            count += puts.len();
                            high_water = high_water.max(more);
                            group.push((puts, done));
                        }
                        Ok(sweep) => {
                            later = Some(sweep);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                engine.write_group(group, high_water);
            }
        })?;
    Ok((tx, thread))
}

impl Engine {
    fn write_group(&mut self, group: Vec<Written>, high_water: Option<u64>) {
        let result = self.write(&group, high_water).map_err(WriteFailed::from);
        for (puts, done) in group {
            // The caller finishes its claims when it hears back; one that
            // stopped waiting cannot, so the committer does.
            if done.send(result.clone()).is_err() {
                for put in &puts {
                    self.claims.finish_completing(&put.key, put.token, &result);
                }
            }
        }
    }

    fn write(&mut self, group: &[Written], high_water: Option<u64>) -> fjall::Result<()> {
        let mut batch = self.db.batch();
        for put in group.iter().flat_map(|(puts, _)| puts) {
            batch.insert(&self.records, put.key.clone(), put.value.clone());
            batch.insert(&self.expiry, put.expiry.clone(), Slice::empty());
            batch.insert(&self.completed, put.completed.clone(), Slice::empty());
        }
        let raised = high_water.filter(|&t| t > self.high_water);
        if let Some(t) = raised {
            batch.insert(&self.meta, HIGH_WATER, t.to_le_bytes());
        }
        batch.commit()?;
        // The journal is persisted by hand (`manual_journal_persist`): even the
        // buffered mode must hand the batch to the operating system before it
        // acknowledges, or a killed process would lose it. A raised
        // high-water mark is synced in every mode, as the token ceiling is:
        // tokens must stay monotonic across a power loss too.
        self.db.persist(match self.durability {
            Durability::Buffered if raised.is_none() => PersistMode::Buffer,
            _ => PersistMode::SyncData,
        })?;
        if let Some(t) = raised {
            self.high_water = t;
        }
        Ok(())
    }

    /// Deletes the records `keys` names (with `expired_by`, only those
    /// expired by then) and their expiry index entries; returns how many
    /// went. Synced like a write: a purge an operator was told is done
    /// stays done.
    fn purge(&self, keys: &[Slice], expired_by: Option<Timestamp>) -> fjall::Result<usize> {
        let mut batch = self.db.batch();
        let mut removed = 0;
        for enc in keys {
            let Some(v) = self.records.get(enc)? else {
                continue;
            };
            let record = decode_completed(&v).ok();
            let expires_at = record.as_ref().map(|r| r.expires_at);
            if expired_by.is_some_and(|by| expires_at.is_none_or(|at| at > by)) {
                continue;
            }
            if let Some(r) = &record {
                batch.remove(&self.expiry, expiry_key(r.expires_at, enc));
                batch.remove(&self.completed, completed_key(r.completed_at, enc));
            }
            batch.remove(&self.records, enc.clone());
            removed += 1;
        }
        batch.commit()?;
        self.db.persist(PersistMode::SyncData)?;
        Ok(removed)
    }

    /// Deletes the record of `enc` if it is completed by `token` and live
    /// at `now`, with its index entries, synced; answers whether it went.
    fn reopen(&self, enc: &Slice, token: u64, now: Timestamp) -> fjall::Result<bool> {
        let Some(v) = self.records.get(enc)? else {
            return Ok(false);
        };
        let Ok(r) = decode_completed(&v) else {
            return Ok(false);
        };
        if !idem_core::machine::completed_by(r.token.get(), token, r.expires_at, now) {
            return Ok(false);
        }
        let mut batch = self.db.batch();
        batch.remove(&self.expiry, expiry_key(r.expires_at, enc));
        batch.remove(&self.completed, completed_key(r.completed_at, enc));
        batch.remove(&self.records, enc.clone());
        batch.commit()?;
        self.db.persist(PersistMode::SyncData)?;
        Ok(true)
    }

    /// Deletes what `due` names and is still due; returns how many records
    /// went. Not synced: a delete lost in a crash is redone by a later
    /// sweep, and reads treat an expired record as absent meanwhile.
    fn sweep(&self, due: &[Slice]) -> fjall::Result<usize> {
        let mut batch = self.db.batch();
        let mut removed = 0;
        for index_key in due {
            if let Some((expires_at, enc)) = split_expiry_key(index_key)
                && let Some(v) = self.records.get(enc)?
                && let Ok(r) = decode_completed(&v)
                && r.expires_at == expires_at
            {
                batch.remove(&self.records, enc);
                batch.remove(&self.completed, completed_key(r.completed_at, enc));
                removed += 1;
            }
            batch.remove(&self.expiry, index_key.clone());
        }
        batch.commit()?;
        Ok(removed)
    }
}
