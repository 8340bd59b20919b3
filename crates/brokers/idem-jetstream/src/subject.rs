//! NATS subjects and names: validity, wildcard coverage, and the name of
//! the stream that keeps dead letters.

/// A subject: non-empty tokens separated by `.`, `*` a whole token, `>` only
/// as the last token, no whitespace.
pub(crate) fn is_valid(subject: &str) -> bool {
    let tokens: Vec<&str> = subject.split('.').collect();
    tokens.iter().enumerate().all(|(i, t)| {
        !t.is_empty()
            && !t.contains(char::is_whitespace)
            && (*t == "*" || *t == ">" || !t.contains(['*', '>']))
            && (*t != ">" || i == tokens.len() - 1)
    })
}

/// Whether the subject holds `*` or `>`.
pub(crate) fn has_wildcard(subject: &str) -> bool {
    subject.split('.').any(|t| t == "*" || t == ">")
}

/// A stream or consumer name: non-empty, without `.`, `*`, `>`, path
/// separators or whitespace.
pub(crate) fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains(|c: char| matches!(c, '.' | '*' | '>' | '/' | '\\') || c.is_whitespace())
}

/// Whether every subject `subject` matches (it may hold wildcards) is also
/// matched by `pattern`: a stream with subject `pattern` captures it.
pub(crate) fn covers(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(t)) if t != ">" => {}
            (Some(a), Some(b)) if a == b && a != ">" && a != "*" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The stream created for dead-letter subject `subject`: the subject with
/// each character a stream name cannot hold replaced by `_`.
pub(crate) fn stream_name_for(subject: &str) -> String {
    subject
        .chars()
        .map(|c| {
            if matches!(c, '.' | '*' | '>' | '/' | '\\') || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_cover_what_they_match() {
        assert!(covers("orders.>", "orders.eu.paid"));
        assert!(covers("orders.>", "orders.*"));
        assert!(covers("orders.*", "orders.paid"));
        assert!(covers(">", "anything.at.all"));
        assert!(covers("orders.paid", "orders.paid"));
        assert!(!covers("orders.*", "orders.eu.paid"));
        assert!(!covers("orders.*", "orders.>"));
        assert!(!covers("orders.paid", "orders.*"));
        assert!(!covers("orders.>", "orders"));
        assert!(!covers("ORDERS.>", "orders.paid"));
    }

    #[test]
    fn subjects_and_names_are_checked() {
        for good in ["a", "a.b", "a.*.c", "a.>", ">"] {
            assert!(is_valid(good), "{good}");
        }
        for bad in ["", "a..b", "a.>.c", "a b", "a.b*", ".a"] {
            assert!(!is_valid(bad), "{bad}");
        }
        assert!(is_valid_name("ORDERS_dead-letter"));
        assert!(!is_valid_name("ORDERS.dead-letter"));
        assert_eq!(stream_name_for("ORDERS.dead-letter"), "ORDERS_dead-letter");
    }
}
