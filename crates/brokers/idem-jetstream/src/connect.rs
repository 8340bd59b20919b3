//! Connecting, and declaring the stream, the consumer and the dead-letter
//! stream idempotently.

use std::time::Duration;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::consumer::{FromConsumer, PullConsumer};
use async_nats::jetstream::{self, consumer::AckPolicy, consumer::pull, context, stream};
use url::Url;

use crate::config::address_of;
use crate::{JetStreamConfig, subject};

/// AckWait of a consumer this creates when none is asked for (the server's
/// own default).
const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// `max_ack_pending` of a consumer this creates, at least: the server's
/// default, as it bounds all the processes sharing the consumer together.
const SHARED_ACK_PENDING: i64 = 1000;

/// The source could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The server could not be reached.
    #[error("NATS server unreachable at {address}: {reason}")]
    Unreachable {
        /// `host:port`.
        address: String,
        /// Why.
        reason: String,
    },
    /// The server runs without JetStream.
    #[error(
        "JetStream is not enabled on the NATS server at {address} ({reason}); start nats-server with `-js` (or `jetstream {{}}` in its config)"
    )]
    JetStreamDisabled {
        /// `host:port`.
        address: String,
        /// What the server answered.
        reason: String,
    },
    /// The stream does not exist and cannot be created.
    #[error("stream `{stream}` does not exist and could not be created: {reason}")]
    StreamMissing {
        /// The stream.
        stream: String,
        /// Why, and what to do.
        reason: String,
    },
    /// A stream, consumer or dead-letter destination exists with settings
    /// idem cannot use.
    #[error("{what} is incompatible: {reason}")]
    Incompatible {
        /// Which object.
        what: String,
        /// Which setting, and how to fix it.
        reason: String,
    },
    /// A request to the server failed.
    #[error("{what} failed: {reason}")]
    Request {
        /// What was asked.
        what: String,
        /// Why it failed.
        reason: String,
    },
}

fn request(what: impl Into<String>, e: impl std::fmt::Display) -> ConnectError {
    ConnectError::Request {
        what: what.into(),
        reason: e.to_string(),
    }
}

/// Connects to the server and checks that JetStream answers.
pub(crate) async fn jetstream(server: &Url) -> Result<context::Context, ConnectError> {
    let address = address_of(server);
    // rustls chooses a crypto provider by itself only when the program
    // links exactly one; ring is the one this crate asks for.
    let _ = async_nats::rustls::crypto::ring::default_provider().install_default();
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(server.as_str())
        .await
        .map_err(|e| ConnectError::Unreachable {
            address: address.clone(),
            reason: e.to_string(),
        })?;
    // The account info request answers whether JetStream is on (the
    // client's typed call cannot parse a 2.9 server's answer).
    let answer = client
        .request("$JS.API.INFO", bytes::Bytes::new())
        .await
        .map_err(|e| match e.kind() {
            async_nats::RequestErrorKind::NoResponders => ConnectError::JetStreamDisabled {
                address: address.clone(),
                reason: "nothing answers JetStream requests".into(),
            },
            _ => request(format!("asking {address} for its JetStream account"), e),
        })?;
    let info: serde_json::Value = serde_json::from_slice(&answer.payload)
        .map_err(|e| request(format!("reading {address}'s JetStream account"), e))?;
    if let Some(error) = info.get("error") {
        return Err(ConnectError::JetStreamDisabled {
            address,
            reason: error
                .get("description")
                .and_then(|d| d.as_str())
                .unwrap_or("an error")
                .to_owned(),
        });
    }
    let js = jetstream::new(client);
    Ok(js)
}

/// What the source consumes, once declared.
pub(crate) struct Declared {
    pub consumer: PullConsumer,
    pub ack_wait: Duration,
}

/// The stream (created with the subject when absent), its durable pull
/// consumer (created, or checked and raised to the settings asked for), and
/// a stream that stores the dead-letter subject.
pub(crate) async fn declare(
    js: &context::Context,
    config: &JetStreamConfig,
) -> Result<Declared, ConnectError> {
    let stream = declare_stream(js, config).await?;
    let consumer = declare_consumer(&stream, config).await?;
    declare_dead_letter(js, config).await?;
    let ack_wait = consumer.cached_info().config.ack_wait;
    Ok(Declared { consumer, ack_wait })
}

async fn declare_stream(
    js: &context::Context,
    config: &JetStreamConfig,
) -> Result<stream::Stream, ConnectError> {
    let name = &config.stream;
    match js.get_stream(name).await {
        Ok(stream) => {
            let subjects = &stream.cached_info().config.subjects;
            if let Some(wanted) = &config.subject
                && !subjects.iter().any(|s| subject::covers(s, wanted))
            {
                return Err(ConnectError::Incompatible {
                    what: format!("stream `{name}`"),
                    reason: format!(
                        "it captures {subjects:?}, not `{wanted}`; add the subject to the stream (`nats stream edit {name} --subjects ...`) or consume a subject it captures"
                    ),
                });
            }
            Ok(stream)
        }
        Err(e) if is_not_found(&e) => {
            let Some(wanted) = &config.subject else {
                return Err(ConnectError::StreamMissing {
                    stream: name.clone(),
                    reason:
                        "no `subject` was given to create it with (add `&subject=...` to the URL)"
                            .into(),
                });
            };
            match create_stream(js, name, wanted).await {
                Ok(stream) => Ok(stream),
                // Another process created it meanwhile.
                Err(_) if js.get_stream(name).await.is_ok() => {
                    Box::pin(declare_stream(js, config)).await
                }
                Err(e) => Err(ConnectError::StreamMissing {
                    stream: name.clone(),
                    reason: e.to_string(),
                }),
            }
        }
        Err(e) => Err(request(format!("looking up stream `{name}`"), e)),
    }
}

/// A file-backed stream named `name` capturing `subject`, with the server's
/// defaults otherwise (limits retention, a 2 minute duplicate window).
async fn create_stream(
    js: &context::Context,
    name: &str,
    subject: &str,
) -> Result<stream::Stream, context::CreateStreamError> {
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![subject.to_owned()],
        ..Default::default()
    })
    .await
}

fn is_not_found(e: &context::GetStreamError) -> bool {
    matches!(e.kind(), context::GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

async fn declare_consumer(
    stream: &stream::Stream,
    config: &JetStreamConfig,
) -> Result<PullConsumer, ConnectError> {
    let name = &config.consumer;
    let what = format!("consumer `{name}` on stream `{}`", config.stream);
    let wanted_pending = i64::try_from(config.concurrency).unwrap_or(i64::MAX);
    match stream.consumer_info(name).await {
        Ok(info) => {
            let existing = info.config;
            let fix = format!(
                "delete it (`nats consumer rm {} {name}`) to have it created anew, or choose another `consumer=`",
                config.stream
            );
            let refuse = |reason: String| ConnectError::Incompatible {
                what: what.clone(),
                reason: format!("{reason}; {fix}"),
            };
            if existing.deliver_subject.is_some() {
                return Err(refuse("it is a push consumer; idem pulls".into()));
            }
            if existing.ack_policy != AckPolicy::Explicit {
                return Err(refuse(format!(
                    "its ack policy is {:?}; idem acks each message explicitly",
                    existing.ack_policy
                )));
            }
            if existing.max_deliver > 0 {
                return Err(refuse(format!(
                    "its MaxDeliver is {}: the server would stop delivering a message without it being dead-lettered (idem decides that)",
                    existing.max_deliver
                )));
            }
            if let Some(wanted) = &config.subject
                && existing.filter_subject != *wanted
            {
                return Err(refuse(format!(
                    "its filter subject is `{}`, not `{wanted}`",
                    existing.filter_subject
                )));
            }
            let original = pull::Config::try_from_consumer_config(existing.clone())
                .map_err(|e| refuse(format!("it is not a pull consumer ({e})")))?;
            let mut updated = original.clone();
            if existing.max_ack_pending > 0 && existing.max_ack_pending < wanted_pending {
                updated.max_ack_pending = wanted_pending;
            }
            if let Some(ack_wait) = config.ack_wait {
                updated.ack_wait = ack_wait;
            }
            if updated == original {
                return stream
                    .get_consumer(name)
                    .await
                    .map_err(|e| request(format!("binding {what}"), e));
            }
            stream
                .create_consumer(updated)
                .await
                .map_err(|e| ConnectError::Incompatible {
                    what: what.clone(),
                    reason: format!(
                        "raising its max_ack_pending to {wanted_pending} or setting its AckWait failed ({e}); {fix}"
                    ),
                })
        }
        Err(e) if e.kind() == context::ConsumerInfoErrorKind::NotFound => stream
            .create_consumer(pull::Config {
                durable_name: Some(name.clone()),
                ack_policy: AckPolicy::Explicit,
                ack_wait: config.ack_wait.unwrap_or(DEFAULT_ACK_WAIT),
                max_deliver: -1,
                max_ack_pending: wanted_pending.max(SHARED_ACK_PENDING),
                filter_subject: config.subject.clone().unwrap_or_default(),
                ..Default::default()
            })
            .await
            .map_err(|e| request(format!("creating {what}"), e)),
        Err(e) => Err(request(format!("looking up {what}"), e)),
    }
}

async fn declare_dead_letter(
    js: &context::Context,
    config: &JetStreamConfig,
) -> Result<(), ConnectError> {
    let dead = config.dead_letter_subject();
    match js.stream_by_subject(dead.clone()).await {
        Ok(owner) if owner == config.stream => Err(ConnectError::Incompatible {
            what: format!("dead-letter subject `{dead}`"),
            reason: format!(
                "stream `{owner}` captures it, so dead letters would be consumed again; choose a dead-letter subject outside the stream's subjects"
            ),
        }),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == context::GetStreamByNameErrorKind::NotFound => {
            let name = subject::stream_name_for(&dead);
            match create_stream(js, &name, &dead).await {
                Ok(_) => Ok(()),
                // Another process created it meanwhile.
                Err(_) if js.stream_by_subject(dead.clone()).await.is_ok() => Ok(()),
                Err(e) => Err(ConnectError::StreamMissing {
                    stream: name,
                    reason: format!("it would keep the dead-letter subject `{dead}`: {e}"),
                }),
            }
        }
        Err(e) => Err(request(format!("looking up the stream of `{dead}`"), e)),
    }
}
