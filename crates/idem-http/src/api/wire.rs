//! The JSON the service speaks (docs/contract.md §5). Times are
//! milliseconds since the Unix epoch on the store's clock; durations are
//! milliseconds.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

/// `POST /v1/{ns}/begin`, and one item of `begin-batch`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BeginRequest {
    /// The idempotency key: 1 to 255 bytes of UTF-8 by default.
    #[schema(min_length = 1, max_length = 255)]
    pub key: String,
    /// Any string that identifies the content (a hash of the payload, say).
    /// The same key with another fingerprint is a `mismatch`.
    #[serde(default)]
    pub fingerprint: Option<String>,
    /// How long the claim lasts without `extend`; the server's default
    /// (30 000) when absent. From 1 ms up to the server's limit (7 days).
    #[serde(default, deserialize_with = "integral::optional")]
    #[schema(minimum = 1, maximum = 604_800_000)]
    pub lease_ms: Option<u64>,
}

/// The answer of `begin`: one of four, told apart by `status`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum BeginAnswer {
    /// The caller holds the key: do the work, then `complete` or `release`.
    Acquired {
        /// The fencing token for `complete`, `release` and `extend`.
        token: u64,
        /// When the lease runs out unless extended.
        lease_expires_at_ms: u64,
        /// 1, or more after takeovers of expired leases.
        attempt: u32,
    },
    /// Another holder is working on it: try again after `retry_after_ms`.
    InProgress {
        /// Time left on the other holder's lease.
        retry_after_ms: u64,
    },
    /// Done before: here is the stored outcome. Do not do it again.
    Completed {
        /// The outcome given to `complete`, exactly as it was sent (`null`
        /// when none was).
        #[schema(value_type = serde_json::Value)]
        outcome: Box<RawValue>,
        /// When it was completed.
        completed_at_ms: u64,
    },
    /// The key was used before with another fingerprint.
    Mismatch,
}

/// `POST /v1/{ns}/complete`, and one item of `complete-batch`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    /// The key.
    #[schema(min_length = 1, max_length = 255)]
    pub key: String,
    /// The token `begin` returned.
    #[serde(deserialize_with = "integral::exact")]
    pub token: u64,
    /// Any JSON value, returned to every duplicate exactly as sent: the
    /// same text, key order, spacing and number digits (1 MiB at most,
    /// counted on that text).
    #[serde(default)]
    #[schema(value_type = Option<serde_json::Value>)]
    pub outcome: Option<Box<RawValue>>,
    /// How long to remember the completion; the server's default (24 h)
    /// when absent.
    #[serde(default, deserialize_with = "integral::optional")]
    #[schema(minimum = 1, maximum = 31_536_000_000u64)]
    pub retention_ms: Option<u64>,
}

/// `POST /v1/{ns}/release`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// The key.
    #[schema(min_length = 1, max_length = 255)]
    pub key: String,
    /// The token `begin` returned.
    #[serde(deserialize_with = "integral::exact")]
    pub token: u64,
}

/// `POST /v1/{ns}/extend`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendRequest {
    /// The key.
    #[schema(min_length = 1, max_length = 255)]
    pub key: String,
    /// The token `begin` returned.
    #[serde(deserialize_with = "integral::exact")]
    pub token: u64,
    /// The new lease, from now; the server's default when absent.
    #[serde(default, deserialize_with = "integral::optional")]
    #[schema(minimum = 1, maximum = 604_800_000)]
    pub lease_ms: Option<u64>,
}

/// A successful `complete`.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompleteAnswer {
    /// Always `completed`.
    #[schema(example = "completed")]
    pub status: &'static str,
}

/// A successful `release`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReleaseAnswer {
    /// Always `released`.
    #[schema(example = "released")]
    pub status: &'static str,
}

/// A successful `extend`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExtendAnswer {
    /// Always `extended`.
    #[schema(example = "extended")]
    pub status: &'static str,
    /// The new end of the lease.
    pub lease_expires_at_ms: u64,
}

/// `POST /v1/{ns}/begin-batch`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BeginBatch {
    /// Up to 10 000 items (the server's `max_batch`).
    #[schema(max_items = 10_000)]
    pub items: Vec<BeginRequest>,
}

/// `POST /v1/{ns}/complete-batch`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteBatch {
    /// Up to 10 000 items (the server's `max_batch`).
    #[schema(max_items = 10_000)]
    pub items: Vec<CompleteRequest>,
}

/// The answers of `begin-batch`, one per item, in order.
#[derive(Debug, Serialize, ToSchema)]
pub struct BeginBatchAnswer {
    /// One per item, in order.
    pub results: Vec<BeginAnswer>,
}

impl BeginBatchAnswer {
    /// The JSON of an answer with these `results`: the very bytes
    /// `serde_json::to_vec` makes of it (a test holds the two together),
    /// written into one buffer sized up front as the results come, without
    /// a vector of them first. serde_json escapes every tag and field name
    /// byte by byte as it writes them, which was most of a batch's
    /// serialization; here they are constants.
    pub(super) fn json_of(results: impl ExactSizeIterator<Item = BeginAnswer>) -> Vec<u8> {
        // An `acquired` answer with a six-digit token is about 85 bytes.
        let mut out = Vec::with_capacity(16 + 96 * results.len());
        let mut numbers = Numbers::default();
        out.extend_from_slice(br#"{"results":["#);
        for (i, answer) in results.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            answer.write_json(&mut out, &mut numbers);
        }
        out.extend_from_slice(b"]}");
        out
    }
}

impl BeginAnswer {
    /// Appends the answer as `serde_json` writes it: the tag first, then the
    /// fields in declaration order, no spaces.
    fn write_json(&self, out: &mut Vec<u8>, numbers: &mut Numbers) {
        match self {
            Self::Acquired {
                token,
                lease_expires_at_ms,
                attempt,
            } => {
                out.extend_from_slice(br#"{"status":"acquired","token":"#);
                numbers.write(out, *token);
                out.extend_from_slice(br#","lease_expires_at_ms":"#);
                numbers.write_time(out, *lease_expires_at_ms);
                out.extend_from_slice(br#","attempt":"#);
                numbers.write(out, u64::from(*attempt));
            }
            Self::InProgress { retry_after_ms } => {
                out.extend_from_slice(br#"{"status":"in_progress","retry_after_ms":"#);
                numbers.write(out, *retry_after_ms);
            }
            Self::Completed {
                outcome,
                completed_at_ms,
            } => {
                out.extend_from_slice(br#"{"status":"completed","outcome":"#);
                out.extend_from_slice(outcome.get().as_bytes());
                out.extend_from_slice(br#","completed_at_ms":"#);
                numbers.write(out, *completed_at_ms);
            }
            Self::Mismatch => out.extend_from_slice(br#"{"status":"mismatch""#),
        }
        out.push(b'}');
    }
}

/// Writes the numbers of a batch's answers in decimal.
#[derive(Default)]
struct Numbers {
    digits: itoa::Buffer,
    /// The last lease end written, and its digits: the claims of one batch
    /// mostly end in the same millisecond, so it is formatted once.
    time: Option<(u64, [u8; 20], usize)>,
}

impl Numbers {
    fn write(&mut self, out: &mut Vec<u8>, n: u64) {
        match u8::try_from(n) {
            // Attempts, mostly.
            Ok(d @ 0..=9) => out.push(b'0' + d),
            _ => out.extend_from_slice(self.digits.format(n).as_bytes()),
        }
    }

    fn write_time(&mut self, out: &mut Vec<u8>, ms: u64) {
        let (_, text, len) = match &mut self.time {
            Some(last) if last.0 == ms => last,
            time => {
                let digits = self.digits.format(ms).as_bytes();
                let mut text = [0; 20];
                text[..digits.len()].copy_from_slice(digits);
                time.insert((ms, text, digits.len()))
            }
        };
        out.extend_from_slice(&text[..*len]);
    }
}

/// One answer of `complete-batch`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CompleteItemAnswer {
    /// The outcome was stored.
    Completed,
    /// The token did not own the key: nothing changed.
    Stale,
}

/// The answers of `complete-batch`, one per item, in order.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompleteBatchAnswer {
    /// One per item, in order.
    pub results: Vec<CompleteItemAnswer>,
}

/// `GET /v1/{ns}/record?key=K`: a record as stored.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RecordAnswer {
    /// Someone holds the key.
    InProgress {
        /// The holder's token.
        token: u64,
        /// The stored fingerprint digest (hex), if one was given.
        fingerprint: Option<String>,
        /// When the lease runs out.
        lease_expires_at_ms: u64,
        /// Acquisitions so far.
        attempts: u32,
        /// When the current holder acquired it.
        started_at_ms: u64,
    },
    /// Done, with its outcome.
    Completed {
        /// The token that completed it.
        token: u64,
        /// The stored fingerprint digest (hex), if one was given.
        fingerprint: Option<String>,
        /// The stored outcome, exactly as it was sent.
        #[schema(value_type = serde_json::Value)]
        outcome: Box<RawValue>,
        /// When it was completed.
        completed_at_ms: u64,
        /// When it will be forgotten.
        expires_at_ms: u64,
    },
}

/// `GET /v1/{ns}/record` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RecordQuery {
    /// The key to look up.
    #[param(min_length = 1, max_length = 255)]
    pub key: String,
}

/// `GET /healthz` and `GET /readyz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: &'static str,
}

/// JSON Schema counts `5.0` as an integer, so the API takes it as one; a
/// fraction, a negative number or one past the int64 range the document
/// declares is refused.
mod integral {
    use serde::{Deserialize, Deserializer, de::Error};

    pub fn exact<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let n = serde_json::Number::deserialize(d)?;
        const MAX: u64 = i64::MAX as u64;
        let whole = match n.as_u64() {
            Some(u) => Some(u),
            None => n
                .as_f64()
                .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f <= MAX as f64)
                .map(|f| f as u64),
        };
        whole
            .filter(|u| *u <= MAX)
            .ok_or_else(|| D::Error::custom(format!("{n} is not a whole number from 0 to {MAX}")))
    }

    pub fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        match Option::<serde_json::Number>::deserialize(d)? {
            None => Ok(None),
            Some(n) => exact(serde_json::Value::Number(n))
                .map(Some)
                .map_err(D::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_kind() -> Vec<BeginAnswer> {
        let raw = |text: &str| RawValue::from_string(text.to_owned()).unwrap();
        vec![
            BeginAnswer::Acquired {
                token: 1,
                lease_expires_at_ms: 1_700_000_000_000,
                attempt: 1,
            },
            BeginAnswer::Acquired {
                token: u64::MAX,
                lease_expires_at_ms: 0,
                attempt: u32::MAX,
            },
            BeginAnswer::InProgress {
                retry_after_ms: 29_999,
            },
            BeginAnswer::Completed {
                outcome: raw(r#"{ "b": [1, 2.50, "\u00e9"], "a": null }"#),
                completed_at_ms: 42,
            },
            BeginAnswer::Completed {
                outcome: RawValue::NULL.to_owned(),
                completed_at_ms: u64::MAX,
            },
            BeginAnswer::Completed {
                outcome: serde_json::value::to_raw_value("not \"json\" \u{1}").unwrap(),
                completed_at_ms: 7,
            },
            BeginAnswer::Mismatch,
            BeginAnswer::Acquired {
                token: 9,
                lease_expires_at_ms: 1_700_000_000_000,
                attempt: 10,
            },
            BeginAnswer::Acquired {
                token: 10,
                lease_expires_at_ms: 1_700_000_000_000,
                attempt: 0,
            },
            BeginAnswer::Acquired {
                token: 255,
                lease_expires_at_ms: 1_700_000_000_001,
                attempt: 256,
            },
            BeginAnswer::Acquired {
                token: 256,
                lease_expires_at_ms: 0,
                attempt: 9,
            },
            BeginAnswer::InProgress { retry_after_ms: 0 },
        ]
    }

    #[test]
    fn a_begin_batch_answer_is_written_as_serde_json_writes_it() {
        let cases: [fn() -> Vec<BeginAnswer>; 3] =
            [Vec::new, || vec![BeginAnswer::Mismatch], every_kind];
        for results in cases {
            let by_serde = serde_json::to_string(&BeginBatchAnswer { results: results() }).unwrap();
            let by_hand = BeginBatchAnswer::json_of(results().into_iter());
            assert_eq!(String::from_utf8(by_hand).unwrap(), by_serde);
        }
    }
}
