//! Power loss: the store runs on a disk that forgets everything not synced
//! (`idem_testkit::power_loss`), under load from a child process; the power
//! is cut, the disk mounted again and the store reopened. Every acknowledged
//! completion is there with its outcome and token, no record is corrupt, and
//! tokens continue above every token issued before the cut, also when the
//! cut lands while the token ceiling is being raised. A store that does not
//! sync (`Durability::Buffered`) is seen to lose acknowledged completions:
//! the test can tell a missing `fsync`.

mod support;

use std::path::Path;

use idem_file::{Durability, FileStore};
use idem_testkit::power_loss::PowerLossDisk;
use support::{Found, Setup, Written, check_restarted, write_until_stopped};

/// Tokens per ceiling raise in the runs that exercise it: 25 to a few
/// hundred raises per run, where the default block (2^20) is never reached.
const SMALL_BLOCK: u64 = 8;

/// Outcomes of this size fill a memtable (8 MiB) every 64 completions: the
/// engine writes tables while the child writes, and the cut may land in the
/// middle of one.
const LARGE_OUTCOME: usize = 128 * 1024;

/// One run on a fresh mount of `backing`: write, cut the power, kill the
/// writer, mount what the disk kept, reopen and check.
async fn cut_once(backing: &Path, setup: Setup, run: u32) -> Option<(Written, Found)> {
    let mountpoint = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store_dir = mountpoint.path().join("store");
    let disk = PowerLossDisk::mount_for_test(backing, mountpoint.path())?;
    let written = write_until_stopped(&store_dir, setup, run, |child| {
        disk.cut_power();
        child.start_kill().unwrap();
    })
    .await;
    disk.unmount().unwrap();

    let disk = PowerLossDisk::mount(backing, mountpoint.path()).unwrap();
    let store = FileStore::open(&store_dir).expect("the store reopens after a power cut");
    let found = check_restarted(&store, setup, &written, run).await;
    drop(store);
    disk.unmount().unwrap();
    println!(
        "{setup:?} run {run}: {} acked, {} lost, {} on disk after the cut, highest token {}",
        written.acked.len(),
        found.lost.len(),
        found.on_disk,
        written.max_token
    );
    Some((written, found))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cut_keeps_every_acknowledged_completion() {
    let group = Setup::new(Durability::GroupCommit);
    let small_block = Setup {
        token_block: Some(SMALL_BLOCK),
        ..group
    };
    let large_outcomes = Setup {
        outcome_bytes: LARGE_OUTCOME,
        ..group
    };
    let runs = [
        (group, 2),
        (Setup::new(Durability::Immediate), 1),
        (small_block, 2),
        (large_outcomes, 2),
    ];
    let mut run = 0;
    for (setup, cuts) in runs {
        let backing = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        // Repeated cuts in one directory: recovery of a recovered store too.
        for _ in 0..cuts {
            run += 1;
            let Some((written, found)) = cut_once(backing.path(), setup, run).await else {
                return;
            };
            assert!(
                found.lost.is_empty(),
                "{setup:?}: {} of {} acknowledged completions are gone after the power cut, e.g. {:?}",
                found.lost.len(),
                written.acked.len(),
                &found.lost[..found.lost.len().min(5)]
            );
            if let Some(block) = setup.token_block {
                // The writer is stopped after 200 acks at the earliest, each
                // taking at least one token: at least 25 raises of the
                // ceiling, so at least 20 says the cut met a store that was
                // raising it all the time.
                let raises = (written.max_token - written.min_token) / block;
                assert!(
                    raises >= 20,
                    "the run raised the token ceiling only {raises} times"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cut_loses_what_buffered_mode_never_synced() {
    let backing = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let Some((written, found)) =
        cut_once(backing.path(), Setup::new(Durability::Buffered), 100).await
    else {
        return;
    };
    assert!(
        !found.lost.is_empty(),
        "all {} completions acknowledged without a sync survived the power cut: the disk kept unsynced writes",
        written.acked.len()
    );
}
