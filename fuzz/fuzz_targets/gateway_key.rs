//! The `Idempotency-Key` header through the gateway's public tower layer:
//! any header bytes, any client identity, any body. Nothing may panic; a
//! key the gateway's rules accept (1 to `max_key_bytes` visible ASCII
//! characters, optionally quoted) reaches the upstream or a replay, and
//! any other is refused with 400 and a problem body.
#![no_main]

use std::convert::Infallible;
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::MemoryStore;
use idem_fuzz::runtime;
use idem_http::gateway::{GatewayBody, GatewayConfig, IDEMPOTENCY_KEY, IdempotencyLayer};
use libfuzzer_sys::fuzz_target;
use tower::{Layer, ServiceExt, service_fn};

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    patch: bool,
    keys: Vec<&'a [u8]>,
    authorization: Option<&'a [u8]>,
    body: &'a [u8],
    status: u16,
}

fn layer() -> &'static IdempotencyLayer<MemoryStore> {
    static LAYER: OnceLock<IdempotencyLayer<MemoryStore>> = OnceLock::new();
    LAYER.get_or_init(|| {
        let config = GatewayConfig {
            max_key_bytes: 40,
            max_request_bytes: 1024,
            ..GatewayConfig::default()
        };
        IdempotencyLayer::new(MemoryStore::new(), config)
    })
}

/// What the gateway's rules accept, written independently of its code.
fn acceptable(raw: &[u8], max: usize) -> bool {
    let trimmed = raw.trim_ascii();
    let inner = match trimmed {
        [b'"', inner @ .., b'"'] => inner,
        other => other,
    };
    !inner.is_empty() && inner.len() <= max && inner.iter().all(u8::is_ascii_graphic)
}

fuzz_target!(|input: Input<'_>| {
    let method = if input.patch {
        Method::PATCH
    } else {
        Method::POST
    };
    let mut req = Request::builder().method(method).uri("/pay");
    for key in &input.keys {
        let Ok(value) = HeaderValue::from_bytes(key) else {
            return;
        };
        req = req.header(IDEMPOTENCY_KEY, value);
    }
    if let Some(auth) = input.authorization {
        let Ok(value) = HeaderValue::from_bytes(auth) else {
            return;
        };
        req = req.header(http::header::AUTHORIZATION, value);
    }
    let req = req
        .body(Full::new(Bytes::copy_from_slice(input.body)))
        .expect("a request");
    // The gateway reads the first value of the header.
    let first = input.keys.first();
    let upstream_status = StatusCode::from_u16(200 + input.status % 300).unwrap_or(StatusCode::OK);
    let upstream = service_fn(move |req: Request<GatewayBody>| async move {
        let body = req
            .into_body()
            .collect()
            .await
            .expect("the body")
            .to_bytes();
        Ok::<_, Infallible>(
            Response::builder()
                .status(upstream_status)
                .body(Full::new(body))
                .expect("a response"),
        )
    });
    let service = layer().layer(upstream);
    runtime().block_on(async move {
        let response = service.oneshot(req).await.expect("infallible");
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        let content_type = response.headers().get(http::header::CONTENT_TYPE).cloned();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("a body")
            .to_bytes();
        match first {
            Some(raw) if !acceptable(raw, 40) => {
                assert_eq!(status, StatusCode::BAD_REQUEST, "key {raw:?}");
                assert_eq!(
                    content_type.as_ref().map(HeaderValue::as_bytes),
                    Some(&b"application/problem+json"[..])
                );
                let problem: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
                assert_eq!(
                    problem["type"],
                    "urn:idem:problem:malformed-idempotency-key"
                );
            }
            _ => {
                assert!(
                    status == upstream_status
                        || replayed
                        || status == StatusCode::CONFLICT
                        || status == StatusCode::UNPROCESSABLE_ENTITY
                        || status == StatusCode::PAYLOAD_TOO_LARGE,
                    "key {first:?} got {status}: {}",
                    String::from_utf8_lossy(&body)
                );
            }
        }
    });
    // Let released or stored keys settle before the next input.
    runtime().block_on(layer().wait_detached());
});
