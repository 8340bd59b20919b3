//! A JetStream message's headers (any names and values NATS accepts) and
//! payload: decoding it never panics, and its dead letter's headers are
//! always built (a dead letter that cannot be built would bring the message
//! back forever), with no value that could break the header block.
#![no_main]

use std::str::FromStr;

use arbitrary::Arbitrary;
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use idem_consumer::DeadLetter;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    headers: Vec<(&'a str, &'a str)>,
    payload: &'a [u8],
    attempt: u32,
    sequence: u64,
    key: Option<String>,
    attempts: u32,
    last_error: String,
}

fuzz_target!(|input: Input<'_>| {
    let mut headers = HeaderMap::new();
    let mut appended = 0;
    for (name, value) in &input.headers {
        if let (Ok(name), Ok(value)) = (HeaderName::from_str(name), HeaderValue::from_str(value)) {
            headers.append(name, value);
            appended += 1;
        }
    }
    let headers = (appended > 0).then_some(headers);
    let message = idem_jetstream::decode::message_of(
        headers.as_ref(),
        Bytes::copy_from_slice(input.payload),
        input.attempt,
    );
    assert_eq!(message.headers.len(), appended);
    let why = DeadLetter {
        key: input.key,
        attempts: input.attempts,
        last_error: input.last_error,
    };
    let dead = idem_jetstream::decode::dead_letter_headers(
        "orders",
        input.sequence,
        headers.as_ref(),
        &why,
    )
    .expect("a dead letter's headers are always built");
    for (name, values) in dead.iter() {
        let name: &str = name.as_ref();
        assert!(!name.contains(['\r', '\n', ':']), "{name:?}");
        for v in values {
            assert!(!v.as_str().contains(['\r', '\n']), "{name}: {v:?}");
        }
    }
});
