//! Keys: what a record is found by.

use std::fmt;
use std::hash::Hasher;
use std::sync::Arc;

use bytes::Bytes;

use crate::limits::InvalidInput;

/// The longest namespace, in bytes.
pub const MAX_NAMESPACE_BYTES: usize = 64;

/// A namespace: `[A-Za-z0-9_.-]{1,64}`. Records in different namespaces never
/// meet, even under the same key.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Namespace(Arc<str>);

impl Namespace {
    /// Checks and wraps a namespace name.
    ///
    /// ```
    /// use idem_core::Namespace;
    /// assert!(Namespace::new("orders.v2").is_ok());
    /// assert!(Namespace::new("orders/v2").is_err());
    /// ```
    pub fn new(name: &str) -> Result<Self, InvalidInput> {
        let bad = |reason: &'static str| InvalidInput::Namespace {
            namespace: name.chars().take(80).collect(),
            reason,
        };
        if name.is_empty() {
            return Err(bad("it is empty"));
        }
        if name.len() > MAX_NAMESPACE_BYTES {
            return Err(bad("it is longer than 64 bytes"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        {
            return Err(bad("only A-Z, a-z, 0-9, '_', '.' and '-' are allowed"));
        }
        Ok(Self(name.into()))
    }

    /// The namespace's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<&str> for Namespace {
    type Error = InvalidInput;
    fn try_from(name: &str) -> Result<Self, InvalidInput> {
        Self::new(name)
    }
}

/// A record's identity: a namespace and up to [`Limits::max_key_bytes`]
/// bytes of key (255 by default).
///
/// [`Limits::max_key_bytes`]: crate::Limits::max_key_bytes
///
/// ```
/// use idem_core::Key;
/// let key = Key::new("payments", "charge-42")?;
/// assert_eq!(key.to_string(), "payments/charge-42");
/// # Ok::<_, idem_core::InvalidInput>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key {
    namespace: Namespace,
    key: Bytes,
}

impl Key {
    /// A key in the namespace named `namespace`.
    ///
    /// The key must not be empty; its length limit is the store's
    /// ([`Limits`](crate::Limits)), checked when it is used.
    pub fn new(namespace: &str, key: impl Into<Bytes>) -> Result<Self, InvalidInput> {
        Self::in_namespace(Namespace::new(namespace)?, key)
    }

    /// A key in an already checked namespace (no allocation for the name).
    pub fn in_namespace(namespace: Namespace, key: impl Into<Bytes>) -> Result<Self, InvalidInput> {
        let key = key.into();
        if key.is_empty() {
            return Err(InvalidInput::EmptyKey);
        }
        Ok(Self { namespace, key })
    }

    /// The namespace.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// The key's bytes, without the namespace.
    pub fn bytes(&self) -> &Bytes {
        &self.key
    }

    /// The key as one byte string that sorts by namespace, then key:
    /// `[namespace length][namespace][key]`. Stores use it as their storage key.
    pub fn encode(&self) -> Vec<u8> {
        let ns = self.namespace.as_str().as_bytes();
        let mut out = Vec::with_capacity(1 + ns.len() + self.key.len());
        out.push(ns.len() as u8);
        out.extend_from_slice(ns);
        out.extend_from_slice(&self.key);
        out
    }

    /// The prefix every encoded key of `namespace` starts with.
    pub fn encode_namespace(namespace: &Namespace) -> Vec<u8> {
        let ns = namespace.as_str().as_bytes();
        let mut out = Vec::with_capacity(1 + ns.len());
        out.push(ns.len() as u8);
        out.extend_from_slice(ns);
        out
    }

    /// Reads back what [`Key::encode`] wrote.
    pub fn decode(encoded: &[u8]) -> Result<Self, InvalidInput> {
        let (ns, key) = split_encoded(encoded).ok_or(InvalidInput::EncodedKey)?;
        let ns = std::str::from_utf8(ns).map_err(|_| InvalidInput::EncodedKey)?;
        Self::new(ns, Bytes::copy_from_slice(key))
    }

    /// Whether `encoded` is this key's [`encode`](Key::encode)d form, without
    /// building it.
    pub fn matches_encoded(&self, encoded: &[u8]) -> bool {
        match split_encoded(encoded) {
            Some((ns, key)) => ns == self.namespace.as_str().as_bytes() && key == &self.key[..],
            None => false,
        }
    }

    /// Feeds the namespace and the key to `hasher`.
    pub fn hash_into(&self, hasher: &mut impl Hasher) {
        let ns = self.namespace.as_str().as_bytes();
        hasher.write(ns);
        hasher.write(&self.key);
    }
}

fn split_encoded(encoded: &[u8]) -> Option<(&[u8], &[u8])> {
    let (&len, rest) = encoded.split_first()?;
    (rest.len() > len as usize).then(|| rest.split_at(len as usize))
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.key.escape_ascii())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips_and_sorts_by_namespace_then_key() {
        let a = Key::new("a", "zz").unwrap();
        let b = Key::new("ab", "a").unwrap();
        assert_eq!(Key::decode(&a.encode()).unwrap(), a);
        assert!(a.matches_encoded(&a.encode()));
        assert!(!a.matches_encoded(&b.encode()));
        let ns = Key::encode_namespace(a.namespace());
        assert!(a.encode().starts_with(&ns));
        assert!(!b.encode().starts_with(&ns));
    }

    #[test]
    fn bad_namespaces_say_what_is_wrong() {
        let e = Namespace::new("a b").unwrap_err().to_string();
        assert!(e.contains("only A-Z"), "{e}");
        assert!(Namespace::new("").is_err());
        assert!(Namespace::new(&"x".repeat(65)).is_err());
        assert!(Namespace::new(&"x".repeat(64)).is_ok());
        assert_eq!(Key::new("n", "").unwrap_err(), InvalidInput::EmptyKey);
    }
}
