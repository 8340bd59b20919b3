//! Where a message's idempotency key comes from.

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;

use crate::Message;

/// Where the runner reads each message's key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyFrom {
    /// The producer's message id ([`Message::id`]).
    MessageId,
    /// A header's value.
    Header(String),
    /// A field of the JSON body, by JSON pointer (RFC 6901), e.g.
    /// `/order/id`; a string or a number.
    Json(String),
}

impl KeyFrom {
    /// The key of `message`, or why it has none.
    pub fn extract(&self, message: &Message) -> Result<Bytes, KeyFromError> {
        let missing = |what: String| KeyFromError { what };
        match self {
            KeyFrom::MessageId => match message.id.as_deref() {
                Some(id) if !id.is_empty() => Ok(Bytes::copy_from_slice(id.as_bytes())),
                _ => Err(missing(
                    "the message has no message id (publish with one, or choose another --key)"
                        .into(),
                )),
            },
            KeyFrom::Header(name) => match message.header(name) {
                Some(v) if !v.is_empty() => Ok(v.clone()),
                _ => Err(missing(format!("the message has no header `{name}`"))),
            },
            KeyFrom::Json(pointer) => {
                let body: serde_json::Value = serde_json::from_slice(&message.body)
                    .map_err(|e| missing(format!("the body is not JSON ({e})")))?;
                match body.pointer(pointer) {
                    Some(serde_json::Value::String(s)) if !s.is_empty() => {
                        Ok(Bytes::copy_from_slice(s.as_bytes()))
                    }
                    Some(serde_json::Value::Number(n)) => Ok(Bytes::from(n.to_string())),
                    Some(other) => Err(missing(format!(
                        "the body's `{pointer}` is {other}, not a non-empty string or a number"
                    ))),
                    None => Err(missing(format!("the body has no `{pointer}`"))),
                }
            }
        }
    }
}

impl fmt::Display for KeyFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyFrom::MessageId => f.write_str("message-id"),
            KeyFrom::Header(name) => write!(f, "header:{name}"),
            KeyFrom::Json(pointer) => write!(f, "json:{pointer}"),
        }
    }
}

/// Parses `message-id`, `header:NAME` or `json:/pointer`.
impl FromStr for KeyFrom {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "message-id" {
            return Ok(KeyFrom::MessageId);
        }
        if let Some(name) = s.strip_prefix("header:") {
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
                return Err(format!(
                    "`{s}`: a header name is one or more visible characters without `:`"
                ));
            }
            return Ok(KeyFrom::Header(name.to_owned()));
        }
        if let Some(pointer) = s.strip_prefix("json:") {
            if !pointer.starts_with('/') {
                return Err(format!(
                    "`{s}`: a JSON pointer starts with `/`, e.g. `json:/order/id`"
                ));
            }
            return Ok(KeyFrom::Json(pointer.to_owned()));
        }
        Err(format!(
            "`{s}`: expected `message-id`, `header:NAME` or `json:/pointer`"
        ))
    }
}

/// A message without a usable key: it is dead-lettered, since no redelivery
/// can give it one.
#[derive(Clone, Debug, thiserror::Error)]
#[error("no idempotency key: {what}")]
pub struct KeyFromError {
    what: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(body: &str) -> Message {
        let mut m = Message::new(body.to_owned());
        m.id = Some("m-1".into());
        m.headers
            .push(("Order-Id".into(), Bytes::from_static(b"o-7")));
        m
    }

    #[test]
    fn keys_come_from_the_id_a_header_or_a_json_field() {
        let m = message(r#"{"order":{"id":"o-9","n":42}}"#);
        assert_eq!(KeyFrom::MessageId.extract(&m).unwrap(), "m-1");
        assert_eq!(
            "header:order-id"
                .parse::<KeyFrom>()
                .unwrap()
                .extract(&m)
                .unwrap(),
            "o-7"
        );
        let json: KeyFrom = "json:/order/id".parse().unwrap();
        assert_eq!(json.extract(&m).unwrap(), "o-9");
        let number: KeyFrom = "json:/order/n".parse().unwrap();
        assert_eq!(number.extract(&m).unwrap(), "42");
    }

    #[test]
    fn missing_keys_say_what_is_missing() {
        let m = message("not json");
        let e = "json:/id"
            .parse::<KeyFrom>()
            .unwrap()
            .extract(&m)
            .unwrap_err();
        assert!(e.to_string().contains("not JSON"), "{e}");
        let e = KeyFrom::Header("x".into()).extract(&m).unwrap_err();
        assert!(e.to_string().contains("no header `x`"), "{e}");
        let e = KeyFrom::MessageId.extract(&Message::new("")).unwrap_err();
        assert!(e.to_string().contains("no message id"), "{e}");
    }

    #[test]
    fn bad_key_specs_are_refused_with_the_forms_allowed() {
        for bad in ["id", "header:", "json:id", "header:a b"] {
            let e = bad.parse::<KeyFrom>().unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
        for good in ["message-id", "header:X-Key", "json:/a/0"] {
            assert_eq!(good.parse::<KeyFrom>().unwrap().to_string(), good);
        }
    }
}
