//! The file store passes the conformance kit, in each durability mode.

use idem_core::ManualClock;
use idem_file::{Durability, FileStore};
use idem_testkit::{Subject, TimeControl};

async fn subject(durability: Durability) -> Subject<FileStore> {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
        .keep();
    let clock = ManualClock::new();
    let store = FileStore::builder(&dir)
        .durability(durability)
        .clock(clock.clone())
        .open()
        .unwrap();
    Subject::new(store, TimeControl::Manual(clock))
}

mod group_commit {
    idem_testkit::conformance_tests!(super::subject(idem_file::Durability::GroupCommit));
}

mod immediate {
    idem_testkit::conformance_tests!(super::subject(idem_file::Durability::Immediate));
}

/// The tier cases: imports, token floors and the completed keys.
mod tier {
    idem_testkit::tier_conformance_tests!(super::subject(idem_file::Durability::GroupCommit));
}

/// The operator's cases: counting, listing and purging namespaces.
mod admin {
    idem_testkit::admin_conformance_tests!(super::subject(idem_file::Durability::GroupCommit));
}
