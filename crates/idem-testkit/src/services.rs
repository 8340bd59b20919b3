//! Tests that need a real service (Redis, PostgreSQL, …).
//!
//! Service URLs come from the environment (`IDEM_TEST_REDIS_URL`, …) with
//! loopback defaults. When a service cannot be reached, a test skips with a
//! printed reason on a developer's machine, and fails when `CI` or
//! `IDEM_REQUIRE_SERVICES` is set: CI never passes by skipping.

use std::fmt::Display;

/// The URL in `var`, or `default`.
pub fn url(var: &str, default: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// Whether absent services are failures (`CI` or `IDEM_REQUIRE_SERVICES`
/// set to anything but `0` or `false`).
pub fn required() -> bool {
    ["CI", "IDEM_REQUIRE_SERVICES"].iter().any(|var| {
        std::env::var(var)
            .map(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
            .unwrap_or(false)
    })
}

/// Reports that `service` at `url` cannot be used: panics when services are
/// required, otherwise prints why the test is skipped and returns `None`.
pub fn absent<T>(service: &str, url: &str, why: impl Display) -> Option<T> {
    if required() {
        panic!(
            "{service} at {url} is required here (CI or IDEM_REQUIRE_SERVICES is set) but cannot be used: {why}"
        );
    }
    eprintln!("skipping: {service} at {url} cannot be used ({why}); start it or set the URL");
    None
}

/// Whether the program `name` (a server a test starts itself, such as
/// `redis-server`) runs here; when not, reports it as
/// [`absent`] and returns `false`.
pub fn program(name: &str) -> bool {
    std::process::Command::new(name)
        .arg("--version")
        .output()
        .is_ok()
        || absent::<()>(name, "PATH", "not installed").is_some()
}
