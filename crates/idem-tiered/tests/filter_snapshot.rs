//! A snapshot brings the filter back with its keys and windows, and the
//! loaded filter asks for the keys created since the snapshot was taken
//! before it answers `Absent`.

mod filter_support;

use std::io::Read;

use idem_tiered::filter::{KeyFilter, Membership, Readiness, SnapshotError};

use filter_support::{at, config, feed, hours, key, no_keys, ready};

#[test]
fn a_loaded_filter_holds_the_same_keys_and_windows() {
    let config = config(10_000);
    let filter = ready(&config, at(0));
    for hour in 0..3 {
        filter.rotate(hours(hour as f64));
        for n in hour * 1000..(hour + 1) * 1000 {
            filter.insert(&key(n));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("filter.snapshot");
    let written = filter.write_snapshot(&path, hours(2.5)).unwrap();
    assert_eq!(written, std::fs::metadata(&path).unwrap().len());
    assert!(written > filter.memory_bytes());

    let loaded = KeyFilter::load_snapshot(&path, &config, hours(2.5)).unwrap();
    assert_eq!(loaded.generation_starts(), filter.generation_starts());
    loaded.rebuild(no_keys(), Some(0), |_, _| {}).unwrap();
    for n in 0..3000 {
        assert_eq!(loaded.check(&key(n)), Membership::Maybe, "key {n}");
    }
    let absent_before = (3000..13_000)
        .filter(|&n| filter.check(&key(n)).is_absent())
        .count();
    let absent_after = (3000..13_000)
        .filter(|&n| loaded.check(&key(n)).is_absent())
        .count();
    assert_eq!(absent_after, absent_before);
    // Aging goes on from the loaded windows: the first hour's generation
    // is the second oldest.
    assert!(loaded.rotate(hours(4.0)));
    assert_eq!(loaded.check(&key(0)), Membership::Maybe);
    assert!(loaded.rotate(hours(5.0)));
    assert!(loaded.check(&key(0)).is_absent());
    assert_eq!(loaded.check(&key(1000)), Membership::Maybe);
}

#[test]
fn a_loaded_filter_answers_maybe_until_fed_the_keys_created_since_the_snapshot() {
    let config = config(10_000);
    let filter = ready(&config, at(0));
    filter.insert(&key(1));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("filter.snapshot");
    filter.write_snapshot(&path, at(60_000)).unwrap();
    // Inserted after the snapshot was taken: lost with the process.
    filter.insert(&key(2));

    let loaded = KeyFilter::load_snapshot(&path, &config, at(120_000)).unwrap();
    assert_eq!(
        loaded.readiness(),
        Readiness::NeedsRebuild {
            since: Some(at(60_000))
        }
    );
    assert_eq!(loaded.check(&key(2)), Membership::Maybe);
    assert_eq!(loaded.check(&key(3)), Membership::Maybe);
    // The records created since the snapshot: key 2's.
    loaded.rebuild(feed([key(2)]), Some(1), |_, _| {}).unwrap();
    assert_eq!(loaded.readiness(), Readiness::Ready);
    assert_eq!(loaded.check(&key(1)), Membership::Maybe);
    assert_eq!(loaded.check(&key(2)), Membership::Maybe);
    assert_eq!(loaded.check(&key(3)), Membership::Absent);
}

#[test]
fn a_snapshot_of_a_filter_that_lacks_keys_still_asks_for_them() {
    let config = config(1_000);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("filter.snapshot");

    // Never rebuilt: it may lack any key.
    let new = KeyFilter::new(&config, at(0)).unwrap();
    new.write_snapshot(&path, at(10)).unwrap();
    let loaded = KeyFilter::load_snapshot(&path, &config, at(20)).unwrap();
    assert_eq!(loaded.readiness(), Readiness::NeedsRebuild { since: None });

    // Loaded from a snapshot taken at 30 and not caught up: written again
    // at 50, it still lacks the keys created from 30 on.
    ready(&config, at(0)).write_snapshot(&path, at(30)).unwrap();
    let behind = KeyFilter::load_snapshot(&path, &config, at(40)).unwrap();
    behind.write_snapshot(&path, at(50)).unwrap();
    let loaded = KeyFilter::load_snapshot(&path, &config, at(60)).unwrap();
    assert_eq!(
        loaded.readiness(),
        Readiness::NeedsRebuild {
            since: Some(at(30))
        }
    );
}

#[test]
fn a_loaded_filter_rotates_to_the_time_it_is_loaded_at() {
    let config = config(1_000);
    let filter = ready(&config, at(0));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("filter.snapshot");
    filter.write_snapshot(&path, hours(0.5)).unwrap();

    let loaded = KeyFilter::load_snapshot(&path, &config, hours(4.5)).unwrap();
    let mut expected = filter.generation_starts()[1..].to_vec();
    expected.push(hours(4.5));
    assert_eq!(loaded.generation_starts(), expected);
    assert_eq!(loaded.stats().rotations, 1);
}

#[test]
fn writing_replaces_the_previous_snapshot_whole_and_leaves_no_temporary_file() {
    let config = config(1_000);
    let filter = ready(&config, at(0));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("filter.snapshot");
    filter.write_snapshot(&path, at(1)).unwrap();
    let mut previous = std::fs::File::open(&path).unwrap();
    let previous_bytes = std::fs::read(&path).unwrap();
    filter.insert(&key(1));
    filter.write_snapshot(&path, at(2)).unwrap();
    // The new snapshot is another file renamed into place: the previous one
    // was never written over, so a crash mid-write leaves it whole.
    let mut still = Vec::new();
    previous.read_to_end(&mut still).unwrap();
    assert_eq!(still, previous_bytes);
    assert_ne!(std::fs::read(&path).unwrap(), previous_bytes);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["filter.snapshot"]);
    let loaded = KeyFilter::load_snapshot(&path, &config, at(3)).unwrap();
    assert_eq!(
        loaded.readiness(),
        Readiness::NeedsRebuild { since: Some(at(2)) }
    );
    loaded.rebuild(no_keys(), None, |_, _| {}).unwrap();
    assert_eq!(loaded.check(&key(1)), Membership::Maybe);
}

#[test]
fn a_failed_write_says_what_to_check_and_keeps_the_previous_snapshot() {
    let config = config(1_000);
    let filter = ready(&config, at(0));
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir").join("filter.snapshot");
    let error = filter.write_snapshot(&missing, at(1)).unwrap_err();
    assert!(matches!(error, SnapshotError::Write { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains("check that its directory exists"),
        "{error}"
    );

    // A directory where the snapshot should be: the rename fails, the
    // temporary file is removed, the directory is left as it was.
    let occupied = dir.path().join("occupied");
    std::fs::create_dir(&occupied).unwrap();
    std::fs::write(occupied.join("inside"), b"x").unwrap();
    assert!(filter.write_snapshot(&occupied, at(1)).is_err());
    assert!(!dir.path().join("occupied.tmp").exists());
    assert_eq!(std::fs::read(occupied.join("inside")).unwrap(), b"x");
}
