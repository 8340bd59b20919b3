//! Reading Redis's replies into the store's answers, and records in their
//! packed layout (`scripts/record.lua`).

use std::time::Duration;

use bytes::Bytes;
use idem_core::{
    Begin, Claim, Completed, Fenced, FencingToken, Fingerprint, InProgress, Record, StoreError,
    Timestamp,
};
use redis::Value;

pub(crate) fn unavailable(e: redis::RedisError) -> StoreError {
    // Redis refuses writes it could not persist (a full disk under its
    // append-only file or snapshot): say what to do, as its error does not.
    if e.code() == Some("MISCONF") {
        return StoreError::unavailable(format!(
            "Redis refuses writes because it cannot persist them ({e}); free space on the disk holding Redis's data directory, or fix what Redis's log names: Redis takes writes again by itself once it can write, and idem with it"
        ));
    }
    StoreError::unavailable(e)
}

pub(crate) fn corrupt(what: &str, v: &Value) -> StoreError {
    StoreError::Corrupt(format!("unexpected reply from Redis for {what}: {v:?}"))
}

/// A reply element as a number (Lua numbers arrive as integers, our
/// formatted numbers as strings).
pub(crate) fn number(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

pub(crate) fn bytes(v: &Value) -> Option<Bytes> {
    match v {
        Value::BulkString(b) => Some(Bytes::copy_from_slice(b)),
        _ => None,
    }
}

/// One item's answer from the begin script, which ran at `now` (ms); a
/// lease it granted lasts `lease_ms`.
pub(crate) fn parse_begin(v: &Value, now: u64, lease_ms: u64) -> Result<Begin, StoreError> {
    let bad = || corrupt("begin", v);
    let lease_expires_at = Timestamp::from_millis(now.saturating_add(lease_ms));
    let items = match v {
        Value::Array(items) => items,
        Value::Int(_) => {
            return Ok(Begin::Acquired(Claim {
                token: FencingToken::new(number(v).ok_or_else(bad)?),
                lease_expires_at,
                attempt: 1,
            }));
        }
        _ => return Err(bad()),
    };
    let tag = items.first().and_then(bytes).ok_or_else(bad)?;
    let num = |i: usize| items.get(i).and_then(number).ok_or_else(bad);
    Ok(match &tag[..] {
        b"a" => Begin::Acquired(Claim {
            token: FencingToken::new(num(1)?),
            lease_expires_at,
            attempt: u32::try_from(num(2)?).unwrap_or(u32::MAX),
        }),
        b"i" => Begin::InProgress {
            retry_after: Duration::from_millis(num(1)?.max(1)),
        },
        b"c" => Begin::Completed {
            completed_at: Timestamp::from_millis(num(1)?),
            outcome: items.get(2).and_then(bytes),
        },
        b"m" => Begin::Mismatch,
        _ => return Err(bad()),
    })
}

pub(crate) fn fenced(what: &str, v: &Value) -> Result<Fenced, StoreError> {
    match number(v) {
        Some(1) => Ok(Fenced::Ok(())),
        Some(0) => Ok(Fenced::Stale),
        _ => Err(corrupt(what, v)),
    }
}

/// A record from its packed value (`GET`), `None` when there is none (or
/// only a released key's tombstone). Layout: see `scripts/record.lua`.
pub(crate) fn parse_record(v: &Value) -> Result<Option<Record>, StoreError> {
    let bytes = match v {
        Value::Nil => return Ok(None),
        Value::BulkString(b) => &b[..],
        _ => return Err(corrupt("a record", v)),
    };
    let bad = || corrupt("a record", v);
    if bytes.len() < HEAD {
        return Err(bad());
    }
    let int = |at: usize, n: usize| {
        let mut buf = [0u8; 8];
        buf[..n].copy_from_slice(&bytes[at..at + n]);
        u64::from_le_bytes(buf)
    };
    let (state, flags) = (bytes[0], bytes[1]);
    let until = Timestamp::from_millis(int(2, 8));
    let since = Timestamp::from_millis(int(10, 8));
    let token = FencingToken::new(int(18, 8));
    let attempts = u32::try_from(int(26, 4)).unwrap_or(u32::MAX);
    let mut rest = &bytes[HEAD..];
    let fingerprint = if flags & 1 != 0 {
        let (fp, tail) = rest.split_at_checked(16).ok_or_else(bad)?;
        rest = tail;
        Some(Fingerprint::from_bytes(fp.try_into().expect("16 bytes")))
    } else {
        None
    };
    let outcome = (flags & 2 != 0).then(|| Bytes::copy_from_slice(rest));
    Ok(Some(match state {
        b'p' => Record::InProgress(InProgress {
            token,
            fingerprint,
            lease_expires_at: until,
            attempts,
            started_at: since,
        }),
        b'c' => Record::Completed(Completed {
            token,
            fingerprint,
            outcome,
            completed_at: since,
            expires_at: until,
        }),
        // A released key's tombstone: absent to readers.
        b'r' => return Ok(None),
        _ => return Err(bad()),
    }))
}

/// What a record's first [`COUNTED`] bytes say (`GETRANGE key 0 17`):
/// enough to count it, no more.
pub(crate) enum Counted {
    /// A claim: when its lease ends and when it started.
    InProgress { until: Timestamp, since: Timestamp },
    /// A completed record: when its retention ends.
    Completed { until: Timestamp },
}

/// The bytes of a record [`Counted`] reads: its state, flags and two times.
pub(crate) const COUNTED: usize = 1 + 1 + 8 + 8;

/// A record's state and times from the first [`COUNTED`] bytes of its
/// value; `None` for no record or a released key's tombstone.
pub(crate) fn parse_counted(v: &Value) -> Result<Option<Counted>, StoreError> {
    let bytes = match v {
        Value::Nil => return Ok(None),
        Value::BulkString(b) if b.is_empty() => return Ok(None),
        Value::BulkString(b) if b.len() >= COUNTED => &b[..],
        _ => return Err(corrupt("the head of a record", v)),
    };
    let time = |at: usize| {
        Timestamp::from_millis(u64::from_le_bytes(
            bytes[at..at + 8].try_into().expect("8 bytes"),
        ))
    };
    Ok(match bytes[0] {
        b'p' => Some(Counted::InProgress {
            until: time(2),
            since: time(10),
        }),
        b'c' => Some(Counted::Completed { until: time(2) }),
        b'r' => None,
        _ => return Err(corrupt("the head of a record", v)),
    })
}

/// The latest time (ms) written into a record: the scripts read times as
/// signed 64-bit numbers, and a record's key expires 1 ms after its end.
pub(crate) const LATEST_MS: u64 = i64::MAX as u64 - 1;

/// `record` packed as `complete` leaves a completed record (layout: see
/// `scripts/record.lua`), with 1 attempt, as a first claim has. Times past
/// [`LATEST_MS`] are cut to it.
pub(crate) fn pack_completed(record: &Completed) -> Vec<u8> {
    let time = |t: Timestamp| t.as_millis().min(LATEST_MS).to_le_bytes();
    let fingerprint = record.fingerprint.map(|f| f.to_bytes());
    let outcome = record.outcome.as_deref();
    let flags = u8::from(fingerprint.is_some()) + 2 * u8::from(outcome.is_some());
    let mut out = Vec::with_capacity(HEAD + 16 + outcome.map_or(0, <[u8]>::len));
    out.extend_from_slice(&[b'c', flags]);
    out.extend_from_slice(&time(record.expires_at));
    out.extend_from_slice(&time(record.completed_at));
    out.extend_from_slice(&record.token.get().to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(fingerprint.as_ref().map_or(&[][..], |f| &f[..]));
    out.extend_from_slice(outcome.unwrap_or_default());
    out
}

/// The packed header's length: state, flags, end, since, token, attempts.
pub(crate) const HEAD: usize = 1 + 1 + 8 + 8 + 8 + 4;

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use idem_core::{Completed, FencingToken, Fingerprint, Record, Timestamp};
    use redis::Value;

    use super::{pack_completed, parse_record};

    #[test]
    fn a_packed_completed_record_reads_back_as_given() {
        let full = Completed {
            token: FencingToken::new(u64::MAX - 3),
            fingerprint: Some(Fingerprint::sha256(b"payload")),
            outcome: Some(Bytes::from_static(b"receipt")),
            completed_at: Timestamp::from_millis(1_764_669_570_000),
            expires_at: Timestamp::from_millis(1_764_673_170_000),
        };
        let bare = Completed {
            fingerprint: None,
            outcome: None,
            ..full.clone()
        };
        let empty_outcome = Completed {
            outcome: Some(Bytes::new()),
            ..bare.clone()
        };
        for given in [full, bare, empty_outcome] {
            let packed = Value::BulkString(pack_completed(&given));
            assert_eq!(
                parse_record(&packed).unwrap(),
                Some(Record::Completed(given))
            );
        }
    }
}
