//! `idem consume` against a real broker: a sink that records every call,
//! the sidecar as a child process, and the scenarios every broker's test
//! file runs (`consume_<broker>.rs` implements [`Broker`] and calls them).
#![allow(async_fn_in_trait)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use idem_consumer::dlq::is_dead_lettered;
use idem_consumer::{HandlerError, KeyFrom, Message, Runner, Source};
use idem_core::{Begin, ClaimHandle, Guard, Key, Lease, Record, Store};
use idem_redis::RedisStore;
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A broker under test, with names of its own for one test.
pub trait Broker {
    /// The library runner's source.
    type Source: Source;
    /// `--from` for `idem consume`.
    fn source_url(&self) -> String;
    /// The queue or stream name (the default namespace).
    fn name(&self) -> String;
    /// A source on the same queue or stream, for the library runner.
    async fn library_source(&self) -> Self::Source;
    /// Publishes each `(id, body)` with its id as the message id.
    async fn publish(&self, messages: &[(String, Vec<u8>)]);
    /// What the dead-letter destination holds: each message's headers
    /// (names lowercased) and body.
    async fn dead_letters(&self) -> Vec<(HashMap<String, String>, Vec<u8>)>;
    /// Whether every published message is settled: none waiting, none
    /// delayed, none unacknowledged.
    async fn drained(&self) -> bool;
    /// The lease of the key another holder keeps in the busy-key scenario:
    /// it must outlast the sidecar's start and the broker's first delivery,
    /// so the first delivery finds the key busy.
    fn busy_lease(&self) -> Duration {
        Duration::from_millis(1500)
    }
}

/// One call the sink received.
#[derive(Clone, Debug)]
pub struct Call {
    pub key: String,
    pub token: Option<u64>,
    pub attempt: u32,
    pub by: &'static str,
    /// When the call ended.
    pub at: Instant,
    /// Whether the sink did the work and said so: a 2xx answer that
    /// reached the caller (a batch's item the answer left out, or a batch
    /// answered with garbage, did the work but never said so).
    pub done: bool,
}

#[derive(Default)]
struct Ledger {
    calls: Vec<Call>,
    /// Keys whose effect is applied: recorded with the effect, in one step,
    /// as a database records the key in the business transaction.
    applied: HashMap<String, u64>,
    /// Calls started, per key (for the slow and failing behaviours).
    started: HashMap<String, u32>,
    /// When each key's first call came.
    first_call: HashMap<String, Instant>,
    /// The keys of each batch request, in the order they came.
    batches: Vec<Vec<String>>,
    /// Batch behaviours already played once (`short-`, `notjson-`,
    /// `down-`).
    played: std::collections::HashSet<String>,
}

/// The business system: an HTTP endpoint for `idem consume` and a function
/// for the library runner, with one ledger. What it does depends on the
/// key's prefix: `fail2-` fails (503) twice then succeeds, `always-` always
/// fails (500), `bad-` is refused (422), `slow-` takes 2 s; over HTTP only,
/// `problem-` is refused with a multi-line problem body (422), `auth-` is
/// refused as unauthorized (401) for its first 2 s, and `late-` answers
/// 200 at once and sends its body 2.5 s later; anything else succeeds after
/// a short pause.
#[derive(Clone, Default)]
pub struct Sink {
    ledger: Arc<Mutex<Ledger>>,
    /// Set by [`Sink::fix`]: every key succeeds from then on.
    fixed: Arc<std::sync::atomic::AtomicBool>,
}

impl Sink {
    /// Serves the sink's endpoint; returns its URL.
    pub async fn serve(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route("/handle", axum::routing::post(http_handle))
            .route("/batch", axum::routing::post(http_batch))
            .with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/handle")
    }

    /// Handles one message: the sink's behaviour for its key.
    pub async fn handle(
        &self,
        key: &str,
        token: Option<u64>,
        attempt: u32,
        by: &'static str,
    ) -> StatusCode {
        let (n, since_first) = {
            let mut l = self.ledger.lock();
            let n = l.started.entry(key.to_owned()).or_default();
            *n += 1;
            let n = *n;
            let first = *l
                .first_call
                .entry(key.to_owned())
                .or_insert_with(Instant::now);
            (n, first.elapsed())
        };
        let fixed = self.fixed.load(std::sync::atomic::Ordering::SeqCst);
        let status = if fixed {
            StatusCode::OK
        } else if key.starts_with("fail2-") && n <= 2 {
            StatusCode::SERVICE_UNAVAILABLE
        } else if key.starts_with("always-") {
            StatusCode::INTERNAL_SERVER_ERROR
        } else if key.starts_with("bad-") || key.starts_with("problem-") {
            StatusCode::UNPROCESSABLE_ENTITY
        } else if key.starts_with("auth-") && since_first < Duration::from_secs(2) {
            StatusCode::UNAUTHORIZED
        } else {
            let pause = if key.starts_with("slow-") { 2000 } else { 1 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
            StatusCode::OK
        };
        let mut l = self.ledger.lock();
        l.calls.push(Call {
            key: key.to_owned(),
            token,
            attempt,
            by,
            at: Instant::now(),
            done: status.is_success(),
        });
        if status.is_success() {
            l.applied
                .entry(key.to_owned())
                .or_insert(token.unwrap_or(0));
        }
        status
    }

    /// The fix is deployed: every key succeeds from now on.
    pub fn fix(&self) {
        self.fixed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.ledger.lock().calls.clone()
    }

    pub fn calls_for(&self, key: &str) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.key == key).collect()
    }

    pub fn applied(&self) -> usize {
        self.ledger.lock().applied.len()
    }

    /// The keys of each batch request so far.
    pub fn batches(&self) -> Vec<Vec<String>> {
        self.ledger.lock().batches.clone()
    }

    /// Whether `behaviour` (a key) is played for the first time.
    fn first_time(&self, behaviour: &str) -> bool {
        self.ledger.lock().played.insert(behaviour.to_owned())
    }

    /// The work of `key`'s last call was done, but the caller was not told.
    fn untold(&self, key: &str) {
        let mut l = self.ledger.lock();
        if let Some(call) = l.calls.iter_mut().rev().find(|c| c.key == key) {
            call.done = false;
        }
    }

    pub fn started(&self, key: &str) -> u32 {
        self.ledger.lock().started.get(key).copied().unwrap_or(0)
    }
}

async fn http_handle(State(sink): State<Sink>, headers: HeaderMap, _body: Bytes) -> Response {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let Some(key) = text("idempotency-key") else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let token = text("idem-fencing-token").and_then(|t| t.parse().ok());
    let attempt = text("idem-attempt")
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let status = sink.handle(&key, token, attempt, "sidecar").await;
    if key.starts_with("problem-") {
        let body = "{\r\n  \"type\": \"https://example.com/out-of-stock\",\n  \"title\": \"Out of stock\"\u{1}KEYS\u{2}x\n}";
        return (status, [("content-type", "application/problem+json")], body).into_response();
    }
    if key.starts_with("late-") {
        // The head goes now; the body 2.5 s later.
        let body = futures_util::stream::once(async {
            tokio::time::sleep(Duration::from_millis(2500)).await;
            Ok::<_, std::io::Error>(Bytes::from_static(b"{\"receipt\":1}"))
        });
        return (status, axum::body::Body::from_stream(body)).into_response();
    }
    status.into_response()
}

/// The batch endpoint (`idem consume --batch`): each item by the sink's
/// behaviour for its key, all at once, answered per item. Batch-only
/// behaviours, each played the first time its key comes: a batch holding
/// `down-` is answered 503 as a whole without any work; one holding
/// `notjson-` does every item's work and answers 200 with a body that is
/// not JSON; `short-` is done and left out of the answer. `fail2-` asks
/// for its retry after 150 ms (under the test's `--retry-max-ms 200`,
/// which caps it), `bad-` says why.
async fn http_batch(State(sink): State<Sink>, headers: HeaderMap, body: Bytes) -> Response {
    let Ok(serde_json::Value::Array(items)) = serde_json::from_slice(&body) else {
        return (StatusCode::BAD_REQUEST, "not a JSON array").into_response();
    };
    let count = headers
        .get("idem-batch")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    assert_eq!(count, Some(items.len()), "Idem-Batch counts the items");
    let keys: Vec<String> = items
        .iter()
        .map(|i| i["key"].as_str().expect("each item has its key").to_owned())
        .collect();
    sink.ledger.lock().batches.push(keys.clone());
    if let Some(down) = keys.iter().find(|k| k.starts_with("down-"))
        && sink.first_time(down)
    {
        return (StatusCode::SERVICE_UNAVAILABLE, "down for a moment").into_response();
    }
    let statuses = futures_util::future::join_all(items.iter().map(|item| {
        let key = item["key"].as_str().unwrap();
        let token = item["token"].as_u64();
        let attempt = item["attempt"].as_u64().unwrap_or(0) as u32;
        // The body travels as JSON, or as its text where the broker gives
        // no content type.
        let body = match &item["body"] {
            serde_json::Value::String(text) => serde_json::from_str(text).unwrap_or_default(),
            body => body.clone(),
        };
        let key = if body["id"].as_str() == Some(key) {
            key
        } else {
            "bad-body"
        };
        sink.handle(key, token, attempt, "sidecar")
    }))
    .await;
    if let Some(garbage) = keys.iter().find(|k| k.starts_with("notjson-"))
        && sink.first_time(garbage)
    {
        for key in &keys {
            sink.untold(key);
        }
        return (StatusCode::OK, "ok").into_response();
    }
    let mut results = Vec::new();
    for (key, status) in keys.iter().zip(statuses) {
        if key.starts_with("short-") && sink.first_time(key) {
            sink.untold(key);
            continue;
        }
        let mut result = serde_json::json!({ "key": key, "status": status.as_u16() });
        if status.is_success() {
            result["outcome"] = serde_json::json!({ "handled": key });
        } else if key.starts_with("fail2-") {
            result["retry_after_ms"] = 150.into();
        } else if key.starts_with("bad-") {
            result["error"] = "out of stock\r\nKEYS: injected".into();
        }
        results.push(result);
    }
    axum::Json(serde_json::json!({ "results": results })).into_response()
}

/// A running `idem consume`.
pub struct Consume {
    pub child: Child,
}

/// Starts `idem consume ARGS…` and waits for its ready line.
pub async fn start(args: &[String]) -> Consume {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("consume")
        .args(args)
        .env_remove("IDEM_CONFIG")
        .env("IDEM_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("the idem binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("idem consume should be ready within 30 s")
        .unwrap()
        .unwrap_or_else(|| panic!("idem consume {args:?} exited before it was ready"));
    assert!(
        line.starts_with("idem consume ready"),
        "unexpected first line {line:?}"
    );
    Consume { child }
}

impl Consume {
    /// SIGKILL: the process dies mid-work.
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM, then the exit code.
    pub async fn terminate(mut self) -> i32 {
        super::sigterm(&mut self.child, Duration::from_secs(40)).await
    }
}

/// The Redis store both consumers share, and its URL.
pub async fn store() -> Option<(RedisStore, String)> {
    let url = super::redis().await?;
    let store = RedisStore::builder(&url)
        .connect()
        .await
        .expect("Redis connects");
    Some((store, url))
}

fn args(broker: &impl Broker, to: &str, store: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--from",
        &broker.source_url(),
        "--to",
        to,
        "--store",
        store,
        "--retry-initial-ms",
        "50",
        "--retry-max-ms",
        "200",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

async fn wait_for(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn messages(ids: impl IntoIterator<Item = String>) -> Vec<(String, Vec<u8>)> {
    ids.into_iter()
        .map(|id| {
            let body = format!("{{\"id\":\"{id}\"}}").into_bytes();
            (id, body)
        })
        .collect()
}

/// 10 000 messages, 10 % published twice (some while the first copy is
/// being handled), two consumers (the library runner in this process and
/// `idem consume`), the sidecar killed with SIGKILL mid-run and restarted:
/// every message's effect reaches the sink, and the only second calls are
/// for keys the killed process was handling, each with a larger fencing
/// token.
pub async fn crash_and_duplicates(broker: impl Broker) {
    crash_and_duplicates_with(broker, None).await;
}

/// [`crash_and_duplicates`] with the sidecar's handler taking batches of 16
/// (`--batch 16`): the killed process may hold as many messages as without
/// batches, and no more run twice.
pub async fn crash_and_duplicates_in_batches(broker: impl Broker) {
    crash_and_duplicates_with(broker, Some("16")).await;
}

async fn crash_and_duplicates_with(broker: impl Broker, batch: Option<&str>) {
    let Some((store, store_url)) = store().await else {
        return;
    };
    let sink = Sink::default();
    let mut to = sink.serve().await;
    let mut extra = vec!["--concurrency", "16", "--default-lease-ms", "2000"];
    if let Some(n) = batch {
        to = to.replace("/handle", "/batch");
        extra.extend(["--batch", n]);
    }
    let total = 10_000;
    let ids: Vec<String> = (0..total).map(|i| format!("m-{i}")).collect();
    let mut first = messages(ids.iter().cloned());
    // Half the copies go out at once, among the originals.
    for i in (0..total).step_by(20) {
        first.push((
            ids[i].clone(),
            format!("{{\"id\":\"{}\"}}", ids[i]).into_bytes(),
        ));
    }
    broker.publish(&first).await;
    let concurrency = 16;
    let sidecar_args = args(&broker, &to, &store_url, &extra);
    let sidecar = start(&sidecar_args).await;
    let stop = CancellationToken::new();
    let library = {
        let guard = Guard::new(store.clone()).lease(Lease::from_millis(2000));
        let sink = sink.clone();
        let handler = move |m: Message, claim: ClaimHandle| {
            let sink = sink.clone();
            async move {
                let key =
                    String::from_utf8_lossy(m.key.as_deref().unwrap_or_default()).into_owned();
                let status = sink
                    .handle(&key, claim.token().map(|t| t.get()), m.attempt, "library")
                    .await;
                if status.is_success() {
                    Ok(Bytes::new())
                } else {
                    Err(HandlerError::transient(status.to_string()))
                }
            }
        };
        let runner = Runner::new(guard, broker.library_source().await, handler)
            .key(KeyFrom::MessageId)
            .concurrency(concurrency);
        tokio::spawn(runner.run(stop.clone()))
    };
    // The other half of the copies, while the first copies are handled.
    wait_for("the first effects", Duration::from_secs(60), async || {
        sink.applied() >= 1_000
    })
    .await;
    let late = messages((0..total).skip(10).step_by(20).map(|i| ids[i].clone()));
    broker.publish(&late).await;
    wait_for(
        "a third of the effects",
        Duration::from_secs(120),
        async || sink.applied() >= total / 3,
    )
    .await;
    let calls_before_kill = sink.calls().len();
    sidecar.kill().await;
    let sidecar = start(&sidecar_args).await;
    wait_for(
        "every effect and a drained broker",
        Duration::from_secs(240),
        async || sink.applied() == total && broker.drained().await,
    )
    .await;
    assert_eq!(sidecar.terminate().await, 0, "SIGTERM exits 0");
    stop.cancel();
    let report = library.await.unwrap().unwrap();

    let calls = sink.calls();
    let mut per_key: HashMap<&str, Vec<&Call>> = HashMap::new();
    for c in &calls {
        per_key.entry(&c.key).or_default().push(c);
    }
    assert_eq!(
        per_key.len(),
        total,
        "every message's effect reached the sink"
    );
    let again: Vec<_> = per_key.iter().filter(|(_, cs)| cs.len() > 1).collect();
    for (key, cs) in &again {
        assert!(
            cs.windows(2).all(|w| w[0].token < w[1].token),
            "{key}: a second call must carry a larger fencing token: {cs:?}"
        );
        assert_eq!(
            cs[0].by, "sidecar",
            "{key}: only the killed process's work runs again: {cs:?}"
        );
    }
    assert!(
        again.len() <= concurrency,
        "only messages the killed process held may run twice; {} did: {:?}",
        again.len(),
        again.iter().take(5).collect::<Vec<_>>()
    );
    let by_library = calls.iter().filter(|c| c.by == "library").count();
    assert!(
        by_library > 0 && by_library < calls.len(),
        "both consumers worked: {by_library} of {}",
        calls.len()
    );
    assert!(calls_before_kill > 0);
    assert!(
        report.duplicates > 0 || calls.len() < total + total / 10,
        "{report:?}"
    );
    if batch.is_some() {
        let batches = sink.batches();
        assert!(
            batches.iter().any(|b| b.len() > 1),
            "the sidecar sent batches"
        );
    }
    eprintln!(
        "crash_and_duplicates (batch {batch:?}): {} calls for {total} messages, {} keys called twice (killed in flight), library {by_library}, library report {report:?}",
        calls.len(),
        again.len()
    );
}

/// A handler that fails twice (503) is called a third time after backoff
/// and applied once; one that always fails (500) is dead-lettered after
/// `--max-attempts` with its body and the idem headers; one refused with
/// 422 is dead-lettered at once.
pub async fn retries_and_dead_letters(broker: impl Broker) {
    let Some((_store, store_url)) = store().await else {
        return;
    };
    let sink = Sink::default();
    // A handler URL with a credential: it shows nowhere.
    let to = format!("{}?token=s3cret-handler-token", sink.serve().await);
    broker
        .publish(&messages([
            "fail2-a".into(),
            "always-b".into(),
            "bad-c".into(),
            "ok-d".into(),
        ]))
        .await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = start(&args(
        &broker,
        &to,
        &store_url,
        &["--max-attempts", "3", "--metrics-listen", &metrics],
    ))
    .await;
    wait_for("two dead letters", Duration::from_secs(60), async || {
        broker.dead_letters().await.len() == 2 && sink.applied() == 2
    })
    .await;
    wait_for("a drained broker", Duration::from_secs(30), async || {
        broker.drained().await
    })
    .await;
    // The status page counts them, and charts what was settled.
    let status_json = format!("http://{metrics}/status.json");
    wait_for(
        "dead letters on the chart",
        Duration::from_secs(10),
        async || {
            let status = super::get(&status_json).await.json();
            status["activity"]["families"][0]["outcomes"]["dead_lettered"]
                .as_array()
                .is_some_and(|rates| rates.iter().any(|r| r.as_f64() > Some(0.0)))
        },
    )
    .await;
    let status = super::get(&status_json).await.json();
    let consumer = &status["consumer"];
    assert_eq!(consumer["dead_lettered_total"], 2, "{consumer}");
    assert_eq!(consumer["running"], true, "{consumer}");
    assert!(consumer["source"].is_string(), "{consumer}");
    assert!(
        consumer["to"].as_str().unwrap().ends_with("?token=***"),
        "{consumer}"
    );
    assert!(!status.to_string().contains("s3cret"), "{status}");
    assert_eq!(status["store"]["keys_shown"], false, "{status}");
    assert_eq!(sidecar.terminate().await, 0);

    let flaky = sink.calls_for("fail2-a");
    assert_eq!(flaky.len(), 3, "{flaky:?}");
    assert_eq!(
        flaky.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(
        sink.calls_for("always-b").len(),
        3,
        "three attempts, then the dead letter"
    );
    assert_eq!(sink.calls_for("bad-c").len(), 1, "a 422 is not retried");
    assert_eq!(sink.calls_for("ok-d").len(), 1);
    let dead = broker.dead_letters().await;
    let find = |key: &str| dead_letter(&dead, key);
    let (headers, body) = find("always-b");
    assert_eq!(headers["idem-attempts"], "3");
    assert!(headers["idem-last-error"].contains("500"), "{headers:?}");
    assert!(
        headers["idem-last-error"].contains("token=***"),
        "{headers:?}"
    );
    assert!(
        !headers["idem-last-error"].contains("s3cret"),
        "{headers:?}"
    );
    assert_eq!(body, br#"{"id":"always-b"}"#);
    let (headers, _) = find("bad-c");
    assert_eq!(headers["idem-attempts"], "1");
    assert!(headers["idem-last-error"].contains("422"), "{headers:?}");
}

/// The dead letter of `key` among `dead`.
fn dead_letter<'a>(
    dead: &'a [(HashMap<String, String>, Vec<u8>)],
    key: &str,
) -> &'a (HashMap<String, String>, Vec<u8>) {
    dead.iter()
        .find(|(h, _)| h.get("idem-key").map(String::as_str) == Some(key))
        .unwrap_or_else(|| panic!("{key} is not among the dead letters: {dead:?}"))
}

/// Parks `n` dead letters (keys `bad-0000`…, refused by the handler)
/// through `idem consume`, and answers `idem dlq ARGS… --from` for the
/// broker's source: a runner of `idem dlq` commands.
pub async fn park<B: Broker>(
    broker: &B,
    n: usize,
) -> Option<impl Fn(&[&str]) -> (i32, String, String) + Send + Sync + use<B>> {
    let (_store, store_url) = store().await?;
    let sink = Sink::default();
    let to = sink.serve().await;
    broker
        .publish(&messages((0..n).map(|i| format!("bad-{i:04}"))))
        .await;
    let sidecar = start(&args(broker, &to, &store_url, &[])).await;
    let from = broker.source_url();
    let dlq = move |args: &[&str]| {
        let mut all = vec!["dlq"];
        all.extend_from_slice(args);
        all.extend(["--from", &from]);
        super::run(&all, &[])
    };
    wait_for("the dead letters", Duration::from_secs(60), async || {
        let (code, out, _) = dlq(&["ls", "--json", "--limit", "100000"]);
        code == 0 && out.lines().count() == n
    })
    .await;
    assert_eq!(sidecar.terminate().await, 0);
    Some(dlq)
}

/// `idem dlq` on a thousand dead letters: listed with their idem headers,
/// one shown, replayed after the fix by key and then all at once (a key
/// completed meanwhile stays parked), and the replayed messages handled
/// once each, on their first attempt again.
pub async fn dead_letters_replay_after_a_fix(broker: impl Broker) {
    const DEAD: usize = 1000;
    let Some((store, store_url)) = store().await else {
        return;
    };
    let sink = Sink::default();
    let to = sink.serve().await;
    let ids: Vec<String> = (0..DEAD).map(|i| format!("bad-{i:04}")).collect();
    broker.publish(&messages(ids.iter().cloned())).await;
    let sidecar = start(&args(&broker, &to, &store_url, &["--concurrency", "64"])).await;
    let from = broker.source_url();
    let dlq = |args: &[&str]| {
        let mut all = vec!["dlq"];
        all.extend_from_slice(args);
        super::run(&all, &[])
    };
    // Counted by the tool itself (a dead-letter topic may not exist yet).
    wait_for("the dead letters", Duration::from_secs(120), async || {
        let (code, out, _) = dlq(&["ls", "--from", &from, "--json", "--limit", "5000"]);
        code == 0 && out.lines().count() == DEAD
    })
    .await;
    assert_eq!(sidecar.terminate().await, 0);
    let lines = |out: &str| -> Vec<serde_json::Value> {
        out.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    };

    let (code, out, err) = dlq(&["ls", "--from", &from, "--json", "--limit", "5000"]);
    assert_eq!(code, 0, "{err}");
    let listed = lines(&out);
    assert_eq!(listed.len(), DEAD, "every dead letter, once");
    let first = &listed[0];
    assert!(
        first["key"].as_str().unwrap().starts_with("bad-"),
        "{first}"
    );
    assert_eq!(first["attempts"], 1, "{first}");
    assert!(
        first["last_error"].as_str().unwrap().contains("422"),
        "{first}"
    );
    assert!(
        first["parked_ms_ago"].as_u64().unwrap() < 600_000,
        "{first}"
    );
    let (code, out, _) = dlq(&["ls", "--from", &from, "--limit", "3"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("ID"), "{out}");
    assert!(out.contains("(first 3 dead letters"), "{out}");
    // Pages, filters and order.
    let ls = |extra: &[&str]| {
        let (code, out, err) = dlq(&[&["ls", "--from", &from, "--json"][..], extra].concat());
        assert_eq!(code, 0, "{extra:?}: {err}");
        lines(&out)
    };
    let ids_of = |letters: &[serde_json::Value]| -> Vec<serde_json::Value> {
        letters.iter().map(|l| l["id"].clone()).collect()
    };
    let page = ls(&["--limit", "3", "--after", listed[2]["id"].as_str().unwrap()]);
    assert_eq!(ids_of(&page), ids_of(&listed[3..6]), "the second page");
    let one = ls(&["--key", "bad-0007"]);
    assert_eq!(
        (one.len(), &one[0]["key"]),
        (1, &serde_json::json!("bad-0007"))
    );
    assert_eq!(
        ls(&["--error", "422 UNPROCESSABLE", "--limit", "5000"]).len(),
        DEAD
    );
    assert!(ls(&["--error", "no such error"]).is_empty());
    assert!(ls(&["--older-than", "1h"]).is_empty());
    let newest = ls(&["--newest-first", "--limit", "1"]);
    assert_eq!(newest[0]["id"], listed[DEAD - 1]["id"]);
    let id = first["id"].as_str().unwrap();
    let (code, out, err) = dlq(&["show", id, "--from", &from]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("idem-last-error") && out.contains("\"id\":"),
        "{out}"
    );

    // A replay must say which, confirm --all, and look keys up in the
    // store unless told not to.
    let (code, _, err) = dlq(&["replay", "--from", &from]);
    assert_eq!(code, 2);
    assert!(err.contains("--all"), "{err}");
    let (code, _, err) = dlq(&["replay", "--from", &from, "--all", "--store", &store_url]);
    assert_eq!(code, 2);
    assert!(err.contains("--yes"), "{err}");
    let (code, _, err) = dlq(&["replay", "--from", &from, "--key", "bad-0000"]);
    assert_eq!(code, 2);
    assert!(err.contains("--no-store-check"), "{err}");

    // Every dead-lettered key is recorded as such, so a copy would be
    // acked as a duplicate.
    for id in &ids {
        let key = Key::new(&broker.name(), id.clone()).unwrap();
        match store.get(&key).await.unwrap() {
            Some(Record::Completed(c)) => {
                assert!(is_dead_lettered(c.outcome.as_deref()), "{id}: {c:?}")
            }
            other => panic!("{id}: expected the dead-lettered record, got {other:?}"),
        }
    }

    // The fix is deployed; one key's work was done elsewhere meanwhile
    // (after an operator reopened it).
    sink.fix();
    let done = Key::new(&broker.name(), "bad-0001").unwrap();
    let Some(Record::Completed(dead)) = store.get(&done).await.unwrap() else {
        panic!("bad-0001 is recorded as dead-lettered");
    };
    assert_eq!(
        store.reopen(&done, dead.token).await.unwrap(),
        idem_core::Fenced::Ok(())
    );
    let Begin::Acquired(c) = store
        .begin(&done, None, Lease::from_secs(60))
        .await
        .unwrap()
    else {
        panic!("bad-0001 is free");
    };
    let completed = store
        .complete(&done, c.token, None, Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(completed, idem_core::Fenced::Ok(()));
    let (code, out, err) = dlq(&[
        "replay", "--from", &from, "--key", "bad-0000", "--store", &store_url, "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let replayed = lines(&out);
    assert_eq!(replayed.len(), 1, "{out}");
    assert_eq!(replayed[0]["key"], "bad-0000");
    assert!(err.contains("dead letter replayed"), "logged: {err}");
    // A letter parked longer ago than the record retention may have
    // outlived its key's record: kept, unless forced.
    let older = |extra: &[&str]| {
        let mut all = vec![
            "replay",
            "--from",
            &from,
            "--key",
            "bad-0002",
            "--store",
            &store_url,
            "--default-retention-ms",
            "1",
        ];
        all.extend_from_slice(extra);
        dlq(&all)
    };
    let (code, out, err) = older(&[]);
    assert_eq!(code, 4, "{out}{err}");
    assert!(out.contains("longer than the record retention"), "{out}");
    let (code, out, err) = older(&["--force"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("replayed 1 dead letter"), "{out}");
    // An id from the first listing still names the same letter, however
    // many were replayed before it since.
    let later = listed
        .iter()
        .find(|l| l["key"] == "bad-0005")
        .expect("bad-0005 was listed");
    let (code, out, err) = dlq(&[
        "show",
        later["id"].as_str().unwrap(),
        "--from",
        &from,
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let shown: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(shown["key"], "bad-0005", "{shown}");
    let (code, _, err) = dlq(&["show", "no-such-id", "--from", &from]);
    assert_eq!(code, 3, "{err}");
    // A look first, which changes nothing.
    let all = [
        "replay", "--from", &from, "--all", "--yes", "--store", &store_url,
    ];
    let (code, out, err) = dlq(&[&all[..], &["--dry-run"]].concat());
    assert_eq!(code, 4, "bad-0001 would be kept: {out}{err}");
    assert!(
        out.contains(&format!("would replay {} dead letters", DEAD - 3)),
        "{out}"
    );
    let (code, out, err) = dlq(&all);
    assert_eq!(code, 4, "bad-0001 is kept: {out}{err}");
    assert!(
        out.contains(&format!("replayed {} dead letters", DEAD - 3)),
        "{out}"
    );
    assert!(out.contains("kept") && out.contains("bad-0001"), "{out}");
    let (_, out, _) = dlq(&["ls", "--from", &from, "--json"]);
    let left = lines(&out);
    assert_eq!(left.len(), 1, "only the completed key stays parked: {out}");
    assert_eq!(left[0]["key"], "bad-0001");
    // Dropped for good: nothing is left to replay by mistake once its
    // record expires.
    let (code, out, err) = dlq(&[
        "drop",
        "--from",
        &from,
        "--completed",
        "--store",
        &store_url,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("dropped 1 dead letter"), "{out}");
    assert!(err.contains("dead letter dropped"), "logged: {err}");
    let (_, out, _) = dlq(&["ls", "--from", &from, "--json"]);
    assert_eq!(out.lines().count(), 0, "{out}");
    let (code, _, err) = dlq(&all);
    assert_eq!(code, 3, "nothing matched: {err}");
    let (code, _, err) = dlq(&[
        "replay",
        "--from",
        &from,
        "--id",
        "no-such-id",
        "--store",
        &store_url,
    ]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no dead letter no-such-id"), "{err}");

    let sidecar = start(&args(&broker, &to, &store_url, &["--concurrency", "64"])).await;
    wait_for(
        "the replayed messages",
        Duration::from_secs(120),
        async || sink.applied() == DEAD - 1,
    )
    .await;
    wait_for("a drained broker", Duration::from_secs(30), async || {
        broker.drained().await
    })
    .await;
    assert_eq!(sidecar.terminate().await, 0);
    for id in &ids {
        let calls = sink.calls_for(id);
        if id == "bad-0001" {
            assert_eq!(calls.len(), 1, "the completed key is not run again");
            continue;
        }
        assert_eq!(
            calls.len(),
            2,
            "{id}: refused once, then handled once: {calls:?}"
        );
        assert_eq!(calls[1].attempt, 1, "{id}: a whole attempt budget again");
    }
}

/// A key another holder works on is retried once its lease has run out,
/// not dropped and not spun on; then handled once.
pub async fn busy_keys_are_retried_later(broker: impl Broker) {
    let Some((store, store_url)) = store().await else {
        return;
    };
    let sink = Sink::default();
    let to = sink.serve().await;
    let key = Key::new(&broker.name(), "held-a").unwrap();
    let lease = broker.busy_lease();
    let Begin::Acquired(_) = store.begin(&key, None, Lease::new(lease)).await.unwrap() else {
        panic!("a fresh key")
    };
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = start(&args(
        &broker,
        &to,
        &store_url,
        &["--metrics-listen", &metrics],
    ))
    .await;
    let started = Instant::now();
    broker.publish(&messages(["held-a".into()])).await;
    wait_for(
        "the held key's effect",
        Duration::from_secs(30),
        async || sink.applied() == 1,
    )
    .await;
    assert!(
        started.elapsed() >= lease.saturating_sub(Duration::from_millis(500)),
        "waited for the lease"
    );
    assert_eq!(sink.calls_for("held-a").len(), 1);
    let text = super::get(&format!("http://{metrics}/metrics")).await;
    let busy: f64 = String::from_utf8_lossy(&text.body)
        .lines()
        .filter(|l| l.starts_with("idem_consumer_messages_total") && l.contains("retried_busy"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        (1.0..=3.0).contains(&busy),
        "retried a few times, not spun on: {busy}"
    );
    wait_for("a drained broker", Duration::from_secs(30), async || {
        broker.drained().await
    })
    .await;
    assert_eq!(sidecar.terminate().await, 0);
}

/// With slow handlers and messages waiting, `--metrics-listen` exports
/// the broker's count of them as `idem_consumer_lag{namespace}`.
pub async fn lag_counts_waiting_messages(broker: impl Broker) {
    let Some((_store, store_url)) = store().await else {
        return;
    };
    let sink = Sink::default();
    let to = sink.serve().await;
    broker
        .publish(&messages((0..40).map(|i| format!("slow-{i:02}"))))
        .await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = start(&args(
        &broker,
        &to,
        &store_url,
        &["--metrics-listen", &metrics, "--concurrency", "1"],
    ))
    .await;
    let series = format!("idem_consumer_lag{{namespace=\"{}\"}}", broker.name());
    let mut seen = 0.0;
    let mut last = String::new();
    let deadline = Instant::now() + Duration::from_secs(40);
    while seen < 10.0 {
        assert!(
            Instant::now() < deadline,
            "no lag of 10 or more in:\n{last}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let text = super::get(&format!("http://{metrics}/metrics")).await;
        last = String::from_utf8_lossy(&text.body).into_owned();
        seen = last
            .lines()
            .find(|l| l.starts_with(&series))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    assert!(seen <= 40.0, "at most what was published: {seen}");
    // The status page shows the same lag.
    let status = super::get(&format!("http://{metrics}/status.json"))
        .await
        .json();
    let lags = status["consumer"]["lag"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        lags.iter()
            .any(|l| l["namespace"] == broker.name() && l["lag"].as_f64() > Some(0.0)),
        "{status}"
    );
    assert_eq!(sidecar.terminate().await, 0);
}

/// SIGTERM while a handler works: it finishes, the message is acked, the
/// sidecar exits 0.
pub async fn sigterm_finishes_work_in_flight(broker: impl Broker) {
    let Some((_store, store_url)) = store().await else {
        return;
    };
    let sink = Sink::default();
    let to = sink.serve().await;
    let sidecar = start(&args(&broker, &to, &store_url, &[])).await;
    broker.publish(&messages(["slow-a".into()])).await;
    wait_for(
        "the slow handler to start",
        Duration::from_secs(30),
        async || sink.started("slow-a") == 1,
    )
    .await;
    let stopped = Instant::now();
    assert_eq!(sidecar.terminate().await, 0);
    assert!(
        stopped.elapsed() >= Duration::from_millis(1000),
        "it waited for the handler"
    );
    assert_eq!(sink.applied(), 1);
    assert!(broker.drained().await, "the finished message was acked");
}

/// A sidecar killed after its effects but before it committed them
/// (`never_commit` is its source URL, set to hold its commits): the
/// next sidecar gets every message again from the last commit, and acks
/// each as a duplicate without calling the handler. The replay is counted
/// (the `duplicate` outcome of its metrics): it is real; the double effect
/// is not.
pub async fn killed_before_commit_replays_as_duplicates(broker: impl Broker, never_commit: &str) {
    let Some((_store, store_url)) = store().await else {
        return;
    };
    let sink = Sink::default();
    let to = sink.serve().await;
    let total = 200;
    broker
        .publish(&messages((0..total).map(|i| format!("r-{i}"))))
        .await;
    let first =
        start(&["--from", never_commit, "--to", &to, "--store", &store_url].map(String::from))
            .await;
    wait_for("every effect", Duration::from_secs(60), async || {
        sink.applied() == total
    })
    .await;
    // Let the last completions reach the store; the commit never comes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    first.kill().await;
    assert!(
        !broker.drained().await,
        "nothing was committed before the kill"
    );

    let metrics = format!("127.0.0.1:{}", free_port());
    let second = start(&args(
        &broker,
        &to,
        &store_url,
        &["--metrics-listen", &metrics],
    ))
    .await;
    wait_for("a drained broker", Duration::from_secs(60), async || {
        broker.drained().await
    })
    .await;
    let text = super::get(&format!("http://{metrics}/metrics")).await;
    let count = |outcome: &str| -> f64 {
        String::from_utf8_lossy(&text.body)
            .lines()
            .filter(|l| {
                l.starts_with("idem_consumer_messages_total")
                    && l.contains(&format!("outcome=\"{outcome}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(
        count("duplicate"),
        total as f64,
        "every message came again, and was a duplicate"
    );
    assert_eq!(count("handled"), 0.0);
    assert_eq!(sink.calls().len(), total, "no effect twice");
    assert_eq!(second.terminate().await, 0);
}

/// How `idem consume` reads its handler's answers (`--timeout-ms 1000`,
/// `--max-attempts 2`):
/// - a 200 whose body comes 2.5 s after its head counts as done: one call,
///   acked, not retried;
/// - a 422 with a multi-line problem body (CR, LF and RocketMQ's property
///   separators in it) is dead-lettered with a one-line `idem-last-error`,
///   and the sidecar goes on;
/// - a 401 pauses consumption without using attempts: GET /ready answers
///   503 meanwhile, the message is handled once the handler takes it, with
///   `Idem-Attempt: 1`, and nothing else is dead-lettered.
pub async fn handler_answers(broker: impl Broker) {
    let Some((_store, store_url)) = store().await else {
        return;
    };
    let sink = Sink::default();
    let to = sink.serve().await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = start(&args(
        &broker,
        &to,
        &store_url,
        &[
            "--timeout-ms",
            "1000",
            "--max-attempts",
            "2",
            "--metrics-listen",
            &metrics,
        ],
    ))
    .await;
    broker
        .publish(&messages([
            "late-a".into(),
            "problem-b".into(),
            "auth-c".into(),
        ]))
        .await;
    let ready = format!("http://{metrics}/ready");
    let mut paused_seen = false;
    wait_for(
        "the handler's answers",
        Duration::from_secs(60),
        async || {
            if super::get(&ready).await.status == 503 {
                paused_seen = true;
            }
            sink.applied() == 2 && broker.dead_letters().await.len() == 1
        },
    )
    .await;
    assert!(paused_seen, "GET /ready answered 503 while paused");
    wait_for("a drained broker", Duration::from_secs(30), async || {
        broker.drained().await
    })
    .await;
    assert_eq!(super::get(&ready).await.status, 200, "ready again");
    assert_eq!(sidecar.terminate().await, 0);

    assert_eq!(
        sink.calls_for("late-a").len(),
        1,
        "a 2xx head is the effect, whenever its body comes"
    );
    let auth = sink.calls_for("auth-c");
    assert!(auth.len() >= 2, "{auth:?}");
    assert!(
        auth.iter().all(|c| c.attempt == 1),
        "refusals as unauthorized use no attempt: {auth:?}"
    );
    let dead = broker.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let (headers, _) = &dead[0];
    assert_eq!(headers["idem-key"], "problem-b");
    let last_error = &headers["idem-last-error"];
    assert!(last_error.contains("422"), "{headers:?}");
    assert!(
        !last_error.chars().any(char::is_control),
        "one line, no separators: {last_error:?}"
    );
    assert!(
        !headers.contains_key("keys"),
        "no injected property: {headers:?}"
    );
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `--batch 8`: 60 plain messages and one of each behaviour, through the
/// batch endpoint with a lease of 1 s. Batches of several messages reach
/// the handler; each message is settled by its own result: `fail2-` is
/// retried no sooner than its `retry_after_ms` and then done, `always-` is
/// dead-lettered after its attempts, `bad-` at once with its reason,
/// `auth-` pauses without using attempts; what the answer leaves out
/// (`short-`), a body that is not JSON (`notjson-`) and a 503 for the
/// whole batch (`down-`) settle nothing and are retried; a batch slower
/// than the lease (`slow-`) keeps every claim. Every key's work is told
/// done exactly once, by its last call; copies published afterwards never
/// reach the handler.
pub async fn batches(broker: impl Broker) {
    let Some((_store, store_url)) = store().await else {
        return;
    };
    let sink = Sink::default();
    let to = sink.serve().await.replace("/handle", "/batch");
    let plain: Vec<String> = (0..60).map(|i| format!("ok-{i:03}")).collect();
    // The behaviours of one item first; those of a whole batch (each
    // costs every item of its batch an attempt) in a second round, so that
    // no message meets more than the three attempts it has.
    let special = [
        "fail2-a", "always-b", "bad-c", "short-d", "auth-g", "slow-h",
    ];
    let whole = ["notjson-e", "down-f"];
    let sidecar = start(&args(
        &broker,
        &to,
        &store_url,
        &[
            "--batch",
            "8",
            "--batch-linger-ms",
            "20",
            "--max-attempts",
            "3",
            "--default-lease-ms",
            "1000",
        ],
    ))
    .await;
    let mut first: Vec<String> = special.iter().map(|s| s.to_string()).collect();
    first.extend(plain[..40].iter().cloned());
    broker.publish(&messages(first.clone())).await;
    wait_for("the first round", Duration::from_secs(90), async || {
        sink.applied() == first.len() - 2 && broker.dead_letters().await.len() == 2
    })
    .await;
    let mut second: Vec<String> = whole.iter().map(|s| s.to_string()).collect();
    second.extend(plain[40..].iter().cloned());
    broker.publish(&messages(second.clone())).await;
    let all: Vec<String> = first.iter().chain(&second).cloned().collect();
    wait_for("the second round", Duration::from_secs(90), async || {
        sink.applied() == all.len() - 2
    })
    .await;
    wait_for("a drained broker", Duration::from_secs(30), async || {
        broker.drained().await
    })
    .await;
    let calls_before = sink.calls().len();
    broker.publish(&messages(plain[..10].to_vec())).await;
    wait_for("the copies acked", Duration::from_secs(30), async || {
        broker.drained().await
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sidecar.terminate().await, 0);
    assert_eq!(
        sink.calls().len(),
        calls_before,
        "copies of completed messages reached the handler"
    );

    let batches = sink.batches();
    let largest = batches.iter().map(Vec::len).max().unwrap();
    assert!(
        largest > 1 && largest <= 8,
        "batches of up to 8: {batches:?}"
    );
    // Every key's work is told done once, by its last call; a call that
    // was not told done (left out, garbage, a failure) is followed by
    // another, with a larger token.
    for key in &all {
        let calls = sink.calls_for(key);
        let done: Vec<_> = calls.iter().filter(|c| c.done).collect();
        let dead = key.starts_with("always-") || key.starts_with("bad-");
        assert_eq!(done.len(), usize::from(!dead), "{key}: {calls:?}");
        if !dead {
            assert!(calls.last().unwrap().done, "{key}: {calls:?}");
        }
        for pair in calls.windows(2) {
            assert!(pair[0].token < pair[1].token, "{key}: {calls:?}");
        }
    }
    let flaky = sink.calls_for("fail2-a");
    assert_eq!(
        flaky.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    for pair in flaky.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(
            gap >= Duration::from_millis(150),
            "retried {gap:?} after the answer asked for 150 ms"
        );
    }
    assert_eq!(sink.calls_for("always-b").len(), 3);
    assert_eq!(sink.calls_for("bad-c").len(), 1, "a 422 is not retried");
    assert_eq!(
        sink.calls_for("short-d").len(),
        2,
        "left out, then answered"
    );
    // Every batch reached the sink's work for each of its items, but the
    // one answered 503 as a whole.
    let down_at = batches
        .iter()
        .position(|b| b.iter().any(|k| k.starts_with("down-")))
        .unwrap();
    let down = &batches[down_at];
    for key in &all {
        let sent = batches.iter().filter(|b| b.contains(key)).count();
        assert_eq!(
            sink.calls_for(key).len(),
            sent - usize::from(down.contains(key)),
            "{key} went out in {sent} batches"
        );
    }
    let auth = sink.calls_for("auth-g");
    assert!(
        auth.len() >= 2 && auth.iter().all(|c| c.attempt == 1),
        "refusals as unauthorized use no attempt: {auth:?}"
    );
    assert_eq!(
        sink.calls_for("slow-h").len(),
        1,
        "a batch slower than the lease keeps its claims"
    );
    // The items of the batch answered with garbage (the first with
    // `notjson-` that was not refused whole) were all called again.
    let garbage = batches
        .iter()
        .enumerate()
        .find(|(i, b)| *i != down_at && b.iter().any(|k| k.starts_with("notjson-")))
        .unwrap()
        .1;
    for key in garbage {
        assert!(sink.calls_for(key).len() >= 2, "{key} in {garbage:?}");
    }
    let dead = broker.dead_letters().await;
    let find = |key: &str| dead_letter(&dead, key);
    let (headers, _) = find("always-b");
    assert_eq!(headers["idem-attempts"], "3");
    assert!(headers["idem-last-error"].contains("500"), "{headers:?}");
    let (headers, body) = find("bad-c");
    assert_eq!(headers["idem-attempts"], "1");
    let last_error = &headers["idem-last-error"];
    assert!(
        last_error.contains("422") && last_error.contains("out of stock"),
        "{headers:?}"
    );
    assert!(
        !last_error.chars().any(char::is_control) && !headers.contains_key("keys"),
        "one line, no injected property: {headers:?}"
    );
    assert_eq!(body, br#"{"id":"bad-c"}"#);
}
