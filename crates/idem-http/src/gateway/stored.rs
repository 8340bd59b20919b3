//! A response as the gateway stores it, and its codec.
//!
//! `[version 1][status u16 BE][flags][header count u16 BE]
//! { [name length u16 BE][name][value length u16 BE][value] }* [body]`;
//! flag 1: the body was too large to store and is omitted.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use idem_core::Codec;

/// What the gateway replays.
#[derive(Clone, Debug)]
pub struct StoredResponse {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
    /// Set on replays whose body was too large to store.
    pub body_omitted: bool,
}

/// Headers never stored: hop-by-hop, per-response, and cookies (a replay
/// must not hand out a session).
pub fn is_stored(name: &HeaderName) -> bool {
    !matches!(
        *name,
        header::CONNECTION
            | header::TRANSFER_ENCODING
            | header::TE
            | header::TRAILER
            | header::UPGRADE
            | header::PROXY_AUTHENTICATE
            | header::PROXY_AUTHORIZATION
            | header::CONTENT_LENGTH
            | header::DATE
            | header::SET_COOKIE
    ) && name.as_str() != "keep-alive"
}

impl StoredResponse {
    pub fn from_parts(status: StatusCode, headers: &HeaderMap, body: Bytes) -> Self {
        Self {
            status,
            headers: headers
                .iter()
                .filter(|(n, _)| is_stored(n))
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect(),
            body,
            body_omitted: false,
        }
    }
}

const VERSION: u8 = 1;
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
        let headers: Vec<_> = r
            .headers
            .iter()
            .filter(|(n, v)| {
                n.as_str().len() <= usize::from(u16::MAX) && v.len() <= usize::from(u16::MAX)
            })
            .take(usize::from(u16::MAX))
            .collect();
        out.put_u16(headers.len() as u16);
        for (name, value) in headers {
            out.put_u16(name.as_str().len() as u16);
            out.put_slice(name.as_str().as_bytes());
            out.put_u16(value.len() as u16);
            out.put_slice(value.as_bytes());
        }
        if out.len() + r.body.len() <= self.max_bytes && !r.body_omitted {
            out.put_slice(&r.body);
        } else {
            out[flags_at] = BODY_OMITTED;
        }
        Ok(out.freeze())
    }

    fn decode(&self, stored: Option<&[u8]>) -> Result<StoredResponse, Malformed> {
        let mut b = stored.ok_or(Malformed("no outcome was stored"))?;
        let need = |b: &[u8], n: usize| {
            if b.len() >= n {
                Ok(())
            } else {
                Err(Malformed("cut short"))
            }
        };
        need(b, 6)?;
        if b.get_u8() != VERSION {
            return Err(Malformed("unknown version"));
        }
        let status = StatusCode::from_u16(b.get_u16()).map_err(|_| Malformed("bad status"))?;
        let flags = b.get_u8();
        let count = b.get_u16();
        let mut headers = Vec::with_capacity(count.into());
        for _ in 0..count {
            need(b, 2)?;
            let n = usize::from(b.get_u16());
            need(b, n + 2)?;
            let name = HeaderName::from_bytes(&b[..n]).map_err(|_| Malformed("bad header name"))?;
            b.advance(n);
            let v = usize::from(b.get_u16());
            need(b, v)?;
            let value =
                HeaderValue::from_bytes(&b[..v]).map_err(|_| Malformed("bad header value"))?;
            b.advance(v);
            headers.push((name, value));
        }
        Ok(StoredResponse {
            status,
            headers,
            body: Bytes::copy_from_slice(b),
            body_omitted: flags & BODY_OMITTED != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let r = StoredResponse::from_parts(
            StatusCode::CREATED,
            &headers,
            Bytes::from_static(b"{\"id\":1}"),
        );
        let codec = ResponseCodec { max_bytes: 1024 };
        let back = codec.decode(Some(&codec.encode(&r).unwrap())).unwrap();
        assert_eq!(back.status, StatusCode::CREATED);
        assert_eq!(back.body, r.body);
        assert!(!back.body_omitted);
        assert_eq!(back.headers.len(), 2, "set-cookie is not stored");
        let small = ResponseCodec { max_bytes: 40 };
        let cut = small.decode(Some(&small.encode(&r).unwrap())).unwrap();
        assert!(cut.body_omitted && cut.body.is_empty());
        assert!(codec.decode(Some(&[1, 0])).is_err());
    }
}
