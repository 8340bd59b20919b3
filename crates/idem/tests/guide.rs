//! The scenario guide's examples (docs/guide.md) run, and each keeps its
//! promise: every example checks its own result and exits non-zero when an
//! effect happened twice or not at all; these tests run the built example
//! and check its exit status and its summary line.
//!
//! `cargo test -p idem` (and the workspace's test command) builds the
//! examples together with the tests: the crate's dev-dependency on itself
//! turns on the features they need. `cargo test -p idem --test guide`
//! builds only this file, so an example missing or older than its source
//! is built here first. A test whose service cannot be reached skips,
//! unless `CI` or `IDEM_REQUIRE_SERVICES` is set.

use std::io::Read;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use idem_testkit::services::{absent, url};

/// Each example runs in seconds; this bounds a loaded machine's worst.
const TIMEOUT: Duration = Duration::from_secs(180);

/// A service an example needs, as `idem-testkit` names it.
struct Service {
    name: &'static str,
    var: &'static str,
    default: &'static str,
    port: u16,
}

const POSTGRES: Service = Service {
    name: "PostgreSQL",
    var: "IDEM_TEST_POSTGRES_URL",
    default: "postgres://postgres@127.0.0.1:5432/test",
    port: 5432,
};

const REDIS: Service = Service {
    name: "Redis",
    var: "IDEM_TEST_REDIS_URL",
    default: "redis://127.0.0.1:6379",
    port: 6379,
};

#[test]
fn payments_pay_each_order_once_however_often_its_events_come() {
    if !reachable(&POSTGRES) {
        return;
    }
    let out = run("guide_payments");
    assert!(out.contains("ok: 300 orders paid once each from "), "{out}");
}

#[test]
fn a_flash_sale_burst_places_each_order_once() {
    if !reachable(&REDIS) {
        return;
    }
    let out = run("guide_flash_sale");
    assert!(
        out.contains("ok: 16000 orders placed once each from 20000 requests"),
        "{out}"
    );
}

#[test]
fn iot_readings_are_stored_once_despite_resends_and_a_dead_consumer() {
    if !reachable(&REDIS) {
        return;
    }
    let out = run("guide_iot");
    assert!(
        out.contains("ok: 2000 readings stored once each from "),
        "{out}"
    );
}

#[test]
fn an_offline_batch_books_each_row_once_across_a_crash_and_reruns() {
    let out = run("guide_offline_batch");
    assert!(
        out.contains("ok: 12000 rows booked once each across 3 runs and a crash"),
        "{out}"
    );
}

/// Whether `service` answers on its port; when not, skips (or fails under
/// CI) through `idem-testkit`.
fn reachable(service: &Service) -> bool {
    let url = url(service.var, service.default);
    let address = host_and_port(&url, service.port);
    let connected = address
        .to_socket_addrs()
        .map_err(|e| e.to_string())
        .and_then(|mut addrs| addrs.next().ok_or_else(|| "no address".to_owned()))
        .and_then(|addr| {
            TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())
        });
    match connected {
        Ok(_) => true,
        Err(e) => absent::<()>(service.name, &url, e).is_some(),
    }
}

/// `HOST:PORT` of a `scheme://[user[:password]@]host[:port][/…][?…]` URL.
fn host_and_port(url: &str, default_port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let has_port = host.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']'));
    if has_port {
        host.to_owned()
    } else {
        format!("{host}:{default_port}")
    }
}

/// Runs the example `name` to its end and returns what it printed;
/// panics, with its output, when it fails or outlasts [`TIMEOUT`].
fn run(name: &str) -> String {
    let exe = example(name);
    let started = Instant::now();
    let mut child = Command::new(&exe)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()));
    let stdout = drain(child.stdout.take().expect("piped"));
    let stderr = drain(child.stderr.take().expect("piped"));
    let status = wait(&mut child, name);
    let (stdout, stderr) = (
        stdout.join().expect("reader"),
        stderr.join().expect("reader"),
    );
    println!(
        "{name}: {status} in {:.2} s\n{stdout}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "{name} failed ({status}):\n{stdout}\n{stderr}"
    );
    stdout
}

fn wait(child: &mut std::process::Child, name: &str) -> ExitStatus {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for the example") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name} did not finish within {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = pipe.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    })
}

/// The built example `name`, built first when it is missing or older than
/// its source. One build at a time: they would wait on cargo's lock anyway.
fn example(name: &str) -> PathBuf {
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    // This test runs as target/<profile>/deps/guide-<hash>.
    let test = std::env::current_exe().expect("the test's own path");
    let profile_dir = test
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is in target/<profile>/deps");
    let exe = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(format!("{name}.rs"));
    if !newer(&exe, &source) {
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => "dev",
            Some(other) => other,
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
        let target_dir = profile_dir.parent().expect("target/<profile>");
        println!("building the example {name} (missing or older than its source)");
        let mut build = Command::new(cargo);
        build
            .args([
                "build",
                "-p",
                "idem",
                "--example",
                name,
                "--profile",
                profile,
            ])
            .arg("--target-dir")
            .arg(target_dir);
        // What cargo set for this test, not for the build: build scripts
        // that watch these variables (ring's) would run again, and the
        // next ordinary build after them.
        for (var, _) in std::env::vars_os() {
            let var = var.to_string_lossy();
            if var.starts_with("CARGO_PKG_")
                || [
                    "CARGO_MANIFEST_DIR",
                    "CARGO_MANIFEST_PATH",
                    "CARGO_CRATE_NAME",
                    "CARGO_BIN_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                    "CARGO_RUSTC_CURRENT_DIR",
                    "OUT_DIR",
                ]
                .contains(&var.as_ref())
            {
                build.env_remove(var.as_ref());
            }
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success(), "building the example {name} failed");
    }
    exe
}

/// Whether `built` exists and is at least as new as `source`.
fn newer(built: &Path, source: &Path) -> bool {
    let modified = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    match (modified(built), modified(source)) {
        (Some(b), Some(s)) => b >= s,
        _ => false,
    }
}
