//! Bearer tokens, each allowed a set of namespaces.

use http::HeaderValue;
use idem_core::Namespace;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::Problem;

/// Which namespaces a token may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Namespaces {
    /// Every namespace (`*`).
    All,
    /// These.
    Only(Vec<String>),
}

/// One configured bearer token.
#[derive(Clone)]
pub struct Grant {
    /// SHA-256 of the token: compared in constant time, whatever the length.
    digest: [u8; 32],
    namespaces: Namespaces,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("token", &"<redacted>")
            .field("namespaces", &self.namespaces)
            .finish()
    }
}

impl Grant {
    /// `token` may use `namespaces`.
    pub fn new(token: &str, namespaces: Namespaces) -> Self {
        Self {
            digest: Sha256::digest(token.as_bytes()).into(),
            namespaces,
        }
    }
}

/// Who may call `/v1/*`. With no grants, everyone may (auth off).
#[derive(Clone, Debug, Default)]
pub struct Auth {
    grants: Vec<Grant>,
}

impl Auth {
    /// Auth with these grants; none means auth is off.
    pub fn new(grants: Vec<Grant>) -> Self {
        Self { grants }
    }

    /// Whether any token is required.
    pub fn is_on(&self) -> bool {
        !self.grants.is_empty()
    }

    /// Checks an `Authorization` header for `namespace`.
    pub fn check(
        &self,
        header: Option<&HeaderValue>,
        namespace: &Namespace,
    ) -> Result<(), Problem> {
        if !self.is_on() {
            return Ok(());
        }
        let Some(presented) = header.and_then(|h| h.to_str().ok()).and_then(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
        }) else {
            return Err(Problem::unauthorized(
                "send `Authorization: Bearer <token>`; this server requires a token",
            ));
        };
        let digest: [u8; 32] = Sha256::digest(presented.trim().as_bytes()).into();
        // Compare against every grant, so timing does not tell which matched.
        let mut allowed = false;
        let mut known = false;
        for grant in &self.grants {
            let matches: bool = grant.digest.ct_eq(&digest).into();
            known |= matches;
            allowed |= matches
                && match &grant.namespaces {
                    Namespaces::All => true,
                    Namespaces::Only(list) => list.iter().any(|n| n == namespace.as_str()),
                };
        }
        match (known, allowed) {
            (_, true) => Ok(()),
            (true, false) => Err(Problem::forbidden(format!(
                "this token may not use namespace {namespace:?}"
            ))),
            (false, _) => Err(Problem::unauthorized("the bearer token is not known")),
        }
    }
}
