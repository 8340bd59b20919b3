//! The on-disk form of a completed record and of the expiry index.
//!
//! `records`: key = [`Key::encode`](idem_core::Key::encode), value =
//! `[version 1][token u64 LE][completed_at u64 LE][expires_at u64 LE][flags]
//! [fingerprint: 16 bytes if flag 1][outcome: the rest, if flag 2]`.
//!
//! `expiry`: key = `[expires_at u64 BE][encoded key]`, value empty. Big-endian
//! so that keys sort by time and the sweeper reads what is due as one range.

use bytes::Bytes;
use idem_core::{Completed, FencingToken, Fingerprint, Timestamp};

const VERSION: u8 = 1;
const HAS_FINGERPRINT: u8 = 1;
const HAS_OUTCOME: u8 = 2;
const HEADER: usize = 1 + 8 + 8 + 8 + 1;

/// The value stored for the completed record `r`.
pub fn encode_completed(r: &Completed) -> Vec<u8> {
    let outcome_len = r.outcome.as_ref().map_or(0, Bytes::len);
    let mut out = Vec::with_capacity(HEADER + 16 + outcome_len);
    out.push(VERSION);
    out.extend_from_slice(&r.token.get().to_le_bytes());
    out.extend_from_slice(&r.completed_at.as_millis().to_le_bytes());
    out.extend_from_slice(&r.expires_at.as_millis().to_le_bytes());
    let flags = if r.fingerprint.is_some() {
        HAS_FINGERPRINT
    } else {
        0
    } | if r.outcome.is_some() { HAS_OUTCOME } else { 0 };
    out.push(flags);
    if let Some(fp) = r.fingerprint {
        out.extend_from_slice(&fp.to_bytes());
    }
    if let Some(o) = &r.outcome {
        out.extend_from_slice(o);
    }
    out
}

/// Checks that `value` starts with a header this version reads.
fn check_header(value: &[u8]) -> Result<(), String> {
    if value.len() < HEADER {
        return Err(format!(
            "record of {} bytes is shorter than its header",
            value.len()
        ));
    }
    if value[0] != VERSION {
        return Err(format!(
            "record format version {} is not known to this idem (it reads version {VERSION})",
            value[0]
        ));
    }
    Ok(())
}

/// The completed record stored as `value`, or what is wrong with it.
pub fn decode_completed(value: &[u8]) -> Result<Completed, String> {
    check_header(value)?;
    let u64_at = |at: usize| u64::from_le_bytes(value[at..at + 8].try_into().expect("8 bytes"));
    let flags = value[25];
    if flags & !(HAS_FINGERPRINT | HAS_OUTCOME) != 0 {
        return Err(format!("record has unknown flags {flags:#x}"));
    }
    let mut rest = &value[HEADER..];
    let fingerprint = if flags & HAS_FINGERPRINT != 0 {
        if rest.len() < 16 {
            return Err("record is cut short inside its fingerprint".into());
        }
        let (fp, tail) = rest.split_at(16);
        rest = tail;
        Some(Fingerprint::from_bytes(fp.try_into().expect("16 bytes")))
    } else {
        None
    };
    let outcome = if flags & HAS_OUTCOME != 0 {
        Some(Bytes::copy_from_slice(rest))
    } else if rest.is_empty() {
        None
    } else {
        return Err("record has trailing bytes".into());
    };
    Ok(Completed {
        token: FencingToken::new(u64_at(1)),
        fingerprint,
        outcome,
        completed_at: Timestamp::from_millis(u64_at(9)),
        expires_at: Timestamp::from_millis(u64_at(17)),
    })
}

/// When the record in `value` expires, read from its header alone: a scan
/// of keys needs no copy of the outcome.
pub fn expires_at_of(value: &[u8]) -> Result<Timestamp, String> {
    check_header(value)?;
    let at = u64::from_le_bytes(value[17..25].try_into().expect("8 bytes"));
    Ok(Timestamp::from_millis(at))
}

pub fn expiry_key(expires_at: Timestamp, encoded_key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + encoded_key.len());
    out.extend_from_slice(&expires_at.as_millis().to_be_bytes());
    out.extend_from_slice(encoded_key);
    out
}

/// The completion index key of the record under `encoded_key`: laid out
/// as an expiry index key, ordered by completion time.
pub fn completed_key(completed_at: Timestamp, encoded_key: &[u8]) -> Vec<u8> {
    expiry_key(completed_at, encoded_key)
}

/// The expiry time and encoded key of the expiry index key `k` (or the
/// completion time and key of a completion index key).
pub fn split_expiry_key(k: &[u8]) -> Option<(Timestamp, &[u8])> {
    let (t, key) = k.split_at_checked(8)?;
    Some((
        Timestamp::from_millis(u64::from_be_bytes(t.try_into().ok()?)),
        key,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_reported() {
        let r = Completed {
            token: FencingToken::new(42),
            fingerprint: Some(Fingerprint::sha256(b"x")),
            outcome: Some(Bytes::from_static(b"{\"ok\":true}")),
            completed_at: Timestamp::from_millis(1),
            expires_at: Timestamp::from_millis(2),
        };
        let bytes = encode_completed(&r);
        assert_eq!(decode_completed(&bytes).unwrap(), r);
        assert_eq!(expires_at_of(&bytes).unwrap(), r.expires_at);
        assert!(expires_at_of(&bytes[..10]).is_err());
        let bare = Completed {
            fingerprint: None,
            outcome: None,
            ..r.clone()
        };
        assert_eq!(decode_completed(&encode_completed(&bare)).unwrap(), bare);
        assert!(decode_completed(&bytes[..10]).is_err());
        let mut future = bytes.clone();
        future[0] = 9;
        assert!(decode_completed(&future).unwrap_err().contains("version 9"));
        let empty_outcome = Completed {
            outcome: Some(Bytes::new()),
            ..bare
        };
        assert_eq!(
            decode_completed(&encode_completed(&empty_outcome)).unwrap(),
            empty_outcome
        );
    }
}
