//! The dead-letter stream seen from outside the runner (`idem dlq`): its
//! entries read with `XRANGE`, and each replayed entry moved back to the
//! work stream by one script (`XADD` there, `XDEL` here), so an entry is
//! never both replayed and still parked, and two operators replaying at
//! once move it once. A dropped entry is removed with `XDEL`.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use idem_consumer::SourceError;
use idem_consumer::dlq::{Before, Choose, DeadLetterQueue, Parked, Settle, Settled};
use redis::Value;
use redis::aio::ConnectionManager;

use crate::entry::{BODY, bytes, text};
use crate::{ConnectError, RedisStreamConfig};

/// Entries one `XRANGE` reads.
const PAGE: usize = 500;

/// Moves entry `ARGV[1]` of the dead-letter stream `KEYS[1]` to the work
/// stream `KEYS[2]` with the fields `ARGV[2..]`, if it is still parked.
const MOVE: &str = r"
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return 0
end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], ARGV[1])
return 1
";

/// A Redis Streams source's dead-letter stream.
pub struct RedisStreamDeadLetters {
    conn: ConnectionManager,
    stream: String,
    dead_letter: String,
    mover: redis::Script,
}

impl RedisStreamDeadLetters {
    /// Connects to the dead-letter stream of the source `config` describes
    /// (`<stream>.dead-letter` unless it names another).
    ///
    /// # Cancel safety
    ///
    /// Dropping it leaves nothing behind.
    pub async fn connect(config: RedisStreamConfig) -> Result<Self, ConnectError> {
        let mut conn = crate::connect::open(&config, Duration::from_secs(10)).await?;
        let dead_letter = config.dead_letter_stream();
        crate::connect::expect_type(&mut conn, &config, &dead_letter, "stream").await?;
        Ok(Self {
            conn,
            stream: config.stream().to_owned(),
            dead_letter,
            mover: redis::Script::new(MOVE),
        })
    }

    /// Up to `count` entries after `after` (exclusive), oldest first.
    async fn page(&self, after: Option<&str>, count: usize) -> Result<Vec<Parked>, SourceError> {
        let start = after.map_or("-".to_owned(), |id| format!("({id}"));
        let reply: Value = redis::cmd("XRANGE")
            .arg(&self.dead_letter)
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| SourceError::new(format!("reading {}", self.dead_letter), e))?;
        let Value::Array(entries) = reply else {
            return Ok(Vec::new());
        };
        Ok(entries.iter().filter_map(parked).collect())
    }
}

/// A dead letter from one `XRANGE` entry: every field but `body` as a
/// header, dated by its id's milliseconds.
fn parked(entry: &Value) -> Option<Parked> {
    let Value::Array(parts) = entry else {
        return None;
    };
    let [id, Value::Array(flat)] = parts.as_slice() else {
        return None;
    };
    let id = text(id)?;
    let mut headers = Vec::with_capacity(flat.len() / 2);
    let mut body = Bytes::new();
    for pair in flat.chunks_exact(2) {
        let (name, value) = (bytes(&pair[0])?, bytes(&pair[1])?);
        if name.as_ref() == BODY.as_bytes() {
            body = value;
        } else {
            headers.push((String::from_utf8_lossy(&name).into_owned(), value));
        }
    }
    let parked_at = id
        .split_once('-')
        .and_then(|(ms, _)| ms.parse::<u64>().ok())
        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
    Some(Parked {
        id,
        parked_at,
        headers,
        body,
    })
}

impl DeadLetterQueue for RedisStreamDeadLetters {
    fn name(&self) -> &str {
        &self.dead_letter
    }

    fn work_name(&self) -> &str {
        &self.stream
    }

    fn peek(&self, limit: usize) -> BoxFuture<'_, Result<Vec<Parked>, SourceError>> {
        async move {
            let mut out: Vec<Parked> = Vec::new();
            while out.len() < limit {
                let after = out.last().map(|p| p.id.clone());
                let page = self
                    .page(after.as_deref(), PAGE.min(limit - out.len()))
                    .await?;
                if page.is_empty() {
                    break;
                }
                out.extend(page);
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
            let mut after: Option<String> = None;
            while done < limit {
                let page = self.page(after.as_deref(), PAGE).await?;
                let Some(last) = page.last() else {
                    break;
                };
                after = Some(last.id.clone());
                for p in page.into_iter().filter(|p| choose(p)) {
                    if done == limit {
                        break;
                    }
                    if !before(&p).await? {
                        continue;
                    }
                    let what = match how {
                        Settle::Replay => format!(
                            "moving entry {} of {} to {}",
                            p.id, self.dead_letter, self.stream
                        ),
                        Settle::Drop => format!("removing entry {} of {}", p.id, self.dead_letter),
                    };
                    let changed: i64 = match how {
                        Settle::Replay => {
                            let mut call = self.mover.key(&self.dead_letter);
                            call.key(&self.stream).arg(&p.id);
                            for (name, value) in p.replay_headers(&self.dead_letter) {
                                call.arg(name).arg(value.as_ref());
                            }
                            call.arg(BODY).arg(p.body.as_ref());
                            call.invoke_async(&mut self.conn.clone()).await
                        }
                        Settle::Drop => {
                            redis::cmd("XDEL")
                                .arg(&self.dead_letter)
                                .arg(&p.id)
                                .query_async(&mut self.conn.clone())
                                .await
                        }
                    }
                    .map_err(|e| SourceError::new(what, e))?;
                    // 0: another run settled it first.
                    if changed == 1 {
                        settled(&p);
                        done += 1;
                    }
                }
            }
            Ok(done)
        }
        .boxed()
    }
}
