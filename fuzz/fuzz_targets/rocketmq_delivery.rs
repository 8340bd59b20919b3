//! A RocketMQ delivery: its properties as the broker sends them (any bytes,
//! packed as `name\u{1}value\u{2}` pairs, decoded by the client), body,
//! reconsume count and message id; then its dead letter. Decoding never
//! panics; the attempt is at least 1; the broker's own properties never
//! become headers; the dead letter is always built, and its properties,
//! encoded and read back as the broker would, are exactly those idem set:
//! no value adds a property of its own.
#![no_main]

use arbitrary::Arbitrary;
use bytes::Bytes;
use idem_consumer::DeadLetter;
use idem_rocketmq::decode::{dead_letter_properties, message_of};
use libfuzzer_sys::fuzz_target;
use rocketmq_model::common::message::STRING_HASH_SET;
use rocketmq_model::common::message::message_single::Message as RocketMessage;
use rocketmq_protocol::common::message::message_decoder::message_properties_to_string;
use rocketmq_protocol::protocol::body::message_codec::decode_properties;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    properties: &'a [u8],
    body: Option<&'a [u8]>,
    reconsume_times: i32,
    msg_id: &'a str,
    key: Option<String>,
    attempts: u32,
    last_error: String,
}

fuzz_target!(|input: Input<'_>| {
    let map = decode_properties(input.properties);
    let properties: Vec<(&str, &str)> = map.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let decoded = message_of(
        &properties,
        input.body.map(Bytes::copy_from_slice),
        input.reconsume_times,
        input.msg_id,
    );
    let message = &decoded.message;
    assert!(message.attempt >= 1);
    assert!(message.id.as_deref().is_none_or(|id| !id.is_empty()));
    assert!(message.headers.is_sorted_by(|a, b| a.0 <= b.0));
    for (name, _) in &message.headers {
        assert!(!STRING_HASH_SET.contains(name.as_str()), "{name}");
    }

    let why = DeadLetter {
        key: input.key,
        attempts: input.attempts,
        last_error: input.last_error,
    };
    let set = dead_letter_properties(message, &why);
    let mut builder = RocketMessage::builder()
        .topic("%DLQ%billing")
        .body(message.body.clone());
    if let Some(keys) = &decoded.keys {
        builder = builder.key(keys.as_str());
    }
    if let Some(tags) = &decoded.tags {
        builder = builder.tags(tags.as_str());
    }
    for (name, value) in &set {
        builder = builder
            .raw_property(name.as_str(), value.as_str())
            .unwrap_or_else(|e| panic!("{name}={value:?} refused: {e}"));
    }
    let copy = builder.build().expect("a dead letter is always built");
    let sent = copy.properties().as_map();
    let wire = message_properties_to_string(sent);
    let read = decode_properties(wire.as_bytes());
    for (name, value) in &read {
        assert_eq!(sent.get(name), Some(value), "{name} read back as {value:?}");
    }
    for (name, value) in &set {
        if !value.is_empty() {
            assert_eq!(
                read.get(name.as_str()).map(|v| v.as_str()),
                Some(value.as_str()),
                "{name} in {wire:?}"
            );
        }
    }
});
