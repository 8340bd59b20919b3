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

    /// The namespaces the token in an `Authorization` header may use:
    /// [`Namespaces::All`] when auth is off; 401 without a token, or with
    /// one that is not known.
    pub fn namespaces_for(&self, header: Option<&HeaderValue>) -> Result<Namespaces, Problem> {
        if !self.is_on() {
            return Ok(Namespaces::All);
        }
        let digest = presented_digest(header)?;
        // Every grant is compared, so timing does not tell which matched;
        // a token granted several times may use what each grant allows.
        let mut found: Option<Namespaces> = None;
        for grant in &self.grants {
            let matches: bool = grant.digest.ct_eq(&digest).into();
            if !matches {
                continue;
            }
            found = Some(match (found, &grant.namespaces) {
                (Some(Namespaces::All), _) | (_, Namespaces::All) => Namespaces::All,
                (Some(Namespaces::Only(mut list)), Namespaces::Only(more)) => {
                    list.extend(more.iter().cloned());
                    Namespaces::Only(list)
                }
                (None, Namespaces::Only(list)) => Namespaces::Only(list.clone()),
            });
        }
        found.ok_or_else(|| Problem::unauthorized("the bearer token is not known"))
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
        let digest = presented_digest(header)?;
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

/// SHA-256 of the bearer token in an `Authorization` header; 401 without
/// one.
fn presented_digest(header: Option<&HeaderValue>) -> Result<[u8; 32], Problem> {
    let Some(presented) = header.and_then(|h| h.to_str().ok()).and_then(|h| {
        h.strip_prefix("Bearer ")
            .or_else(|| h.strip_prefix("bearer "))
    }) else {
        return Err(Problem::unauthorized(
            "send `Authorization: Bearer <token>`; this server requires a token",
        ));
    };
    Ok(Sha256::digest(presented.trim().as_bytes()).into())
}

impl Namespaces {
    /// Whether `namespace` is among them.
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            Namespaces::All => true,
            Namespaces::Only(list) => list.iter().any(|n| n == namespace),
        }
    }
}
