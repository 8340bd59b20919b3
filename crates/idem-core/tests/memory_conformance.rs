//! The memory store passes the conformance kit.

use idem_core::{ManualClock, MemoryStore};
use idem_testkit::{Subject, TimeControl};

idem_testkit::conformance_tests!(async {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    Subject::new(store, TimeControl::Manual(clock))
});

mod tier {
    use idem_core::{ManualClock, MemoryStore};
    use idem_testkit::{Subject, TimeControl};

    idem_testkit::tier_conformance_tests!(async {
        let clock = ManualClock::new();
        let store = MemoryStore::builder().clock(clock.clone()).build();
        Subject::new(store, TimeControl::Manual(clock))
    });
}
