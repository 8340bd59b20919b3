//! Kafka records as the runner sees them, and the headers idem adds to the
//! copies it writes to retry and dead-letter topics.

use bytes::Bytes;
use idem_consumer::Message;
use idem_consumer::copy::{self, CopyValue, HeaderRules};
use rdkafka::Message as _;
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};

use crate::consumer::Tp;

/// The producer's id for a message (set by [`KafkaPublisher`](crate::KafkaPublisher)).
pub const MESSAGE_ID: &str = "message-id";
/// Handler attempts a retried copy has used.
pub const ATTEMPTS: &str = "idem-attempts";
/// When a retried copy is due, in milliseconds since the Unix epoch.
pub const DUE: &str = "idem-due";
/// Where a retried or dead-lettered copy was first published:
/// `topic/partition/offset`.
pub const ORIGIN: &str = "idem-origin";

/// What the source needs to settle a delivery.
#[derive(Debug)]
pub struct Receipt {
    pub(crate) tp: Tp,
    pub(crate) offset: i64,
    /// The assignment the message was polled in.
    pub(crate) epoch: u64,
    /// The record's key, which copies keep (and with it their partition).
    pub(crate) record_key: Option<Bytes>,
    /// `topic/partition/offset` of the first copy, when it is not this one.
    pub(crate) origin: Option<String>,
}

impl Receipt {
    /// The topic the message was read from.
    pub fn topic(&self) -> &str {
        &self.tp.0
    }

    /// Its partition.
    pub fn partition(&self) -> i32 {
        self.tp.1
    }

    /// Its offset.
    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// `topic/partition/offset` of the message's first copy.
    pub fn origin(&self) -> String {
        self.origin
            .clone()
            .unwrap_or_else(|| format!("{}/{}/{}", self.tp.0, self.tp.1, self.offset))
    }
}

/// A retried copy's due time, if it has one.
pub(crate) fn due(m: &BorrowedMessage<'_>) -> Option<i64> {
    let headers = m.headers()?;
    headers
        .iter()
        .find(|h| h.key == DUE)
        .and_then(|h| std::str::from_utf8(h.value?).ok()?.parse().ok())
}

/// The message, the record key and the origin (when the record is a copy)
/// of a polled record.
///
/// The message id is the `message-id` header; a record without one is
/// known by its origin, so that its redeliveries (after a crash or a
/// rebalance) are recognised, though a second publication is not.
pub(crate) fn message(
    m: &BorrowedMessage<'_>,
    lane: Option<Bytes>,
) -> (Message, Option<Bytes>, Option<String>) {
    let mut headers = Vec::new();
    let (mut id, mut attempts_made, mut origin, mut content_type) = (None, 0u32, None, None);
    if let Some(hs) = m.headers() {
        headers.reserve(hs.count());
        for h in hs.iter() {
            let value = h.value.unwrap_or_default();
            let text = || std::str::from_utf8(value).ok().map(str::to_owned);
            match h.key {
                k if k.eq_ignore_ascii_case(MESSAGE_ID) => id = text(),
                ATTEMPTS => attempts_made = text().and_then(|t| t.parse().ok()).unwrap_or(0),
                ORIGIN => origin = text(),
                k if k.eq_ignore_ascii_case("content-type") => content_type = text(),
                _ => {}
            }
            headers.push((h.key.to_owned(), Bytes::copy_from_slice(value)));
        }
    }
    let id = id.filter(|i| !i.is_empty()).unwrap_or_else(|| {
        origin
            .clone()
            .unwrap_or_else(|| format!("{}/{}/{}", m.topic(), m.partition(), m.offset()))
    });
    let message = Message {
        id: Some(id),
        headers,
        body: Bytes::copy_from_slice(m.payload().unwrap_or_default()),
        content_type,
        attempt: attempts_made.saturating_add(1),
        lane,
        key: None,
    };
    (message, m.key().map(Bytes::copy_from_slice), origin)
}

/// The headers of a retry copy or dead letter of `message`: its own (less
/// a retried copy's `idem-due`, which only a retry sets anew), then
/// `idem`'s, whose names replace the original's and whose values are made
/// safe ([`idem_consumer::copy`]). Kafka acts on no header name.
pub(crate) fn copy_headers(message: &Message, idem: &[(&str, &str)]) -> OwnedHeaders {
    let original = message
        .headers
        .iter()
        .filter(|(name, _)| !name.eq_ignore_ascii_case(DUE))
        .map(|(name, value)| (name.as_str(), value));
    let headers = copy::copy_headers(original, HeaderRules::PLAIN, idem);
    let mut owned = OwnedHeaders::new_with_capacity(headers.len());
    for (name, value) in &headers {
        let value: &[u8] = match value {
            CopyValue::Original(v) => v,
            CopyValue::Idem(text) => text.as_bytes(),
        };
        owned = owned.insert(Header {
            key: name,
            value: Some(value),
        });
    }
    owned
}
