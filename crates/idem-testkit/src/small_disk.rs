//! A small disk that a test fills up: a tmpfs of a few MiB mounted for the
//! test alone, and a ballast file that takes whatever room is left, so the
//! next write that needs a new page fails with `ENOSPC`, as on a real disk
//! that ran out of space. Deleting the ballast frees the room again.
//!
//! Mounting needs root (the `mount` command); without it a test skips or
//! fails as [`services::absent`] decides. The disk is unmounted when its
//! [`SmallDisk`] is dropped, also when the test panics; stop whatever runs
//! on it (a server of the test's own) before.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::services;

/// A mounted tmpfs of a fixed size; see the [module docs](self).
pub struct SmallDisk {
    path: PathBuf,
}

/// The ballast file's name, at the root of the disk.
const BALLAST: &str = "ballast";

impl SmallDisk {
    /// Mounts a tmpfs of `bytes` at a new directory in the system's
    /// temporary directory.
    pub fn mount(bytes: u64) -> io::Result<Self> {
        static MOUNTED: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "idem-small-disk-{}-{}",
            std::process::id(),
            MOUNTED.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path)?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&path)
            .output();
        match out {
            Ok(out) if out.status.success() => Ok(Self { path }),
            Ok(out) => {
                let _ = std::fs::remove_dir(&path);
                Err(io::Error::other(format!(
                    "mount -t tmpfs exited {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )))
            }
            Err(e) => {
                let _ = std::fs::remove_dir(&path);
                Err(e)
            }
        }
    }

    /// [`mount`](Self::mount) for a test: when a tmpfs cannot be mounted
    /// here, skips with a printed reason, or fails when services are
    /// required (see [`services`]).
    pub fn mount_for_test(bytes: u64) -> Option<Self> {
        match Self::mount(bytes) {
            Ok(disk) => Some(disk),
            Err(e) => {
                let at = std::env::temp_dir().display().to_string();
                services::absent("a tmpfs mount (needs root)", &at, e)
            }
        }
    }

    /// Where the disk is mounted.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the ballast until the disk refuses more with `ENOSPC`, and
    /// answers how many bytes it took. Only the last partly written page
    /// of each file on the disk is left to write into.
    pub fn fill(&self) -> io::Result<u64> {
        let mut ballast = File::options()
            .create(true)
            .append(true)
            .open(self.path.join(BALLAST))?;
        let mut taken = 0;
        // Smaller and smaller writes, down to one page: a short write at
        // the end is where the room runs out.
        for size in [1 << 20, 64 << 10, 4 << 10] {
            let chunk = vec![0x5a; size];
            loop {
                match ballast.write(&chunk) {
                    Ok(0) => break,
                    Ok(n) => taken += n as u64,
                    Err(e) if e.kind() == io::ErrorKind::StorageFull => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(taken)
    }

    /// Fills the disk, then gives `room` bytes of it back: writes of up to
    /// about that much succeed, the next fail.
    pub fn fill_leaving(&self, room: u64) -> io::Result<u64> {
        let taken = self.fill()?;
        let kept = taken.saturating_sub(room);
        File::options()
            .write(true)
            .open(self.path.join(BALLAST))?
            .set_len(kept)?;
        Ok(kept)
    }

    /// Deletes the ballast: the room it took is free again.
    pub fn free(&self) -> io::Result<()> {
        std::fs::remove_file(self.path.join(BALLAST))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(&self.path)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            // Something still holds a file there: detach the disk now, and
            // the kernel lets it go once the last file is closed.
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}
