//! `TurnBudget`: one envelope for steps, tool calls, reflections and time.
//!
//! Claims are atomic (`fetch_update`), so concurrent tool calls of a
//! parallel wave cannot overspend; the deadline is absolute, and
//! [`TurnBudget::remaining`] clamps every provider call and tool timeout.

use std::{
    sync::atomic::{AtomicU32, Ordering},
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

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Time left before the deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
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
}
