//! Creating the store's directory so that it survives a power cut.

use std::fs::File;
use std::io;
use std::path::Path;

/// `create_dir_all`, then syncs the parent of each directory it made: a new
/// directory's name is durable only once its parent is synced, and the engine
/// syncs the store's directory itself, not the one it sits in.
pub fn create_durably(path: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut dir = path;
    while !dir.exists() {
        missing.push(dir);
        match dir.parent() {
            Some(parent) => dir = parent,
            None => break,
        }
    }
    std::fs::create_dir_all(path)?;
    for made in missing {
        let parent = match made.parent() {
            Some(p) if p.as_os_str().is_empty() => Path::new("."),
            Some(p) => p,
            None => continue,
        };
        File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Syncs `path` and every directory under it. The engine syncs a new
/// keyspace's own folder but not the folder that names it: without this, a
/// power cut after the first open can lose a whole keyspace, and with the
/// `meta` keyspace the token ceiling.
pub fn sync_tree(path: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            sync_tree(&entry.path())?;
        }
    }
    File::open(path)?.sync_all()
}

/// The engine's journal files in `path` (`N.jnl`) and where their data
/// ends: compared with their lengths after the engine opened, they show
/// what its recovery cut off.
pub fn journal_sizes(path: &Path) -> Vec<(std::path::PathBuf, u64)> {
    let Ok(entries) = std::fs::read_dir(path) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "jnl"))
        .filter_map(|p| Some((p.clone(), data_end(&p).ok()?)))
        .collect()
}

/// Where a journal's data ends: its length less the zeros at its end. The
/// engine sets a journal's space aside in advance, as zeros, and cuts them
/// off when it recovers; only a cut into what was written is a loss.
fn data_end(path: &Path) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    const CHUNK: u64 = 1024 * 1024;
    let mut file = std::fs::File::open(path)?;
    let mut end = file.metadata()?.len();
    let mut buf = vec![0u8; CHUNK as usize];
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        let chunk = &mut buf[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        if let Some(last) = chunk.iter().rposition(|&b| b != 0) {
            return Ok(start + last as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}
