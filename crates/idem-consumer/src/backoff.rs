//! Exponential backoff with jitter for retried messages.

use std::time::Duration;

/// Delay before retry `n` (after the `n`th failed attempt): `initial`
/// doubled per attempt, capped at `max`, then scaled by a random factor in
/// `[1 - jitter, 1]` so that messages failing together do not come back
/// together.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// Delay after the first failure (default 1 s).
    pub initial: Duration,
    /// Largest delay (default 5 min).
    pub max: Duration,
    /// Share of the delay that is random, 0 to 1 (default 0.5).
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
            jitter: 0.5,
        }
    }
}

impl Backoff {
    /// The delay after the `attempt`th failure (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(30);
        let full = self
            .initial
            .saturating_mul(1 << doublings)
            .min(self.max)
            .max(self.initial.min(self.max));
        let jitter = self.jitter.clamp(0.0, 1.0);
        full.mul_f64(1.0 - jitter * fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_jitter_stays_in_bounds() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            jitter: 0.5,
        };
        for _ in 0..200 {
            let d1 = b.delay(1);
            assert!(d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100));
            let d3 = b.delay(3);
            assert!(d3 >= Duration::from_millis(200) && d3 <= Duration::from_millis(400));
            let d20 = b.delay(20);
            assert!(d20 >= Duration::from_millis(500) && d20 <= Duration::from_secs(1));
        }
        let exact = Backoff { jitter: 0.0, ..b };
        assert_eq!(exact.delay(2), Duration::from_millis(200));
        assert_eq!(exact.delay(u32::MAX), Duration::from_secs(1));
    }
}
