//! The short chaos suite, as CI runs it: every fault on Redis Streams with
//! the Redis store, and a few on RabbitMQ, NATS, Kafka, RocketMQ,
//! PostgreSQL, MariaDB, the embedded and tiered stores, and the gateway.
//! Fails on anything lost, any double effect no injected fault explains,
//! any stale write the fenced sink took after a later holder had called,
//! any token out of order, any two live holders of a key.

use std::path::Path;
use std::process::Command;

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
    let out = Command::new(chaos)
        .args(["suite", "--idem"])
        .arg(&idem)
        .output()
        .expect("idem-chaos runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(out.status.success(), "the short suite failed:\n{stderr}");
}
