//! Fingerprints: what a request or message said, so that a reused key with a
//! different payload is caught instead of answered with someone else's outcome.

use std::fmt;

use serde::Serialize;
use sha2::{Digest, Sha256};

/// A 128-bit digest of a request's content.
///
/// Two helpers make one: [`Fingerprint::sha256`] (SHA-256 cut to 128 bits:
/// collision-resistant, for content an adversary may choose) and
/// [`Fingerprint::xxh3`] (XXH3-128: several times faster, for trusted
/// content). Both are defined on bytes alone, so they are stable across
/// versions, platforms and processes. 128 bits keep every record small; a
/// collision needs about 2^64 tries.
///
/// ```
/// use idem_core::Fingerprint;
/// let a = Fingerprint::sha256(b"amount=10");
/// assert_eq!(a, Fingerprint::sha256(b"amount=10"));
/// assert_ne!(a, Fingerprint::sha256(b"amount=11"));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 16]);

impl Fingerprint {
    /// The first 128 bits of the SHA-256 digest of `bytes`.
    pub fn sha256(bytes: &[u8]) -> Self {
        let digest = Sha256::digest(bytes);
        let mut out = [0; 16];
        out.copy_from_slice(&digest[..16]);
        Self(out)
    }

    /// The XXH3-128 digest of `bytes`, in its canonical (big-endian) form.
    pub fn xxh3(bytes: &[u8]) -> Self {
        Self(xxhash_rust::xxh3::xxh3_128(bytes).to_be_bytes())
    }

    /// The SHA-256 fingerprint of `value` serialized as canonical JSON
    /// (object keys sorted), so that field order and map iteration order do
    /// not change it.
    pub fn of_json<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        // `Value` keeps objects in a sorted map, which makes the text canonical.
        let canonical = serde_json::to_vec(&serde_json::to_value(value)?)?;
        Ok(Self::sha256(&canonical))
    }

    /// Wraps 16 bytes that already are a fingerprint (read back from storage).
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The 16 bytes.
    pub const fn to_bytes(self) -> [u8; 16] {
        self.0
    }

    /// Lower-case hex, 32 characters.
    pub fn to_hex(self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Pinned values: a change here breaks every stored record's fingerprint.
    #[test]
    fn digests_are_stable() {
        assert_eq!(
            Fingerprint::sha256(b"").to_hex(),
            "e3b0c44298fc1c149afbf4c8996fb924"
        );
        assert_eq!(
            Fingerprint::xxh3(b"").to_hex(),
            "99aa06d3014798d86001c324468d497f"
        );
    }

    #[test]
    fn json_fingerprint_ignores_map_order() {
        let a: serde_json::Value = serde_json::from_str(r#"{"a":1,"b":[1,2]}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"b":[1,2],"a":1}"#).unwrap();
        assert_eq!(
            Fingerprint::of_json(&a).unwrap(),
            Fingerprint::of_json(&b).unwrap()
        );
        let c: serde_json::Value = serde_json::from_str(r#"{"b":[2,1],"a":1}"#).unwrap();
        assert_ne!(
            Fingerprint::of_json(&a).unwrap(),
            Fingerprint::of_json(&c).unwrap()
        );
    }
}
