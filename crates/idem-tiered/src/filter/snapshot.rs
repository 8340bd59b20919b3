//! The filter on disk: written atomically, read back only when it can be
//! trusted.
//!
//! Layout, integers little-endian:
//!
//! | bytes | what |
//! | --- | --- |
//! | 8 | magic `idemkflt` |
//! | 4 | format version ([`SNAPSHOT_FORMAT_VERSION`]) |
//! | 4 | generations `n` |
//! | 8 | the seed's [fingerprint](super::FilterSeed::fingerprint) |
//! | 8 | bits per generation |
//! | 4 | hashes per key |
//! | 8 | window, ms |
//! | 8 | when the snapshot was taken, ms since the epoch |
//! | 8 | the earliest record creation time whose key it may lack, ms (`u64::MAX`: any) |
//! | 8 × n | generation start times, oldest first |
//! | bits / 8 × n | bit arrays, oldest first, as 64-bit words |
//! | 8 | xxh3-64 of everything above |

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use idem_core::Timestamp;
use xxhash_rust::xxh3::Xxh3;

use super::KeyFilter;
use super::config::{ConfigError, FilterConfig, FilterSizing, MAX_GENERATIONS};
use super::generations::{Generations, StoredGeneration};
use super::readiness::ReadinessState;

/// The snapshot format this build writes and reads.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;

const MAGIC: [u8; 8] = *b"idemkflt";
const FIXED_HEADER: u64 = 8 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8;
const CHECKSUM: u64 = 8;
const NOTHING_COMPLETE: u64 = u64::MAX;
const IO_BUFFER: usize = 1 << 20;
/// Bit arrays move in pieces this large, hashed a piece at a time.
const CHUNK: usize = 64 * 1024;

/// Why a snapshot was not written, or not loaded.
///
/// A snapshot that cannot be loaded is never half-used: build a new filter
/// and [rebuild](KeyFilter::rebuild) it from the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// There is no file at the path.
    #[error(
        "no filter snapshot at {path} (first start, or it was removed): rebuild the filter from the store"
    )]
    Missing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The file is not a filter snapshot.
    #[error(
        "{path} is not a filter snapshot (it does not start with the snapshot magic): check the path, or rebuild the filter from the store"
    )]
    NotASnapshot {
        /// The file.
        path: PathBuf,
    },
    /// The file is in a format this build does not read.
    #[error(
        "filter snapshot {path} is in format version {found}; this build reads version {supported}: rebuild the filter from the store"
    )]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The file is shorter than its header says: it was cut off.
    #[error(
        "filter snapshot {path} is truncated: {found} bytes, where a complete one has {expected}; rebuild the filter from the store"
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its length.
        found: u64,
        /// The length its header calls for (or the smallest possible).
        expected: u64,
    },
    /// The file's content does not match its checksum, or its header is
    /// impossible.
    #[error("filter snapshot {path} is corrupt ({reason}): rebuild the filter from the store")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What does not add up.
        reason: String,
    },
    /// The snapshot was written under another seed: its bits mean nothing
    /// under this one.
    #[error(
        "filter snapshot {path} was written with another seed (fingerprint {found:016x}, this filter's is {expected:016x}); its bits mean nothing under this seed: rebuild the filter from the store (or configure the seed it was written with)"
    )]
    ForeignSeed {
        /// The file.
        path: PathBuf,
        /// The seed fingerprint it holds.
        found: u64,
        /// This filter's.
        expected: u64,
    },
    /// The snapshot was sized for other settings.
    #[error(
        "filter snapshot {path} has {what} {found}, this filter {expected} (expected_items, false_positive_rate, retention or generations changed since it was written): rebuild the filter from the store"
    )]
    SizingMismatch {
        /// The file.
        path: PathBuf,
        /// Which number differs.
        what: &'static str,
        /// The snapshot's.
        found: u64,
        /// This filter's.
        expected: u64,
    },
    /// The filter's settings are not valid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Reading the file failed.
    #[error(
        "reading filter snapshot {path} failed: {source}; fix the file's permissions, or rebuild the filter from the store"
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system reported.
        #[source]
        source: io::Error,
    },
    /// Writing the file failed; a previous snapshot at the path is untouched.
    #[error(
        "writing filter snapshot {path} failed: {source}; check that its directory exists, is writable and has room (the previous snapshot, if any, is untouched)"
    )]
    Write {
        /// The file.
        path: PathBuf,
        /// What the system reported.
        #[source]
        source: io::Error,
    },
}

impl KeyFilter {
    /// Writes the filter to `path`, taken at `now`: to a temporary file
    /// beside it, synced, renamed over `path`, and the directory synced, so
    /// `path` holds the previous snapshot or this one, whole, even after a
    /// power cut. Inserts go on meanwhile; rotation waits. Returns the bytes
    /// written.
    ///
    /// Keys inserted after `now` are not in it for sure: whoever loads it
    /// must feed the filter the keys of the records created since `now`
    /// (see [`Readiness::NeedsRebuild`](super::Readiness::NeedsRebuild)).
    pub fn write_snapshot(&self, path: &Path, now: Timestamp) -> Result<u64, SnapshotError> {
        let write_error = |source| SnapshotError::Write {
            path: path.to_owned(),
            source,
        };
        let temporary = temporary_path(path).map_err(write_error)?;
        // Read before the bits, so that a rebuild ending meanwhile counts
        // only if all its keys are in what is copied.
        let complete_before = self.readiness.complete_before(now);
        let written = self.generations.with_rotation_held(|generations| {
            let result = (|| {
                let file = File::create(&temporary)?;
                let mut out = Checksummed::new(BufWriter::with_capacity(IO_BUFFER, file));
                out.write_all(&MAGIC)?;
                out.write_all(&SNAPSHOT_FORMAT_VERSION.to_le_bytes())?;
                out.write_all(&self.sizing.generations.to_le_bytes())?;
                out.write_all(&self.seed.fingerprint().to_le_bytes())?;
                out.write_all(&self.sizing.generation.bits.to_le_bytes())?;
                out.write_all(&self.sizing.generation.hashes.to_le_bytes())?;
                out.write_all(&self.sizing.window_ms().to_le_bytes())?;
                out.write_all(&now.as_millis().to_le_bytes())?;
                let complete_before =
                    complete_before.map_or(NOTHING_COMPLETE, Timestamp::as_millis);
                out.write_all(&complete_before.to_le_bytes())?;
                for generation in generations {
                    out.write_all(&generation.started_at.as_millis().to_le_bytes())?;
                }
                let mut chunk = Vec::with_capacity(CHUNK);
                for generation in generations {
                    for word in generation.words() {
                        chunk.extend_from_slice(&word.to_le_bytes());
                        if chunk.len() == CHUNK {
                            out.write_all(&chunk)?;
                            chunk.clear();
                        }
                    }
                }
                out.write_all(&chunk)?;
                let checksum = out.hasher.digest();
                let mut out = out.inner;
                out.write_all(&checksum.to_le_bytes())?;
                let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
                file.sync_all()?;
                let written = file.metadata()?.len();
                std::fs::rename(&temporary, path)?;
                sync_parent(path)?;
                Ok(written)
            })();
            if result.is_err() {
                // Best effort: the error that matters is the one returned.
                let _ = std::fs::remove_file(&temporary);
            }
            result
        });
        let written = written.map_err(write_error)?;
        tracing::info!(path = %path.display(), bytes = written, "key filter snapshot written");
        Ok(written)
    }

    /// A filter read back from the snapshot at `path`, rotated to `now`.
    ///
    /// Refused, with the reason, when the file is missing, not a snapshot,
    /// of another format version, truncated, corrupt, written under another
    /// seed or for other sizing: then build a new filter and rebuild it.
    /// A loaded filter answers `Maybe` until it has been fed the keys of the
    /// records created since the snapshot was taken
    /// ([`Readiness::NeedsRebuild`](super::Readiness::NeedsRebuild) says
    /// since when).
    pub fn load_snapshot(
        path: &Path,
        config: &FilterConfig,
        now: Timestamp,
    ) -> Result<KeyFilter, SnapshotError> {
        let sizing = config.sizing()?;
        let snapshot = read(path, &sizing, config.seed.fingerprint())?;
        let generations = Generations::from_stored(&sizing, &config.seed, snapshot.generations);
        let readiness = ReadinessState::needs_rebuild(snapshot.complete_before);
        let filter = KeyFilter::assemble(config.seed, sizing, generations, readiness);
        filter.rotate(now);
        tracing::info!(
            path = %path.display(),
            taken_at = snapshot.taken_at.as_millis(),
            "key filter loaded from its snapshot; it answers Maybe until the keys created since are fed to it"
        );
        Ok(filter)
    }
}

struct Snapshot {
    taken_at: Timestamp,
    complete_before: Option<Timestamp>,
    generations: Vec<StoredGeneration>,
}

/// The header's numbers, as read.
struct Header {
    generations: u32,
    fingerprint: u64,
    bits: u64,
    hashes: u32,
    window_ms: u64,
    taken_at: u64,
    complete_before: u64,
}

fn read(path: &Path, sizing: &FilterSizing, fingerprint: u64) -> Result<Snapshot, SnapshotError> {
    let path_buf = || path.to_owned();
    let read_error = |source: io::Error| match source.kind() {
        io::ErrorKind::NotFound => SnapshotError::Missing { path: path_buf() },
        _ => SnapshotError::Read {
            path: path_buf(),
            source,
        },
    };
    let corrupt = |reason: String| SnapshotError::Corrupt {
        path: path_buf(),
        reason,
    };
    let file = File::open(path).map_err(read_error)?;
    let length = file.metadata().map_err(read_error)?.len();
    let mut input = Checksummed::new(BufReader::with_capacity(IO_BUFFER, file));

    let mut fixed = [0u8; FIXED_HEADER as usize];
    let got = read_up_to(&mut input, &mut fixed).map_err(read_error)?;
    let magic_seen = got.min(MAGIC.len());
    if fixed[..magic_seen] != MAGIC[..magic_seen] {
        return Err(SnapshotError::NotASnapshot { path: path_buf() });
    }
    if got < fixed.len() {
        return Err(SnapshotError::Truncated {
            path: path_buf(),
            found: length,
            expected: FIXED_HEADER + CHECKSUM,
        });
    }
    let mut fields = Fields(&fixed[MAGIC.len()..]);
    let version = fields.u32();
    if version != SNAPSHOT_FORMAT_VERSION {
        return Err(SnapshotError::UnsupportedVersion {
            path: path_buf(),
            found: version,
            supported: SNAPSHOT_FORMAT_VERSION,
        });
    }
    let header = Header {
        generations: fields.u32(),
        fingerprint: fields.u64(),
        bits: fields.u64(),
        hashes: fields.u32(),
        window_ms: fields.u64(),
        taken_at: fields.u64(),
        complete_before: fields.u64(),
    };
    if header.generations == 0
        || header.generations > MAX_GENERATIONS
        || !header.bits.is_multiple_of(64)
    {
        return Err(corrupt(format!(
            "its header describes {} generations of {} bits",
            header.generations, header.bits
        )));
    }
    let count = u64::from(header.generations);
    let expected = (header.bits / 8)
        .checked_mul(count)
        .and_then(|bytes| bytes.checked_add(FIXED_HEADER + 8 * count + CHECKSUM))
        .ok_or_else(|| {
            corrupt(format!(
                "its header describes {} bits per generation",
                header.bits
            ))
        })?;
    if length < expected {
        return Err(SnapshotError::Truncated {
            path: path_buf(),
            found: length,
            expected,
        });
    }
    if length > expected {
        return Err(corrupt(format!(
            "{} bytes follow the checksum its header places at byte {}",
            length - expected,
            expected - CHECKSUM
        )));
    }

    let mut starts = Vec::with_capacity(count as usize);
    for _ in 0..count {
        starts.push(Timestamp::from_millis(
            read_u64(&mut input).map_err(read_error)?,
        ));
    }
    let mut generations = Vec::with_capacity(count as usize);
    for started_at in starts {
        let words = read_words(&mut input, header.bits / 64).map_err(read_error)?;
        generations.push(StoredGeneration { started_at, words });
    }
    let computed = input.hasher.digest();
    let stored = read_u64(&mut input.inner).map_err(read_error)?;
    if stored != computed {
        return Err(corrupt(format!(
            "its checksum is {stored:016x} but its content hashes to {computed:016x}"
        )));
    }

    if header.fingerprint != fingerprint {
        return Err(SnapshotError::ForeignSeed {
            path: path_buf(),
            found: header.fingerprint,
            expected: fingerprint,
        });
    }
    let expected_sizing = [
        ("generations", u64::from(sizing.generations), count),
        ("bits per generation", sizing.generation.bits, header.bits),
        (
            "hashes per key",
            u64::from(sizing.generation.hashes),
            u64::from(header.hashes),
        ),
        ("a window in ms of", sizing.window_ms(), header.window_ms),
    ];
    for (what, expected, found) in expected_sizing {
        if found != expected {
            return Err(SnapshotError::SizingMismatch {
                path: path_buf(),
                what,
                found,
                expected,
            });
        }
    }
    Ok(Snapshot {
        taken_at: Timestamp::from_millis(header.taken_at),
        complete_before: (header.complete_before != NOTHING_COMPLETE)
            .then(|| Timestamp::from_millis(header.complete_before)),
        generations,
    })
}

/// `path` with `.tmp` added to its file name: the same directory, so the
/// rename that publishes it is atomic.
fn temporary_path(path: &Path) -> io::Result<PathBuf> {
    let mut name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?
        .to_owned();
    name.push(".tmp");
    Ok(path.with_file_name(name))
}

/// Syncs the directory holding `path`: a rename is durable only then.
fn sync_parent(path: &Path) -> io::Result<()> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}

/// A reader or writer that hashes every byte passing through.
struct Checksummed<T> {
    inner: T,
    hasher: Xxh3,
}

impl<T> Checksummed<T> {
    fn new(inner: T) -> Self {
        Self {
            inner,
            hasher: Xxh3::new(),
        }
    }
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(bytes)?;
        self.hasher.update(&bytes[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Checksummed<R> {
    fn read(&mut self, bytes: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(bytes)?;
        self.hasher.update(&bytes[..read]);
        Ok(read)
    }
}

/// Fills `buffer` as far as the input goes; returns how far.
fn read_up_to(input: &mut impl Read, buffer: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match input.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn read_u64(input: &mut impl Read) -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    input.read_exact(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

fn read_words(input: &mut impl Read, count: u64) -> io::Result<Vec<u64>> {
    let mut words = Vec::with_capacity(count as usize);
    let mut chunk = vec![0u8; CHUNK];
    let mut left = count as usize * 8;
    while left > 0 {
        let part = &mut chunk[..left.min(CHUNK)];
        input.read_exact(part)?;
        words.extend(
            part.chunks_exact(8)
                .map(|word| u64::from_le_bytes(word.try_into().expect("8 bytes"))),
        );
        left -= part.len();
    }
    Ok(words)
}

/// Little-endian numbers read off a header in order.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let (field, rest) = self.0.split_at(N);
        self.0 = rest;
        field.try_into().expect("the header holds every field")
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}
