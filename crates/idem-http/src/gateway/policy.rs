//! Which upstream answers are stored and replayed, and which release the key.

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

use http::StatusCode;

/// The upstream statuses that release the key instead of being stored: the
/// client may retry, and the retry reaches the upstream again. Every other
/// status is stored and replayed for the retention. An upstream that cannot
/// be reached, or whose body fails mid-way, always releases.
///
/// The default releases 408, 425, 429 and 5xx: answers that say "not done,
/// try again". Written as text: `408,425,429,500-599` (`none` stores every
/// status).
///
/// ```
/// use idem_http::gateway::ReleasePolicy;
/// let policy: ReleasePolicy = "409,500-599".parse()?;
/// assert!(policy.releases(http::StatusCode::CONFLICT));
/// assert!(!policy.releases(http::StatusCode::TOO_MANY_REQUESTS));
/// assert!(ReleasePolicy::default().releases(http::StatusCode::TOO_MANY_REQUESTS));
/// # Ok::<_, idem_http::gateway::ReleasePolicyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleasePolicy {
    ranges: Vec<RangeInclusive<u16>>,
}

impl ReleasePolicy {
    /// Releases the statuses in `ranges`.
    pub fn new(ranges: impl IntoIterator<Item = RangeInclusive<u16>>) -> Self {
        Self {
            ranges: ranges.into_iter().collect(),
        }
    }

    /// Stores every status (only failures to reach the upstream release).
    pub fn none() -> Self {
        Self::new([])
    }

    /// Whether `status` releases the key.
    pub fn releases(&self, status: StatusCode) -> bool {
        self.ranges.iter().any(|r| r.contains(&status.as_u16()))
    }
}

impl Default for ReleasePolicy {
    fn default() -> Self {
        Self::new([408..=408, 425..=425, 429..=429, 500..=599])
    }
}

/// A release policy that could not be read.
#[derive(Debug, thiserror::Error)]
#[error(
    "{part:?} is not a status code (100 to 599) or a range of them; write e.g. 408,425,429,500-599, or `none`"
)]
pub struct ReleasePolicyError {
    part: String,
}

impl FromStr for ReleasePolicy {
    type Err = ReleasePolicyError;

    fn from_str(text: &str) -> Result<Self, ReleasePolicyError> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("none") {
            return Ok(Self::none());
        }
        let status = |part: &str, s: &str| {
            s.trim()
                .parse::<u16>()
                .ok()
                .filter(|n| (100..=599).contains(n))
                .ok_or_else(|| ReleasePolicyError {
                    part: part.to_owned(),
                })
        };
        let mut ranges = Vec::new();
        for part in text.split(',').map(str::trim) {
            let range = match part.split_once('-') {
                Some((from, to)) => status(part, from)?..=status(part, to)?,
                None => status(part, part)?..=status(part, part)?,
            };
            if range.is_empty() {
                return Err(ReleasePolicyError {
                    part: part.to_owned(),
                });
            }
            ranges.push(range);
        }
        Ok(Self::new(ranges))
    }
}

impl fmt::Display for ReleasePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ranges.is_empty() {
            return f.write_str("none");
        }
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match r.start() == r.end() {
                true => write!(f, "{}", r.start())?,
                false => write!(f, "{}-{}", r.start(), r.end())?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_read_and_print_as_lists_of_ranges() {
        let default = ReleasePolicy::default();
        assert_eq!(default.to_string(), "408,425,429,500-599");
        assert_eq!(default, default.to_string().parse().unwrap());
        for (status, released) in [(408, true), (409, false), (425, true), (429, true)] {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(default.releases(status), released, "{status}");
        }
        assert!(default.releases(StatusCode::BAD_GATEWAY));
        assert!(!default.releases(StatusCode::CREATED));
        let none: ReleasePolicy = "none".parse().unwrap();
        assert!(!none.releases(StatusCode::SERVICE_UNAVAILABLE));
        for bad in ["", "5xx", "600", "599-500", "408,,429", "99"] {
            let e = bad.parse::<ReleasePolicy>().unwrap_err().to_string();
            assert!(e.contains("408,425,429,500-599"), "{bad}: {e}");
        }
    }
}
