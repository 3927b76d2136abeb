//! Calls that wait for an answer from outside the turn: a person's
//! decision on a call (an approval) or the result of a client's own tool.
//!
//! A wait ends unanswered `wait_timeout` after it was asked (its
//! `expires_at`, in the event that asks), whatever the turn's compute
//! deadline, which stands still meanwhile. With `park_after`, the turn
//! waits here that long at most; then it is parked ([`Wait::Parked`]): the
//! step stops once its wave has ended, and the turn goes on from its
//! records when the answer comes (or the wait ends), on whichever process
//! takes it.

use std::time::Duration;

use chrono::{DateTime, Utc};

use tokio_util::sync::CancellationToken;

use super::{
    HarnessOptions,
    budget::TurnBudget,
    durable::Asked,
    hooks::{ApprovalDecision, ApprovalGate, ApprovalRequest},
};
use crate::tools::client::{ClientResult, ClientResults};

/// What a wait needs of its turn.
pub(super) struct Waiter<'a> {
    pub options: &'a HarnessOptions,
    /// Its clock stands still while the wait lasts.
    pub budget: &'a TurnBudget,
    /// Ends the wait (`Cancelled`).
    pub cancel: &'a CancellationToken,
}

/// How a wait here ended.
pub(super) enum Wait<T> {
    /// With this (an answer, or why there is none).
    Ended(T),
    /// No answer yet: the turn is parked until then.
    Parked(DateTime<Utc>),
}

/// When a wait asked now ends unanswered (to the millisecond: every
/// store keeps it as the event says it).
pub(super) fn new_deadline(options: &HarnessOptions) -> DateTime<Utc> {
    use chrono::SubsecRound as _;
    let timeout = chrono::Duration::from_std(options.wait_timeout)
        .unwrap_or_else(|_| chrono::Duration::days(30));
    let now = Utc::now();
    now.checked_add_signed(timeout)
        .unwrap_or(now)
        .trunc_subsecs(3)
}

/// When a wait ends: the deadline the log shows it was asked with, or a
/// new one (a log from before waits had one).
pub(super) fn deadline_of(asked: Asked, options: &HarnessOptions) -> DateTime<Utc> {
    asked.expires_at.unwrap_or_else(|| new_deadline(options))
}

/// How long to look for the answer here, and whether the turn parks when
/// none comes by then (else the wait has ended).
fn here(options: &HarnessOptions, until: DateTime<Utc>) -> (Duration, bool) {
    let left = (until - Utc::now()).to_std().unwrap_or_default();
    match options.park_after {
        Some(after) if after < left => (after, true),
        _ => (left, false),
    }
}

/// Waits for a person's decision on `request`'s call.
pub(super) async fn decision(
    waiter: Waiter<'_>,
    gate: &dyn ApprovalGate,
    request: &ApprovalRequest,
    until: DateTime<Utc>,
) -> Wait<ApprovalDecision> {
    let (within, parks) = here(waiter.options, until);
    let _waiting = waiter.budget.wait();
    match gate.decide(request, within, waiter.cancel).await {
        ApprovalDecision::TimedOut if parks => Wait::Parked(until),
        decision => Wait::Ended(decision),
    }
}

/// Waits for the result the client posts for `call_id`.
pub(super) async fn client_result(
    waiter: Waiter<'_>,
    results: &dyn ClientResults,
    turn_id: uuid::Uuid,
    call_id: &str,
    until: DateTime<Utc>,
) -> Wait<ClientResult> {
    let (within, parks) = here(waiter.options, until);
    let _waiting = waiter.budget.wait();
    match results.wait(turn_id, call_id, within, waiter.cancel).await {
        ClientResult::TimedOut if parks => Wait::Parked(until),
        result => Wait::Ended(result),
    }
}
