//! Dead-letter queues seen from outside the runner: what an operator lists,
//! reads and replays after a fix (`idem dlq`).
//!
//! Each broker crate implements [`DeadLetterQueue`] on its own
//! dead-letter destination (a RabbitMQ queue, a JetStream stream's subject,
//! a Redis stream, a Kafka topic, a RocketMQ `%DLQ%` topic). A replayed
//! message goes back to the work queue or topic with its body and its own
//! headers, without `idem-attempts` and `idem-last-error` (so it has a
//! whole attempt budget again), and with `idem-replayed-from` naming where
//! it was parked; then it leaves the dead-letter queue, where the broker
//! can remove one message (Kafka keeps it: its topics are logs).

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::future::BoxFuture;

use crate::SourceError;

/// The header a dead letter carries its key in.
pub const KEY_HEADER: &str = "idem-key";
/// The header a dead letter carries its attempt count in.
pub const ATTEMPTS_HEADER: &str = "idem-attempts";
/// The header a dead letter carries the last error in.
pub const LAST_ERROR_HEADER: &str = "idem-last-error";
/// The header a dead letter carries the time it was parked in, in
/// milliseconds since the Unix epoch.
pub const PARKED_AT_HEADER: &str = "idem-dead-lettered-at";
/// The header a replayed message carries: where it was parked.
pub const REPLAYED_FROM_HEADER: &str = "idem-replayed-from";

/// The outcome the runner stores for a key whose message it dead-lettered
/// after the handler failed: a later copy of the message is then acked as
/// a duplicate (its dead letter is parked already) instead of running and
/// being parked again, for the guard's retention. A copy replayed by an
/// operator (it carries [`REPLAYED_FROM_HEADER`]) reopens the key
/// ([`Store::reopen`](idem_core::Store::reopen)) and runs. It starts with
/// the byte `0xff`, which no UTF-8 text holds, so no text outcome of a
/// handler is ever taken for it.
pub const DEAD_LETTERED: &[u8] = b"\xffidem:dead-lettered";

/// Whether `outcome` is the one the runner stores for a dead-lettered key
/// ([`DEAD_LETTERED`]).
pub fn is_dead_lettered(outcome: Option<&[u8]>) -> bool {
    outcome == Some(DEAD_LETTERED)
}

/// One dead letter, as its queue holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parked {
    /// Where the queue keeps it: a stream entry id, a sequence number,
    /// `partition:offset`, a position in a queue. What `--id` selects.
    pub id: String,
    /// When it was parked, where the broker tells.
    pub parked_at: Option<SystemTime>,
    /// Its headers (or stream fields), idem's among them, as stored.
    pub headers: Vec<(String, Bytes)>,
    /// Its body.
    pub body: Bytes,
}

impl Parked {
    /// The value of header `name` (compared without regard to case), as
    /// text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    /// Its idempotency key (`idem-key`).
    pub fn key(&self) -> Option<String> {
        self.header(KEY_HEADER)
    }

    /// Handler attempts made before it was parked (`idem-attempts`).
    pub fn attempts(&self) -> Option<u32> {
        self.header(ATTEMPTS_HEADER)
            .and_then(|a| a.trim().parse().ok())
    }

    /// Why it was parked (`idem-last-error`).
    pub fn last_error(&self) -> Option<String> {
        self.header(LAST_ERROR_HEADER)
    }

    /// Its headers as the replayed copy carries them: its own, less
    /// `idem-attempts`, `idem-last-error`, `idem-dead-lettered-at` and any
    /// earlier `idem-replayed-from`, then `idem-replayed-from: <queue>/<id>`.
    pub fn replay_headers(&self, queue: &str) -> Vec<(String, Bytes)> {
        let dropped = [
            ATTEMPTS_HEADER,
            LAST_ERROR_HEADER,
            PARKED_AT_HEADER,
            REPLAYED_FROM_HEADER,
        ];
        let mut out: Vec<(String, Bytes)> = self
            .headers
            .iter()
            .filter(|(n, _)| !dropped.iter().any(|d| n.eq_ignore_ascii_case(d)))
            .cloned()
            .collect();
        let from = crate::copy::header_text(&format!("{queue}/{}", self.id)).into_owned();
        out.push((REPLAYED_FROM_HEADER.to_owned(), Bytes::from(from)));
        out
    }
}

/// Which dead letters to replay: those matching every criterion given.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Only these keys (any, when empty).
    pub keys: Vec<String>,
    /// Only these ids (any, when empty).
    pub ids: Vec<String>,
    /// Only those parked longer ago than this.
    pub older_than: Option<Duration>,
    /// Only those parked more recently than this.
    pub newer_than: Option<Duration>,
}

impl Selection {
    /// Whether `parked` is chosen, at `now`. A dead letter whose broker
    /// does not date it never matches an age criterion.
    pub fn admits(&self, parked: &Parked, now: SystemTime) -> bool {
        let key_ok = self.keys.is_empty() || parked.key().is_some_and(|k| self.keys.contains(&k));
        let id_ok = self.ids.is_empty() || self.ids.contains(&parked.id);
        let age = parked
            .parked_at
            .map(|t| now.duration_since(t).unwrap_or_default());
        let older_ok = self
            .older_than
            .is_none_or(|d| age.is_some_and(|age| age > d));
        let newer_ok = self
            .newer_than
            .is_none_or(|d| age.is_some_and(|age| age < d));
        key_ok && id_ok && older_ok && newer_ok
    }
}

/// A predicate that picks dead letters for [`DeadLetterQueue::settle`].
pub type Choose<'a> = &'a (dyn Fn(&Parked) -> bool + Send + Sync);

/// What [`DeadLetterQueue::settle`] does with each dead letter it picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// Republish it to the work queue or topic, then remove it.
    Replay,
    /// Remove it, for good (an operator decided it must not run).
    Drop,
}

/// Called on each dead letter as soon as it is settled, before the next
/// is read: whatever becomes of the rest, what was done is known (and
/// logged) one letter at a time.
pub type Settled<'a> = &'a (dyn Fn(&Parked) + Send + Sync);

/// What runs on each chosen dead letter before it is republished (the
/// operator's tool releases its key there): `true` to replay it, `false`
/// to leave it parked; an error leaves it parked and stops the replay.
pub type Before<'a> =
    &'a (dyn Fn(&Parked) -> BoxFuture<'a, Result<bool, SourceError>> + Send + Sync);

/// A dead-letter queue an operator can read and replay.
///
/// # Cancel safety
///
/// `peek` leaves the queue as it was. `settle` moves one message at a
/// time, publishing its copy (confirmed) before removing the original: a
/// replay dropped part way has moved some messages and not others (each
/// reported through `settled` as it went), and at worst one message is
/// both replayed and still parked (the guard absorbs the duplicate if it
/// is replayed again).
pub trait DeadLetterQueue: Send + Sync {
    /// Where dead letters are parked, for people: `orders.dead-letter`.
    fn name(&self) -> &str;

    /// Where replayed messages go, for people.
    fn work_name(&self) -> &str;

    /// Up to `limit` dead letters, oldest first, leaving them parked.
    fn peek(&self, limit: usize) -> BoxFuture<'_, Result<Vec<Parked>, SourceError>>;

    /// The dead letter `id`, if it is parked, leaving it parked; reads no
    /// further than it where the queue is read in order.
    fn find<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Parked>, SourceError>> {
        Box::pin(async move {
            Ok(self
                .peek(usize::MAX)
                .await?
                .into_iter()
                .find(|p| p.id == id))
        })
    }

    /// Settles the dead letters `choose` picks, oldest first and at most
    /// `limit`: [`Settle::Replay`] republishes each to the work queue or
    /// topic (see the module docs) and removes it once its copy is
    /// confirmed; [`Settle::Drop`] removes it. [`Before`] runs on each
    /// chosen one first; `settled` on each as soon as it is done. Answers
    /// how many were settled. A letter another run settled first (two
    /// operators at once) is skipped, not an error.
    fn settle<'a>(
        &'a self,
        how: Settle,
        choose: Choose<'a>,
        limit: usize,
        before: Before<'a>,
        settled: Settled<'a>,
    ) -> BoxFuture<'a, Result<usize, SourceError>>;
}

/// What [`ReplayLog::unreplayed`] answers.
pub type Unreplayed<E> = Result<Vec<(Parked, E)>, SourceError>;

/// A dead-letter queue kept in a log (a Kafka or RocketMQ topic): nothing
/// leaves it, so each replay (or drop) is recorded beside it, and what was
/// settled is left out from then on. Such a queue is a [`DeadLetterQueue`].
pub trait ReplayLog: Send + Sync {
    /// What a republish needs of a record besides the [`Parked`] (its
    /// record key, say).
    type Extra: Send + Sync;

    /// Where dead letters are parked, for people.
    fn log_name(&self) -> &str;

    /// Where replayed messages go, for people.
    fn log_work_name(&self) -> &str;

    /// Every dead letter not replayed yet, oldest first.
    fn unreplayed(&self) -> BoxFuture<'_, Unreplayed<Self::Extra>>;

    /// [`Settle::Replay`]: publishes `parked`'s copy to the work topic,
    /// then records its replay. [`Settle::Drop`]: records it as dropped.
    fn settle_one<'a>(
        &'a self,
        how: Settle,
        parked: &'a Parked,
        extra: &'a Self::Extra,
    ) -> BoxFuture<'a, Result<(), SourceError>>;
}

impl<L: ReplayLog> DeadLetterQueue for L {
    fn name(&self) -> &str {
        self.log_name()
    }

    fn work_name(&self) -> &str {
        self.log_work_name()
    }

    fn peek(&self, limit: usize) -> BoxFuture<'_, Result<Vec<Parked>, SourceError>> {
        Box::pin(async move {
            let mut parked = self.unreplayed().await?;
            parked.truncate(limit);
            Ok(parked.into_iter().map(|(p, _)| p).collect())
        })
    }

    fn settle<'a>(
        &'a self,
        how: Settle,
        choose: Choose<'a>,
        limit: usize,
        before: Before<'a>,
        settled: Settled<'a>,
    ) -> BoxFuture<'a, Result<usize, SourceError>> {
        Box::pin(async move {
            let mut done = 0;
            for (p, extra) in self.unreplayed().await? {
                if done == limit {
                    break;
                }
                if !choose(&p) || !before(&p).await? {
                    continue;
                }
                self.settle_one(how, &p, &extra).await?;
                settled(&p);
                done += 1;
            }
            Ok(done)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parked(key: &str, id: &str, age_s: u64) -> Parked {
        Parked {
            id: id.into(),
            parked_at: Some(SystemTime::now() - Duration::from_secs(age_s)),
            headers: vec![
                ("Idem-Key".into(), Bytes::from(key.to_owned())),
                ("idem-attempts".into(), Bytes::from_static(b"16")),
                ("idem-last-error".into(), Bytes::from_static(b"500 boom")),
                ("trace".into(), Bytes::from_static(b"t-1")),
                ("idem-replayed-from".into(), Bytes::from_static(b"old/1")),
            ],
            body: Bytes::from_static(b"{}"),
        }
    }

    #[test]
    fn the_idem_headers_read_back_and_a_replay_resets_the_attempts() {
        let p = parked("o-1", "5", 10);
        assert_eq!(p.key().as_deref(), Some("o-1"));
        assert_eq!(p.attempts(), Some(16));
        assert_eq!(p.last_error().as_deref(), Some("500 boom"));
        let h = p.replay_headers("orders.dead-letter");
        let names: Vec<&str> = h.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["Idem-Key", "trace", "idem-replayed-from"]);
        assert_eq!(&h[2].1[..], b"orders.dead-letter/5");
    }

    #[test]
    fn a_selection_matches_every_criterion_given() {
        let now = SystemTime::now();
        let (a, b) = (parked("o-1", "1", 3600), parked("o-2", "2", 5));
        let all = Selection::default();
        assert!(all.admits(&a, now) && all.admits(&b, now));
        let by_key = Selection {
            keys: vec!["o-2".into()],
            ..Default::default()
        };
        assert!(!by_key.admits(&a, now) && by_key.admits(&b, now));
        let by_id = Selection {
            ids: vec!["1".into()],
            ..Default::default()
        };
        assert!(by_id.admits(&a, now) && !by_id.admits(&b, now));
        let old = Selection {
            older_than: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        assert!(old.admits(&a, now) && !old.admits(&b, now));
        let recent = Selection {
            newer_than: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        assert!(!recent.admits(&a, now) && recent.admits(&b, now));
        let undated = Parked {
            parked_at: None,
            ..a.clone()
        };
        assert!(!old.admits(&undated, now), "no date, no age match");
    }
}
