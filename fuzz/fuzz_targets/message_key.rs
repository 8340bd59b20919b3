//! Where the consumer takes a message's key from (`--key`), over any
//! message, and the copies it writes: keys are read or refused with a
//! reason, and idem's header values on a copy are single-line, free of
//! control characters and within their length limit.
#![no_main]

use std::str::FromStr;

use arbitrary::Arbitrary;
use bytes::Bytes;
use idem_consumer::KeyFrom;
use idem_consumer::Message;
use idem_consumer::copy::{CopyValue, HeaderRules, copy_headers, header_text_within};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    spec: &'a str,
    id: Option<String>,
    headers: Vec<(String, &'a [u8])>,
    body: &'a [u8],
    idem: Vec<(&'a str, &'a str)>,
    max: u16,
}

fuzz_target!(|input: Input<'_>| {
    let mut message = Message::new(Bytes::copy_from_slice(input.body));
    message.id = input.id;
    message.headers = input
        .headers
        .iter()
        .map(|(n, v)| (n.clone(), Bytes::copy_from_slice(v)))
        .collect();
    for spec in [input.spec, "message-id", "json:/id"] {
        if let Ok(from) = KeyFrom::from_str(spec) {
            match from.extract(&message) {
                Ok(key) => assert!(!key.is_empty()),
                Err(e) => assert!(!e.to_string().is_empty()),
            }
        }
    }
    let original = message.headers.iter().map(|(n, v)| (n.as_str(), v));
    let rules = HeaderRules {
        is_control: |name| name.eq_ignore_ascii_case("cc"),
    };
    for (name, value) in copy_headers(original, rules, &input.idem) {
        if let CopyValue::Idem(text) = value {
            assert!(!text.chars().any(char::is_control), "{name}: {text:?}");
            assert!(text.len() <= idem_consumer::copy::MAX_HEADER_TEXT);
        }
    }
    let max = usize::from(input.max);
    for (_, text) in &input.idem {
        let safe = header_text_within(text, max);
        assert!(safe.len() <= max.max(4), "{} > {max}", safe.len());
        assert!(
            !safe
                .chars()
                .any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}')
        );
    }
});
