//! Kafka records as the runner sees them, and the headers idem adds to the
//! copies it writes to retry and dead-letter topics.

use std::borrow::Cow;
use std::ffi::{CStr, c_char, c_void};
use std::ptr;

use bytes::Bytes;
use idem_consumer::Message;
use idem_consumer::copy::{self, CopyValue, HeaderRules};
use rdkafka::Message as _;
use rdkafka::bindings as rdsys;
use rdkafka::message::{BorrowedMessage, Header, OwnedHeaders};

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

/// A polled record as plain values: what [`message_of`] reads, and what
/// `message` takes from rdkafka's message.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// The topic it was read from.
    pub topic: &'a str,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its headers in order: names, and values (`None` for a null value).
    pub headers: &'a [(&'a str, Option<&'a [u8]>)],
    /// The record's key.
    pub key: Option<&'a [u8]>,
    /// The record's value.
    pub payload: Option<&'a [u8]>,
}

/// A retried copy's due time, if it has one.
pub(crate) fn due(m: &BorrowedMessage<'_>) -> Option<i64> {
    due_of(
        headers_of(m)
            .iter()
            .map(|(name, value)| (name.as_ref(), *value)),
    )
}

/// The headers of a polled record, in order, each name read lossily.
///
/// rdkafka's own reader (`Headers::iter`) panics on a header name that is
/// not UTF-8, which any producer writing through librdkafka's C API can
/// send: the panic would end the consumer's poll thread and stall every
/// partition. This reads the same list through librdkafka directly.
fn headers_of<'m>(m: &'m BorrowedMessage<'_>) -> Vec<(Cow<'m, str>, Option<&'m [u8]>)> {
    const OK: rdsys::rd_kafka_resp_err_t = rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
    let mut list: *mut rdsys::rd_kafka_headers_t = ptr::null_mut();
    // SAFETY: `m.ptr()` is the live message `m` borrows. librdkafka answers
    // the message's own header list, freed with the message.
    if unsafe { rdsys::rd_kafka_message_headers(m.ptr(), &mut list) } != OK || list.is_null() {
        return Vec::new();
    }
    // SAFETY: `list` is the message's header list, alive as long as `m`.
    let count = unsafe { rdsys::rd_kafka_header_cnt(list) };
    let mut headers = Vec::with_capacity(count);
    for i in 0..count {
        let mut name: *const c_char = ptr::null();
        let mut value: *const c_void = ptr::null();
        let mut size = 0usize;
        // SAFETY: `i` is below the count; librdkafka points `name` and
        // `value` into the list, which lives as long as `m`.
        let found =
            unsafe { rdsys::rd_kafka_header_get_all(list, i, &mut name, &mut value, &mut size) };
        if found != OK || name.is_null() {
            break;
        }
        // SAFETY: a header name is NUL-terminated, and `value` (when not
        // null) holds `size` bytes; both are owned by the message.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let value = (!value.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) });
        headers.push((name, value));
    }
    headers
}

/// The due time in `headers` (the first `idem-due`), if it reads as one.
pub fn due_of<'a>(mut headers: impl Iterator<Item = (&'a str, Option<&'a [u8]>)>) -> Option<i64> {
    headers
        .find(|(name, _)| *name == DUE)
        .and_then(|(_, value)| std::str::from_utf8(value?).ok()?.parse().ok())
}

/// The message, the record key and the origin (when the record is a copy)
/// of a polled record; see [`message_of`].
pub(crate) fn message(
    m: &BorrowedMessage<'_>,
    lane: Option<Bytes>,
) -> (Message, Option<Bytes>, Option<String>) {
    let read = headers_of(m);
    let headers: Vec<(&str, Option<&[u8]>)> = read
        .iter()
        .map(|(name, value)| (name.as_ref(), *value))
        .collect();
    let record = Record {
        topic: m.topic(),
        partition: m.partition(),
        offset: m.offset(),
        headers: &headers,
        key: m.key(),
        payload: m.payload(),
    };
    message_of(&record, lane)
}

/// The message, the record key and the origin (when the record is a copy)
/// of `record`.
///
/// The message id is the `message-id` header; a record without one is
/// known by its origin, so that its redeliveries (after a crash or a
/// rebalance) are recognised, though a second publication is not.
pub fn message_of(
    record: &Record<'_>,
    lane: Option<Bytes>,
) -> (Message, Option<Bytes>, Option<String>) {
    let mut headers = Vec::with_capacity(record.headers.len());
    let (mut id, mut attempts_made, mut origin, mut content_type) = (None, 0u32, None, None);
    for &(name, value) in record.headers {
        let value = value.unwrap_or_default();
        let text = || std::str::from_utf8(value).ok().map(str::to_owned);
        match name {
            k if k.eq_ignore_ascii_case(MESSAGE_ID) => id = text(),
            ATTEMPTS => attempts_made = text().and_then(|t| t.parse().ok()).unwrap_or(0),
            // An empty origin names no record: the record is known by its own.
            ORIGIN => origin = text().filter(|o| !o.is_empty()),
            k if k.eq_ignore_ascii_case("content-type") => content_type = text(),
            _ => {}
        }
        headers.push((name.to_owned(), Bytes::copy_from_slice(value)));
    }
    let id = id.filter(|i| !i.is_empty()).unwrap_or_else(|| {
        origin
            .clone()
            .unwrap_or_else(|| format!("{}/{}/{}", record.topic, record.partition, record.offset))
    });
    let message = Message {
        id: Some(id),
        headers,
        body: Bytes::copy_from_slice(record.payload.unwrap_or_default()),
        content_type,
        attempt: attempts_made.saturating_add(1),
        lane,
        key: None,
    };
    (message, record.key.map(Bytes::copy_from_slice), origin)
}

/// The headers of a retry copy or dead letter of `message`: its own (less
/// a retried copy's `idem-due`, which only a retry sets anew), then
/// `idem`'s, whose names replace the original's and whose values are made
/// safe ([`idem_consumer::copy`]). Kafka acts on no header name.
pub(crate) fn copy_headers(message: &Message, idem: &[(&str, &str)]) -> OwnedHeaders {
    let headers = copy_header_list(message, idem);
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

/// The headers `copy_headers` writes, in order, as plain values.
pub fn copy_header_list<'m>(
    message: &'m Message,
    idem: &[(&str, &str)],
) -> Vec<(String, CopyValue<&'m Bytes>)> {
    let original = message
        .headers
        .iter()
        .filter(|(name, _)| !name.eq_ignore_ascii_case(DUE))
        .map(|(name, value)| (name.as_str(), value));
    copy::copy_headers(original, HeaderRules::PLAIN, idem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record<'a>(headers: &'a [(&'a str, Option<&'a [u8]>)]) -> Record<'a> {
        Record {
            topic: "orders",
            partition: 3,
            offset: 42,
            headers,
            key: Some(b"k"),
            payload: Some(b"{}"),
        }
    }

    #[test]
    fn an_empty_origin_does_not_become_the_message_id() {
        for value in [None, Some(&b""[..])] {
            let headers = [(ORIGIN, value)];
            let (message, _, origin) = message_of(&record(&headers), None);
            assert_eq!(message.id.as_deref(), Some("orders/3/42"));
            assert_eq!(origin, None);
        }
    }

    #[test]
    fn a_copy_is_known_by_its_origin_and_counts_its_attempts() {
        let headers = [
            (ORIGIN, Some(&b"orders/0/7"[..])),
            (ATTEMPTS, Some(&b"2"[..])),
            (DUE, Some(&b"1764669600000"[..])),
        ];
        let (message, key, origin) = message_of(&record(&headers), None);
        assert_eq!(message.id.as_deref(), Some("orders/0/7"));
        assert_eq!(origin.as_deref(), Some("orders/0/7"));
        assert_eq!(message.attempt, 3);
        assert_eq!(key.as_deref(), Some(&b"k"[..]));
        assert_eq!(due_of(headers.iter().copied()), Some(1_764_669_600_000));
        let copy = copy_header_list(&message, &[(ORIGIN, "orders/0/7")]);
        assert!(copy.iter().all(|(name, _)| name != DUE));
    }
}
