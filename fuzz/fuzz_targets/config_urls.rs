//! The URLs and settings `idem serve` and `idem consume` read: each
//! broker's `from_url`, the Redis store's URL (as the Redis client reads
//! it, and as idem shows it with the password hidden), the consumer's
//! `--key`. Any text is read or refused with a reason; nothing panics.
#![no_main]

use std::str::FromStr;

use idem_consumer::KeyFrom;
use libfuzzer_sys::fuzz_target;
use redis::IntoConnectionInfo;

fuzz_target!(|text: &str| {
    if let Err(e) = idem_amqp::AmqpConfig::from_url(text) {
        assert!(!e.to_string().is_empty());
    }
    if let Err(e) = idem_jetstream::JetStreamConfig::from_url(text) {
        assert!(!e.to_string().is_empty());
    }
    if let Err(e) = idem_redis_streams::RedisStreamConfig::from_url(text) {
        assert!(!e.to_string().is_empty());
    }
    // `--store redis+cluster://A,B` is split into one URL per node.
    let nodes: Vec<String> = match text.split_once("+cluster://") {
        Some((scheme, nodes)) => nodes
            .split(',')
            .map(|n| format!("{scheme}://{n}"))
            .collect(),
        None => vec![text.to_owned()],
    };
    for node in &nodes {
        let shown = idem_redis::redacted(node);
        if let Ok(url) = url::Url::parse(node)
            && let Some(password) = url.password()
            && !password.is_empty()
            && password != "***"
            && node.matches(&format!(":{password}@")).count() == 1
        {
            assert!(
                !shown.contains(&format!(":{password}@")),
                "{node} shown as {shown}"
            );
        }
        let _ = node.as_str().into_connection_info();
    }
    if let Ok(key) = KeyFrom::from_str(text) {
        assert_eq!(KeyFrom::from_str(&key.to_string()), Ok(key));
    }
});
