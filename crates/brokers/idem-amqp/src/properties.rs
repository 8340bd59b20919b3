//! AMQP properties and headers: read into a [`Message`](idem_consumer::Message),
//! and copied onto republished messages.

use bytes::Bytes;
use idem_consumer::Message;
use idem_consumer::copy::{CopyValue, HeaderRules, copy_headers};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

/// AMQP's `delivery_mode` for a message written to disk.
pub(crate) const PERSISTENT: u8 = 2;

/// The header carrying how many handler attempts a message has used.
pub(crate) const ATTEMPTS: &str = "idem-attempts";

/// The runner's message for a first delivery with `props` and `body`: its
/// attempt is one more than the `idem-attempts` header counts.
pub fn message_of(props: &BasicProperties, body: Bytes) -> Message {
    Message {
        id: props.message_id().as_ref().map(|s| s.to_string()),
        headers: headers_of(props),
        body,
        content_type: props.content_type().as_ref().map(|s| s.to_string()),
        attempt: attempts_made(props).saturating_add(1),
        ..Message::default()
    }
}

/// The headers as name and bytes: strings as they are, numbers and booleans
/// as decimal text; arrays and tables (such as RabbitMQ's `x-death`) are
/// left out.
pub(crate) fn headers_of(props: &BasicProperties) -> Vec<(String, Bytes)> {
    let Some(table) = props.headers() else {
        return Vec::new();
    };
    table
        .inner()
        .iter()
        .filter_map(|(name, value)| Some((name.to_string(), scalar(value)?)))
        .collect()
}

fn scalar(value: &AMQPValue) -> Option<Bytes> {
    let text = match value {
        AMQPValue::LongString(s) => return Some(Bytes::copy_from_slice(s.as_bytes())),
        AMQPValue::ShortString(s) => return Some(Bytes::copy_from_slice(s.as_str().as_bytes())),
        AMQPValue::ByteArray(b) => return Some(Bytes::copy_from_slice(b.as_slice())),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Float(n) => n.to_string(),
        AMQPValue::Double(n) => n.to_string(),
        AMQPValue::Timestamp(n) => n.to_string(),
        _ => return None,
    };
    Some(Bytes::from(text))
}

/// Handler attempts used so far, from the `idem-attempts` header (0 when
/// absent or unreadable).
pub(crate) fn attempts_made(props: &BasicProperties) -> u32 {
    props
        .headers()
        .as_ref()
        .and_then(|t| t.inner().get(ATTEMPTS))
        .and_then(scalar)
        .and_then(|b| std::str::from_utf8(&b).ok()?.trim().parse().ok())
        .unwrap_or(0)
}

/// What RabbitMQ does with header names at publish: `CC` and `BCC` add
/// routing keys (sender-selected distribution). A copy keeps them as
/// `idem-original-CC` and `idem-original-BCC`, so that it goes only where
/// idem sends it.
pub(crate) const HEADER_RULES: HeaderRules = HeaderRules {
    is_control: |name| name.eq_ignore_ascii_case("CC") || name.eq_ignore_ascii_case("BCC"),
};

/// A copy of `props` for republishing: every property kept except the
/// expiration (replaced by `expiration`, or dropped so that a parked or
/// requeued copy does not expire) and the delivery mode; the headers as
/// [`copy_headers`] makes them, with `set` as idem's (original values keep
/// their AMQP types, `x-death` stays an array of tables).
///
/// The copy is always persistent: the original is acked once the copy is
/// confirmed, so a transient copy would make a broker restart lose a
/// message the producer had handed over.
pub(crate) fn republished(
    props: &BasicProperties,
    set: &[(&str, &str)],
    expiration: Option<String>,
) -> BasicProperties {
    let original = props.headers().clone().unwrap_or_default();
    let original = original
        .inner()
        .iter()
        .map(|(name, value)| (name.as_str(), value.clone()));
    let mut headers = FieldTable::default();
    for (name, value) in copy_headers(original, HEADER_RULES, set) {
        let value = match value {
            CopyValue::Original(v) => v,
            CopyValue::Idem(text) => AMQPValue::LongString(LongString::from(text)),
        };
        headers.insert(ShortString::from(name), value);
    }
    let mut out = BasicProperties::default()
        .with_headers(headers)
        .with_delivery_mode(PERSISTENT);
    macro_rules! keep {
        ($($get:ident => $with:ident),* $(,)?) => {
            $(if let Some(v) = props.$get() { out = out.$with(v.clone()); })*
        };
    }
    keep!(
        content_type => with_content_type,
        content_encoding => with_content_encoding,
        priority => with_priority,
        correlation_id => with_correlation_id,
        reply_to => with_reply_to,
        message_id => with_message_id,
        timestamp => with_timestamp,
        kind => with_type,
        user_id => with_user_id,
        app_id => with_app_id,
        cluster_id => with_cluster_id,
    );
    if let Some(e) = expiration {
        out = out.with_expiration(e.into());
    }
    out
}

/// Headers for a fresh publish.
pub(crate) fn table(headers: &[(String, Bytes)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (name, value) in headers {
        t.insert(
            ShortString::from(name.as_str()),
            AMQPValue::LongString(LongString::from(value.to_vec())),
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_republished_copy_keeps_properties_and_headers_and_replaces_the_expiration() {
        let mut h = FieldTable::default();
        h.insert("tenant".into(), AMQPValue::LongString("acme".into()));
        h.insert(ATTEMPTS.into(), AMQPValue::LongLongInt(2));
        let props = BasicProperties::default()
            .with_headers(h)
            .with_message_id("m1".into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_expiration("60000".into());
        assert_eq!(attempts_made(&props), 2);
        let copy = republished(&props, &[(ATTEMPTS, "3")], None);
        assert_eq!(copy.message_id().as_ref().unwrap().as_str(), "m1");
        assert_eq!(copy.delivery_mode(), &Some(2));
        assert_eq!(copy.expiration(), &None);
        assert_eq!(attempts_made(&copy), 3);
        let headers = headers_of(&copy);
        assert!(headers.contains(&("tenant".into(), Bytes::from_static(b"acme"))));
        let delayed = republished(&props, &[], Some("500".into()));
        assert_eq!(delayed.expiration().as_ref().unwrap().as_str(), "500");
        assert_eq!(attempts_made(&delayed), 2);
    }

    #[test]
    fn a_copy_keeps_cc_and_bcc_as_idem_original_and_typed_values_as_they_are() {
        let routes = AMQPValue::FieldArray(vec![AMQPValue::LongString("elsewhere".into())].into());
        let mut death = FieldTable::default();
        death.insert("count".into(), AMQPValue::LongLongInt(2));
        let deaths = AMQPValue::FieldArray(vec![AMQPValue::FieldTable(death)].into());
        let mut h = FieldTable::default();
        h.insert("CC".into(), routes.clone());
        h.insert("bcc".into(), routes.clone());
        h.insert("x-death".into(), deaths.clone());
        h.insert("Idem-Attempts".into(), AMQPValue::LongLongInt(1));
        let props = BasicProperties::default().with_headers(h);
        let copy = republished(
            &props,
            &[(ATTEMPTS, "2"), ("idem-last-error", "a\nb")],
            None,
        );
        let headers = copy.headers().clone().unwrap();
        let headers = headers.inner();
        assert_eq!(headers.get("CC"), None);
        assert_eq!(headers.get("bcc"), None);
        assert_eq!(headers.get("idem-original-CC"), Some(&routes));
        assert_eq!(headers.get("idem-original-bcc"), Some(&routes));
        assert_eq!(headers.get("x-death"), Some(&deaths));
        assert_eq!(headers.get("Idem-Attempts"), None, "replaced by idem's");
        assert_eq!(attempts_made(&copy), 2);
        assert_eq!(
            headers.get("idem-last-error"),
            Some(&AMQPValue::LongString("a\\nb".into()))
        );
    }

    #[test]
    fn a_republished_copy_is_persistent_whatever_its_original() {
        for original in [None, Some(1), Some(2)] {
            let mut props = BasicProperties::default();
            if let Some(mode) = original {
                props = props.with_delivery_mode(mode);
            }
            let copy = republished(&props, &[(ATTEMPTS, "1")], None);
            assert_eq!(copy.delivery_mode(), &Some(2), "original {original:?}");
        }
    }
}
