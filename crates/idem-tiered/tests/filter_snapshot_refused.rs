//! A snapshot that cannot be trusted is refused with a typed error saying
//! what is wrong and that the filter must be rebuilt: missing, not a
//! snapshot, another format version, truncated, corrupt, written under
//! another seed, or sized for other settings.

mod filter_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use idem_tiered::filter::{FilterConfig, FilterSeed, KeyFilter, SnapshotError};

use filter_support::{at, config, key, ready};

/// A snapshot of a filter for 1 000 keys, with a few in it.
fn snapshot(dir: &Path) -> PathBuf {
    let filter = ready(&config(1_000), at(0));
    for n in 0..100 {
        filter.insert(&key(n));
    }
    let path = dir.join("filter.snapshot");
    filter.write_snapshot(&path, at(1)).unwrap();
    path
}

fn refused(path: &Path, config: &FilterConfig) -> SnapshotError {
    let error = KeyFilter::load_snapshot(path, config, at(2)).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("rebuild the filter from the store"),
        "{error}"
    );
    assert!(
        error.to_string().contains(&path.display().to_string()),
        "{error}"
    );
    error
}

/// The snapshot at `path` with `change` made to its bytes.
fn alter(path: &Path, change: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = std::fs::read(path).unwrap();
    change(&mut bytes);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_missing_snapshot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let error = refused(&dir.path().join("none"), &config(1_000));
    assert!(matches!(error, SnapshotError::Missing { .. }), "{error}");
}

#[test]
fn a_file_that_is_not_a_snapshot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, b"shopping: milk, eggs").unwrap();
    let error = refused(&path, &config(1_000));
    assert!(
        matches!(error, SnapshotError::NotASnapshot { .. }),
        "{error}"
    );
}

#[test]
fn another_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = snapshot(dir.path());
    alter(&path, |bytes| bytes[8] = 2);
    let error = refused(&path, &config(1_000));
    assert!(
        matches!(
            error,
            SnapshotError::UnsupportedVersion {
                found: 2,
                supported: 1,
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn a_truncated_snapshot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = snapshot(dir.path());
    let full = std::fs::metadata(&path).unwrap().len();
    for keep in [0, 5, 40, full / 2, full - 1] {
        alter(&path, |bytes| bytes.truncate(keep as usize));
        let error = refused(&path, &config(1_000));
        assert!(
            matches!(error, SnapshotError::Truncated { found, .. } if found == keep),
            "{keep} bytes: {error}"
        );
        assert!(error.to_string().contains("truncated"), "{error}");
        snapshot(dir.path());
    }
}

#[test]
fn a_corrupt_snapshot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = snapshot(dir.path());
    let full = std::fs::metadata(&path).unwrap().len() as usize;
    // A bit of the arrays, of the seed fingerprint, of a start time, of the
    // checksum.
    for at_byte in [full / 2, 16, 60, full - 1] {
        alter(&path, |bytes| bytes[at_byte] ^= 0x10);
        let error = refused(&path, &config(1_000));
        assert!(
            matches!(error, SnapshotError::Corrupt { .. }),
            "byte {at_byte}: {error}"
        );
        assert!(error.to_string().contains("checksum"), "{error}");
        snapshot(dir.path());
    }
    alter(&path, |bytes| bytes.extend_from_slice(b"more"));
    let error = refused(&path, &config(1_000));
    assert!(
        error.to_string().contains("4 bytes follow the checksum"),
        "{error}"
    );
}

#[test]
fn a_snapshot_written_under_another_seed_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = snapshot(dir.path());
    let mut other = config(1_000);
    other.seed = FilterSeed::new(42);
    let error = refused(&path, &other);
    assert!(
        matches!(error, SnapshotError::ForeignSeed { expected, .. } if expected == other.seed.fingerprint()),
        "{error}"
    );
    assert!(error.to_string().contains("another seed"), "{error}");
}

#[test]
fn a_snapshot_sized_for_other_settings_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = snapshot(dir.path());
    type Change = fn(&mut FilterConfig);
    let cases: [(Change, &str); 4] = [
        (|c| c.expected_items = 2_000, "bits per generation"),
        (|c| c.false_positive_rate = 0.01, "bits per generation"),
        (|c| c.generations = 5, "generations"),
        (
            |c| c.retention = Duration::from_secs(6 * 3600),
            "a window in ms of",
        ),
    ];
    for (change, what) in cases {
        let mut other = config(1_000);
        change(&mut other);
        let error = refused(&path, &other);
        assert!(
            matches!(&error, SnapshotError::SizingMismatch { what: w, .. } if *w == what),
            "{error}"
        );
        assert!(
            error.to_string().contains("changed since it was written"),
            "{error}"
        );
    }
}
