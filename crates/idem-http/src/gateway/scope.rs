//! Who the client is: the scope that keeps two clients' keys apart.

use http::request::Parts;
use http::{HeaderMap, HeaderName, header};

/// Tells clients apart, so that two clients sending the same
/// `Idempotency-Key` never see each other's responses, and the keyless
/// window never merges requests of two clients.
///
/// The gateway hashes what [`identify`](ClientScope::identify) returns and
/// puts it in front of the key. Identify clients by what authenticates them:
/// the `Authorization` header ([`HeaderScope::default`]), an API-key header,
/// a session cookie, or the TLS client identity (implement the trait, or
/// pass a closure, reading it from the request's extensions).
///
/// ```
/// use idem_http::gateway::{ClientScope, HeaderScope};
/// let by_api_key = HeaderScope::new(["x-api-key"]);
/// let by_session = HeaderScope::from_cookie("session");
/// let by_tenant = |req: &http::request::Parts| {
///     req.extensions.get::<String>().map(|tenant| tenant.clone().into_bytes())
/// };
/// # fn takes(_: impl ClientScope) {}
/// # takes(by_api_key); takes(by_session); takes(by_tenant);
/// ```
pub trait ClientScope: Send + Sync + 'static {
    /// Bytes that identify the client that sent `request`, or `None` when
    /// the request carries no identity. Keyed requests without one share a
    /// single anonymous scope; keyless ones are never merged.
    fn identify(&self, request: &Parts) -> Option<Vec<u8>>;
}

impl<F> ClientScope for F
where
    F: Fn(&Parts) -> Option<Vec<u8>> + Send + Sync + 'static,
{
    fn identify(&self, request: &Parts) -> Option<Vec<u8>> {
        self(request)
    }
}

/// Identifies clients by the values of named headers and cookies; the
/// default is the `Authorization` header.
#[derive(Clone, Debug)]
pub struct HeaderScope {
    headers: Vec<HeaderName>,
    cookies: Vec<String>,
}

impl HeaderScope {
    /// The client is who these headers say (all that are present, together).
    ///
    /// # Panics
    ///
    /// If a name is not a valid header name; use [`HeaderScope::try_new`]
    /// for names read from configuration.
    pub fn new<N: AsRef<str>>(headers: impl IntoIterator<Item = N>) -> Self {
        Self::try_new(headers).expect("valid header names")
    }

    /// Like [`new`](HeaderScope::new), refusing an invalid header name.
    pub fn try_new<N: AsRef<str>>(
        headers: impl IntoIterator<Item = N>,
    ) -> Result<Self, http::header::InvalidHeaderName> {
        Ok(Self {
            headers: headers
                .into_iter()
                .map(|n| HeaderName::from_bytes(n.as_ref().trim().as_bytes()))
                .collect::<Result<_, _>>()?,
            cookies: Vec::new(),
        })
    }

    /// The client is who the cookie `name` says (a session cookie).
    pub fn from_cookie(name: impl Into<String>) -> Self {
        Self {
            headers: Vec::new(),
            cookies: vec![name.into()],
        }
    }

    /// Also identify the client by the cookie `name`.
    pub fn cookie(mut self, name: impl Into<String>) -> Self {
        self.cookies.push(name.into());
        self
    }
}

impl Default for HeaderScope {
    fn default() -> Self {
        Self {
            headers: vec![header::AUTHORIZATION],
            cookies: Vec::new(),
        }
    }
}

impl ClientScope for HeaderScope {
    fn identify(&self, request: &Parts) -> Option<Vec<u8>> {
        // Each part carries its name, so `X-API-Key: a` and
        // `Authorization: a` are two clients; values hold no newline.
        let mut id = Vec::new();
        for name in &self.headers {
            for value in request.headers.get_all(name) {
                id.extend_from_slice(name.as_str().as_bytes());
                id.push(b':');
                id.extend_from_slice(value.as_bytes());
                id.push(b'\n');
            }
        }
        for name in &self.cookies {
            if let Some(value) = cookie(&request.headers, name) {
                id.extend_from_slice(b"cookie:");
                id.extend_from_slice(name.as_bytes());
                id.push(b'=');
                id.extend_from_slice(value);
                id.push(b'\n');
            }
        }
        (!id.is_empty()).then_some(id)
    }
}

/// The value of cookie `name` in the `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            (pair[..eq].trim_ascii() == name.as_bytes()).then(|| pair[eq + 1..].trim_ascii())
        })
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut req = http::Request::builder();
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.body(()).unwrap().into_parts().0
    }

    #[test]
    fn headers_and_cookies_identify_clients() {
        let scope = HeaderScope::from_cookie("session");
        assert_eq!(scope.identify(&parts(&[("x-api-key", "a")])), None);
        let scope = HeaderScope::new(["x-api-key"]).cookie("session");
        assert_eq!(scope.identify(&parts(&[])), None);
        assert_eq!(scope.identify(&parts(&[("authorization", "a")])), None);
        let a = scope.identify(&parts(&[("x-api-key", "a")]));
        let b = scope.identify(&parts(&[("x-api-key", "b")]));
        assert!(a.is_some() && a != b);
        let s1 = scope.identify(&parts(&[("cookie", "theme=dark; session=s1")]));
        let s2 = scope.identify(&parts(&[("cookie", "session=s2; theme=dark")]));
        assert!(s1.is_some() && s1 != s2);
        assert_eq!(scope.identify(&parts(&[("cookie", "session=")])), None);
        // The same value in another header is another client.
        let by_auth = HeaderScope::default().identify(&parts(&[("authorization", "a")]));
        assert!(by_auth.is_some() && by_auth != a);
        assert!(HeaderScope::try_new(["bad name"]).is_err());
    }
}
