//! The copies a source writes of a delivered message (a retry copy, a dead
//! letter): which of the original's headers they keep, under which names,
//! and idem's own headers with every value made safe to send.
//!
//! Every source builds its copies here, so that the rules hold on every
//! broker alike:
//!
//! - the original's headers are kept as they came, except those idem sets
//!   itself (compared without regard to case), which idem's values replace;
//! - a header the broker acts on when it is published (a NATS
//!   `Nats-Expected-Last-Sequence`, an AMQP `CC`) is kept as
//!   `idem-original-<name>`, never sent as a control: a copy must not be
//!   refused or routed elsewhere because of what its original asked for;
//! - idem's values come from untrusted text (a handler's error body, a key
//!   taken from the payload) and go through [`header_text`]: control
//!   characters escaped, length capped.

use std::borrow::Cow;

/// Prefix under which a copy keeps a control header of its original.
pub const ORIGINAL_PREFIX: &str = "idem-original-";

/// Most bytes of an idem header value on a copy; longer text is cut at a
/// character boundary and ends with `…`.
pub const MAX_HEADER_TEXT: usize = 1024;

/// What a broker does with header names on a published message.
#[derive(Clone, Copy, Debug)]
pub struct HeaderRules {
    /// Whether the broker acts on a header of this name when a message
    /// carrying it is published (routing, expectations, deduplication).
    pub is_control: fn(&str) -> bool,
}

impl HeaderRules {
    /// A broker that acts on no header name (Kafka, Redis Streams).
    pub const PLAIN: HeaderRules = HeaderRules {
        is_control: |_| false,
    };
}

/// A header value of a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyValue<V> {
    /// The original's value, as the broker delivered it.
    Original(V),
    /// A value idem set, already made safe by [`header_text`].
    Idem(String),
}

/// The headers of a copy of a message whose headers are `original`: the
/// original's (less those `idem` sets; controls renamed under
/// [`ORIGINAL_PREFIX`]), then `idem`'s, in that order, each idem value
/// passed through [`header_text`].
///
/// Generic over the value type, so a source keeps its broker's typed
/// values (an AMQP integer stays an integer).
pub fn copy_headers<N, V>(
    original: impl IntoIterator<Item = (N, V)>,
    rules: HeaderRules,
    idem: &[(&str, &str)],
) -> Vec<(String, CopyValue<V>)>
where
    N: AsRef<str>,
{
    let set_by_idem = |name: &str| idem.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    let mut out: Vec<(String, CopyValue<V>)> = original
        .into_iter()
        .filter(|(name, _)| !set_by_idem(name.as_ref()))
        .map(|(name, value)| {
            let name = name.as_ref();
            let name = if (rules.is_control)(name) {
                format!("{ORIGINAL_PREFIX}{name}")
            } else {
                name.to_owned()
            };
            (name, CopyValue::Original(value))
        })
        .collect();
    out.extend(idem.iter().map(|(name, value)| {
        (
            (*name).to_owned(),
            CopyValue::Idem(header_text(value).into_owned()),
        )
    }));
    out
}

/// `text` made safe for a header value or a broker property on any broker
/// idem speaks to, and for a log line: control characters (CR, LF, NUL,
/// RocketMQ's `\u{1}`/`\u{2}` property separators, …) and Unicode line
/// separators escaped as `\n`, `\r`, `\t` or `\u{…}`, and the result cut to
/// [`MAX_HEADER_TEXT`] bytes.
pub fn header_text(text: &str) -> Cow<'_, str> {
    header_text_within(text, MAX_HEADER_TEXT)
}

/// [`header_text`] with another length limit (at least 4 bytes).
pub fn header_text_within(text: &str, max: usize) -> Cow<'_, str> {
    let max = max.max(4);
    if text.len() <= max && !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    const ELLIPSIS: &str = "…";
    let mut out = String::with_capacity(text.len().min(max));
    // Where the text is cut if it turns out longer than `max`: the last
    // piece boundary that leaves room for the ellipsis.
    let mut cut = 0;
    for c in text.chars() {
        let mut buf = [0u8; 4];
        let piece: Cow<'_, str> = match c {
            '\n' => "\\n".into(),
            '\r' => "\\r".into(),
            '\t' => "\\t".into(),
            c if needs_escape(c) => format!("\\u{{{:x}}}", c as u32).into(),
            c => Cow::Borrowed(&*c.encode_utf8(&mut buf)),
        };
        if out.len() + piece.len() > max {
            out.truncate(cut);
            out.push_str(ELLIPSIS);
            return Cow::Owned(out);
        }
        out.push_str(&piece);
        if out.len() <= max - ELLIPSIS.len() {
            cut = out.len();
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    idem_core::text::is_invisible(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_kept_as_it_is() {
        assert!(matches!(
            header_text("order 7 refused: café"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn line_breaks_and_separators_are_escaped() {
        let body = "{\r\n  \"title\": \"bad\"\n}\u{1}KEYS\u{2}x\u{0}";
        let safe = header_text(body);
        assert_eq!(
            safe,
            "{\\r\\n  \"title\": \"bad\"\\n}\\u{1}KEYS\\u{2}x\\u{0}"
        );
        assert!(!safe.chars().any(char::is_control));
    }

    #[test]
    fn long_text_is_cut_within_the_limit_at_a_character_boundary() {
        let long = "é".repeat(5000);
        let safe = header_text(&long);
        assert!(safe.len() <= MAX_HEADER_TEXT, "{}", safe.len());
        assert!(safe.ends_with('…'));
        let escaped = "\n".repeat(5000);
        let safe = header_text_within(&escaped, 11);
        assert_eq!(safe, "\\n\\n\\n\\n…");
    }

    #[test]
    fn text_that_fits_exactly_is_not_cut() {
        let exact = "a".repeat(MAX_HEADER_TEXT);
        assert_eq!(header_text(&exact), exact);
    }

    #[test]
    fn a_copy_keeps_the_original_renames_controls_and_sets_idem_headers() {
        let rules = HeaderRules {
            is_control: |n| n.len() > 5 && n[..5].eq_ignore_ascii_case("nats-"),
        };
        let original = [
            ("tenant", 1),
            ("Nats-Expected-Last-Sequence", 2),
            ("IDEM-ATTEMPTS", 3),
        ];
        let copy = copy_headers(
            original,
            rules,
            &[("idem-attempts", "4"), ("idem-last-error", "a\nb")],
        );
        assert_eq!(
            copy,
            vec![
                ("tenant".to_owned(), CopyValue::Original(1)),
                (
                    "idem-original-Nats-Expected-Last-Sequence".to_owned(),
                    CopyValue::Original(2)
                ),
                ("idem-attempts".to_owned(), CopyValue::Idem("4".into())),
                (
                    "idem-last-error".to_owned(),
                    CopyValue::Idem("a\\nb".into())
                ),
            ]
        );
    }
}
