//! The handler `idem consume` runs: a POST to the user's HTTP endpoint.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_consumer::copy::header_text;
use idem_consumer::{Handler, HandlerError, Message};
use idem_core::ClaimHandle;
use idem_http::gateway::ReleasePolicy;
use serde_json::json;

use super::batch::Batcher;
use crate::run::error_chain;

/// POSTs each message to `to` and reads the answer (docs/contract.md §7:
/// the handler gets the key and the fencing token, so it can refuse a
/// second effect itself).
///
/// - 2xx: success; the status and body become the stored outcome. The
///   effect happened once the head has arrived: the body gets a bound of
///   its own, and a body that never completes is stored as omitted;
/// - a status in [`Statuses::pause`] (401, 403, 404, 405, 407 by
///   default): the handler is misconfigured, consumption pauses
///   ([`HandlerError::pause`]);
/// - a status in [`Statuses::dead_letter`] (the other 4xx by default): a
///   permanent failure, dead-lettered at once;
/// - any other status (408, 409, 423, 425, 429, 5xx by default), no head
///   within the timeout, a refused connection: a transient failure, retried
///   with backoff, no sooner than `Retry-After` (seconds or an HTTP date,
///   capped).
///
/// With `--batch` ([`super::batch`]) several messages go in one request and
/// each is settled by its own item of the answer, by the same rules.
pub struct HttpHandler {
    endpoint: Arc<Endpoint>,
    /// With `--batch`: gathers the calls into batches.
    batcher: Option<Batcher>,
}

/// The handler's endpoint and how its answers are read; shared by single
/// calls and batches.
pub struct Endpoint {
    client: Client<HttpConnector, Full<Bytes>>,
    pub(super) to: Uri,
    /// `to` with its credentials hidden (`?token=***`), for what failures
    /// say: a log line, a dead letter's `idem-last-error`.
    pub(super) shown_to: String,
    /// How long the answer's head may take, and then its body.
    timeout: Duration,
    /// Largest answer body kept in the outcome; a larger one is recorded
    /// by its size only.
    pub(super) max_body: usize,
    pub(super) statuses: Statuses,
    /// The longest `Retry-After` honoured.
    max_retry_after: Duration,
}

/// Which handler statuses pause consumption and which dead-letter, written
/// as the gateway writes status lists (`401,403,404-405`, `none`).
#[derive(Clone, Debug)]
pub struct Statuses {
    /// Statuses that say the handler is misconfigured.
    pub pause: ReleasePolicy,
    /// Statuses that say the message can never succeed.
    pub dead_letter: ReleasePolicy,
}

/// `--pause-status` by default.
pub const DEFAULT_PAUSE_STATUS: &str = "401,403-405,407";
/// `--dead-letter-status` by default: every 4xx that neither pauses nor
/// says "try again later" (408, 409, 423, 425, 429).
pub const DEFAULT_DEAD_LETTER_STATUS: &str = "400,402,406,410-422,424,426-428,430-499";

impl Default for Statuses {
    fn default() -> Self {
        Self {
            pause: DEFAULT_PAUSE_STATUS.parse().expect("a valid list"),
            dead_letter: DEFAULT_DEAD_LETTER_STATUS.parse().expect("a valid list"),
        }
    }
}

/// What a handler's status calls for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Done,
    Pause,
    DeadLetter,
    Retry,
}

impl Statuses {
    pub(super) fn verdict(&self, status: StatusCode) -> Verdict {
        // `ReleasePolicy::releases` reads as "is in the list" here.
        if status.is_success() {
            Verdict::Done
        } else if self.pause.releases(status) {
            Verdict::Pause
        } else if self.dead_letter.releases(status) {
            Verdict::DeadLetter
        } else {
            Verdict::Retry
        }
    }
}

/// With `--batch`: how many messages go in one request, and how long the
/// first waits for the others.
#[derive(Clone, Copy, Debug)]
pub struct BatchSettings {
    pub size: usize,
    pub linger: Duration,
}

impl HttpHandler {
    pub fn new(endpoint: Endpoint, batch: Option<BatchSettings>) -> Self {
        let endpoint = Arc::new(endpoint);
        let batcher = batch.map(|b| Batcher::start(endpoint.clone(), b.size, b.linger));
        Self { endpoint, batcher }
    }
}

impl Endpoint {
    pub fn new(
        to: Uri,
        timeout: Duration,
        max_body: usize,
        statuses: Statuses,
        max_retry_after: Duration,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Self {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
            shown_to: idem_core::text::redacted_url(&to.to_string()),
            to,
            timeout,
            max_body,
            statuses,
            max_retry_after,
        }
    }

    fn request(&self, message: &Message, claim: &ClaimHandle) -> Request<Full<Bytes>> {
        let mut builder = Request::post(self.to.clone());
        let headers = builder.headers_mut().expect("a fresh builder has headers");
        let content_type = message
            .content_type
            .as_deref()
            .and_then(|t| HeaderValue::from_str(t).ok())
            .unwrap_or(HeaderValue::from_static("application/octet-stream"));
        headers.insert(header::CONTENT_TYPE, content_type);
        if let Some(key) = message
            .key
            .as_ref()
            .and_then(|k| HeaderValue::from_bytes(k).ok())
        {
            headers.insert("idempotency-key", key);
        }
        if let Some(token) = claim.token() {
            headers.insert("idem-fencing-token", HeaderValue::from(token.get()));
        }
        headers.insert("idem-attempt", HeaderValue::from(message.attempt.max(1)));
        for (name, value) in &message.headers {
            let http_name = HeaderName::try_from(format!("idem-header-{name}"));
            match (http_name, HeaderValue::from_bytes(value)) {
                (Ok(http_name), Ok(value)) => {
                    headers.append(http_name, value);
                }
                _ => tracing::debug!(
                    header = %header_text(name),
                    "a broker header that is not a valid HTTP header was left out"
                ),
            }
        }
        builder
            .body(Full::new(message.body.clone()))
            .expect("the parts are valid")
    }

    /// Sends `request`: the answer's head within the timeout, then its
    /// body within `limit` bytes and a timeout of its own (`Err` in the
    /// body says why it is missing); `Err` when no head came.
    pub(super) async fn exchange(
        &self,
        request: Request<Full<Bytes>>,
        limit: usize,
    ) -> Result<(http::response::Parts, Result<Bytes, String>), String> {
        let response = match tokio::time::timeout(self.timeout, self.client.request(request)).await
        {
            Err(_) => {
                return Err(format!(
                    "{} did not answer within {} ms",
                    self.shown_to,
                    self.timeout.as_millis()
                ));
            }
            Ok(Err(e)) => {
                return Err(format!(
                    "cannot reach {}: {}",
                    self.shown_to,
                    error_chain(&e)
                ));
            }
            Ok(Ok(response)) => response,
        };
        let (parts, body) = response.into_parts();
        let body =
            match tokio::time::timeout(self.timeout, Limited::new(body, limit).collect()).await {
                Err(_) => Err(format!(
                    "the body did not arrive within {} ms",
                    self.timeout.as_millis()
                )),
                Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                    Err("larger than the outcome limit".to_owned())
                }
                Ok(Err(e)) => Err(format!("the body broke off: {}", error_chain(e.as_ref()))),
                Ok(Ok(b)) => Ok(b.to_bytes()),
            };
        Ok((parts, body))
    }

    /// The failure a status that is not a success calls for, waiting no
    /// less than `after` (capped) before a retry.
    pub(super) fn failure(
        &self,
        verdict: Verdict,
        why: String,
        after: Option<Duration>,
    ) -> HandlerError {
        match verdict {
            Verdict::Pause => HandlerError::pause(why),
            Verdict::DeadLetter => HandlerError::permanent(why),
            Verdict::Retry | Verdict::Done => {
                let mut e = HandlerError::transient(why);
                if let Some(after) = after {
                    e = e.retry_after(after.min(self.max_retry_after));
                }
                e
            }
        }
    }

    /// One message, one request.
    async fn single(&self, message: Message, claim: ClaimHandle) -> Result<Bytes, HandlerError> {
        let request = self.request(&message, &claim);
        // The timeout covers the head: once a 2xx head is here, the effect
        // has happened, whatever becomes of the body.
        let (parts, body) = self
            .exchange(request, self.max_body)
            .await
            .map_err(HandlerError::transient)?;
        let status = parts.status;
        let verdict = self.statuses.verdict(status);
        if verdict == Verdict::Done {
            if let Err(why) = &body
                && why.starts_with("the body")
            {
                tracing::warn!(to = %self.shown_to, status = status.as_u16(), reason = %why, "the handler succeeded; its answer's body is stored as omitted");
            }
            return Ok(outcome(status, &parts.headers, body));
        }
        let why = format!(
            "{} answered {status}: {}",
            self.shown_to,
            failure_text(body)
        );
        let after = retry_after(&parts.headers, SystemTime::now());
        Err(self.failure(verdict, why, after))
    }
}

impl Handler for HttpHandler {
    async fn handle(&self, message: Message, claim: ClaimHandle) -> Result<Bytes, HandlerError> {
        match &self.batcher {
            Some(batcher) => {
                let token = claim.token().map(|t| t.get());
                batcher.call(message, token).await
            }
            None => self.endpoint.single(message, claim).await,
        }
    }
}

/// What a failed answer's body says, for the error: its first 200 bytes as
/// text, trimmed (empty when it did not arrive).
pub(super) fn failure_text(body: Result<Bytes, String>) -> String {
    body.ok()
        .map(|b| {
            String::from_utf8_lossy(&b[..b.len().min(200)])
                .trim()
                .to_owned()
        })
        .unwrap_or_default()
}

/// `Retry-After` in seconds or as an HTTP date (a date in the past is no
/// wait).
pub(super) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

/// The stored outcome: `{"status": 200, "body": …}`, the body as JSON when
/// the answer is JSON, as text when it is UTF-8, in base64 otherwise; a body
/// over the size limit, or one that did not arrive, is recorded as omitted
/// with the reason.
fn outcome(status: StatusCode, headers: &HeaderMap, body: Result<Bytes, String>) -> Bytes {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let value = match body {
        Err(why) => json!({ "status": status.as_u16(), "body_omitted": why }),
        Ok(b) if b.is_empty() => json!({ "status": status.as_u16() }),
        Ok(b) => {
            let parsed = content_type
                .filter(|t| t.contains("json"))
                .and_then(|_| serde_json::from_slice::<serde_json::Value>(&b).ok());
            match (parsed, std::str::from_utf8(&b)) {
                (Some(v), _) => json!({ "status": status.as_u16(), "body": v }),
                (None, Ok(text)) => json!({ "status": status.as_u16(), "body": text }),
                (None, Err(_)) => {
                    use base64::Engine;
                    let encoded = base64::engine::general_purpose::STANDARD.encode(&b);
                    json!({ "status": status.as_u16(), "body_base64": encoded })
                }
            }
        }
    };
    Bytes::from(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_done_pause_retry_or_dead_letter() {
        let statuses = Statuses::default();
        let verdict = |s: u16| statuses.verdict(StatusCode::from_u16(s).unwrap());
        for s in [200, 201, 204] {
            assert_eq!(verdict(s), Verdict::Done, "{s}");
        }
        for s in [401, 403, 404, 405, 407] {
            assert_eq!(verdict(s), Verdict::Pause, "{s}");
        }
        for s in [408, 409, 423, 425, 429, 500, 502, 503, 301] {
            assert_eq!(verdict(s), Verdict::Retry, "{s}");
        }
        for s in [400, 402, 406, 410, 413, 422, 424, 426, 499] {
            assert_eq!(verdict(s), Verdict::DeadLetter, "{s}");
        }
        let chosen = Statuses {
            pause: "none".parse().unwrap(),
            dead_letter: "400-499".parse().unwrap(),
        };
        assert_eq!(
            chosen.verdict(StatusCode::UNAUTHORIZED),
            Verdict::DeadLetter
        );
    }

    #[test]
    fn outcomes_keep_the_status_and_the_body() {
        let mut json_headers = HeaderMap::new();
        json_headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let o = outcome(
            StatusCode::CREATED,
            &json_headers,
            Ok(Bytes::from_static(b"{\"id\":7}")),
        );
        assert_eq!(o, r#"{"body":{"id":7},"status":201}"#);
        let o = outcome(
            StatusCode::OK,
            &HeaderMap::new(),
            Ok(Bytes::from_static(b"ok")),
        );
        assert_eq!(o, r#"{"body":"ok","status":200}"#);
        let o = outcome(
            StatusCode::OK,
            &HeaderMap::new(),
            Ok(Bytes::from_static(&[0xff, 0])),
        );
        assert_eq!(o, r#"{"body_base64":"/wA=","status":200}"#);
        let o = outcome(
            StatusCode::OK,
            &HeaderMap::new(),
            Err("the body did not arrive within 1000 ms".into()),
        );
        assert_eq!(
            o,
            r#"{"body_omitted":"the body did not arrive within 1000 ms","status":200}"#
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(3)));
        h.insert(
            header::RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:30:00 GMT"),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(120)));
        h.insert(
            header::RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:00:00 GMT"),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::ZERO));
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h, now), None);
    }
}
