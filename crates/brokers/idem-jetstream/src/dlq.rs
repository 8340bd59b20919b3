//! The dead-letter subject seen from outside the runner (`idem dlq`): its
//! messages read one by one from the stream that keeps it (by sequence, so
//! nothing is consumed), and each replayed one published back to the work
//! stream (waiting for the stream's ack) and then deleted from the
//! dead-letter stream.
//!
//! A replayed copy goes to the subject its original was published to (the
//! dead letter's `idem-subject`), keeps its producer's id in
//! `idem-message-id` (which the source reads as the message id, so a key
//! taken from the message id stays the same), and has the `Nats-Msg-Id`
//! `replay:<dead-letter subject>:<sequence>`: a replay published twice
//! within the work stream's duplicate window is stored once, and a replay
//! is never taken for a duplicate of its original.

use std::str::FromStr as _;
use std::time::{Duration, SystemTime};

use async_nats::HeaderMap;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context;
use async_nats::jetstream::stream::{DeleteMessageErrorKind, LastRawMessageErrorKind, Stream};
use async_nats::{HeaderName, HeaderValue};
use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use idem_consumer::SourceError;
use idem_consumer::dlq::{Before, Choose, DeadLetterQueue, Parked, Settle, Settled};

use crate::{ConnectError, JetStreamConfig};

/// A JetStream source's dead-letter subject and the stream keeping it.
pub struct JetStreamDeadLetters {
    js: context::Context,
    stream: Stream,
    dead_letter: String,
    work_subject: String,
}

impl JetStreamDeadLetters {
    /// Connects to the dead-letter subject of the source `config` describes
    /// (`<stream>.dead-letter` unless it names another). Replays go to each
    /// message's original subject.
    ///
    /// # Cancel safety
    ///
    /// Dropping it leaves nothing behind.
    pub async fn connect(config: JetStreamConfig) -> Result<Self, ConnectError> {
        let js = crate::connect::jetstream(&config.server).await?;
        let dead_letter = config.dead_letter_subject();
        let owner = js
            .stream_by_subject(dead_letter.clone())
            .await
            .map_err(|e| ConnectError::StreamMissing {
                stream: dead_letter.clone(),
                reason: format!("no stream keeps the dead-letter subject: {e}"),
            })?;
        let stream = js
            .get_stream(&owner)
            .await
            .map_err(|e| ConnectError::StreamMissing {
                stream: owner.clone(),
                reason: e.to_string(),
            })?;
        let work_subject = match config.subject() {
            Some(s) => s.to_owned(),
            None => {
                let work = js.get_stream(config.stream()).await.map_err(|e| {
                    ConnectError::StreamMissing {
                        stream: config.stream().to_owned(),
                        reason: e.to_string(),
                    }
                })?;
                work.cached_info().config.subjects.join(",")
            }
        };
        Ok(Self {
            js,
            stream,
            dead_letter,
            work_subject,
        })
    }

    /// The first dead letter at or after stream sequence `from`.
    async fn at_or_after(&self, from: u64) -> Result<Option<Parked>, SourceError> {
        let found = self
            .stream
            .get_first_raw_message_by_subject(&self.dead_letter, from)
            .await;
        let m = match found {
            Ok(m) => m,
            Err(e)
                if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound)
                    || matches!(e.kind(), LastRawMessageErrorKind::JetStream(j)
                        if j.error_code() == ErrorCode::NO_MESSAGE_FOUND) =>
            {
                return Ok(None);
            }
            Err(e) => {
                return Err(SourceError::new(
                    format!("reading `{}` from sequence {from}", self.dead_letter),
                    e,
                ));
            }
        };
        let headers = m
            .headers
            .iter()
            .flat_map(|(name, values)| {
                values.iter().map(move |v| {
                    (
                        AsRef::<str>::as_ref(name).to_owned(),
                        Bytes::copy_from_slice(v.as_str().as_bytes()),
                    )
                })
            })
            .collect();
        let nanos = u64::try_from(m.time.unix_timestamp_nanos()).unwrap_or(0);
        Ok(Some(Parked {
            id: m.sequence.to_string(),
            parked_at: Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos)),
            headers,
            body: m.payload,
        }))
    }

    /// The headers of `p`'s replayed copy: its own (see
    /// [`Parked::replay_headers`]) less `idem-subject` and the dead
    /// letter's `Nats-Msg-Id`, with a replay id as `Nats-Msg-Id`.
    fn replay_headers(&self, p: &Parked) -> Result<HeaderMap, SourceError> {
        let mut headers = HeaderMap::new();
        let replay_id = format!("replay:{}:{}", self.dead_letter, p.id);
        let own = p
            .replay_headers(&self.dead_letter)
            .into_iter()
            .filter(|(name, _)| {
                !name.eq_ignore_ascii_case("Nats-Msg-Id")
                    && !name.eq_ignore_ascii_case("idem-subject")
            });
        for (name, value) in own.chain([("Nats-Msg-Id".to_owned(), Bytes::from(replay_id))]) {
            let value = String::from_utf8_lossy(&value);
            let bad = |e: String| SourceError::new(format!("copying header `{name}`"), e);
            headers.append(
                HeaderName::from_str(&name).map_err(|e| bad(e.to_string()))?,
                HeaderValue::from_str(&value).map_err(|e| bad(e.to_string()))?,
            );
        }
        Ok(headers)
    }

    /// Where `p` is replayed to: its original subject, else the source's
    /// subject when that names one subject.
    fn target(&self, p: &Parked) -> Result<String, SourceError> {
        if let Some(s) = p.header("idem-subject") {
            return Ok(s);
        }
        if !self.work_subject.contains(['*', '>']) {
            return Ok(self.work_subject.clone());
        }
        Err(SourceError::new(
            format!("replaying {}/{}", self.dead_letter, p.id),
            format!(
                "it does not say which subject it came from (dead-lettered by an older idem), and `{}` is a wildcard: give the source URL `&subject=` one subject",
                self.work_subject
            ),
        ))
    }
}

/// Whether a delete failed because the message is gone already: NATS says
/// "no message found" under either of two codes, by version.
fn already_gone(kind: &DeleteMessageErrorKind) -> bool {
    match kind {
        DeleteMessageErrorKind::JetStream(j) => {
            j.error_code() == ErrorCode::NO_MESSAGE_FOUND
                || (j.error_code() == ErrorCode::STREAM_MESSAGE_DELETE_FAILED
                    && j.to_string().contains("no message found"))
        }
        _ => false,
    }
}

impl DeadLetterQueue for JetStreamDeadLetters {
    fn name(&self) -> &str {
        &self.dead_letter
    }

    fn work_name(&self) -> &str {
        &self.work_subject
    }

    fn peek(&self, limit: usize) -> BoxFuture<'_, Result<Vec<Parked>, SourceError>> {
        async move {
            let mut out: Vec<Parked> = Vec::new();
            let mut from = 1;
            while out.len() < limit {
                let Some(p) = self.at_or_after(from).await? else {
                    break;
                };
                from = p.id.parse::<u64>().unwrap_or(u64::MAX).saturating_add(1);
                out.push(p);
            }
            Ok(out)
        }
        .boxed()
    }

    fn settle<'a>(
        &'a self,
        how: Settle,
        choose: Choose<'a>,
        limit: usize,
        before: Before<'a>,
        settled: Settled<'a>,
    ) -> BoxFuture<'a, Result<usize, SourceError>> {
        async move {
            let mut done = 0;
            let mut from = 1;
            while done < limit {
                let Some(p) = self.at_or_after(from).await? else {
                    break;
                };
                let sequence = p.id.parse::<u64>().unwrap_or(u64::MAX);
                from = sequence.saturating_add(1);
                if !choose(&p) {
                    continue;
                }
                if !before(&p).await? {
                    continue;
                }
                if how == Settle::Replay {
                    let target = self.target(&p)?;
                    let what = format!("replaying {}/{} to `{target}`", self.dead_letter, p.id);
                    let headers = self.replay_headers(&p)?;
                    // A duplicate (the same replay id within the stream's
                    // duplicate window) means another run replayed this
                    // dead letter first: no second copy is stored.
                    self.js
                        .publish_with_headers(target, headers, p.body.clone())
                        .await
                        .map_err(|e| SourceError::new(what.clone(), e))?
                        .await
                        .map_err(|e| SourceError::new(what.clone(), e))?;
                }
                match self.stream.delete_message(sequence).await {
                    Ok(_) => {}
                    // Removed by another run meanwhile: settled, not by us.
                    Err(e) if already_gone(&e.kind()) => continue,
                    Err(e) => {
                        return Err(SourceError::new(
                            format!("removing {}/{}", self.dead_letter, p.id),
                            e,
                        ));
                    }
                }
                settled(&p);
                done += 1;
            }
            Ok(done)
        }
        .boxed()
    }
}
