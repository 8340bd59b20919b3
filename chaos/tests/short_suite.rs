//! The short chaos suite, as CI runs it: every fault on Redis Streams with
//! the Redis store, and a few on RabbitMQ, NATS, Kafka, RocketMQ,
//! PostgreSQL, MariaDB, a Redis Cluster, the embedded and tiered stores,
//! the gateway and the service, with poison messages on every broker and
//! two seeded mixes of faults. Fails on anything lost, any dead letter
//! missing, doubled or wrong, any double effect no fault inside the claim
//! it cut explains (or more than the faults could cut), any final copy of
//! a completed message handled again, anything the broker still holds at
//! the end, any stale write the fenced sink took, any token out of order,
//! any second call while a key's holder is alive, and any run that could
//! not finish.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The whole suite's bound: it takes about twenty minutes on two cores;
/// each run inside it has a bound of its own, and this one catches
/// anything past them.
const LIMIT: Duration = Duration::from_secs(45 * 60);

#[test]
fn the_short_suite_loses_nothing_and_explains_every_double() {
    let chaos = Path::new(env!("CARGO_BIN_EXE_idem-chaos"));
    let idem = chaos.with_file_name("idem");
    if !idem.is_file() {
        idem_testkit::services::absent::<()>(
            "the idem binary",
            &idem.display().to_string(),
            "not built: run `cargo build -p idem-server` or `cargo test --workspace`",
        );
        return;
    }
    // The suite's progress goes straight to this test's standard error, so
    // a slow run shows where it is.
    let mut child = Command::new(chaos)
        .args(["suite", "--idem"])
        .arg(&idem)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("idem-chaos starts");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("idem-chaos can be waited on") {
            break status;
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the short suite did not finish within {LIMIT:?}; its runs are above");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        status.success(),
        "the short suite failed ({status}); its runs are above"
    );
}
