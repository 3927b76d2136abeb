//! The one retry policy of the service: a provider's retries within a
//! turn, and the outbox's deliveries (webhooks, A2A pushes) between
//! tries. Waits grow exponentially (backon's schedule) up to a most, and
//! each is jittered so that the retries of many do not come together.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use rand::RngExt;

/// Exponential backoff with jitter: `first`, doubling, at most `most`;
/// each wait between half and all of that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub most: Duration,
}

/// Tries past this many wait as long as this one (the schedule is at its
/// most long before).
const LONGEST_SCHEDULE: u32 = 64;

impl Backoff {
    /// The wait before try `attempt + 1`, after failed try `attempt`
    /// (1-based), without jitter.
    pub fn full(&self, attempt: u32) -> Duration {
        let step = attempt.clamp(1, LONGEST_SCHEDULE) as usize - 1;
        ExponentialBuilder::new()
            .with_min_delay(self.first)
            .with_max_delay(self.most)
            .with_factor(2.0)
            .without_max_times()
            .build()
            .nth(step)
            .unwrap_or(self.most)
    }

    /// The wait after failed try `attempt` (1-based): [`Self::full`],
    /// jittered to between half and all of it.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.full(attempt)
            .mul_f64(rand::rng().random_range(0.5..=1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_most_with_jitter_below_them() {
        let backoff = Backoff {
            first: Duration::from_secs(1),
            most: Duration::from_secs(600),
        };
        assert_eq!(backoff.full(0), Duration::from_secs(1));
        assert_eq!(backoff.full(1), Duration::from_secs(1));
        assert_eq!(backoff.full(4), Duration::from_secs(8));
        assert_eq!(backoff.full(10), Duration::from_secs(512));
        assert_eq!(backoff.full(11), Duration::from_secs(600));
        assert_eq!(backoff.full(u32::MAX), Duration::from_secs(600));
        let waits: Vec<Duration> = (0..200).map(|_| backoff.delay(5)).collect();
        assert!(
            waits
                .iter()
                .all(|w| *w >= Duration::from_secs(8) && *w <= Duration::from_secs(16))
        );
        assert!(
            waits.iter().any(|w| *w != waits[0]),
            "jittered, not the same every time"
        );
    }
}
