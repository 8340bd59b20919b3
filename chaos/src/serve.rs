//! The service run: HTTP clients of `idem serve`'s API (`begin`, the
//! effect, `complete`) that time out, cut their connections mid-request and
//! retry; optionally `idem serve` killed and restarted mid-run on its store.
//!
//! Each key's client begins; with a token it applies the effect (counted
//! per key, with the token) and completes with the outcome
//! `{"effect":N,"token":T}`, retrying a cut `complete` with the same token;
//! a `completed` answer ends the key with the stored outcome, `in_progress`
//! waits its `retry_after_ms`. Checked: every key ends; one effect a key
//! unless a kill fell while the claim was open; tokens increasing per key;
//! and every outcome a client ended with is the first effect's.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use parking_lot::Mutex;

use crate::fault::Fault;
use crate::gateway::{Server, client::Client};
use crate::judge::{HttpEffect, Outcome};
use crate::spec::{Spec, at};
use crate::store::{Store, free_port};

/// Effects per key, in the order applied.
type Effects = HashMap<String, Vec<HttpEffect>>;

/// The outcomes each key's client ended with.
type Answers = HashMap<String, Vec<String>>;

/// Runs the service scenario of `spec` (fault `client-cuts` or
/// `serve-kill`) with the `idem` binary at `idem`.
pub async fn run(spec: &Spec, idem: &Path) -> Result<Outcome, String> {
    let dir = tempfile::Builder::new()
        .prefix("idem-chaos-")
        .tempdir()
        .map_err(|e| format!("a temporary directory: {e}"))?;
    let name = format!("chaos_serve_{}", std::process::id());
    at("starting the store");
    let store = Store::start(spec.store, &name, dir.path(), false).await?;
    let port = free_port()?;
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--log".into(),
        "warn".into(),
    ];
    args.extend(store.args.iter().cloned());
    at("starting idem serve");
    let mut server = Server::start(idem, args, port).await?;
    at("sending the requests");

    let start = Instant::now();
    let client = Client::new(port);
    let keys: Vec<String> = (0..spec.messages).map(|i| format!("s-{i}")).collect();
    let effects: Arc<Mutex<Effects>> = Arc::default();
    let answers: Arc<Mutex<Answers>> = Arc::default();
    let sent = Arc::new(AtomicU64::new(0));
    let cuts = Arc::new(AtomicU64::new(0));
    let deadline = start + spec.deadline;
    let lease_ms = spec.lease.as_millis() as u64;
    let clients = {
        let (keys, effects, answers, sent, cuts) = (
            keys.clone(),
            effects.clone(),
            answers.clone(),
            sent.clone(),
            cuts.clone(),
        );
        tokio::spawn(async move {
            futures_util::stream::iter(keys.into_iter().enumerate())
                .for_each_concurrent(32, |(i, key)| {
                    let calls = Calls {
                        client: &client,
                        sent: &sent,
                        cuts: &cuts,
                        // A third of the keys have their first begin and
                        // their first complete cut at 1 ms.
                        cut_first: i % 3 == 0,
                    };
                    let (effects, answers) = (&effects, &answers);
                    async move {
                        if let Some(outcome) =
                            one_key(&calls, &key, lease_ms, deadline, start, effects).await
                        {
                            answers.lock().entry(key).or_default().push(outcome);
                        }
                    }
                })
                .await;
        })
    };

    let mut kills: Vec<Duration> = Vec::new();
    if spec.fault == Fault::ServeKill {
        for _ in 0..spec.times {
            tokio::time::sleep(Duration::from_millis(400)).await;
            kills.push(start.elapsed());
            at("killing and restarting idem serve");
            server.kill_and_restart(port).await?;
            at("sending the requests");
        }
    }
    let _ = clients.await;
    let elapsed = start.elapsed();
    at("stopping idem serve and the store");
    server.stop().await;
    store.stop().await;
    at("judging the history");

    let effects = std::mem::take(&mut *effects.lock());
    let answers = std::mem::take(&mut *answers.lock());
    Ok(crate::gateway::judge_http(
        spec, keys, elapsed, sent, cuts, effects, answers, kills,
    ))
}

/// A client's request settings for one key.
struct Calls<'a> {
    client: &'a Client,
    sent: &'a AtomicU64,
    cuts: &'a AtomicU64,
    cut_first: bool,
}

impl Calls<'_> {
    /// POSTs `body` to `path`, cut at 1 ms when `cut` (before the request
    /// is out or while the server works on it: `idem serve` answers in
    /// about a millisecond); answers the status and the body, or `None` for
    /// a cut or failed connection.
    async fn post(&self, path: &str, body: String, cut: bool) -> Option<(u16, serde_json::Value)> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        let limit = if cut {
            Duration::from_millis(1)
        } else {
            Duration::from_secs(5)
        };
        match tokio::time::timeout(limit, self.client.post_json(path, body)).await {
            Err(_) => {
                self.cuts.fetch_add(1, Ordering::Relaxed);
                None
            }
            Ok(Err(_)) => None,
            Ok(Ok((status, text))) => Some((status, serde_json::from_str(&text).ok()?)),
        }
    }
}

/// One key's client, to its end: the outcome it was answered.
async fn one_key(
    calls: &Calls<'_>,
    key: &str,
    lease_ms: u64,
    deadline: Instant,
    start: Instant,
    effects: &Mutex<Effects>,
) -> Option<String> {
    let mut first_begin = true;
    let mut first_complete = true;
    while Instant::now() < deadline {
        let begin = format!(r#"{{"key":"{key}","lease_ms":{lease_ms}}}"#);
        let begun = start.elapsed();
        let cut = calls.cut_first && std::mem::take(&mut first_begin);
        let Some((200, answer)) = calls.post("/v1/chaos/begin", begin, cut).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        match answer["status"].as_str() {
            Some("completed") => return Some(answer["outcome"].to_string()),
            Some("in_progress") => {
                let wait = answer["retry_after_ms"].as_u64().unwrap_or(100).min(500);
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            Some("acquired") => {
                let token = answer["token"].as_u64()?;
                let (outcome, n) = {
                    let mut effects = effects.lock();
                    let applied = effects.entry(key.to_owned()).or_default();
                    applied.push(HttpEffect {
                        begun,
                        applied: start.elapsed(),
                        token: Some(token),
                        stored: None,
                    });
                    let n = applied.len();
                    (format!(r#"{{"effect":{n},"token":{token}}}"#), n - 1)
                };
                // The same token's `complete` again until it lands or is
                // stale (the lease ran out: begin again).
                while Instant::now() < deadline {
                    let complete =
                        format!(r#"{{"key":"{key}","token":{token},"outcome":{outcome}}}"#);
                    let cut = calls.cut_first && std::mem::take(&mut first_complete);
                    match calls.post("/v1/chaos/complete", complete, cut).await {
                        Some((200, _)) => {
                            if let Some(e) = effects
                                .lock()
                                .get_mut(key)
                                .and_then(|applied| applied.get_mut(n))
                            {
                                e.stored.get_or_insert(start.elapsed());
                            }
                            return Some(outcome);
                        }
                        Some((409, _)) => break,
                        _ => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    None
}
