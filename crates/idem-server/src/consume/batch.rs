//! `--batch N`: the handler gets up to N claimed messages in one POST and
//! settles each by its own status (docs/consume.md, "Batches").
//!
//! The runner claims, guards and settles every message on its own, exactly
//! as without batches: each message's handler call hands its message to the
//! [`Batcher`] and waits for its own item's answer. The batcher gathers the
//! calls that arrive within the linger (a fetched batch arrives at once) and
//! POSTs them together. So the lease of every item is kept alive by its own
//! watchdog while the batch is out, a duplicate found in the store never
//! reaches the handler, and each item is completed, retried, dead-lettered
//! or paused by its own status.
//!
//! An answer settles an item only when it names the item's key once with a
//! valid status: an item it leaves out, names twice or answers with
//! something unreadable is a transient failure (retried, never a success).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode, header};
use http_body_util::Full;
use idem_consumer::{HandlerError, Message};
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::http::{Endpoint, Verdict, failure_text, retry_after};

/// The largest `--batch`.
pub const MAX_BATCH: usize = 1000;
/// The longest `--batch-linger-ms`.
pub const MAX_BATCH_LINGER: Duration = Duration::from_secs(1);
/// The largest answer body read for a batch, whatever its size: the
/// per-item outcome limit times the batch, capped here.
const MAX_BATCH_ANSWER: usize = 64 << 20;

/// One message waiting for its place in a batch.
struct Item {
    message: Message,
    token: Option<u64>,
    answer: oneshot::Sender<Result<Bytes, HandlerError>>,
}

/// Gathers handler calls into batches; one per `idem consume`.
pub struct Batcher {
    queue: mpsc::UnboundedSender<Item>,
}

impl Batcher {
    /// Starts the gathering task: batches of at most `size` calls, each
    /// sent once it is full or `linger` after its first call came.
    pub fn start(endpoint: Arc<Endpoint>, size: usize, linger: Duration) -> Self {
        let (queue, calls) = mpsc::unbounded_channel();
        tokio::spawn(gather(calls, endpoint, size, linger));
        Self { queue }
    }

    /// Sends `message` in the next batch and waits for its item's answer.
    ///
    /// # Cancel safety
    ///
    /// Dropped before its batch is sent, the message is left out of it;
    /// dropped after, the batch goes on for the other items and this
    /// item's answer is discarded (its claim is then the runner's to
    /// release, as for a handler call dropped mid-way).
    pub async fn call(&self, message: Message, token: Option<u64>) -> Result<Bytes, HandlerError> {
        let (answer, answered) = oneshot::channel();
        let item = Item {
            message,
            token,
            answer,
        };
        if self.queue.send(item).is_err() {
            return Err(HandlerError::transient(
                "the batching task has stopped; the message is retried",
            ));
        }
        answered.await.unwrap_or_else(|_| {
            Err(HandlerError::transient(
                "the batch this message was in was abandoned; the message is retried",
            ))
        })
    }
}

/// Takes calls off `calls` into batches and sends each on a task of its
/// own, so that a slow batch never holds the next one back.
async fn gather(
    mut calls: mpsc::UnboundedReceiver<Item>,
    endpoint: Arc<Endpoint>,
    size: usize,
    linger: Duration,
) {
    while let Some(first) = calls.recv().await {
        let mut items = vec![first];
        let until = Instant::now() + linger;
        while items.len() < size {
            if let Ok(item) = calls.try_recv() {
                items.push(item);
                continue;
            }
            tokio::select! {
                item = calls.recv() => match item {
                    Some(item) => items.push(item),
                    None => break,
                },
                () = tokio::time::sleep_until(until) => break,
            }
        }
        // A call dropped while it waited is not sent.
        items.retain(|item| !item.answer.is_closed());
        if items.is_empty() {
            continue;
        }
        let endpoint = endpoint.clone();
        tokio::spawn(async move { send(&endpoint, items).await });
    }
}

/// POSTs `items` as one batch and answers each.
async fn send(endpoint: &Endpoint, items: Vec<Item>) {
    let body = request_body(&items);
    let mut builder = Request::post(endpoint.to.clone());
    let headers = builder.headers_mut().expect("a fresh builder has headers");
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert("idem-batch", HeaderValue::from(items.len()));
    let request = builder.body(Full::new(body)).expect("the parts are valid");
    let limit = endpoint
        .max_body
        .saturating_mul(items.len())
        .saturating_add(64 * 1024)
        .min(MAX_BATCH_ANSWER);
    let answers = match endpoint.exchange(request, limit).await {
        Err(why) => Answers::All(HandlerError::transient(why)),
        Ok((parts, body)) => {
            let verdict = endpoint.statuses.verdict(parts.status);
            if verdict == Verdict::Done {
                match body {
                    Ok(body) => settle(endpoint, &items, &body),
                    Err(why) => Answers::All(HandlerError::transient(format!(
                        "{} answered {} to a batch but its body is missing ({why}): \
                         no item is settled",
                        endpoint.shown_to, parts.status
                    ))),
                }
            } else {
                let why = format!(
                    "{} answered {} to the whole batch: {}",
                    endpoint.shown_to,
                    parts.status,
                    failure_text(body)
                );
                let after = retry_after(&parts.headers, SystemTime::now());
                Answers::All(endpoint.failure(verdict, why, after))
            }
        }
    };
    match answers {
        Answers::All(failure) => {
            for item in items {
                let _ = item.answer.send(Err(copy_of(&failure)));
            }
        }
        Answers::Each(answers) => {
            for (item, answer) in items.into_iter().zip(answers) {
                let _ = item.answer.send(answer);
            }
        }
    }
}

/// What a batch's answer says.
enum Answers {
    /// One failure for every item.
    All(HandlerError),
    /// One answer per item, in the items' order.
    Each(Vec<Result<Bytes, HandlerError>>),
}

/// A copy of `failure`, for each item of a batch it applies to.
fn copy_of(failure: &HandlerError) -> HandlerError {
    let text = failure.to_string();
    let mut copy = if failure.is_pause() {
        HandlerError::pause(text)
    } else if failure.is_permanent() {
        HandlerError::permanent(text)
    } else {
        HandlerError::transient(text)
    };
    if let Some(after) = failure.requested_delay() {
        copy = copy.retry_after(after);
    }
    copy
}

/// The request: a JSON array, one object per message with the fields a
/// single message carries in its headers.
fn request_body(items: &[Item]) -> Bytes {
    let array: Vec<Value> = items.iter().map(item_json).collect();
    Bytes::from(serde_json::to_vec(&array).expect("JSON values serialise"))
}

fn item_json(item: &Item) -> Value {
    let message = &item.message;
    let mut object = Map::new();
    object.insert("key".into(), key_text(message).into());
    if let Some(token) = item.token {
        object.insert("token".into(), token.into());
    }
    object.insert("attempt".into(), message.attempt.max(1).into());
    let content_type = message
        .content_type
        .as_deref()
        .unwrap_or("application/octet-stream");
    object.insert("content_type".into(), content_type.into());
    let mut headers = Map::new();
    for (name, value) in &message.headers {
        // The first of a repeated name, as `Message::header` reads it; a
        // value that is not text is left out, as a single message leaves
        // out a value that is not a valid HTTP header.
        if let Ok(text) = std::str::from_utf8(value)
            && !headers.contains_key(name)
        {
            headers.insert(name.clone(), text.into());
        }
    }
    object.insert("headers".into(), Value::Object(headers));
    let body = &message.body;
    let parsed = content_type
        .contains("json")
        .then(|| serde_json::from_slice::<Value>(body).ok())
        .flatten();
    match (parsed, std::str::from_utf8(body)) {
        (Some(v), _) => object.insert("body".into(), v),
        (None, Ok(text)) => object.insert("body".into(), text.into()),
        (None, Err(_)) => {
            use base64::Engine;
            let encoded = base64::engine::general_purpose::STANDARD.encode(body);
            object.insert("body_base64".into(), encoded.into())
        }
    };
    Value::Object(object)
}

fn key_text(message: &Message) -> String {
    message
        .key
        .as_ref()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .unwrap_or_default()
}

/// Reads a 2xx answer's per-item results. Anything that does not settle an
/// item clearly is a transient failure of that item.
fn settle(endpoint: &Endpoint, items: &[Item], body: &[u8]) -> Answers {
    let shown = &endpoint.shown_to;
    let results = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(mut o)) => match o.remove("results") {
            Some(Value::Array(results)) => results,
            _ => {
                return Answers::All(HandlerError::transient(format!(
                    "{shown} answered a batch without a `results` array: no item is settled"
                )));
            }
        },
        _ => {
            return Answers::All(HandlerError::transient(format!(
                "{shown} answered a batch with a body that is not a JSON object \
                 {{\"results\":[…]}}: no item is settled"
            )));
        }
    };
    // Each key the batch holds, and how often the answer names it.
    let mut by_key: HashMap<String, (usize, u32)> = HashMap::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        by_key
            .entry(key_text(&item.message))
            .and_modify(|(_, n)| *n += 1)
            .or_insert((i, 1));
    }
    let mut answers: Vec<Option<Result<Bytes, HandlerError>>> =
        items.iter().map(|_| None).collect();
    let mut named = vec![0u32; items.len()];
    for result in &results {
        let Some(key) = result.get("key").and_then(Value::as_str) else {
            continue;
        };
        let Some(&(i, holders)) = by_key.get(key) else {
            tracing::debug!(to = %shown, "a batch answer named a key the batch did not hold");
            continue;
        };
        named[i] += 1;
        if holders > 1 {
            continue;
        }
        answers[i] = Some(item_answer(endpoint, result));
    }
    Answers::Each(
        answers
            .into_iter()
            .zip(named)
            .map(|(answer, named)| match (answer, named) {
                (Some(answer), 1) => answer,
                (_, 0) => Err(HandlerError::transient(format!(
                    "{shown} answered the batch without a result for this message"
                ))),
                _ => Err(HandlerError::transient(format!(
                    "{shown} answered the batch with {named} results for this message's key"
                ))),
            })
            .collect(),
    )
}

/// One item's result: `{"key", "status", "outcome"?, "retry_after_ms"?,
/// "error"?}`.
fn item_answer(endpoint: &Endpoint, result: &Value) -> Result<Bytes, HandlerError> {
    let shown = &endpoint.shown_to;
    let Some(status) = result
        .get("status")
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
    else {
        return Err(HandlerError::transient(format!(
            "{shown} answered this message without a valid `status` (a number from 100 to 999)"
        )));
    };
    let verdict = endpoint.statuses.verdict(status);
    if verdict == Verdict::Done {
        let value = match result.get("outcome") {
            None | Some(Value::Null) => json!({ "status": status.as_u16() }),
            Some(outcome) => json!({ "status": status.as_u16(), "body": outcome }),
        };
        let mut stored = serde_json::to_vec(&value).expect("JSON values serialise");
        if stored.len() > endpoint.max_body {
            stored = serde_json::to_vec(
                &json!({ "status": status.as_u16(), "body_omitted": "larger than the outcome limit" }),
            )
            .expect("JSON values serialise");
        }
        return Ok(Bytes::from(stored));
    }
    let text = match result.get("error").or_else(|| result.get("outcome")) {
        Some(Value::String(s)) => s.clone(),
        Some(v) if !v.is_null() => v.to_string(),
        _ => String::new(),
    };
    let text: String = text.chars().take(200).collect();
    let why = format!(
        "{shown} answered {status} for this message: {}",
        text.trim()
    );
    let after = result
        .get("retry_after_ms")
        .and_then(Value::as_u64)
        .map(Duration::from_millis);
    Err(endpoint.failure(verdict, why, after))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consume::http::Statuses;

    fn endpoint() -> Endpoint {
        Endpoint::new(
            "http://127.0.0.1:1/h".parse().unwrap(),
            Duration::from_secs(1),
            200,
            Statuses::default(),
            Duration::from_secs(60),
        )
    }

    fn items(keys: &[&str]) -> Vec<Item> {
        keys.iter()
            .map(|k| {
                let mut message = Message::new(format!("{{\"k\":\"{k}\"}}"));
                message.key = Some(Bytes::from(k.to_string()));
                message.content_type = Some("application/json".into());
                Item {
                    message,
                    token: Some(7),
                    answer: oneshot::channel().0,
                }
            })
            .collect()
    }

    /// A failure as the tests read it: its text, whether it is permanent,
    /// whether it pauses, and the delay it asks for.
    type Failure = (String, bool, bool, Option<Duration>);

    fn each(answers: Answers) -> Vec<Result<String, Failure>> {
        let Answers::Each(answers) = answers else {
            panic!("expected one answer per item");
        };
        answers
            .into_iter()
            .map(|a| {
                a.map(|b| String::from_utf8(b.to_vec()).unwrap())
                    .map_err(|e| {
                        (
                            e.to_string(),
                            e.is_permanent(),
                            e.is_pause(),
                            e.requested_delay(),
                        )
                    })
            })
            .collect()
    }

    #[test]
    fn each_item_is_settled_by_its_own_status() {
        let e = endpoint();
        let body = br#"{"results":[
            {"key":"c","status":503,"retry_after_ms":250,"error":"busy"},
            {"key":"a","status":200,"outcome":{"id":1}},
            {"key":"b","status":422,"error":"out of stock"},
            {"key":"d","status":401},
            {"key":"e","status":201}
        ]}"#;
        let got = each(settle(&e, &items(&["a", "b", "c", "d", "e"]), body));
        assert_eq!(got[0], Ok(r#"{"body":{"id":1},"status":200}"#.into()));
        let (why, permanent, pause, _) = got[1].clone().unwrap_err();
        assert!(permanent && !pause && why.contains("422") && why.contains("out of stock"));
        let (why, permanent, pause, after) = got[2].clone().unwrap_err();
        assert!(!permanent && !pause && why.contains("busy"), "{why}");
        assert_eq!(after, Some(Duration::from_millis(250)));
        let (_, permanent, pause, _) = got[3].clone().unwrap_err();
        assert!(pause && !permanent);
        assert_eq!(got[4], Ok(r#"{"status":201}"#.into()));
    }

    #[test]
    fn what_an_answer_does_not_settle_clearly_fails() {
        let e = endpoint();
        // `b` left out, `c` named twice, `d` without a status, `e` with a
        // status out of range, a key the batch did not hold.
        let body = br#"{"results":[
            {"key":"a","status":200},
            {"key":"c","status":200},
            {"key":"c","status":500},
            {"key":"d"},
            {"key":"e","status":42},
            {"key":"zz","status":200},
            "junk"
        ]}"#;
        let got = each(settle(&e, &items(&["a", "b", "c", "d", "e"]), body));
        assert_eq!(got[0], Ok(r#"{"status":200}"#.into()));
        for (i, part) in [
            (1, "without a result"),
            (2, "2 results"),
            (3, "valid `status`"),
            (4, "valid `status`"),
        ] {
            let (why, permanent, pause, _) = got[i].clone().unwrap_err();
            assert!(!permanent && !pause && why.contains(part), "{i}: {why}");
        }
    }

    #[test]
    fn a_body_that_is_not_a_results_object_settles_nothing() {
        let e = endpoint();
        for body in [
            &b"ok"[..],
            b"[]",
            br#"{"result":[]}"#,
            br#"{"results":{}}"#,
            b"",
        ] {
            match settle(&e, &items(&["a", "b"]), body) {
                Answers::All(e) => assert!(!e.is_permanent() && !e.is_pause(), "{e}"),
                _ => panic!("{:?} settled something", String::from_utf8_lossy(body)),
            }
        }
    }

    #[test]
    fn an_outcome_over_the_limit_is_stored_as_omitted() {
        let e = endpoint();
        let big = "x".repeat(500);
        let body = format!(r#"{{"results":[{{"key":"a","status":200,"outcome":"{big}"}}]}}"#);
        let got = each(settle(&e, &items(&["a"]), body.as_bytes()));
        assert_eq!(
            got[0],
            Ok(r#"{"body_omitted":"larger than the outcome limit","status":200}"#.into())
        );
    }

    #[test]
    fn items_carry_what_a_single_message_carries() {
        let mut list = items(&["a"]);
        list[0].message.attempt = 3;
        list[0].message.headers = vec![
            ("trace".into(), Bytes::from_static(b"t-1")),
            ("trace".into(), Bytes::from_static(b"t-2")),
            ("raw".into(), Bytes::from_static(&[0xff])),
        ];
        let mut binary = items(&["b"]).remove(0);
        binary.message.content_type = None;
        binary.message.body = Bytes::from_static(&[0, 0xff]);
        binary.token = None;
        list.push(binary);
        let sent: Value = serde_json::from_slice(&request_body(&list)).unwrap();
        assert_eq!(
            sent,
            json!([
                {"key":"a","token":7,"attempt":3,"content_type":"application/json",
                 "headers":{"trace":"t-1"},"body":{"k":"a"}},
                {"key":"b","attempt":1,"content_type":"application/octet-stream",
                 "headers":{},"body_base64":"AP8="}
            ])
        );
    }

    /// A handler that records each batch's keys and answers every item 200.
    async fn recording() -> (Arc<Endpoint>, Arc<parking_lot::Mutex<Vec<Vec<String>>>>) {
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to = format!("http://{}/", listener.local_addr().unwrap());
        let log = seen.clone();
        let app = axum::Router::new().route(
            "/",
            axum::routing::post(move |body: Bytes| {
                let items: Vec<Value> = serde_json::from_slice(&body).unwrap();
                let keys: Vec<String> = items
                    .iter()
                    .map(|i| i["key"].as_str().unwrap().to_owned())
                    .collect();
                let results: Vec<Value> = keys
                    .iter()
                    .map(|k| json!({"key": k, "status": 200, "outcome": k}))
                    .collect();
                log.lock().push(keys);
                std::future::ready(axum::Json(json!({ "results": results })))
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        let endpoint = Endpoint::new(
            to.parse().unwrap(),
            Duration::from_secs(5),
            1024,
            Statuses::default(),
            Duration::from_secs(60),
        );
        (Arc::new(endpoint), seen)
    }

    fn message(key: &str) -> Message {
        let mut message = Message::new("x");
        message.key = Some(Bytes::from(key.to_owned()));
        message
    }

    #[tokio::test]
    async fn calls_are_gathered_up_to_the_size_and_each_gets_its_own_answer() {
        let (endpoint, seen) = recording().await;
        let batcher = Batcher::start(endpoint, 3, Duration::from_millis(50));
        let calls = (0..7).map(|i| batcher.call(message(&format!("k{i}")), Some(1)));
        let answers = futures_util::future::join_all(calls).await;
        for (i, answer) in answers.into_iter().enumerate() {
            let outcome = String::from_utf8(answer.unwrap().to_vec()).unwrap();
            assert_eq!(outcome, format!(r#"{{"body":"k{i}","status":200}}"#));
        }
        let mut sizes: Vec<usize> = seen.lock().iter().map(Vec::len).collect();
        sizes.sort_unstable();
        assert_eq!(sizes, [1, 3, 3]);
    }

    #[tokio::test]
    async fn a_call_dropped_while_it_waits_for_its_batch_is_not_sent() {
        let (endpoint, seen) = recording().await;
        let batcher = Batcher::start(endpoint, 10, Duration::from_millis(200));
        let kept = batcher.call(message("kept"), Some(1));
        let dropped = batcher.call(message("dropped"), Some(1));
        // Both are queued; then one caller leaves before the linger ends.
        let gave_up = tokio::time::timeout(Duration::from_millis(20), async {
            tokio::join!(kept, dropped)
        });
        assert!(gave_up.await.is_err());
        let kept = batcher.call(message("again"), Some(1)).await;
        assert!(kept.is_ok());
        // The first two were both dropped by the timeout; only the third
        // went out, alone.
        assert_eq!(*seen.lock(), [vec!["again".to_owned()]]);
    }
}
