//! The guarded upstream call: forward, then read the response into what is
//! stored, or stream it when it is too large to store.

use std::convert::Infallible;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, Request, Response, header};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, BodyStream, Full, StreamBody};
use idem_core::{BoxError, Codec};
use tower::{Service, ServiceExt};

use super::stored::{Malformed, ResponseCodec, StoredResponse};
use super::{GatewayBody, IDEMPOTENT_REPLAYED, ReleasePolicy, UpstreamDeadline};

/// What a guarded call produced: what a replay gets, and — when the body
/// was too large to store — the whole body for the first caller.
pub(super) struct Forwarded {
    pub stored: StoredResponse,
    pub streamed: Option<GatewayBody>,
}

/// Why a guarded call did not produce a response to store; each releases
/// the key.
pub(super) enum Forward<E> {
    /// The upstream's status is one the policy releases: passed on.
    Released(Response<GatewayBody>),
    /// The inner service failed: error passed on.
    Inner(E),
    /// The upstream's body failed mid-way: 502.
    Body(BoxError),
    /// The call took longer than the gateway's `upstream_timeout`: 504.
    TimedOut(std::time::Duration),
}

impl Codec<Forwarded> for ResponseCodec {
    type Error = Malformed;

    fn encode(&self, f: &Forwarded) -> Result<Bytes, Malformed> {
        <Self as Codec<StoredResponse>>::encode(self, &f.stored)
    }

    fn decode(&self, stored: Option<&[u8]>) -> Result<Forwarded, Malformed> {
        Ok(Forwarded {
            stored: <Self as Codec<StoredResponse>>::decode(self, stored)?,
            streamed: None,
        })
    }
}

/// Forwards `request` and reads the answer: up to `max_body` bytes of body
/// are kept with the trailers for replay; past that the response is marked
/// not replayable and its body streams on to the first caller.
pub(super) async fn call<I, ResB>(
    inner: I,
    request: Request<GatewayBody>,
    release: &ReleasePolicy,
    max_body: usize,
) -> Result<Forwarded, Forward<I::Error>>
where
    I: Service<Request<GatewayBody>, Response = Response<ResB>>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let response = inner.oneshot(request).await.map_err(Forward::Inner)?;
    let response = response.map(GatewayBody::new);
    if release.releases(response.status()) {
        return Err(Forward::Released(response));
    }
    let (parts, mut body) = response.into_parts();
    let mut data = BytesMut::new();
    let mut trailers: Option<HeaderMap> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Forward::Body)?;
        let frame = match frame.into_data() {
            Ok(chunk) if data.len() + chunk.len() > max_body => {
                let read = [data.freeze(), chunk].map(|d| Ok(Frame::data(d)));
                let rest = futures_util::stream::iter(read).chain(BodyStream::new(body));
                return Ok(Forwarded {
                    stored: StoredResponse::omitted(parts.status, &parts.headers),
                    streamed: Some(GatewayBody::new(StreamBody::new(rest))),
                });
            }
            Ok(chunk) => {
                data.extend_from_slice(&chunk);
                continue;
            }
            Err(frame) => frame,
        };
        if let Ok(t) = frame.into_trailers() {
            trailers.get_or_insert_default().extend(t);
        }
    }
    Ok(Forwarded {
        stored: StoredResponse::from_parts(
            parts.status,
            &parts.headers,
            data.freeze(),
            trailers.as_ref(),
        ),
        streamed: None,
    })
}

/// `call`, dropped (the upstream connection with it) at `deadline`, when
/// there is one: [`Forward::TimedOut`] with its `limit`.
pub(super) async fn call_within<E>(
    deadline: Option<UpstreamDeadline>,
    call: impl Future<Output = Result<Forwarded, Forward<E>>>,
) -> Result<Forwarded, Forward<E>> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d.at, call)
            .await
            .unwrap_or(Err(Forward::TimedOut(d.limit))),
        None => call.await,
    }
}

/// The response for a stored answer: to the first caller, or replayed.
pub(super) fn reply(forwarded: Forwarded, replayed: bool) -> Response<GatewayBody> {
    let Forwarded { stored, streamed } = forwarded;
    let mut response = Response::new(match streamed {
        Some(body) => body,
        None => replay_body(stored.body, &stored.trailers),
    });
    *response.status_mut() = stored.status;
    let headers = response.headers_mut();
    for (name, value) in stored.headers {
        headers.append(name, value);
    }
    if !stored.trailers.is_empty() && !headers.contains_key(header::TRAILER) {
        // HTTP/1 sends only the trailers this header announces.
        let names: Vec<&str> = stored.trailers.iter().map(|(n, _)| n.as_str()).collect();
        if let Ok(v) = HeaderValue::from_str(&names.join(", ")) {
            headers.insert(header::TRAILER, v);
        }
    }
    if replayed {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

fn replay_body(body: Bytes, trailers: &[(http::HeaderName, HeaderValue)]) -> GatewayBody {
    if trailers.is_empty() {
        return GatewayBody::new(Full::new(body));
    }
    let mut map = HeaderMap::new();
    for (name, value) in trailers {
        map.append(name, value.clone());
    }
    let frames = [Frame::data(body), Frame::trailers(map)].map(Ok::<_, Infallible>);
    GatewayBody::new(StreamBody::new(futures_util::stream::iter(frames)))
}
