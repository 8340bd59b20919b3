//! The SQL store's URL: what idem reads from it (`table=`, `shards=`,
//! `pool_size=`, `lock_timeout=`) before it goes to the driver, the
//! driver's own reading of what is left (without connecting), and the URL
//! as idem shows it. Any text, and URLs assembled from a user, a password,
//! a host and a query: read or refused with a reason; nothing panics; a
//! refusal and a shown URL never hold the password.
#![no_main]

use arbitrary::Arbitrary;
use idem_sql::decode::read_store_url;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    text: &'a str,
    scheme: u8,
    user: &'a str,
    password: &'a str,
    host: &'a str,
    query: &'a str,
}

const SCHEMES: [&str; 4] = ["postgres", "postgresql", "mysql", "mariadb"];

/// The secrets in `url` as the drivers read them: the password of the
/// user information, and the values of query parameters that carry one.
fn secrets_of(url: &str) -> Vec<String> {
    // The URL parser drops tabs and line breaks and escapes other control
    // characters and spaces, so what it reads would not be a piece of
    // `url`.
    if url.contains(|c: char| c.is_control() || c.is_whitespace()) {
        return Vec::new();
    }
    let Ok(parsed) = url::Url::parse(url) else {
        return Vec::new();
    };
    // The parser escapes some characters and decodes the query: only what
    // stands in `url` as written is looked for.
    let mut out: Vec<String> = parsed
        .password()
        .filter(|p| url.contains(&format!(":{p}@")))
        .map(str::to_owned)
        .into_iter()
        .collect();
    for (name, value) in parsed.query_pairs() {
        if matches!(&*name, "password" | "sslkey" | "ssl-key") && url.contains(&format!("={value}"))
        {
            out.push(value.into_owned());
        }
    }
    out
}

/// Whether `secret` is one `shown` must not hold: long enough and with a
/// letter or digit, not to be spelt by chance (as `:::` by the `: ` after a
/// URL in a message), in `url` once only, without the `*` that stands in
/// for a secret (so that `://:***@` cannot spell it) and without `&` (idem
/// drops empty query pairs, so `a&&b` may be shown as `a&b`, which is no
/// secret even when it spells one).
fn telling(secret: &str, url: &str) -> bool {
    secret.len() >= 4
        && secret.chars().any(char::is_alphanumeric)
        && !secret.contains(['*', '&'])
        && url.matches(secret).count() == 1
}

fn check(url: &str, secrets: Vec<String>) {
    // What is shown of `url`, and why it is refused.
    let mut said = vec![(url.to_owned(), idem_sql::redacted(url))];
    match read_store_url(url) {
        Err(e) => {
            let why = e.to_string();
            assert!(!why.is_empty());
            // The message's own ": " after the URL is not the URL's.
            said.push((url.to_owned(), why.replace(": ", " ")));
        }
        Ok(read) => {
            let query = read.driver_url.split_once('?').map_or("", |(_, q)| q);
            for pair in query.split('&') {
                let name = pair.split_once('=').map_or(pair, |(n, _)| n);
                assert!(
                    !matches!(name, "shards" | "table" | "pool_size" | "lock_timeout"),
                    "{name} left in {}",
                    read.driver_url
                );
            }
            assert!((1..=256).contains(&read.tables.shards()));
            assert!(read.pool_size >= 1);
            // Checked against the secrets the driver reads from it.
            for secret in secrets_of(&read.driver_url)
                .iter()
                .filter(|s| telling(s, &read.driver_url))
            {
                assert!(
                    !read.shown.contains(secret.as_str()),
                    "{secret:?} in {:?}",
                    read.shown
                );
            }
        }
    }
    for (from, text) in &said {
        for secret in secrets.iter().filter(|s| telling(s, from)) {
            assert!(
                !text.contains(secret.as_str()),
                "{secret:?} in {text:?} (from {url:?})"
            );
        }
    }
}

fuzz_target!(|input: Input<'_>| {
    check(input.text, secrets_of(input.text));
    let scheme = SCHEMES[usize::from(input.scheme) % SCHEMES.len()];
    if input.user.contains([':', '@']) || input.password.contains('@') {
        return;
    }
    let url = format!(
        "{scheme}://{}:{}@{}?{}",
        input.user, input.password, input.host, input.query
    );
    let mut known = secrets_of(&url);
    known.push(input.password.to_owned());
    check(&url, known);
});
