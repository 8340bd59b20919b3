//! `begin-batch` bodies of the usual shape, read without serde.
//!
//! A batch is mostly its items, and serde_json spends on each one about as
//! much as the memory store does: a field visitor, an owned `String` per key,
//! a vector that grows by copying. This reader takes the plain shape clients
//! send (a string key with no escapes, the optional `fingerprint` and
//! `lease_ms`) and hands each item over as slices of the body. Anything else
//! (an escape, an unknown or repeated field, a number that is not a plain
//! integer, bad JSON) makes it give up, and the caller reads the body with
//! serde_json as before. So every refusal, and its message, still comes from
//! serde_json; this reader only accepts what serde_json reads the same way
//! (a test holds the two together).

/// One item, as slices of the body.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct PlainBeginItem<'a> {
    /// The key's bytes: valid UTF-8 with nothing to unescape.
    pub key: &'a [u8],
    /// The fingerprint's bytes, if one was given (and not `null`).
    pub fingerprint: Option<&'a [u8]>,
    /// `lease_ms`, if given as a plain integer (and not `null`).
    pub lease_ms: Option<u64>,
}

/// The items of a `begin-batch` body `{"items": [...]}`, or `None` when the
/// body is not of the plain shape.
pub(super) fn begin_items(body: &[u8]) -> Option<Vec<PlainBeginItem<'_>>> {
    // serde_json checks that the strings it reads are UTF-8, and outside
    // strings only ASCII is JSON: checking the whole body once covers both.
    std::str::from_utf8(body).ok()?;
    let mut r = Reader { body, at: 0 };
    r.expect(b'{')?;
    if r.plain_string()? != b"items" {
        return None;
    }
    r.expect(b':')?;
    r.expect(b'[')?;
    // A plain item takes at least 12 bytes; the bound keeps a large body
    // from reserving much before it is read.
    let mut items = Vec::with_capacity((body.len() / 16).min(1024));
    if r.peek()? == b']' {
        r.at += 1;
    } else {
        loop {
            items.push(r.item()?);
            match r.peek()? {
                b',' => r.at += 1,
                b']' => {
                    r.at += 1;
                    break;
                }
                _ => return None,
            }
        }
    }
    r.expect(b'}')?;
    r.skip_whitespace();
    (r.at == body.len()).then_some(items)
}

/// How many bytes at the start of a string's text need no attention: up to
/// its first `"`, `\` or control character (all of `text` if none). Eight
/// bytes at a time, since keys are most of a batch.
fn plain_run(text: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A high bit for each byte of `x` below `n` (at most 0x80). A borrow can
    // also mark bytes after the first one that is, so only the first mark
    // counts.
    let below = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x & HIGH;
    let mut at = 0;
    while let Some(chunk) = text.get(at..at + 8) {
        let x = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let quote = x ^ (ONES * u64::from(b'"'));
        let backslash = x ^ (ONES * u64::from(b'\\'));
        let marks = below(quote, 1) | below(backslash, 1) | below(x, 0x20);
        if marks != 0 {
            return at + marks.trailing_zeros() as usize / 8;
        }
        at += 8;
    }
    at + text[at..]
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .unwrap_or(text.len() - at)
}

struct Reader<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// JSON's whitespace, as serde_json skips it.
    fn skip_whitespace(&mut self) {
        while matches!(self.body.get(self.at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, not taken.
    fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.body.get(self.at).copied()
    }

    /// Takes `byte`, after whitespace.
    fn expect(&mut self, byte: u8) -> Option<()> {
        if self.peek()? != byte {
            return None;
        }
        self.at += 1;
        Some(())
    }

    /// Takes `null`, if it comes next.
    fn null(&mut self) -> bool {
        self.skip_whitespace();
        let null = self.body[self.at..].starts_with(b"null");
        if null {
            self.at += 4;
        }
        null
    }

    /// A string with nothing to unescape: the bytes between its quotes.
    fn plain_string(&mut self) -> Option<&'a [u8]> {
        self.expect(b'"')?;
        let start = self.at;
        let end = start + plain_run(&self.body[start..]);
        if self.body.get(end) != Some(&b'"') {
            return None;
        }
        self.at = end + 1;
        Some(&self.body[start..end])
    }

    /// An integer without sign, fraction or exponent, of at most 18 digits
    /// (so it fits, and serde_json reads it as the same `u64`). What follows
    /// is checked by the caller, who expects `,` or `}`: `01`, `1.5` or `1e3`
    /// stop there.
    fn integer(&mut self) -> Option<u64> {
        self.skip_whitespace();
        let digits = self.body[self.at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 || digits > 18 {
            return None;
        }
        let text = &self.body[self.at..self.at + digits];
        // A leading zero is taken alone, and what follows it refused.
        let text = if text[0] == b'0' { &text[..1] } else { text };
        self.at += text.len();
        Some(text.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
    }

    /// `{"key": "...", "fingerprint": "..." | null, "lease_ms": N | null}`,
    /// the last two optional, in any order, each at most once.
    fn item(&mut self) -> Option<PlainBeginItem<'a>> {
        self.expect(b'{')?;
        let mut key = None;
        let mut fingerprint = None;
        let mut lease_ms = None;
        if self.peek()? != b'}' {
            loop {
                let name = self.plain_string()?;
                self.expect(b':')?;
                match name {
                    b"key" if key.is_none() => key = Some(self.plain_string()?),
                    b"fingerprint" if fingerprint.is_none() => {
                        fingerprint = Some(if self.null() {
                            None
                        } else {
                            Some(self.plain_string()?)
                        });
                    }
                    b"lease_ms" if lease_ms.is_none() => {
                        lease_ms = Some(if self.null() {
                            None
                        } else {
                            Some(self.integer()?)
                        });
                    }
                    _ => return None,
                }
                match self.peek()? {
                    b',' => self.at += 1,
                    b'}' => break,
                    _ => return None,
                }
            }
        }
        self.at += 1;
        Some(PlainBeginItem {
            key: key?,
            fingerprint: fingerprint.flatten(),
            lease_ms: lease_ms.flatten(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::wire::BeginBatch;

    /// An item's key, fingerprint and lease, owned.
    type Item = (String, Option<String>, Option<u64>);

    /// The items as serde_json reads them, or `None` when it refuses.
    fn by_serde(body: &str) -> Option<Vec<Item>> {
        let batch: BeginBatch = serde_json::from_str(body).ok()?;
        Some(
            batch
                .items
                .into_iter()
                .map(|i| (i.key, i.fingerprint, i.lease_ms))
                .collect(),
        )
    }

    fn plain(body: &str) -> Option<Vec<Item>> {
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
        let items = begin_items(body.as_bytes())?;
        Some(
            items
                .into_iter()
                .map(|i| (text(i.key), i.fingerprint.map(text), i.lease_ms))
                .collect(),
        )
    }

    #[test]
    fn what_it_reads_serde_json_reads_the_same_and_the_rest_is_left_to_serde_json() {
        let taken = [
            r#"{"items":[{"key":"a"}]}"#,
            r#"{"items":[]}"#,
            " {\n\t\"items\" : [ { \"key\" : \"a b\" } , {\"key\":\"é-ü-€-𝄞\"} ] }\r\n",
            r#"{"items":[{"key":"a","fingerprint":"f","lease_ms":5}]}"#,
            r#"{"items":[{"lease_ms":0,"fingerprint":null,"key":"a"}]}"#,
            r#"{"items":[{"key":"a","lease_ms":null}]}"#,
            r#"{"items":[{"key":"a","lease_ms":999999999999999999}]}"#,
            r#"{"items":[{"key":"a","fingerprint":""}]}"#,
            r#"{"items":[{"key":""}]}"#,
            r#"{"items":[{"key":"a"},{"key":"a"},{"key":"'/{}[]:,"}]}"#,
        ];
        for body in taken {
            let read = plain(body);
            assert!(read.is_some(), "not taken: {body}");
            assert_eq!(read, by_serde(body), "{body}");
        }
        let left = [
            // Escapes, which serde_json decodes.
            r#"{"items":[{"key":"a\"b"}]}"#,
            r#"{"items":[{"key":"\u0061"}]}"#,
            r#"{"items":[{"k\u0065y":"a"}]}"#,
            r#"{"items":[{"key":"a","fingerprint":"\n"}]}"#,
            // Numbers other than plain integers.
            r#"{"items":[{"key":"a","lease_ms":5.0}]}"#,
            r#"{"items":[{"key":"a","lease_ms":5e3}]}"#,
            r#"{"items":[{"key":"a","lease_ms":-5}]}"#,
            r#"{"items":[{"key":"a","lease_ms":05}]}"#,
            r#"{"items":[{"key":"a","lease_ms":9999999999999999999}]}"#,
            r#"{"items":[{"key":"a","lease_ms":"5"}]}"#,
            // Refusals, with serde_json's messages.
            r#"{"items":[{"key":"a"}],"more":1}"#,
            r#"{"items":[{"key":"a","lease":1}]}"#,
            r#"{"items":[{"key":"a","key":"b"}]}"#,
            r#"{"items":[{"key":"a","fingerprint":null,"fingerprint":"f"}]}"#,
            r#"{"items":[{"fingerprint":"f"}]}"#,
            r#"{"items":[{}]}"#,
            r#"{"items":[{"key":null}]}"#,
            r#"{"items":[{"key":1}]}"#,
            r#"{"items":[{"key":"a"},]}"#,
            r#"{"items":[{"key":"a",}]}"#,
            r#"{"items":[{"key":"a"}]"#,
            r#"{"items":[{"key":"a"}]}x"#,
            r#"{"items":[{"key":"a"}]}{}"#,
            r#"{"items":[{"key":"a"} {"key":"b"}]}"#,
            r#"{"items":{"key":"a"}}"#,
            r#"{"items":null}"#,
            r#"{}"#,
            r#"[]"#,
            "",
            "\u{feff}{\"items\":[]}",
            "{\"items\":[{\"key\":\"a\tb\"}]}",
            r#"{"items":[{"key":"a","fingerprint":nul}]}"#,
            r#"{"items":[{"key":"a","lease_ms":nullx}]}"#,
            r#"{"items":[{"key":"a","lease_ms":}]}"#,
        ];
        for body in left {
            assert_eq!(plain(body), None, "taken: {body}");
        }
        // Not UTF-8 inside a string.
        assert!(begin_items(b"{\"items\":[{\"key\":\"\xff\"}]}").is_none());
    }

    #[test]
    fn a_string_ends_at_its_first_quote_backslash_or_control_character() {
        for len in 0..40 {
            for stop in [b'"', b'\\', 0, 0x1f] {
                for at in 0..=len {
                    let mut text = "é-kéy-€-".repeat(8).into_bytes();
                    text.truncate(len);
                    text.extend_from_slice(b"abcdefghijklmnop");
                    if at < len {
                        text[at] = stop;
                    }
                    let first = text
                        .iter()
                        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
                        .unwrap_or(text.len());
                    assert_eq!(plain_run(&text), first, "{text:?}");
                }
            }
        }
        assert_eq!(plain_run(b""), 0);
        assert_eq!(plain_run(b"\x7f\x80\xff !#[]~"), 9);
        assert_eq!(plain_run(b"\x7f\x80\xff !#[]~\x1f"), 9);
    }

    #[test]
    fn a_batch_is_read_whole_and_in_order() {
        let body = format!(
            r#"{{"items":[{}]}}"#,
            (0..3000)
                .map(|i| format!(r#"{{"key":"k-{i}","lease_ms":{i}}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        let read = plain(&body).unwrap();
        assert_eq!(read.len(), 3000);
        assert_eq!(read, by_serde(&body).unwrap());
    }
}
