//! Why the store stopped: the first write the engine could not make.
//!
//! After a failed write the engine takes no more (it cannot promise that
//! what it says is written is), so neither does the store: every later
//! operation answers why it stopped, until the store is opened again. A
//! full disk is the usual cause, and the one an operator can fix, so it is
//! named as such: from the error of a write the store made, or, when the
//! engine stopped after a write of its own failed in the background
//! (a table it flushes or compacts, whose error only its log shows), from
//! the room left on the disk.

use std::path::Path;

use idem_core::StoreError;

/// A write the engine could not make.
#[derive(Clone, Debug)]
pub struct WriteFailed {
    /// What failed, in the engine's or the system's words.
    detail: String,
    /// The disk had no room left (`ENOSPC`), or the quota was used up.
    disk_full: bool,
    /// The engine had stopped already, after a write of its own failed.
    in_background: bool,
}

/// Less room than this left when the engine failed to write a table means
/// the disk is full for it: a flush writes tables of up to 8 MiB (a
/// memtable), a compaction several of them.
const ROOM_FOR_TABLES: u64 = 64 << 20;

impl WriteFailed {
    /// The committer thread is gone: nothing can be written any more.
    pub fn committer_stopped() -> Self {
        Self {
            detail: "the committer thread has stopped".into(),
            disk_full: false,
            in_background: false,
        }
    }

    /// Completes what is known once the store's directory is: an engine
    /// that stopped in the background on a disk with too little room for
    /// its tables stopped for a full disk.
    pub fn at(mut self, path: &Path) -> Self {
        if self.in_background
            && let Some(room) = room_left(path)
            && room < ROOM_FOR_TABLES
        {
            self.detail = format!("{}; {room} bytes left on the disk", self.detail);
            self.disk_full = true;
        }
        self
    }

    /// The store's answer to every operation once it has stopped for this
    /// reason: what happened, and what to do about it.
    pub fn stopped(&self, path: &Path) -> StoreError {
        let path = path.display();
        StoreError::unavailable(if self.disk_full {
            format!(
                "the disk holding the store at {path} is full ({}): the store stopped at the first write it could not make and takes no more operations; completions acknowledged before are kept. Free space on that disk, then reopen the store (restart idem serve)",
                self.detail
            )
        } else {
            format!(
                "a durable write to the store at {path} failed ({}): the store stopped and takes no more operations; completions acknowledged before are kept. Reopen the store (restart idem serve) once the cause is fixed",
                self.detail
            )
        })
    }
}

impl From<fjall::Error> for WriteFailed {
    fn from(e: fjall::Error) -> Self {
        let io = match &e {
            fjall::Error::Io(io) | fjall::Error::Storage(fjall::LsmError::Io(io)) => Some(io),
            _ => None,
        };
        let in_background = matches!(e, fjall::Error::Poisoned);
        let detail = match io {
            Some(io) => io.to_string(),
            None if in_background => {
                "the storage engine stopped after a write of its own failed in the background, writing a table; its log says why".into()
            }
            None => e.to_string(),
        };
        Self {
            detail,
            disk_full: io.is_some_and(is_disk_full),
            in_background,
        }
    }
}

/// Whether `e` says the disk (or the quota on it) has no room left.
pub fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// The bytes an unprivileged writer may still use on the filesystem that
/// holds `path`, when the system tells.
#[cfg(unix)]
fn room_left(path: &Path) -> Option<u64> {
    let fs = rustix::fs::statvfs(path).ok()?;
    Some(fs.f_bavail.saturating_mul(fs.f_frsize))
}

#[cfg(not(unix))]
fn room_left(_: &Path) -> Option<u64> {
    None
}
