//! A disk that loses power: a FUSE filesystem for crash tests that a killed
//! process cannot fake.
//!
//! `kill -9` leaves the operating system's page cache alone, so a store that
//! forgets to `fsync` still passes a kill test. [`PowerLossDisk`] mounts a
//! filesystem whose disk image is a backing directory and keeps two views of
//! it in memory:
//!
//! - what programs see: every write, creation, rename, truncation and
//!   removal, at once;
//! - what is on the platter: a file's content as of its last `fsync` or
//!   `fdatasync`, and a directory's entries (creations, renames, removals) as
//!   of its last `fsync`. Nothing else reaches it, as POSIX promises nothing
//!   more: a new file's name survives only once its directory was synced.
//!
//! [`PowerLossDisk::cut_power`] freezes the platter (every later operation
//! fails with `EIO`); [`PowerLossDisk::unmount`] then writes the platter, and
//! only it, to the backing directory, so mounting that directory again shows
//! what a machine finds after a power cut. Without a cut, unmounting writes
//! everything, like a clean shutdown.
//!
//! Mounting needs `/dev/fuse` and root (the `mount` system call, no
//! `fusermount`). Built only with the `fuse` feature.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};

/// A mounted filesystem that can lose power; see the [module docs](self).
pub struct PowerLossDisk {
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
    backing: PathBuf,
}

impl PowerLossDisk {
    /// Mounts at `mountpoint` (an existing empty directory) a filesystem
    /// whose disk image is `backing` (created if absent).
    pub fn mount(backing: &Path, mountpoint: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(backing)?;
        let state = Arc::new(Mutex::new(State::load(backing)?));
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("idem-power-loss".into()),
            MountOption::NoAtime,
        ];
        let session = fuser::spawn_mount(Fuse(state.clone()), mountpoint, &config)?;
        Ok(Self {
            state,
            session: Some(session),
            backing: backing.to_path_buf(),
        })
    }

    /// [`mount`](Self::mount) for a test: when FUSE cannot be used here,
    /// skips with a printed reason, or fails when services are required
    /// (see [`services`](crate::services)).
    pub fn mount_for_test(backing: &Path, mountpoint: &Path) -> Option<Self> {
        match Self::mount(backing, mountpoint) {
            Ok(disk) => Some(disk),
            Err(e) => crate::services::absent(
                "a FUSE mount (needs /dev/fuse and root)",
                &mountpoint.display().to_string(),
                e,
            ),
        }
    }

    /// Cuts the power: from now on every operation fails with `EIO`, and only
    /// what was synced before is left on the disk.
    pub fn cut_power(&self) {
        lock(&self.state).powered = false;
    }

    /// Unmounts and writes the disk image to the backing directory: what was
    /// synced before [`cut_power`](Self::cut_power), or everything when the
    /// power stayed on.
    pub fn unmount(mut self) -> io::Result<()> {
        if let Some(session) = self.session.take() {
            match session.umount_and_join() {
                Ok(()) => {}
                // The kernel ends the session with ECONNABORTED instead of
                // ENODEV when it aborts the connection at unmount (a killed
                // writer's requests still in flight): over all the same,
                // and the disk's state is all in memory here.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => return Err(e),
            }
        }
        let state = lock(&self.state);
        let tree = if state.powered {
            state.visible_tree()
        } else {
            state.synced_tree()
        };
        for entry in std::fs::read_dir(&self.backing)? {
            let path = entry?.path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path)?;
            } else {
                std::fs::remove_file(&path)?;
            }
        }
        tree.write_into(&self.backing)
    }
}

impl Drop for PowerLossDisk {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

const CHUNK: usize = 64 * 1024;

/// A file's bytes in shared chunks: a sync copies the chunk list, and a later
/// write copies only the chunk it changes. Holes take no memory.
#[derive(Clone, Default)]
struct Data {
    len: u64,
    chunks: Vec<Option<Arc<Vec<u8>>>>,
}

impl Data {
    fn write(&mut self, offset: u64, bytes: &[u8]) {
        let end = offset + bytes.len() as u64;
        let last_chunk = end.div_ceil(CHUNK as u64) as usize;
        if self.chunks.len() < last_chunk {
            self.chunks.resize(last_chunk, None);
        }
        let mut pos = offset;
        let mut rest = bytes;
        while !rest.is_empty() {
            let (i, at) = ((pos / CHUNK as u64) as usize, (pos % CHUNK as u64) as usize);
            let n = rest.len().min(CHUNK - at);
            let chunk = self.chunks[i].get_or_insert_with(|| Arc::new(vec![0; CHUNK]));
            Arc::make_mut(chunk)[at..at + n].copy_from_slice(&rest[..n]);
            pos += n as u64;
            rest = &rest[n..];
        }
        self.len = self.len.max(end);
    }

    fn read(&self, offset: u64, size: usize) -> Vec<u8> {
        let end = self.len.min(offset.saturating_add(size as u64));
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        let mut pos = offset;
        while pos < end {
            let (i, at) = ((pos / CHUNK as u64) as usize, (pos % CHUNK as u64) as usize);
            let n = ((end - pos) as usize).min(CHUNK - at);
            match self.chunks.get(i).and_then(Option::as_ref) {
                Some(chunk) => out.extend_from_slice(&chunk[at..at + n]),
                None => out.resize(out.len() + n, 0),
            }
            pos += n as u64;
        }
        out
    }

    fn truncate(&mut self, len: u64) {
        if len < self.len {
            self.chunks.truncate(len.div_ceil(CHUNK as u64) as usize);
            let at = (len % CHUNK as u64) as usize;
            if at != 0
                && let Some(Some(chunk)) = self.chunks.last_mut()
            {
                Arc::make_mut(chunk)[at..].fill(0);
            }
        }
        self.len = len;
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
}

struct Node {
    kind: Kind,
    data: Data,
    entries: BTreeMap<OsString, u64>,
    links: u32,
    open: u32,
    perm: u16,
}

impl Node {
    fn new(kind: Kind, perm: u16) -> Self {
        Self {
            kind,
            data: Data::default(),
            entries: BTreeMap::new(),
            links: 1,
            open: 0,
            perm,
        }
    }
}

const ROOT: u64 = 1;

struct State {
    powered: bool,
    /// What programs see.
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    /// The kind of every inode ever made: the platter may name an inode that
    /// programs removed since.
    kinds: HashMap<u64, Kind>,
    /// On the platter: each file's content at its last sync, each
    /// directory's entries at its last sync.
    synced_files: HashMap<u64, Data>,
    synced_dirs: HashMap<u64, BTreeMap<OsString, u64>>,
}

/// A directory tree, to write to or read from the backing directory.
enum Tree {
    File(Data),
    Dir(BTreeMap<OsString, Tree>),
}

impl Tree {
    fn read_from(path: &Path) -> io::Result<BTreeMap<OsString, Tree>> {
        let mut entries = BTreeMap::new();
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let tree = if kind.is_dir() {
                Tree::Dir(Self::read_from(&entry.path())?)
            } else if kind.is_file() {
                let mut data = Data::default();
                let mut file = std::fs::File::open(entry.path())?;
                let mut buf = vec![0; CHUNK];
                let mut offset = 0;
                loop {
                    let n = read_full(&mut file, &mut buf)?;
                    if n == 0 {
                        break;
                    }
                    // Zeros stay holes: a preallocated journal costs nothing.
                    if buf[..n].iter().any(|&b| b != 0) {
                        data.write(offset, &buf[..n]);
                    }
                    offset += n as u64;
                }
                data.truncate(offset);
                Tree::File(data)
            } else {
                continue;
            };
            entries.insert(entry.file_name(), tree);
        }
        Ok(entries)
    }

    fn write_into(&self, path: &Path) -> io::Result<()> {
        match self {
            Tree::File(data) => {
                let mut file = std::fs::File::create(path)?;
                for (i, chunk) in data.chunks.iter().enumerate() {
                    if let Some(chunk) = chunk {
                        let start = (i * CHUNK) as u64;
                        let n = (data.len - start).min(CHUNK as u64) as usize;
                        std::io::Seek::seek(&mut file, io::SeekFrom::Start(start))?;
                        file.write_all(&chunk[..n])?;
                    }
                }
                file.set_len(data.len)?;
                file.sync_all()
            }
            Tree::Dir(entries) => {
                std::fs::create_dir_all(path)?;
                for (name, tree) in entries {
                    tree.write_into(&path.join(name))?;
                }
                Ok(())
            }
        }
    }
}

fn read_full(file: &mut std::fs::File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

impl State {
    /// The backing directory as the disk: all of it visible, all of it synced.
    fn load(backing: &Path) -> io::Result<Self> {
        let mut state = State {
            powered: true,
            nodes: HashMap::from([(ROOT, Node::new(Kind::Dir, 0o755))]),
            next_ino: ROOT + 1,
            kinds: HashMap::from([(ROOT, Kind::Dir)]),
            synced_files: HashMap::new(),
            synced_dirs: HashMap::new(),
        };
        state.add_tree(ROOT, Tree::read_from(backing)?);
        Ok(state)
    }

    fn add_tree(&mut self, dir: u64, entries: BTreeMap<OsString, Tree>) {
        for (name, tree) in entries {
            match tree {
                Tree::File(data) => {
                    let ino = self.make(dir, name, Kind::File, 0o644);
                    self.synced_files.insert(ino, data.clone());
                    self.nodes.get_mut(&ino).expect("just made").data = data;
                }
                Tree::Dir(sub) => {
                    let ino = self.make(dir, name, Kind::Dir, 0o755);
                    self.add_tree(ino, sub);
                }
            }
        }
        let entries = self.nodes[&dir].entries.clone();
        self.synced_dirs.insert(dir, entries);
    }

    /// A new inode named `name` in `dir` (visible only).
    fn make(&mut self, dir: u64, name: OsString, kind: Kind, perm: u16) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(ino, Node::new(kind, perm));
        self.kinds.insert(ino, kind);
        self.nodes
            .get_mut(&dir)
            .expect("the parent exists")
            .entries
            .insert(name, ino);
        ino
    }

    fn visible_tree(&self) -> Tree {
        fn walk(state: &State, ino: u64) -> Tree {
            let node = &state.nodes[&ino];
            match node.kind {
                Kind::File => Tree::File(node.data.clone()),
                Kind::Dir => Tree::Dir(
                    node.entries
                        .iter()
                        .map(|(name, &child)| (name.clone(), walk(state, child)))
                        .collect(),
                ),
            }
        }
        walk(self, ROOT)
    }

    /// What a machine finds after the power came back: synced directory
    /// entries only, each file as of its last sync (empty if never synced).
    fn synced_tree(&self) -> Tree {
        fn walk(state: &State, ino: u64, seen: &mut HashSet<u64>) -> Tree {
            if state.kinds[&ino] == Kind::File {
                let data = state.synced_files.get(&ino).cloned().unwrap_or_default();
                return Tree::File(data);
            }
            let mut entries = BTreeMap::new();
            for (name, &child) in state.synced_dirs.get(&ino).into_iter().flatten() {
                // A directory the platter names twice (moved between two
                // synced parents) is restored once.
                if seen.insert(child) {
                    entries.insert(name.clone(), walk(state, child, seen));
                }
            }
            Tree::Dir(entries)
        }
        walk(self, ROOT, &mut HashSet::from([ROOT]))
    }

    fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let node = self.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        let (kind, size) = match node.kind {
            Kind::File => (FileType::RegularFile, node.data.len),
            Kind::Dir => (FileType::Directory, 0),
        };
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            crtime: SystemTime::UNIX_EPOCH,
            kind,
            perm: node.perm,
            nlink: node.links,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn dir(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(node) if node.kind == Kind::Dir => Ok(node),
            Some(_) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn file(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(node) if node.kind == Kind::File => Ok(node),
            Some(_) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    /// Drops one name of `ino`; forgets it when nothing names or holds it.
    fn unlinked(&mut self, ino: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.links = node.links.saturating_sub(1);
            if node.links == 0 && node.open == 0 {
                self.nodes.remove(&ino);
            }
        }
    }

    fn new_entry(
        &mut self,
        parent: u64,
        name: &OsStr,
        kind: Kind,
        mode: u32,
    ) -> Result<FileAttr, Errno> {
        if self.dir(parent)?.entries.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.make(parent, name.to_owned(), kind, (mode & 0o7777) as u16);
        self.attr(ino)
    }

    fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let ino = *self.dir(parent)?.entries.get(name).ok_or(Errno::ENOENT)?;
        match (
            self.nodes.get(&ino).map(|n| (n.kind, n.entries.is_empty())),
            dir,
        ) {
            (Some((Kind::Dir, _)), false) => return Err(Errno::EISDIR),
            (Some((Kind::File, _)), true) => return Err(Errno::ENOTDIR),
            (Some((Kind::Dir, false)), true) => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        self.dir(parent)?.entries.remove(name);
        self.unlinked(ino);
        Ok(())
    }

    /// What `fsync` puts on the platter: a file's content, or a
    /// directory's entries.
    fn sync(&mut self, ino: u64) -> Result<(), Errno> {
        let node = self.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        match node.kind {
            Kind::File => self.synced_files.insert(ino, node.data.clone()).map(drop),
            Kind::Dir => self.synced_dirs.insert(ino, node.entries.clone()).map(drop),
        };
        Ok(())
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return Err(Errno::EINVAL);
        }
        let ino = *self.dir(parent)?.entries.get(name).ok_or(Errno::ENOENT)?;
        if let Some(&old) = self.dir(new_parent)?.entries.get(new_name) {
            if old == ino {
                return Ok(());
            }
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            if self.nodes.get(&old).is_some_and(|n| !n.entries.is_empty()) {
                return Err(Errno::ENOTEMPTY);
            }
            self.unlinked(old);
        }
        self.dir(parent)?.entries.remove(name);
        self.dir(new_parent)?
            .entries
            .insert(new_name.to_owned(), ino);
        Ok(())
    }
}

struct Fuse(Arc<Mutex<State>>);

const TTL: Duration = Duration::from_secs(60);

impl Fuse {
    /// The state while the power is on.
    fn on(&self) -> Result<MutexGuard<'_, State>, Errno> {
        let state = lock(&self.0);
        if state.powered {
            Ok(state)
        } else {
            Err(Errno::EIO)
        }
    }

    /// Runs `op` while the power is on and answers with its result.
    fn answer(&self, reply: ReplyEmpty, op: impl FnOnce(&mut State) -> Result<(), Errno>) {
        match self.on().and_then(|mut s| op(&mut s)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

impl Filesystem for Fuse {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.on().and_then(|mut s| {
            let ino = *s.dir(parent.0)?.entries.get(name).ok_or(Errno::ENOENT)?;
            s.attr(ino)
        });
        match found {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.on().and_then(|s| s.attr(ino.0)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let changed = self.on().and_then(|mut s| {
            if let Some(size) = size {
                s.file(ino.0)?.data.truncate(size);
            }
            if let Some(mode) = mode {
                s.nodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?.perm = (mode & 0o7777) as u16;
            }
            s.attr(ino.0)
        });
        match changed {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        match self
            .on()
            .and_then(|mut s| s.new_entry(parent.0, name, Kind::Dir, mode & !umask))
        {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let made = self.on().and_then(|mut s| {
            let attr = s.new_entry(parent.0, name, Kind::File, mode & !umask)?;
            s.file(attr.ino.0)?.open += 1;
            Ok(attr)
        });
        match made {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.answer(reply, |s| s.remove(parent.0, name, false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.answer(reply, |s| s.remove(parent.0, name, true));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.answer(reply, |s| {
            s.rename(parent.0, name, newparent.0, newname, flags)
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.on().and_then(|mut s| {
            s.file(ino.0)?.open += 1;
            Ok(())
        }) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self
            .on()
            .and_then(|mut s| Ok(s.file(ino.0)?.data.read(offset, size as usize)))
        {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.on().and_then(|mut s| {
            s.file(ino.0)?.data.write(offset, data);
            Ok(())
        }) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Counted even after the cut, so the image stays consistent.
        let mut s = lock(&self.0);
        if let Some(node) = s.nodes.get_mut(&ino.0) {
            node.open = node.open.saturating_sub(1);
            if node.open == 0 && node.links == 0 {
                s.nodes.remove(&ino.0);
            }
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.answer(reply, |s| s.sync(ino.0));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listed = self.on().and_then(|mut s| {
            let entries = s.dir(ino.0)?.entries.clone();
            let mut all = vec![
                (ino.0, FileType::Directory, OsString::from(".")),
                (ino.0, FileType::Directory, OsString::from("..")),
            ];
            for (name, child) in entries {
                let kind = match s.kinds[&child] {
                    Kind::File => FileType::RegularFile,
                    Kind::Dir => FileType::Directory,
                };
                all.push((child, kind, name));
            }
            Ok(all)
        });
        match listed {
            Ok(all) => {
                for (i, (child, kind, name)) in all.into_iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        // The same request for a directory.
        self.fsync(req, ino, fh, datasync, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 24, 1 << 23, 1 << 23, 1 << 20, 1 << 19, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }
}
