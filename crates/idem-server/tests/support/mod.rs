//! Runs the real `idem` binary and talks HTTP to it.
#![allow(dead_code)]

pub mod consume;
pub mod gate;

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A running `idem` process.
pub struct Process {
    pub child: Child,
    /// `http://127.0.0.1:PORT`
    pub base: String,
}

/// Starts `idem ARGS…` (with `--listen 127.0.0.1:0` added unless given) and
/// waits for its "listening on" line.
pub async fn start(args: &[&str], env: &[(&str, &str)]) -> Process {
    start_logging_to(args, env, Stdio::inherit()).await
}

/// [`start`], its log (stderr) in a file whose path comes back with it.
pub async fn start_logged(args: &[&str], env: &[(&str, &str)]) -> (Process, tempfile::TempPath) {
    let log = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let file = std::fs::File::create(&log).unwrap();
    (start_logging_to(args, env, file.into()).await, log)
}

/// The line of the log at `log` that names `id` (a request id), lower
/// case; panics, showing the log, when none does.
pub fn log_line_naming(log: &std::path::Path, id: &str) -> String {
    let logged = std::fs::read_to_string(log).unwrap();
    logged
        .lines()
        .find(|l| l.contains(id))
        .unwrap_or_else(|| panic!("no log line names {id}: {logged}"))
        .to_lowercase()
}

/// A `http://` address where nothing listens.
pub fn nothing_listening() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    dead
}

async fn start_logging_to(args: &[&str], env: &[(&str, &str)], stderr: Stdio) -> Process {
    let mut all: Vec<&str> = args.to_vec();
    if !args.contains(&"--listen") {
        all.extend(["--listen", "127.0.0.1:0"]);
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.args(&all)
        .env_remove("IDEM_CONFIG")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("the idem binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("idem should report its address within 30 s")
        .unwrap()
        .unwrap_or_else(|| panic!("idem {all:?} exited before listening"));
    let base = line
        .split("listening on ")
        .nth(1)
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .trim()
        .to_owned();
    Process { child, base }
}

impl Process {
    /// Sends SIGTERM and waits for the exit code.
    pub async fn terminate(mut self) -> i32 {
        sigterm(&mut self.child, Duration::from_secs(30)).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// Sends SIGTERM to `child` and waits up to `within` for its exit code.
pub async fn sigterm(child: &mut Child, within: Duration) -> i32 {
    let pid = child.id().expect("running").to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = tokio::time::timeout(within, child.wait())
        .await
        .unwrap_or_else(|_| panic!("idem should stop within {within:?} of SIGTERM"))
        .unwrap();
    status.code().expect("exited, not killed")
}

/// Runs `idem ARGS…` to completion: exit code, stdout, stderr.
pub fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.args(args).env_remove("IDEM_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// Asserts a problem+json answer with `status` and returns its `type`.
    pub fn problem(&self, status: u16) -> String {
        assert_eq!(
            self.status.as_u16(),
            status,
            "body: {:?}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(
            self.headers.get("content-type").unwrap(),
            "application/problem+json"
        );
        let p = self.json();
        assert_eq!(p["status"], status);
        assert!(!p["detail"].as_str().unwrap().is_empty());
        p["type"].as_str().unwrap().to_owned()
    }
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

pub async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let response = client()
        .request(req.body(Full::new(body.into())).unwrap())
        .await
        .expect("the request reaches the server");
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

pub async fn post(url: &str, json: serde_json::Value) -> Answer {
    send(
        Method::POST,
        url,
        &[("content-type", "application/json")],
        json.to_string(),
    )
    .await
}

pub async fn post_auth(url: &str, token: &str, json: serde_json::Value) -> Answer {
    let auth = format!("Bearer {token}");
    send(
        Method::POST,
        url,
        &[
            ("content-type", "application/json"),
            ("authorization", &auth),
        ],
        json.to_string(),
    )
    .await
}

pub async fn get(url: &str) -> Answer {
    send(Method::GET, url, &[], Bytes::new()).await
}

/// The Redis URL tests use, if Redis answers there; `None` (after saying
/// why) when it does not and no test requires it.
pub async fn redis() -> Option<String> {
    let url = idem_testkit::services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let addr = url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    match tokio::net::TcpStream::connect(&addr).await {
        Ok(_) => Some(url),
        Err(e) => idem_testkit::services::absent("Redis", &url, e),
    }
}

/// `idem serve` on the test Redis, and a name no earlier run used (records
/// outlive a test there); `None` when Redis is absent and not required.
pub async fn serve_on_redis(name: &str) -> Option<(Process, String)> {
    let url = redis().await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let idem = start(&["serve", "--store", &url], &[]).await;
    Some((idem, format!("{name}-{}-{now}", std::process::id())))
}

/// `prefix` made unique to this run: records outlive a test in the shared
/// services.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// The test PostgreSQL's URL for `table`, migrated by `idem migrate`;
/// `None` (after saying why) when PostgreSQL is absent and not required.
pub fn postgres_table(table: &str) -> Option<String> {
    let pg = idem_testkit::services::url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let url = format!(
        "{pg}{}table={table}",
        if pg.contains('?') { '&' } else { '?' }
    );
    let (code, _, err) = run(&["migrate", "--store", &url], &[]);
    if code != 0 {
        return idem_testkit::services::absent("PostgreSQL", &pg, err);
    }
    Some(url)
}

/// The test Redis and a migrated PostgreSQL table `table`: the tiers of a
/// Redis-over-PostgreSQL tiered store; `None` (after saying why) when
/// either is absent and not required.
pub async fn redis_over_postgres(table: &str) -> Option<(String, String)> {
    let redis = redis().await?;
    Some((redis, postgres_table(table)?))
}
