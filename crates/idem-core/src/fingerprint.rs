//! Fingerprints: what a request or message said, so that a reused key with a
//! different payload is caught instead of answered with someone else's outcome.

use std::fmt;

use serde::Serialize;
use sha2::{Digest, Sha256};

/// A 128-bit digest of a request's content.
///
/// Two digests make one: [`Fingerprint::sha256`] (SHA-256 cut to 128 bits:
/// collision-resistant, for content an adversary may choose) and
/// [`Fingerprint::xxh3`] (XXH3-128: several times faster, for trusted
/// content), of bytes or of any serde value as canonical JSON
/// ([`sha256_json`](Fingerprint::sha256_json),
/// [`xxh3_json`](Fingerprint::xxh3_json)). Both are defined on bytes alone, so they are stable across
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

    /// [`sha256`](Fingerprint::sha256) of `value` serialized as canonical
    /// JSON (object keys sorted), so that field order and map iteration order
    /// do not change it.
    pub fn sha256_json<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        Ok(Self::sha256(&canonical_json(value)?))
    }

    /// [`xxh3`](Fingerprint::xxh3) of `value` serialized as canonical JSON.
    pub fn xxh3_json<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        Ok(Self::xxh3(&canonical_json(value)?))
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

/// `Value` keeps objects in a sorted map, which makes its text canonical.
fn canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&serde_json::to_value(value)?)
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
        let c: serde_json::Value = serde_json::from_str(r#"{"b":[2,1],"a":1}"#).unwrap();
        for f in [Fingerprint::sha256_json, Fingerprint::xxh3_json] {
            assert_eq!(f(&a).unwrap(), f(&b).unwrap());
            assert_ne!(f(&a).unwrap(), f(&c).unwrap());
        }
        assert_ne!(
            Fingerprint::sha256_json(&a).unwrap(),
            Fingerprint::xxh3_json(&a).unwrap()
        );
    }
}
