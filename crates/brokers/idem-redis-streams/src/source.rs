//! The consumer: reads, claims, settles.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::copy::{CopyValue, HeaderRules, copy_headers};
use idem_consumer::{DeadLetter, Delivery, Message, RetryReason, Source, SourceError};
use parking_lot::Mutex;
use redis::aio::ConnectionManager;
use redis::{Script, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::connect::{self, ConnectError};
use crate::entry::{self, ATTEMPTS, Entry, Fields};
use crate::{RedisStreamConfig, RedisStreamPublisher};

/// The longest one read blocks: a copy the retry set gives back waits at
/// most this long past its due time.
const MAX_BLOCK: Duration = Duration::from_millis(250);
/// How often the retry set is looked at when no copy is known to be due
/// sooner (copies other consumers parked, which they move back themselves
/// while they live).
const RETRY_POLL: Duration = Duration::from_secs(1);
/// Most copies moved back from the retry set in one call.
const PROMOTE_BATCH: usize = 1000;
/// How long a non-blocking command may take before it counts as failed.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// Consumes one stream through a consumer group, for the
/// [`Runner`](idem_consumer::Runner). Clones share the connections.
///
/// See the crate docs for the entry layout, how attempts are counted, and
/// where retries and dead letters go.
#[derive(Clone)]
pub struct RedisStreamSource {
    inner: Arc<Inner>,
}

struct Inner {
    stream: String,
    group: String,
    consumer: String,
    retry_set: String,
    dead_letter: String,
    count: usize,
    claim_idle: Duration,
    /// Settling and claiming.
    conn: ConnectionManager,
    /// Blocking reads only, so they never hold up an ack.
    reader: ConnectionManager,
    settle: Script,
    promote: Script,
    claim: Script,
    timers: Mutex<Timers>,
}

/// When the next claim and retry-set passes are due.
struct Timers {
    next_claim: Instant,
    cursor: String,
    next_promote: Instant,
}

/// A fetch's answer on its way; when the fetch is dropped after the answer
/// came, hands the answer back (when before, the reading task does).
struct Read {
    rx: Option<oneshot::Receiver<Result<Vec<Delivery<RedisStreamReceipt>>, SourceError>>>,
    source: RedisStreamSource,
}

impl Drop for Read {
    fn drop(&mut self) {
        let Some(Ok(Ok(answer))) = self.rx.take().map(|mut rx| rx.try_recv()) else {
            return;
        };
        let source = self.source.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(async move { source.hand_back(answer).await })),
            Err(_) => tracing::warn!(
                "entries read for a dropped fetch outside a runtime are claimed after the idle time"
            ),
        }
    }
}

/// What a consumer group has left to do (see
/// [`RedisStreamSource::backlog`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backlog {
    /// Entries in the stream the group has not read yet; `None` when Redis
    /// cannot tell (before 7.0, or after entries were deleted).
    pub unread: Option<u64>,
    /// Entries read by a consumer and not yet settled.
    pub pending: u64,
    /// Copies waiting in the retry set for their due time.
    pub delayed: u64,
}

impl Backlog {
    /// Nothing unread, pending or delayed.
    pub fn is_drained(&self) -> bool {
        self.unread == Some(0) && self.pending == 0 && self.delayed == 0
    }
}

/// What the source needs to settle one entry: its id, and its fields for a
/// copy.
#[derive(Debug)]
pub struct RedisStreamReceipt {
    id: String,
    fields: Fields,
}

impl RedisStreamReceipt {
    /// The entry's id in the stream.
    pub fn entry_id(&self) -> &str {
        &self.id
    }
}

impl RedisStreamSource {
    /// Connects, checks that the stream, its retry set and the dead-letter
    /// stream are absent or of the right type, and creates the consumer
    /// group (with the stream) unless it exists.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves at most the group created, which a later
    /// call finds and uses.
    pub async fn connect(config: RedisStreamConfig) -> Result<Self, ConnectError> {
        let mut conn = connect::open(&config, ANSWER_WITHIN).await?;
        let reader = connect::open(&config, MAX_BLOCK + ANSWER_WITHIN).await?;
        let dead_letter = config.dead_letter_stream();
        let retry_set = config.retry_set();
        connect::expect_type(&mut conn, &config, &config.stream, "stream").await?;
        connect::expect_type(&mut conn, &config, &retry_set, "zset").await?;
        connect::expect_type(&mut conn, &config, &dead_letter, "stream").await?;
        connect::declare_group(&mut conn, &config.stream, &config.group)
            .await
            .map_err(|e| {
                let what = format!(
                    "XGROUP CREATE {} {} 0 MKSTREAM",
                    config.stream, config.group
                );
                connect::refused(&config, what, e)
            })?;
        let consumer = config
            .consumer
            .clone()
            .unwrap_or_else(|| format!("idem-{}-{:08x}", std::process::id(), fastrand::u32(..)));
        let now = Instant::now();
        Ok(Self {
            inner: Arc::new(Inner {
                claim_idle: config.claim_idle_time(),
                stream: config.stream,
                group: config.group,
                consumer,
                retry_set,
                dead_letter,
                count: config.concurrency,
                conn,
                reader,
                settle: Script::new(include_str!("scripts/settle.lua")),
                promote: Script::new(include_str!("scripts/promote.lua")),
                claim: Script::new(include_str!("scripts/claim.lua")),
                timers: Mutex::new(Timers {
                    next_claim: now,
                    cursor: "0-0".into(),
                    next_promote: now,
                }),
            }),
        })
    }

    /// This consumer's name in the group.
    pub fn consumer(&self) -> &str {
        &self.inner.consumer
    }

    /// A publisher to the same stream, on this source's connection.
    pub fn publisher(&self) -> RedisStreamPublisher {
        RedisStreamPublisher::on(self.inner.conn.clone(), &self.inner.stream)
    }

    /// How much work the group has left: entries not yet read, read but
    /// not settled, and copies waiting in the retry set. For health checks,
    /// metrics and tests (`XINFO GROUPS` and `ZCARD`, one round trip).
    ///
    /// # Cancel safety
    ///
    /// Reads only; dropping it changes nothing.
    pub async fn backlog(&self) -> Result<Backlog, SourceError> {
        let i = &self.inner;
        let (groups, delayed): (Vec<HashMap<String, Value>>, u64) = redis::pipe()
            .cmd("XINFO")
            .arg("GROUPS")
            .arg(&i.stream)
            .cmd("ZCARD")
            .arg(&i.retry_set)
            .query_async(&mut i.conn.clone())
            .await
            .map_err(|e| SourceError::new(format!("reading the backlog of {}", i.stream), e))?;
        let group = groups
            .iter()
            .find(|g| g.get("name").and_then(entry::text).as_deref() == Some(i.group.as_str()));
        let field = |name: &str| {
            group
                .and_then(|g| g.get(name))
                .and_then(entry::int)
                .and_then(|n| u64::try_from(n).ok())
        };
        Ok(Backlog {
            unread: field("lag"),
            pending: field("pending").unwrap_or(0),
            delayed,
        })
    }

    /// What [`fetch`](Source::fetch) answers, read on the task it spawns.
    async fn read(&self, max: usize) -> Result<Vec<Delivery<RedisStreamReceipt>>, SourceError> {
        let i = &self.inner;
        let max = max.clamp(1, i.count.max(1));
        let claimed = self.claim_if_due(max).await?;
        if !claimed.is_empty() {
            return Ok(claimed);
        }
        self.promote_if_due().await?;
        let block = self.block_for();
        let reply: redis::RedisResult<Value> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&i.group)
            .arg(&i.consumer)
            .arg("COUNT")
            .arg(max)
            .arg("BLOCK")
            .arg(block.as_millis() as u64)
            .arg("STREAMS")
            .arg(&i.stream)
            .arg(">")
            .query_async(&mut i.reader.clone())
            .await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => return self.failed(format!("reading from {}", i.stream), e).await,
        };
        Ok(read_entries(reply)?
            .into_iter()
            .map(|e| delivery(e, 1))
            .collect())
    }

    /// Hands back entries read for a caller that left.
    async fn hand_back(&self, read: Vec<Delivery<RedisStreamReceipt>>) {
        for d in read {
            if let Err(e) = self.requeue(d).await {
                tracing::warn!(error = %e, "handing back an entry read for a dropped fetch failed; it is claimed after the idle time");
            }
        }
    }

    /// Claims up to `max` entries left idle by other consumers, when a
    /// claim pass is due.
    async fn claim_if_due(
        &self,
        max: usize,
    ) -> Result<Vec<Delivery<RedisStreamReceipt>>, SourceError> {
        let i = &self.inner;
        let cursor = {
            let t = i.timers.lock();
            if Instant::now() < t.next_claim {
                return Ok(Vec::new());
            }
            t.cursor.clone()
        };
        let reply: redis::RedisResult<Value> = i
            .claim
            .key(&i.stream)
            .arg(&i.group)
            .arg(&i.consumer)
            .arg(i.claim_idle.as_millis() as u64)
            .arg(&cursor)
            .arg(max)
            .invoke_async(&mut i.conn.clone())
            .await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                return self
                    .failed(format!("claiming idle entries of {}", i.stream), e)
                    .await;
            }
        };
        let (next, claimed) = match reply {
            Value::Array(parts) if parts.len() == 2 => {
                let next = entry::text(&parts[0]).unwrap_or_else(|| "0-0".into());
                let claimed = match &parts[1] {
                    Value::Array(items) => items
                        .iter()
                        .filter_map(|item| match item {
                            Value::Array(t) if t.len() == 3 => {
                                let e = Entry::parse(&t[0], &t[1])?;
                                let deliveries = entry::int(&t[2]).unwrap_or(1);
                                Some(delivery(e, u32::try_from(deliveries).unwrap_or(u32::MAX)))
                            }
                            _ => None,
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                (next, claimed)
            }
            other => return Err(unexpected("the claim script", &other)),
        };
        let mut t = i.timers.lock();
        t.next_claim = if next == "0-0" {
            Instant::now()
                + (i.claim_idle / 2).clamp(Duration::from_millis(20), Duration::from_secs(5))
        } else {
            Instant::now()
        };
        t.cursor = next;
        if !claimed.is_empty() {
            tracing::info!(stream = %i.stream, count = claimed.len(), "claimed entries another consumer left idle");
        }
        Ok(claimed)
    }

    /// A read or claim failed with `e`. When the group is gone (the stream
    /// was deleted since connect), declares it again, as connect does, and
    /// answers that nothing was read.
    async fn failed(
        &self,
        what: String,
        e: redis::RedisError,
    ) -> Result<Vec<Delivery<RedisStreamReceipt>>, SourceError> {
        let i = &self.inner;
        if e.code() != Some("NOGROUP") {
            return Err(SourceError::new(what, e));
        }
        tracing::warn!(stream = %i.stream, group = %i.group, "the consumer group is gone; creating it again");
        connect::declare_group(&mut i.conn.clone(), &i.stream, &i.group)
            .await
            .map_err(|e| {
                SourceError::new(
                    format!("creating group {} again on {}", i.group, i.stream),
                    e,
                )
            })?;
        Ok(Vec::new())
    }

    /// Moves due copies from the retry set back into the stream, when a
    /// pass is due.
    async fn promote_if_due(&self) -> Result<(), SourceError> {
        let i = &self.inner;
        if Instant::now() < i.timers.lock().next_promote {
            return Ok(());
        }
        let (moved, until_next): (usize, i64) = i
            .promote
            .key(&i.retry_set)
            .key(&i.stream)
            .arg(PROMOTE_BATCH)
            .invoke_async(&mut i.conn.clone())
            .await
            .map_err(|e| {
                SourceError::new(format!("moving due retries back into {}", i.stream), e)
            })?;
        let wait = if moved >= PROMOTE_BATCH {
            Duration::ZERO
        } else if until_next >= 0 {
            Duration::from_millis(until_next as u64).min(RETRY_POLL)
        } else {
            RETRY_POLL
        };
        i.timers.lock().next_promote = Instant::now() + wait;
        Ok(())
    }

    /// How long the next read may block: until the next claim or retry pass
    /// at most.
    fn block_for(&self) -> Duration {
        let t = self.inner.timers.lock();
        let now = Instant::now();
        t.next_claim
            .min(t.next_promote)
            .saturating_duration_since(now)
            .clamp(Duration::from_millis(1), MAX_BLOCK)
    }

    /// Acks the entry and writes `fields` to `target` (`later` by `delay`
    /// in the retry set), in one step; nothing is written when the entry was
    /// settled meanwhile by a consumer that claimed it.
    async fn settle_with_copy(
        &self,
        receipt: &RedisStreamReceipt,
        target: &str,
        delay: Option<Duration>,
        fields: &[(Bytes, Bytes)],
        what: &str,
    ) -> Result<(), SourceError> {
        let i = &self.inner;
        let mut call = i.settle.key(&i.stream);
        call.key(target)
            .arg(&i.group)
            .arg(&receipt.id)
            .arg(if delay.is_some() { "later" } else { "now" })
            .arg(delay.unwrap_or_default().as_millis() as u64);
        for (name, value) in fields {
            call.arg(name.as_ref()).arg(value.as_ref());
        }
        let acked: i64 = call.invoke_async(&mut i.conn.clone()).await.map_err(|e| {
            SourceError::new(format!("{what} entry {} of {}", receipt.id, i.stream), e)
        })?;
        if acked == 0 {
            tracing::debug!(entry = %receipt.id, stream = %i.stream, "entry was settled by another consumer; no copy written");
        }
        Ok(())
    }
}

/// Group `group`'s `lag` in an `XINFO GROUPS` answer (a list of maps, or
/// of flat field-value lists on RESP2): `Ok(None)` when Redis has no such
/// field (before 7.0), an error when it cannot count it now or the group
/// is missing.
fn group_lag(groups: &Value, group: &str) -> Result<Option<u64>, &'static str> {
    let Value::Array(groups) = groups else {
        return Err("XINFO GROUPS answered something else than a list");
    };
    for g in groups {
        let pairs: Vec<(&Value, &Value)> = match g {
            Value::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
            Value::Array(flat) => flat.chunks_exact(2).map(|p| (&p[0], &p[1])).collect(),
            _ => continue,
        };
        let field = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| entry::text(k).as_deref() == Some(name))
                .map(|(_, v)| *v)
        };
        if field("name").and_then(entry::text).as_deref() != Some(group) {
            continue;
        }
        return match field("lag") {
            None => Ok(None),
            Some(lag) => entry::int(lag)
                .and_then(|n| u64::try_from(n).ok())
                .map(Some)
                .ok_or("Redis cannot count the group's lag now (entries were deleted)"),
        };
    }
    Err("the group is missing")
}

/// The fields of a copy of an entry with `fields`: the entry's, less those
/// named in `idem` (which replace them), then `idem`'s, escaped by
/// `copy_headers`. A field name need not be UTF-8: the original's are
/// compared as lossy text (so a name that is not text never matches one of
/// idem's) and written back as they came.
fn copy_fields(fields: &[(Bytes, Bytes)], idem: &[(&str, &str)]) -> Fields {
    let original = fields
        .iter()
        .map(|(name, value)| (String::from_utf8_lossy(name), (name, value)));
    copy_headers(original, HeaderRules::PLAIN, idem)
        .into_iter()
        .map(|(name, value)| match value {
            CopyValue::Original((name, value)) => (name.clone(), value.clone()),
            CopyValue::Idem(value) => (Bytes::from(name), Bytes::from(value)),
        })
        .collect()
}

/// The fields of a retry or hand-back copy that has used up `used`
/// attempts.
fn with_attempts(fields: &[(Bytes, Bytes)], used: u32) -> Fields {
    copy_fields(fields, &[(ATTEMPTS, &used.to_string())])
}

fn delivery(entry: Entry, deliveries: u32) -> Delivery<RedisStreamReceipt> {
    let message: Message = entry.message(deliveries);
    Delivery {
        message,
        receipt: RedisStreamReceipt {
            id: entry.id,
            fields: entry.fields,
        },
    }
}

fn unexpected(what: &str, reply: &Value) -> SourceError {
    SourceError::new(
        format!("reading the answer to {what}"),
        format!("unexpected reply {reply:?}"),
    )
}

/// Entries of an `XREADGROUP` reply (RESP2 arrays or RESP3 maps).
fn read_entries(reply: Value) -> Result<Vec<Entry>, SourceError> {
    let streams = match reply {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(streams) => streams
            .into_iter()
            .filter_map(|s| match s {
                Value::Array(mut pair) if pair.len() == 2 => pair.pop(),
                _ => None,
            })
            .collect::<Vec<_>>(),
        Value::Map(streams) => streams.into_iter().map(|(_, entries)| entries).collect(),
        other => return Err(unexpected("XREADGROUP", &other)),
    };
    let mut out = Vec::new();
    for entries in streams {
        let Value::Array(entries) = entries else {
            continue;
        };
        for e in entries {
            match e {
                Value::Array(pair) if pair.len() == 2 => {
                    // A deleted entry reads as nil fields: nothing to handle.
                    if let Some(entry) = Entry::parse(&pair[0], &pair[1]) {
                        out.push(entry);
                    }
                }
                other => return Err(unexpected("XREADGROUP", &other)),
            }
        }
    }
    Ok(out)
}

impl Source for RedisStreamSource {
    type Receipt = RedisStreamReceipt;

    fn name(&self) -> &str {
        &self.inner.stream
    }

    /// The group's `lag` as `XINFO GROUPS` tells it (Redis 7.0 or later:
    /// entries not yet delivered to the group); `None` on an older Redis.
    async fn lag(&self) -> Result<Option<u64>, SourceError> {
        let i = &self.inner;
        let groups: Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&i.stream)
            .query_async(&mut i.conn.clone())
            .await
            .map_err(|e| SourceError::new(format!("reading the lag of group {}", i.group), e))?;
        group_lag(&groups, &i.group)
            .map_err(|why| SourceError::new(format!("reading the lag of group {}", i.group), why))
    }

    /// First entries other consumers left idle longer than the claim idle
    /// time (`XAUTOCLAIM`, every half of it, at least every 5 s), then new
    /// entries (`XREADGROUP … >`, blocking up to 250 ms); before reading,
    /// moves due copies from the retry set back into the stream. The
    /// reading runs in a task of its own, so that a dropped call can hand
    /// back what it read.
    ///
    /// # Cancel safety
    ///
    /// Entries read for a dropped call are handed back at once (as
    /// [`requeue`](Self::requeue) does), so a consumer that stops while a
    /// read is blocked (the runner at shutdown) does not keep them. If the
    /// process stops before that, they stay pending in the group and are
    /// claimed by another consumer after the claim idle time.
    async fn fetch(&self, max: usize) -> Result<Vec<Delivery<RedisStreamReceipt>>, SourceError> {
        let (tx, rx) = oneshot::channel();
        let this = self.clone();
        tokio::spawn(async move {
            let read = this.read(max).await;
            if let Err(Ok(unwanted)) = tx.send(read) {
                this.hand_back(unwanted).await;
            }
        });
        let mut read = Read {
            rx: Some(rx),
            source: self.clone(),
        };
        let rx = read.rx.as_mut().expect("taken only here");
        let answer = rx.await;
        read.rx = None;
        answer.unwrap_or_else(|_| {
            Err(SourceError::new(
                format!("reading from {}", self.inner.stream),
                "the reading task stopped",
            ))
        })
    }

    /// `XACK`.
    ///
    /// # Cancel safety
    ///
    /// A dropped ack may or may not have reached Redis; an entry left
    /// pending is claimed after the claim idle time and acked as a
    /// duplicate.
    async fn ack(&self, delivery: Delivery<RedisStreamReceipt>) -> Result<(), SourceError> {
        let i = &self.inner;
        let _: i64 = redis::cmd("XACK")
            .arg(&i.stream)
            .arg(&i.group)
            .arg(&delivery.receipt.id)
            .query_async(&mut i.conn.clone())
            .await
            .map_err(|e| {
                SourceError::new(
                    format!("acking entry {} of {}", delivery.receipt.id, i.stream),
                    e,
                )
            })?;
        Ok(())
    }

    /// Acks the entry and parks a copy in the retry set (`<stream>.retry`),
    /// due after `delay` on Redis's clock, in one script; the copy's
    /// `idem-attempts` counts this attempt only for
    /// [`RetryReason::Failed`].
    ///
    /// # Cancel safety
    ///
    /// The script runs whole or not at all; if it did not, the entry stays
    /// pending and is claimed after the claim idle time.
    async fn retry(
        &self,
        delivery: Delivery<RedisStreamReceipt>,
        delay: Duration,
        reason: RetryReason,
    ) -> Result<(), SourceError> {
        let attempt = delivery.message.attempt.max(1);
        let used = if reason.counts_as_attempt() {
            attempt
        } else {
            attempt - 1
        };
        let fields = with_attempts(&delivery.receipt.fields, used);
        let i = &self.inner;
        let (target, later) = if delay.is_zero() {
            (&i.stream, None)
        } else {
            (&i.retry_set, Some(delay))
        };
        self.settle_with_copy(&delivery.receipt, target, later, &fields, "retrying")
            .await?;
        let mut t = i.timers.lock();
        t.next_promote = t.next_promote.min(Instant::now() + delay);
        Ok(())
    }

    /// Acks the entry and adds it to the dead-letter stream with its fields
    /// and `idem-key`, `idem-attempts`, `idem-last-error`, in one script.
    ///
    /// # Cancel safety
    ///
    /// As [`retry`](Self::retry).
    async fn dead_letter(
        &self,
        delivery: Delivery<RedisStreamReceipt>,
        why: DeadLetter,
    ) -> Result<(), SourceError> {
        let why = why.headers();
        let idem: Vec<(&str, &str)> = why.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let fields = copy_fields(&delivery.receipt.fields, &idem);
        let dead = self.inner.dead_letter.clone();
        self.settle_with_copy(&delivery.receipt, &dead, None, &fields, "dead-lettering")
            .await
    }

    /// Acks the entry and adds a copy at the stream's end for immediate
    /// redelivery, in one script; the copy's `idem-attempts` does not count
    /// this attempt. (Leaving the entry pending instead would delay it by
    /// the claim idle time.)
    ///
    /// # Cancel safety
    ///
    /// As [`retry`](Self::retry).
    async fn requeue(&self, delivery: Delivery<RedisStreamReceipt>) -> Result<(), SourceError> {
        let used = delivery.message.attempt.max(1) - 1;
        let fields = with_attempts(&delivery.receipt.fields, used);
        let stream = self.inner.stream.clone();
        self.settle_with_copy(&delivery.receipt, &stream, None, &fields, "handing back")
            .await
    }

    fn keep_alive_every(&self) -> Option<Duration> {
        Some(self.inner.claim_idle / 3)
    }

    /// Resets the entry's idle time (`XCLAIM … 0 id JUSTID`, which does not
    /// count a delivery), so no other consumer claims it while the handler
    /// works.
    ///
    /// # Cancel safety
    ///
    /// Dropping it only skips one refresh.
    async fn keep_alive(&self, receipt: &RedisStreamReceipt) -> Result<(), SourceError> {
        let i = &self.inner;
        let _: Value = redis::cmd("XCLAIM")
            .arg(&i.stream)
            .arg(&i.group)
            .arg(&i.consumer)
            .arg(0)
            .arg(&receipt.id)
            .arg("JUSTID")
            .query_async(&mut i.conn.clone())
            .await
            .map_err(|e| {
                SourceError::new(
                    format!("refreshing entry {} of {}", receipt.id, i.stream),
                    e,
                )
            })?;
        Ok(())
    }
}
