//! `kill -9` a process that writes under load; after a restart every
//! acknowledged completion is there, no record is corrupt, and fencing tokens
//! continue above every token issued before the crash.
//!
//! A kill leaves the operating system's page cache alone, so this cannot see
//! a missing `fsync`: `power_loss.rs` does.

mod support;

use idem_file::{Durability, FileStore};
use support::{Setup, check_restarted, write_until_stopped};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_keeps_every_acknowledged_completion() {
    let rounds = [
        (Durability::GroupCommit, 0),
        (Durability::GroupCommit, 1),
        (Durability::GroupCommit, 2),
        (Durability::Immediate, 3),
        (Durability::Buffered, 4),
    ];
    for (durability, round) in rounds {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        // Two crashes in one directory: recovery of a recovered store too.
        for again in 0..2 {
            let run = round * 2 + again;
            let setup = Setup::new(durability);
            let written = write_until_stopped(dir.path(), setup, run, |child| {
                child.start_kill().unwrap(); // SIGKILL
            })
            .await;
            let store = FileStore::open(dir.path()).expect("the store reopens after kill -9");
            let found = check_restarted(&store, setup, &written, run).await;
            assert!(
                found.lost.is_empty(),
                "{durability:?}: {} acknowledged completions are gone after kill -9, e.g. {:?}",
                found.lost.len(),
                &found.lost[..found.lost.len().min(5)]
            );
            println!(
                "{durability:?} round {round}.{again}: {} acked, {} on disk after restart",
                written.acked.len(),
                found.on_disk
            );
        }
    }
}
