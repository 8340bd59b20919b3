//! Where things live in Redis: every key of one record, or of one lock,
//! shares a hash tag, so a script touching them runs on one cluster node.

use std::time::Duration;

use bytes::Bytes;
use idem_core::tier::Handover;
use idem_core::{FencingToken, Key};

/// A Redis key of `key`'s: `idem:{N:K` then `suffix`.
fn redis_key(key: &Key, suffix: &[u8]) -> Vec<u8> {
    let ns = key.namespace().as_str().as_bytes();
    let k = key.bytes();
    let mut out = Vec::with_capacity(8 + ns.len() + k.len() + suffix.len());
    out.extend_from_slice(b"idem:{");
    out.extend_from_slice(ns);
    out.push(b':');
    out.extend_from_slice(k);
    out.extend_from_slice(suffix);
    out
}

/// The record of `key`: `idem:{N:K}:r`.
pub(crate) fn record_key(key: &Key) -> Vec<u8> {
    redis_key(key, b"}:r")
}

/// What every record key of namespace `ns` starts with, and the `SCAN`
/// pattern that finds them.
pub(crate) fn namespace_prefix(ns: &str) -> (String, String) {
    let prefix = format!("idem:{{{ns}:");
    let pattern = format!("{prefix}*}}:r");
    (prefix, pattern)
}

/// The key inside a record key found under `prefix`.
pub(crate) fn key_in<'a>(record_key: &'a [u8], prefix: &str) -> Option<&'a [u8]> {
    record_key
        .strip_prefix(prefix.as_bytes())?
        .strip_suffix(b"}:r")
}

/// The `SCAN` pattern that finds every record key, all namespaces.
pub(crate) const RECORD_PATTERN: &str = "idem:{*}:r";

/// The key whose record is at `record_key`, or `None` for a key that is
/// not a record's (a stranger's key that happens to match
/// [`RECORD_PATTERN`]). A namespace holds no `:`, so the first one ends it.
pub(crate) fn key_of(record_key: &[u8]) -> Option<Key> {
    let inner = record_key.strip_prefix(b"idem:{")?.strip_suffix(b"}:r")?;
    let colon = inner.iter().position(|&b| b == b':')?;
    let namespace = std::str::from_utf8(&inner[..colon]).ok()?;
    Key::new(namespace, Bytes::copy_from_slice(&inner[colon + 1..])).ok()
}

/// The token high-water mark of the whole store (see `scripts/high_water.lua`).
pub(crate) const HIGH_WATER_KEY: &str = "idem:token-high-water";

/// The list of handovers named `list` (a sorted set), in a hash slot of
/// its own.
pub(crate) fn handover_list_key(list: &str) -> String {
    format!("idem:{{handovers:{list}}}")
}

/// A member of a list of handovers: the key, encoded, then the token (8
/// bytes, big-endian).
pub(crate) fn handover_member(h: &Handover) -> Vec<u8> {
    let mut member = h.key.encode();
    member.extend_from_slice(&h.token.get().to_be_bytes());
    member
}

/// The handover a list member names; `None` for a member idem did not
/// write.
pub(crate) fn handover_of(member: &[u8]) -> Option<Handover> {
    let split = member.len().checked_sub(8)?;
    let (key, token) = member.split_at(split);
    Some(Handover {
        key: Key::decode(key).ok()?,
        token: FencingToken::new(u64::from_be_bytes(token.try_into().ok()?)),
    })
}

/// A key of lock `name`: the lock itself (`suffix` empty), its token
/// counter (`:t`), its queue (`:q`), the queue's deadlines (`:qd`), and
/// the prefix of its waiters' wake lists (`:w:`).
pub(crate) fn lock_key(name: &str, suffix: &str) -> String {
    format!("idem:{{lock:{name}}}{suffix}")
}

/// `d` in whole milliseconds, as Redis takes durations.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use idem_core::Key;

    use idem_core::FencingToken;
    use idem_core::tier::Handover;

    use super::{handover_member, handover_of, key_of, record_key};

    #[test]
    fn a_handover_member_reads_back_as_its_handover() {
        let h = Handover {
            key: Key::new("orders", b"with\0bytes:}".to_vec()).unwrap(),
            token: FencingToken::new(0x0102_0304_0506_0708),
        };
        assert_eq!(handover_of(&handover_member(&h)), Some(h));
        assert_eq!(handover_of(b"short"), None);
    }

    #[test]
    fn a_record_key_reads_back_as_its_key() {
        for (ns, k) in [
            ("orders", &b"o-1"[..]),
            ("a.b_c-9", b"with:colons}:r{and}"),
            ("x", b"\0\xff"),
        ] {
            let key = Key::new(ns, k.to_vec()).unwrap();
            assert_eq!(key_of(&record_key(&key)), Some(key));
        }
        for stranger in [
            &b"idem:{lock:x}"[..],
            b"idem:{nocolon}:r",
            b"idem:{:k}:r",
            b"idem:{bad/ns:k}:r",
            b"other:{n:k}:r",
            b"idem:{n:}:r",
        ] {
            assert_eq!(
                key_of(stranger),
                None,
                "{}",
                String::from_utf8_lossy(stranger)
            );
        }
    }
}
