//! The gateway run: HTTP clients that time out, cut their connections
//! mid-request and retry, through `idem proxy` to an upstream that records
//! every effect; optionally the proxy killed and restarted mid-run.
//!
//! Each client request carries an `Idempotency-Key`; the upstream applies
//! the effect (counting it per key) after 20–60 ms, so a client's 10 ms
//! timeout drops the request while the upstream is working. Checked: every
//! key answered, one upstream effect a key unless a proxy kill cut its
//! upstream call, and every answer a client got for a key the same as the
//! first (the replayed outcome, never a second effect's).

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::post;
use futures_util::StreamExt;
use http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use tokio::process::{Child, Command};

use crate::fault::Fault;
use crate::fleet::signal;
use crate::judge::{self, Facts, HttpEffect, HttpRecord, Outcome};
use crate::spec::{Spec, at};
use crate::store::{Store, free_port};

/// What the upstream saw of one key.
#[derive(Default)]
struct Upstream {
    /// Effects, each with when it started and ended.
    effects: HashMap<String, Vec<HttpEffect>>,
    open: usize,
}

struct Shared {
    start: Instant,
    up: Mutex<Upstream>,
}

/// `POST /pay`: one effect for the request's key, answered with its number.
async fn pay(State(s): State<Arc<Shared>>, headers: HeaderMap) -> (StatusCode, String) {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return (StatusCode::BAD_REQUEST, "no Idempotency-Key".into());
    };
    let began = s.start.elapsed();
    s.up.lock().open += 1;
    let work = 20 + (key.len() as u64 * 7 + began.as_micros() as u64) % 40;
    tokio::time::sleep(Duration::from_millis(work)).await;
    let mut up = s.up.lock();
    up.open -= 1;
    let effects = up.effects.entry(key.clone()).or_default();
    effects.push(HttpEffect {
        begun: began,
        applied: s.start.elapsed(),
        token: None,
        stored: None,
    });
    (
        StatusCode::CREATED,
        format!(r#"{{"key":"{key}","effect":{}}}"#, effects.len()),
    )
}

/// An `idem proxy` or `idem serve` process, restarted after each kill.
pub struct Server {
    bin: std::path::PathBuf,
    args: Vec<String>,
    child: Child,
}

impl Server {
    pub async fn start(bin: &Path, args: Vec<String>, port: u16) -> Result<Self, String> {
        let child = spawn(bin, &args, port).await?;
        Ok(Self {
            bin: bin.to_owned(),
            args,
            child,
        })
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }

    pub async fn kill_and_restart(&mut self, port: u16) -> Result<(), String> {
        if let Some(pid) = self.child.id() {
            signal(pid, libc::SIGKILL);
        }
        let _ = self.child.wait().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.child = spawn(&self.bin, &self.args, port).await?;
        Ok(())
    }
}

async fn spawn(bin: &Path, args: &[String], port: u16) -> Result<Child, String> {
    let child = Command::new(bin)
        .args(args)
        .env_remove("IDEM_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{} does not start: {e}", bin.display()))?;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(child);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "{} {} did not listen on {port} within 10 s",
        bin.display(),
        args.first().map_or("", String::as_str)
    ))
}

/// Runs the gateway scenario of `spec` (fault `client-cuts` or
/// `proxy-kill`) with the `idem` binary at `idem`.
pub async fn run(spec: &Spec, idem: &Path) -> Result<Outcome, String> {
    let dir = tempfile::Builder::new()
        .prefix("idem-chaos-")
        .tempdir()
        .map_err(|e| format!("a temporary directory: {e}"))?;
    let name = format!("chaos_gateway_{}", std::process::id());
    at("starting the store");
    let store = Store::start(spec.store, &name, dir.path(), false).await?;

    let shared = Arc::new(Shared {
        start: Instant::now(),
        up: Mutex::new(Upstream::default()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let upstream = listener.local_addr().map_err(|e| e.to_string())?;
    let app = axum::Router::new()
        .route("/pay", post(pay))
        .with_state(shared.clone());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let port = free_port()?;
    let mut args: Vec<String> = vec![
        "proxy".into(),
        "--upstream".into(),
        format!("http://{upstream}"),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--default-lease-ms".into(),
        spec.lease.as_millis().to_string(),
        "--log".into(),
        "warn".into(),
    ];
    args.extend(store.args.iter().cloned());
    at("starting idem proxy");
    let mut proxy = Server::start(idem, args, port).await?;
    at("sending the requests");

    let client = client::Client::new(port);
    let keys: Vec<String> = (0..spec.messages).map(|i| format!("g-{i}")).collect();
    let answers: Arc<Mutex<HashMap<String, Vec<String>>>> = Arc::default();
    let sent = Arc::new(AtomicU64::new(0));
    let cuts = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + spec.deadline;
    let clients = {
        let (keys, answers, sent, cuts) =
            (keys.clone(), answers.clone(), sent.clone(), cuts.clone());
        tokio::spawn(async move {
            futures_util::stream::iter(keys.into_iter().enumerate())
                .for_each_concurrent(32, |(i, key)| {
                    let (client, answers, sent, cuts) = (&client, &answers, &sent, &cuts);
                    async move {
                        let mut attempt = 0u32;
                        while Instant::now() < deadline {
                            attempt += 1;
                            sent.fetch_add(1, Ordering::Relaxed);
                            // A third of the keys are first sent by a client
                            // that gives up after 10 ms, mid-request.
                            let cut = attempt == 1 && i % 3 == 0;
                            let limit = if cut {
                                Duration::from_millis(10)
                            } else {
                                Duration::from_secs(5)
                            };
                            match tokio::time::timeout(limit, client.post(&key)).await {
                                Err(_) => {
                                    cuts.fetch_add(1, Ordering::Relaxed);
                                }
                                Ok(Ok((status, body, _))) if status < 300 => {
                                    answers.lock().entry(key.clone()).or_default().push(body);
                                    return;
                                }
                                Ok(Ok((_, _, retry_after))) => {
                                    tokio::time::sleep(
                                        retry_after.unwrap_or(Duration::from_millis(100)),
                                    )
                                    .await;
                                    continue;
                                }
                                Ok(Err(_)) => {}
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                })
                .await;
        })
    };

    let mut kills: Vec<Duration> = Vec::new();
    if spec.fault == Fault::ProxyKill {
        for _ in 0..spec.times {
            // Kill while work is in flight.
            let until = Instant::now() + Duration::from_secs(5);
            tokio::time::sleep(Duration::from_millis(400)).await;
            while shared.up.lock().open == 0 && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            kills.push(shared.start.elapsed());
            at("killing and restarting idem proxy");
            proxy.kill_and_restart(port).await?;
            at("sending the requests");
        }
    }
    let _ = clients.await;
    let elapsed = started.elapsed();
    at("stopping idem proxy and the store");
    proxy.stop().await;
    server.abort();
    store.stop().await;
    at("judging the history");

    let up = std::mem::take(&mut *shared.up.lock());
    let answers = std::mem::take(&mut *answers.lock());
    Ok(judge_http(
        spec, keys, elapsed, sent, cuts, up.effects, answers, kills,
    ))
}

/// Judges an HTTP run (the gateway's or the service's).
#[allow(clippy::too_many_arguments)]
pub fn judge_http(
    spec: &Spec,
    keys: Vec<String>,
    elapsed: Duration,
    sent: Arc<AtomicU64>,
    cuts: Arc<AtomicU64>,
    effects: HashMap<String, Vec<HttpEffect>>,
    answers: HashMap<String, Vec<String>>,
    kills: Vec<Duration>,
) -> Outcome {
    let facts = Facts {
        names: spec.names(),
        consumers: 1,
        concurrency: 32,
        keys,
        poison: HashMap::new(),
        copies: 0,
        lease: spec.lease,
        committed: None,
        forced_stops: 0,
        elapsed,
    };
    let mut o = Outcome::empty(facts.names.clone(), 1, facts.keys.len(), elapsed);
    o.duplicates = sent.load(Ordering::Relaxed) - facts.keys.len() as u64;
    o.injected = cuts.load(Ordering::Relaxed) + kills.len() as u64;
    let record = HttpRecord {
        effects,
        answers,
        kills,
    };
    judge::judge_http(&mut o, &facts, &record);
    o
}

/// An HTTP/1.1 client for the proxy: one connection a request (hyper's
/// connection API), so a dropped request is a cut connection.
pub mod client {
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::TokioIo;

    type Error = Box<dyn std::error::Error + Send + Sync>;

    pub struct Client {
        port: u16,
    }

    impl Client {
        pub fn new(port: u16) -> Self {
            Self { port }
        }

        /// POSTs to `/pay` with `key`; answers the status, the body and
        /// `Retry-After`.
        pub async fn post(&self, key: &str) -> Result<(u16, String, Option<Duration>), Error> {
            let request = http::Request::post("/pay")
                .header("host", "gateway")
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(br#"{"amount":1}"#)))?;
            self.send(request).await
        }

        /// POSTs the JSON `body` to `path`; answers the status and the
        /// body.
        pub async fn post_json(&self, path: &str, body: String) -> Result<(u16, String), Error> {
            let request = http::Request::post(path)
                .header("host", "idem")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))?;
            let (status, body, _) = self.send(request).await?;
            Ok((status, body))
        }

        /// Sends `request` on a connection of its own; answers the status,
        /// the body and `Retry-After`.
        async fn send(
            &self,
            request: http::Request<Full<Bytes>>,
        ) -> Result<(u16, String, Option<Duration>), Error> {
            let stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            let response = sender.send_request(request).await?;
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .map(Duration::from_secs);
            let body = response.into_body().collect().await?.to_bytes();
            Ok((
                status,
                String::from_utf8_lossy(&body).into_owned(),
                retry_after,
            ))
        }
    }
}
