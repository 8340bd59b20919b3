//! A response as the gateway stores it, and its codec.
//!
//! `[version 2][status u16 BE][flags][fields: headers][fields: trailers]
//! [body]`, where fields are `[count u16 BE] { [name length u16 BE][name]
//! [value length u16 BE][value] }*`; version 1 has no trailers. Flag 1: the
//! body was too large to store and is omitted.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use idem_core::Codec;

/// What the gateway replays.
#[derive(Clone, Debug)]
pub struct StoredResponse {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
    /// Sent after the body (gRPC's `grpc-status`).
    pub trailers: Vec<(HeaderName, HeaderValue)>,
    /// The body was too large to store: the response cannot be replayed.
    pub body_omitted: bool,
}

/// Headers never stored: hop-by-hop, per-response, and cookies (a replay
/// must not hand out a session). `Trailer` is kept: HTTP/1 sends only the
/// trailers it names.
pub fn is_stored(name: &HeaderName) -> bool {
    !matches!(
        *name,
        header::CONNECTION
            | header::TRANSFER_ENCODING
            | header::TE
            | header::UPGRADE
            | header::PROXY_AUTHENTICATE
            | header::PROXY_AUTHORIZATION
            | header::CONTENT_LENGTH
            | header::DATE
            | header::SET_COOKIE
    ) && name.as_str() != "keep-alive"
}

fn fields(map: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    map.iter()
        .filter(|(n, _)| is_stored(n))
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect()
}

impl StoredResponse {
    pub fn from_parts(
        status: StatusCode,
        headers: &HeaderMap,
        body: Bytes,
        trailers: Option<&HeaderMap>,
    ) -> Self {
        Self {
            status,
            headers: fields(headers),
            body,
            trailers: trailers.map(fields).unwrap_or_default(),
            body_omitted: false,
        }
    }

    /// Status and headers only: the body was too large to store.
    pub fn omitted(status: StatusCode, headers: &HeaderMap) -> Self {
        Self {
            body_omitted: true,
            ..Self::from_parts(status, headers, Bytes::new(), None)
        }
    }
}

const VERSION: u8 = 2;
const BODY_OMITTED: u8 = 1;

/// Encodes responses for the guard, leaving out a body that would take the
/// record over `max_bytes`.
pub struct ResponseCodec {
    pub max_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
#[error("stored response is malformed: {0}")]
pub struct Malformed(&'static str);

impl Codec<StoredResponse> for ResponseCodec {
    type Error = Malformed;

    fn encode(&self, r: &StoredResponse) -> Result<Bytes, Malformed> {
        let mut out = BytesMut::new();
        out.put_u8(VERSION);
        out.put_u16(r.status.as_u16());
        let flags_at = out.len();
        out.put_u8(0);
        put_fields(&mut out, &r.headers);
        put_fields(&mut out, &r.trailers);
        if out.len() + r.body.len() <= self.max_bytes && !r.body_omitted {
            out.put_slice(&r.body);
        } else {
            out[flags_at] = BODY_OMITTED;
        }
        Ok(out.freeze())
    }

    fn decode(&self, stored: Option<&[u8]>) -> Result<StoredResponse, Malformed> {
        let mut b = stored.ok_or(Malformed("no outcome was stored"))?;
        need(b, 4)?;
        let version = b.get_u8();
        if !(1..=VERSION).contains(&version) {
            return Err(Malformed("unknown version"));
        }
        let status = StatusCode::from_u16(b.get_u16()).map_err(|_| Malformed("bad status"))?;
        let flags = b.get_u8();
        let headers = get_fields(&mut b)?;
        let trailers = match version {
            1 => Vec::new(),
            _ => get_fields(&mut b)?,
        };
        Ok(StoredResponse {
            status,
            headers,
            body: Bytes::copy_from_slice(b),
            trailers,
            body_omitted: flags & BODY_OMITTED != 0,
        })
    }
}

fn need(b: &[u8], n: usize) -> Result<(), Malformed> {
    if b.len() >= n {
        Ok(())
    } else {
        Err(Malformed("cut short"))
    }
}

fn put_fields(out: &mut BytesMut, fields: &[(HeaderName, HeaderValue)]) {
    let fields: Vec<_> = fields
        .iter()
        .filter(|(n, v)| {
            n.as_str().len() <= usize::from(u16::MAX) && v.len() <= usize::from(u16::MAX)
        })
        .take(usize::from(u16::MAX))
        .collect();
    out.put_u16(fields.len() as u16);
    for (name, value) in fields {
        out.put_u16(name.as_str().len() as u16);
        out.put_slice(name.as_str().as_bytes());
        out.put_u16(value.len() as u16);
        out.put_slice(value.as_bytes());
    }
}

fn get_fields(b: &mut &[u8]) -> Result<Vec<(HeaderName, HeaderValue)>, Malformed> {
    need(b, 2)?;
    let count = b.get_u16();
    let mut fields = Vec::with_capacity(count.into());
    for _ in 0..count {
        need(b, 2)?;
        let n = usize::from(b.get_u16());
        need(b, n + 2)?;
        let name = HeaderName::from_bytes(&b[..n]).map_err(|_| Malformed("bad header name"))?;
        b.advance(n);
        let v = usize::from(b.get_u16());
        need(b, v)?;
        let value = HeaderValue::from_bytes(&b[..v]).map_err(|_| Malformed("bad header value"))?;
        b.advance(v);
        fields.push((name, value));
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(codec: &ResponseCodec, r: &StoredResponse) -> Bytes {
        Codec::<StoredResponse>::encode(codec, r).unwrap()
    }

    fn decode(codec: &ResponseCodec, b: &[u8]) -> Result<StoredResponse, Malformed> {
        codec.decode(Some(b))
    }

    #[test]
    fn responses_round_trip_and_large_bodies_are_left_out() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            header::SET_COOKIE,
            HeaderValue::from_static("session=secret"),
        );
        headers.insert("x-request-id", HeaderValue::from_static("r-1"));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let r = StoredResponse::from_parts(
            StatusCode::CREATED,
            &headers,
            Bytes::from_static(b"{\"id\":1}"),
            Some(&trailers),
        );
        let codec = ResponseCodec { max_bytes: 1024 };
        let back = decode(&codec, &encode(&codec, &r)).unwrap();
        assert_eq!(back.status, StatusCode::CREATED);
        assert_eq!(back.body, r.body);
        assert!(!back.body_omitted);
        assert_eq!(back.headers.len(), 2, "set-cookie is not stored");
        assert_eq!(back.trailers, r.trailers);
        // A record written before trailers were stored still reads.
        let v1 = [1, 0, 200, 0, 0, 1, 0, 1, b'a', 0, 1, b'b', b'!'];
        let old = decode(&codec, &v1).unwrap();
        assert_eq!((old.headers.len(), &old.body[..]), (1, &b"!"[..]));
        assert!(old.trailers.is_empty());
        let small = ResponseCodec { max_bytes: 40 };
        let cut = decode(&small, &encode(&small, &r)).unwrap();
        assert!(cut.body_omitted && cut.body.is_empty());
        assert!(decode(&codec, &[1, 0]).is_err());
    }
}
