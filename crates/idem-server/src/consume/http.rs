//! The handler `idem consume` runs: a POST to the user's HTTP endpoint.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_consumer::{Handler, HandlerError, Message};
use idem_core::ClaimHandle;
use serde_json::json;

/// POSTs each message to `to` and reads the answer (docs/contract.md §7:
/// the handler gets the key and the fencing token, so it can refuse a
/// second effect itself).
///
/// - 2xx: success; the status and body become the stored outcome;
/// - 408, 409, 423, 425, 429, 5xx, a timeout, a refused connection: a
///   transient failure, retried with backoff, no sooner than `Retry-After`
///   (seconds) when the answer has one;
/// - any other status: a permanent failure, dead-lettered at once.
pub struct HttpHandler {
    client: Client<HttpConnector, Full<Bytes>>,
    to: Uri,
    timeout: Duration,
    /// Largest answer body kept in the outcome; a larger one is recorded
    /// by its size only.
    max_body: usize,
}

impl HttpHandler {
    pub fn new(to: Uri, timeout: Duration, max_body: usize) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Self {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
            to,
            timeout,
            max_body,
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
                    header = %name,
                    "a broker header that is not a valid HTTP header was left out"
                ),
            }
        }
        builder
            .body(Full::new(message.body.clone()))
            .expect("the parts are valid")
    }
}

impl Handler for HttpHandler {
    async fn handle(&self, message: Message, claim: ClaimHandle) -> Result<Bytes, HandlerError> {
        let request = self.request(&message, &claim);
        let answer = tokio::time::timeout(self.timeout, async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, self.max_body).collect().await;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((parts, body.map(|b| b.to_bytes())))
        })
        .await;
        let (parts, body) = match answer {
            Err(_) => {
                return Err(HandlerError::transient(format!(
                    "{} did not answer within {} ms",
                    self.to,
                    self.timeout.as_millis()
                )));
            }
            Ok(Err(e)) => {
                return Err(HandlerError::transient(format!(
                    "cannot reach {}: {}",
                    self.to,
                    error_chain(e.as_ref())
                )));
            }
            Ok(Ok(answer)) => answer,
        };
        let status = parts.status;
        if status.is_success() {
            return Ok(outcome(status, &parts.headers, body.ok()));
        }
        let text = body
            .ok()
            .map(|b| String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned())
            .unwrap_or_default();
        let why = format!("{} answered {status}: {}", self.to, text.trim());
        if is_transient(status) {
            let mut e = HandlerError::transient(why);
            if let Some(after) = retry_after(&parts.headers) {
                e = e.retry_after(after);
            }
            Err(e)
        } else {
            Err(HandlerError::permanent(why))
        }
    }
}

fn is_transient(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 409 | 423 | 425 | 429) || status.is_server_error()
}

/// `Retry-After` in seconds (the HTTP-date form is not read).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// The stored outcome: `{"status": 200, "body": …}`, the body as JSON when
/// the answer is JSON, as text when it is UTF-8, in base64 otherwise; a body
/// over the size limit is recorded by its size only.
fn outcome(status: StatusCode, headers: &HeaderMap, body: Option<Bytes>) -> Bytes {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let value = match body {
        None => {
            json!({ "status": status.as_u16(), "body_omitted": "larger than the outcome limit" })
        }
        Some(b) if b.is_empty() => json!({ "status": status.as_u16() }),
        Some(b) => {
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

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_retry_or_dead_letter() {
        for s in [408, 409, 423, 425, 429, 500, 502, 503] {
            assert!(is_transient(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [400, 401, 403, 404, 410, 413, 422, 301] {
            assert!(!is_transient(StatusCode::from_u16(s).unwrap()), "{s}");
        }
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
            Some(Bytes::from_static(b"{\"id\":7}")),
        );
        assert_eq!(o, r#"{"body":{"id":7},"status":201}"#);
        let o = outcome(
            StatusCode::OK,
            &HeaderMap::new(),
            Some(Bytes::from_static(b"ok")),
        );
        assert_eq!(o, r#"{"body":"ok","status":200}"#);
        let o = outcome(
            StatusCode::OK,
            &HeaderMap::new(),
            Some(Bytes::from_static(&[0xff, 0])),
        );
        assert_eq!(o, r#"{"body_base64":"/wA=","status":200}"#);
        let o = outcome(StatusCode::NO_CONTENT, &HeaderMap::new(), None);
        assert!(o.starts_with(b"{\"body_omitted\""));
    }

    #[test]
    fn retry_after_reads_seconds() {
        let mut h = HeaderMap::new();
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert(
            header::RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), None);
    }
}
