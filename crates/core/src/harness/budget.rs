//! `TurnBudget`: one envelope for steps, tool calls, reflections and time.
//!
//! Claims are atomic (`fetch_update`), so concurrent tool calls of a
//! parallel wave cannot overspend; the deadline is absolute, and
//! [`TurnBudget::remaining`] clamps every provider call and tool timeout.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

/// Limits of a turn (seeds: 6 steps, 6 tool calls, 4 reflections, 60 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetLimits {
    pub max_steps: u32,
    pub max_tool_calls: u32,
    pub max_reflections: u32,
    pub timeout: Duration,
}

impl Default for BudgetLimits {
    fn default() -> Self {
        Self {
            max_steps: 6,
            max_tool_calls: 6,
            max_reflections: 4,
            timeout: Duration::from_secs(60),
        }
    }
}

/// The resource envelope of one turn.
#[derive(Debug)]
pub struct TurnBudget {
    limits: BudgetLimits,
    deadline: Instant,
    steps: AtomicU32,
    tool_calls: AtomicU32,
    reflections: AtomicU32,
    /// Time spent waiting for answers from outside: the deadline moves by
    /// as much.
    waits: Mutex<WaitClock>,
}

/// The waits for answers from outside (a person, a client) of a turn:
/// while any is open the turn's clock stands still.
#[derive(Debug, Default)]
struct WaitClock {
    /// Waits open now.
    open: u32,
    /// Since when one has been open.
    since: Option<Instant>,
    /// What closed stretches of waiting lasted.
    paused: Duration,
}

impl WaitClock {
    fn waited(&self, now: Instant) -> Duration {
        self.paused + self.since.map_or(Duration::ZERO, |since| now - since)
    }
}

/// An open wait: the turn's clock goes on when the last is dropped.
pub struct Waiting<'b>(&'b TurnBudget);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut clock = self.0.clock();
        clock.open = clock.open.saturating_sub(1);
        if clock.open == 0
            && let Some(since) = clock.since.take()
        {
            clock.paused += Instant::now() - since;
        }
    }
}

fn claim(counter: &AtomicU32, max: u32) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            (used < max).then_some(used + 1)
        })
        .is_ok()
}

impl TurnBudget {
    /// A budget whose deadline is `limits.timeout` from now.
    pub fn create(limits: BudgetLimits) -> Self {
        Self {
            limits,
            deadline: Instant::now() + limits.timeout,
            steps: AtomicU32::new(0),
            tool_calls: AtomicU32::new(0),
            reflections: AtomicU32::new(0),
            waits: Mutex::default(),
        }
    }

    /// A budget that ends at `deadline` with `steps`, `tool_calls` and
    /// `reflections` already used (a turn going on from its records).
    pub fn resume(limits: BudgetLimits, deadline: Instant, used: [u32; 3]) -> Self {
        let [steps, tool_calls, reflections] = used;
        Self {
            limits,
            deadline,
            steps: AtomicU32::new(steps),
            tool_calls: AtomicU32::new(tool_calls),
            reflections: AtomicU32::new(reflections),
            waits: Mutex::default(),
        }
    }

    pub fn limits(&self) -> BudgetLimits {
        self.limits
    }

    /// Takes one step; false once `max_steps` are used.
    pub fn claim_step(&self) -> bool {
        claim(&self.steps, self.limits.max_steps)
    }

    /// Takes one tool call; false once `max_tool_calls` are used.
    pub fn claim_tool_call(&self) -> bool {
        claim(&self.tool_calls, self.limits.max_tool_calls)
    }

    /// Takes one reflection; false once `max_reflections` are used.
    pub fn claim_reflection(&self) -> bool {
        claim(&self.reflections, self.limits.max_reflections)
    }

    pub fn steps_used(&self) -> u32 {
        self.steps.load(Ordering::Acquire)
    }

    pub fn tool_calls_used(&self) -> u32 {
        self.tool_calls.load(Ordering::Acquire)
    }

    pub fn reflections_used(&self) -> u32 {
        self.reflections.load(Ordering::Acquire)
    }

    fn clock(&self) -> std::sync::MutexGuard<'_, WaitClock> {
        self.waits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The deadline as it stands: moved by the time spent waiting for
    /// answers from outside.
    pub fn deadline(&self) -> Instant {
        self.deadline + self.clock().waited(Instant::now())
    }

    /// Time left before the deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.deadline().saturating_duration_since(Instant::now())
    }

    /// Stops the turn's clock until the returned guard (and every other
    /// open one) is dropped: the time a call waits for a person or a
    /// client is not the turn's compute time.
    pub fn wait(&self) -> Waiting<'_> {
        let mut clock = self.clock();
        clock.open += 1;
        if clock.since.is_none() {
            clock.since = Some(Instant::now());
        }
        Waiting(self)
    }

    pub fn is_expired(&self) -> bool {
        self.remaining().is_zero()
    }

    /// `wanted`, but never past the deadline.
    pub fn clamp(&self, wanted: Duration) -> Duration {
        wanted.min(self.remaining())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn claims_stop_at_their_limits() {
        let budget = TurnBudget::create(BudgetLimits {
            max_steps: 2,
            max_tool_calls: 3,
            max_reflections: 1,
            timeout: Duration::from_secs(60),
        });
        assert!(budget.claim_step() && budget.claim_step());
        assert!(!budget.claim_step());
        assert_eq!(budget.steps_used(), 2);
        assert_eq!((0..5).filter(|_| budget.claim_tool_call()).count(), 3);
        assert!(budget.claim_reflection());
        assert!(!budget.claim_reflection());
    }

    #[test]
    fn concurrent_claims_never_overspend() {
        let budget = Arc::new(TurnBudget::create(BudgetLimits {
            max_tool_calls: 6,
            ..BudgetLimits::default()
        }));
        let granted: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..16)
                .map(|_| {
                    let budget = budget.clone();
                    scope.spawn(move || (0..10).filter(|_| budget.claim_tool_call()).count())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(granted, 6);
    }

    #[tokio::test(start_paused = true)]
    async fn remaining_counts_down_to_zero_and_clamps() {
        let budget = TurnBudget::create(BudgetLimits {
            timeout: Duration::from_secs(10),
            ..BudgetLimits::default()
        });
        assert_eq!(budget.remaining(), Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(budget.remaining(), Duration::from_secs(6));
        assert_eq!(
            budget.clamp(Duration::from_secs(45)),
            Duration::from_secs(6)
        );
        assert_eq!(budget.clamp(Duration::from_secs(1)), Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(7)).await;
        assert!(budget.is_expired());
        assert_eq!(budget.remaining(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn the_clock_stands_still_while_any_wait_is_open() {
        let budget = TurnBudget::create(BudgetLimits {
            timeout: Duration::from_secs(10),
            ..BudgetLimits::default()
        });
        tokio::time::advance(Duration::from_secs(2)).await;
        let first = budget.wait();
        tokio::time::advance(Duration::from_secs(30)).await;
        let second = budget.wait();
        tokio::time::advance(Duration::from_secs(5)).await;
        drop(first);
        assert_eq!(budget.remaining(), Duration::from_secs(8), "still waiting");
        tokio::time::advance(Duration::from_secs(5)).await;
        drop(second);
        assert_eq!(budget.remaining(), Duration::from_secs(8), "40 s of waits");
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(budget.remaining(), Duration::from_secs(5));
        let third = budget.wait();
        tokio::time::advance(Duration::from_secs(60)).await;
        drop(third);
        assert!(!budget.is_expired());
        assert_eq!(budget.remaining(), Duration::from_secs(5));
    }
}
