//! Untrusted text made safe to print, and secrets kept out of what is
//! printed.

/// Whether `c` must be escaped before untrusted text is printed to a
/// terminal, a log line or a header: control characters, the line and
/// paragraph separators, and the invisible formatting characters (Unicode
/// category Cf), among them the bidirectional overrides and isolates that
/// make `abc\u{202e}fdp.exe` print as `abcexe.pdf`, and zero-width
/// characters that make two different keys look the same.
///
/// ```
/// use idem_core::text::is_invisible;
///
/// assert!(is_invisible('\u{202e}')); // right-to-left override
/// assert!(is_invisible('\u{200b}')); // zero-width space
/// assert!(is_invisible('\n'));
/// assert!(!is_invisible('é'));
/// ```
pub fn is_invisible(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00ad}'
                | '\u{0600}'..='\u{0605}'
                | '\u{061c}'
                | '\u{06dd}'
                | '\u{070f}'
                | '\u{0890}'..='\u{0891}'
                | '\u{08e2}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{110bd}'
                | '\u{110cd}'
                | '\u{13430}'..='\u{1343f}'
                | '\u{1bca0}'..='\u{1bca3}'
                | '\u{1d173}'..='\u{1d17a}'
                | '\u{e0001}'
                | '\u{e0020}'..='\u{e007f}'
        )
}

/// Whether a URL's `user@` without a password is shown.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BareUser {
    Show,
    Hide,
}

/// `url` with every credential replaced by `***`, for logs, errors and
/// command output: the password in `user:password@`, a user name without a
/// password (a token, as NATS takes one: `nats://TOKEN@host`), and query
/// parameters that carry a secret (`password=`, Kafka's
/// `sasl.password=`, `token=`, `secret=`, `sslkey=`, … in any spelling,
/// also percent-encoded). Text that is no URL passes through.
///
/// ```
/// use idem_core::text::redacted_url;
///
/// assert_eq!(redacted_url("amqp://app:s3cret@mq:5672/%2f"), "amqp://app:***@mq:5672/%2f");
/// assert_eq!(redacted_url("nats://t0ken@nats:4222"), "nats://***@nats:4222");
/// assert_eq!(
///     redacted_url("kafka://k:9092?topic=t&sasl.password=s3cret"),
///     "kafka://k:9092?topic=t&sasl.password=***"
/// );
/// assert_eq!(redacted_url("http://h/handle?token=abc"), "http://h/handle?token=***");
/// ```
pub fn redacted_url(url: &str) -> String {
    redacted(url, BareUser::Hide)
}

/// [`redacted_url`], showing a user name that has no password
/// (`mysql://root@db`): for a database's URL, where it names the user.
pub fn redacted_url_keeping_user(url: &str) -> String {
    redacted(url, BareUser::Show)
}

/// `url` with its credentials replaced by `***` (see [`redacted_url`]).
///
/// A password may hold unencoded `/`, `@`, `?` or `#`: everything before
/// the last `@` ahead of the query is user information. Should a query
/// value hold an `@` as well, more than the password is hidden, never less.
fn redacted(url: &str, bare_user: BareUser) -> String {
    // URL parsers drop tabs and line breaks: `redis:/⏎/:secret@h` connects
    // with the password, so it is read as they read it.
    let url: String = url
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    let url = url.as_str();
    // A URL mistyped without `//` is shown in the error that refuses it:
    // it is read as the rest of one.
    // So is a `://` that is no scheme's (inside a query value).
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest))
            if !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) =>
        {
            (&url[..scheme.len() + 3], rest)
        }
        _ => ("", url),
    };
    // Where a secret may be, as byte ranges of `rest`; where a '?' comes
    // before the '@', both readings count: a '?' in the password, and a
    // query whose value holds an '@'.
    let mut hidden = Vec::new();
    // The user information ends at the last '@' before the first '?' that
    // follows an '@'.
    let query_after_at = match rest.find('@') {
        Some(at) => rest[at..].find('?').map(|q| at + q),
        None => None,
    };
    if let Some(at) = rest[..query_after_at.unwrap_or(rest.len())].rfind('@') {
        match rest[..at].find(':') {
            Some(colon) => hidden.push((colon + 1, at)),
            // NATS's `nats://TOKEN@host`: the user name is the secret.
            None if bare_user == BareUser::Hide => hidden.push((0, at)),
            None => {}
        }
    }
    // Every `name=value` pair after the first '?', as the drivers split
    // them: at '&' only.
    if let Some(q) = rest.find('?') {
        let mut offset = q + 1;
        for piece in rest[q + 1..].split_inclusive('&') {
            let pair = piece.strip_suffix('&').unwrap_or(piece);
            if let Some((name, _)) = pair.split_once('=')
                && is_secret_param(&percent_decoded(name))
            {
                hidden.push((offset + name.len() + 1, offset + pair.len()));
            }
            offset += piece.len();
        }
    }
    hidden.sort_unstable();
    let mut out = scheme.to_owned();
    let mut shown_to = 0;
    for (from, to) in hidden {
        if from < shown_to {
            // Overlaps the range hidden last: hide up to the later end.
            if to > shown_to {
                shown_to = to;
            }
            continue;
        }
        out.push_str(&rest[shown_to..from]);
        out.push_str("***");
        shown_to = to;
    }
    out.push_str(&rest[shown_to..]);
    out
}

/// `text` with its `%XX` escapes decoded, as URL parsers read a query
/// parameter; a `%` not followed by two hex digits is kept as it is.
pub fn percent_decoded(text: &str) -> String {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('%') {
        bytes.extend_from_slice(&rest.as_bytes()[..at]);
        match rest
            .get(at + 1..at + 3)
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            Some(byte) => {
                bytes.push(byte);
                rest = &rest[at + 3..];
            }
            None => {
                bytes.push(b'%');
                rest = &rest[at + 1..];
            }
        }
    }
    bytes.extend_from_slice(rest.as_bytes());
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Whether a URL query parameter (or a client property) named `name`
/// carries a secret, as [`redacted_url`] hides it: a
/// password in any spelling (Kafka's `sasl.password`), a token, a secret
/// or a client key.
pub fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase().replace(['-', '_'], "");
    name.contains("password")
        || name.contains("passwd")
        || name.contains("secret")
        || name.contains("token")
        || name.contains("credential")
        || name.contains("privatekey")
        || name.ends_with("key.pem")
        || matches!(
            name.as_str(),
            "pass" | "pwd" | "sslkey" | "key" | "clientkey" | "sslclientkey"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_escapes_decode_as_the_drivers_decode_them() {
        assert_eq!(percent_decoded("a%2"), "a%2");
        assert_eq!(percent_decoded("%zz%41"), "%zzA");
    }

    #[test]
    fn every_broker_and_handler_credential_is_hidden() {
        for (url, shown) in [
            (
                "amqp://guest:guest@127.0.0.1:5672/%2f?queue=orders",
                "amqp://guest:***@127.0.0.1:5672/%2f?queue=orders",
            ),
            (
                "nats://s3cret@127.0.0.1:4222?stream=S",
                "nats://***@127.0.0.1:4222?stream=S",
            ),
            ("nats://app:s3cret@h:4222", "nats://app:***@h:4222"),
            (
                "kafka://h:9092?topic=t&sasl.username=app&sasl.password=s3cret&group=g",
                "kafka://h:9092?topic=t&sasl.username=app&sasl.password=***&group=g",
            ),
            (
                "kafka://h:9092?ssl.key.password=s3cret",
                "kafka://h:9092?ssl.key.password=***",
            ),
            (
                "rocketmq://h:9876?topic=t&secret_key=s3cret",
                "rocketmq://h:9876?topic=t&secret_key=***",
            ),
            (
                "http://127.0.0.1:8080/handle?token=s3cret&x=1",
                "http://127.0.0.1:8080/handle?token=***&x=1",
            ),
            ("https://u:s3cret@h/handle", "https://u:***@h/handle"),
            ("redis:/\n/:s3cret@h", "redis://:***@h"),
            (
                "http://127.0.0.1:8080/handle",
                "http://127.0.0.1:8080/handle",
            ),
        ] {
            assert_eq!(redacted_url(url), shown, "{url}");
        }
        assert_eq!(
            redacted_url_keeping_user("mysql://root@h/test"),
            "mysql://root@h/test"
        );
        assert_eq!(redacted_url("mysql://root@h/test"), "mysql://***@h/test");
    }
}
