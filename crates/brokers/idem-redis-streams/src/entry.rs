//! How a stream entry's fields map to a [`Message`] and back (the layout in
//! the crate docs).

use bytes::Bytes;
use idem_consumer::Message;
use redis::Value;

/// The producer's message id.
pub(crate) const MESSAGE_ID: &str = "message-id";
/// The payload.
pub(crate) const BODY: &str = "body";
/// The payload's media type.
pub(crate) const CONTENT_TYPE: &str = "content-type";
/// Handler attempts used up before this copy, on retried and handed-back
/// copies.
pub(crate) const ATTEMPTS: &str = "idem-attempts";

/// An entry's fields in order, `idem-attempts` left out: what a copy of it
/// carries.
pub(crate) type Fields = Vec<(Bytes, Bytes)>;

/// One entry read from the stream.
pub(crate) struct Entry {
    /// Its id in the stream.
    pub(crate) id: String,
    /// Its fields, less `idem-attempts`.
    pub(crate) fields: Fields,
    /// Attempts used up before this copy (its `idem-attempts` field).
    pub(crate) carried: u32,
}

impl Entry {
    /// An entry from its id and the flat `[field, value, …]` array Redis
    /// answers with.
    pub(crate) fn parse(id: &Value, fields: &Value) -> Option<Self> {
        let id = text(id)?;
        let Value::Array(flat) = fields else {
            return None;
        };
        let mut carried = 0;
        let mut out = Vec::with_capacity(flat.len() / 2);
        for pair in flat.chunks_exact(2) {
            let (name, value) = (bytes(&pair[0])?, bytes(&pair[1])?);
            if name.as_ref() == ATTEMPTS.as_bytes() {
                carried = std::str::from_utf8(&value)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
            } else {
                out.push((name, value));
            }
        }
        Some(Self {
            id,
            fields: out,
            carried,
        })
    }

    /// The message, as delivery number `deliveries` of this copy (1 for a
    /// first read; the group's delivery counter for a claimed one).
    pub(crate) fn message(&self, deliveries: u32) -> Message {
        let mut message = Message::new(Bytes::new());
        message.attempt = self.carried.saturating_add(deliveries.max(1));
        for (name, value) in &self.fields {
            match name.as_ref() {
                n if n == MESSAGE_ID.as_bytes() => {
                    message.id = Some(String::from_utf8_lossy(value).into_owned());
                }
                n if n == BODY.as_bytes() => message.body = value.clone(),
                n if n == CONTENT_TYPE.as_bytes() => {
                    message.content_type = Some(String::from_utf8_lossy(value).into_owned());
                }
                n => message
                    .headers
                    .push((String::from_utf8_lossy(n).into_owned(), value.clone())),
            }
        }
        message
    }
}

/// The fields a message is published with: `message-id`, `content-type`,
/// the headers, then `body`.
pub(crate) fn fields_of(message: &Message) -> Fields {
    let mut fields = Vec::with_capacity(message.headers.len() + 3);
    if let Some(id) = &message.id {
        fields.push((Bytes::from_static(MESSAGE_ID.as_bytes()), id.clone().into()));
    }
    if let Some(ct) = &message.content_type {
        fields.push((
            Bytes::from_static(CONTENT_TYPE.as_bytes()),
            ct.clone().into(),
        ));
    }
    for (name, value) in &message.headers {
        fields.push((name.clone().into(), value.clone()));
    }
    fields.push((Bytes::from_static(BODY.as_bytes()), message.body.clone()));
    fields
}

/// A bulk or simple string's bytes.
pub(crate) fn bytes(v: &Value) -> Option<Bytes> {
    match v {
        Value::BulkString(b) => Some(Bytes::copy_from_slice(b)),
        Value::SimpleString(s) => Some(Bytes::copy_from_slice(s.as_bytes())),
        Value::Int(n) => Some(Bytes::from(n.to_string())),
        _ => None,
    }
}

/// A string reply as text.
pub(crate) fn text(v: &Value) -> Option<String> {
    bytes(v).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// An integer reply, also when Redis sends it as a string.
pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn fields_map_to_id_body_content_type_and_headers_and_back() {
        let flat = Value::Array(
            [
                "message-id",
                "m-1",
                "tenant",
                "t9",
                "content-type",
                "application/json",
                "idem-attempts",
                "2",
                "body",
                "{}",
            ]
            .into_iter()
            .map(bulk)
            .collect(),
        );
        let entry = Entry::parse(&bulk("1-0"), &flat).unwrap();
        assert_eq!(entry.carried, 2);
        let m = entry.message(3);
        assert_eq!(m.id.as_deref(), Some("m-1"));
        assert_eq!(m.body.as_ref(), b"{}");
        assert_eq!(m.content_type.as_deref(), Some("application/json"));
        assert_eq!(m.headers, vec![("tenant".to_owned(), Bytes::from("t9"))]);
        assert_eq!(m.attempt, 5, "two carried plus the third delivery");
        let back = fields_of(&m);
        let names: Vec<_> = back.iter().map(|(n, _)| n.as_ref()).collect();
        assert_eq!(
            names,
            [&b"message-id"[..], b"content-type", b"tenant", b"body"]
        );
    }
}
