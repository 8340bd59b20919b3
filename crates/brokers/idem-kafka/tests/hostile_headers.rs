//! A record whose header name is not UTF-8 (a producer writing through
//! librdkafka's C API can send one) is delivered like any other, its name
//! read lossily, and the records after it keep coming.

mod support;

use std::ffi::{CString, c_void};
use std::time::{Duration, Instant};

use idem_consumer::Source;
use rdkafka::ClientConfig;
use rdkafka::bindings as rdsys;
use rdkafka::producer::{BaseProducer, Producer};
use support::Fixture;

/// One `rd_kafka_produceva` argument.
fn arg(
    vtype: rdsys::rd_kafka_vtype_t,
    u: rdsys::rd_kafka_vu_s__bindgen_ty_1,
) -> rdsys::rd_kafka_vu_t {
    rdsys::rd_kafka_vu_t { vtype, u }
}

/// Produces a record to `topic` with the header `name` (any bytes but NUL)
/// set to `value`, as a C producer would: rdkafka's Rust API only takes
/// names that are UTF-8.
fn produce_with_header(brokers: &str, topic: &str, name: &[u8], value: &[u8], body: &[u8]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("a producer");
    let topic = CString::new(topic).expect("a topic name");
    let name = CString::new(name).expect("a header name without NUL");
    use rdsys::rd_kafka_vtype_t::*;
    let args = [
        arg(
            RD_KAFKA_VTYPE_TOPIC,
            rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                cstr: topic.as_ptr(),
            },
        ),
        arg(
            RD_KAFKA_VTYPE_VALUE,
            rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                mem: rdsys::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                    ptr: body.as_ptr() as *mut c_void,
                    size: body.len(),
                },
            },
        ),
        arg(
            RD_KAFKA_VTYPE_HEADER,
            rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                header: rdsys::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_2 {
                    name: name.as_ptr(),
                    val: value.as_ptr().cast(),
                    size: value.len() as isize,
                },
            },
        ),
        arg(
            RD_KAFKA_VTYPE_MSGFLAGS,
            rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                i: rdsys::RD_KAFKA_MSG_F_COPY,
            },
        ),
    ];
    // SAFETY: every pointer in `args` is alive for the call, and the
    // payload is copied (`RD_KAFKA_MSG_F_COPY`); the producer outlives it.
    let error = unsafe {
        rdsys::rd_kafka_produceva(producer.client().native_ptr(), args.as_ptr(), args.len())
    };
    assert!(error.is_null(), "librdkafka refused the record");
    producer
        .flush(Duration::from_secs(10))
        .expect("the broker takes the record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_name_that_is_not_utf8_is_read_lossily() {
    let Some(f) = Fixture::new("hostile-headers", 1).await else {
        return;
    };
    produce_with_header(&f.brokers, &f.topic, b"bad-\xff\xfe", b"v", br#"{"n":1}"#);
    f.publish("m-after", None, "{}").await;

    let source = f.source("").await;
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < 2 && Instant::now() < deadline {
        let fetched = tokio::time::timeout(Duration::from_secs(5), source.fetch(10))
            .await
            .unwrap_or(Ok(Vec::new()))
            .expect("the source fetches");
        for delivery in fetched {
            got.push(delivery.message.clone());
            source.ack(delivery).await.expect("the ack");
        }
    }
    source.close().await;
    assert_eq!(got.len(), 2, "both records delivered: {got:?}");
    assert_eq!(
        got[0].headers,
        vec![(
            "bad-\u{fffd}\u{fffd}".to_owned(),
            bytes::Bytes::from_static(b"v")
        )],
    );
    assert_eq!(got[0].body.as_ref(), br#"{"n":1}"#);
    assert_eq!(got[1].id.as_deref(), Some("m-after"));
}
