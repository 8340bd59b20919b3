//! An AMQP delivery as the broker sends it: content-header properties in
//! their wire encoding (any bytes), then the body. Whatever parses must
//! turn into the runner's message without panicking; headers that are not
//! UTF-8 stay bytes.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((body, props)) = lapin::protocol::basic::parse_properties(data) else {
        return;
    };
    let message = idem_amqp::decode::message_of(&props, Bytes::copy_from_slice(body));
    assert!(message.attempt >= 1);
    let fields = props.headers().as_ref().map_or(0, |t| t.inner().len());
    assert!(message.headers.len() <= fields);
    assert_eq!(&message.body[..], body);
});
