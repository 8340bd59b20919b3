//! A Redis Streams entry as Redis answers it: an id and a flat
//! `[field, value, …]` array of any Redis values, fields not UTF-8, an odd
//! count, an `idem-attempts` that is no number. Nothing may panic; a
//! decoded message counts at least one attempt.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use redis::Value;

#[derive(Arbitrary, Debug)]
enum Item<'a> {
    MessageId,
    Body,
    ContentType,
    Attempts,
    Bulk(&'a [u8]),
    Simple(String),
    Int(i64),
    Nil,
    Array(Vec<&'a [u8]>),
}

impl Item<'_> {
    fn value(&self) -> Value {
        let bulk = |b: &[u8]| Value::BulkString(b.to_vec());
        match self {
            Item::MessageId => bulk(b"message-id"),
            Item::Body => bulk(b"body"),
            Item::ContentType => bulk(b"content-type"),
            Item::Attempts => bulk(b"idem-attempts"),
            Item::Bulk(b) => bulk(b),
            Item::Simple(s) => Value::SimpleString(s.clone()),
            Item::Int(n) => Value::Int(*n),
            Item::Nil => Value::Nil,
            Item::Array(items) => Value::Array(items.iter().map(|b| bulk(b)).collect()),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    id: Item<'a>,
    fields: Option<Vec<Item<'a>>>,
    deliveries: u32,
}

fuzz_target!(|input: Input<'_>| {
    let fields = match &input.fields {
        Some(items) => Value::Array(items.iter().map(Item::value).collect()),
        None => Value::Nil,
    };
    if let Some(message) =
        idem_redis_streams::decode::message_of(&input.id.value(), &fields, input.deliveries)
    {
        assert!(message.attempt >= 1);
    }
});
