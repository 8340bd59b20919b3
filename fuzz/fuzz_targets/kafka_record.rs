//! A polled Kafka record as plain values (headers with any names and
//! values, null or not, not necessarily UTF-8; a key; a payload), then the
//! headers of its retry copy and of its dead letter: decoding never
//! panics, the message keeps every header in order and has an id and an
//! attempt, and a copy carries each of idem's headers once, made safe,
//! and no stale `idem-due`.
#![no_main]

use arbitrary::Arbitrary;
use bytes::Bytes;
use idem_consumer::DeadLetter;
use idem_consumer::copy::CopyValue;
use idem_kafka::decode::{Record, copy_header_list, due_of, message_of};
use idem_kafka::{ATTEMPTS, DUE, ORIGIN};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    topic: &'a str,
    partition: i32,
    offset: i64,
    headers: Vec<(&'a str, Option<&'a [u8]>)>,
    key: Option<&'a [u8]>,
    payload: Option<&'a [u8]>,
    by_key: bool,
    attempts: u32,
    due: i64,
    dead_key: Option<String>,
    last_error: String,
}

fuzz_target!(|input: Input<'_>| {
    let record = Record {
        topic: input.topic,
        partition: input.partition,
        offset: input.offset,
        headers: &input.headers,
        key: input.key,
        payload: input.payload,
    };
    let _ = due_of(input.headers.iter().copied());
    let lane = input
        .by_key
        .then(|| input.key.map(Bytes::copy_from_slice))
        .flatten();
    let (message, record_key, origin) = message_of(&record, lane);
    assert!(message.attempt >= 1);
    let id = message.id.as_deref().expect("every record has an id");
    assert!(!id.is_empty(), "empty id from {:?}", input.headers);
    assert_eq!(message.headers.len(), input.headers.len());
    for ((name, value), (kept, bytes)) in input.headers.iter().zip(&message.headers) {
        assert_eq!(name, kept);
        assert_eq!(value.unwrap_or_default(), &bytes[..]);
    }
    assert_eq!(&message.body[..], input.payload.unwrap_or_default());
    assert_eq!(record_key.as_deref(), input.key);
    let origin =
        origin.unwrap_or_else(|| format!("{}/{}/{}", input.topic, input.partition, input.offset));

    let (attempts, due) = (input.attempts.to_string(), input.due.to_string());
    let retry = [
        (ORIGIN, origin.as_str()),
        (ATTEMPTS, attempts.as_str()),
        (DUE, due.as_str()),
    ];
    let why = DeadLetter {
        key: input.dead_key,
        attempts: input.attempts,
        last_error: input.last_error,
    };
    let why = why.headers();
    let dead: Vec<(&str, &str)> = std::iter::once((ORIGIN, origin.as_str()))
        .chain(why.iter().map(|(n, v)| (*n, v.as_str())))
        .collect();
    for idem in [&retry[..], &dead[..]] {
        let headers = copy_header_list(&message, idem);
        for (name, _) in idem {
            let count = headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                .count();
            assert_eq!(count, 1, "{name} in {headers:?}");
        }
        let due_set = idem.iter().any(|(n, _)| *n == DUE);
        let dues = headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(DUE))
            .count();
        assert_eq!(dues, usize::from(due_set));
        for (name, value) in &headers {
            if let CopyValue::Idem(text) = value {
                assert!(!text.chars().any(char::is_control), "{name}: {text:?}");
            }
        }
    }
});
