//! Decisions on tool calls that wait for a person, whichever protocol
//! brings them: the native route (`POST …/approvals/{call_id}`), AG-UI's
//! `resume`, the AI SDK's `approval-responded` tool parts, Responses'
//! `mcp_approval_response` items, MCP and A2A. Each is recorded once, for
//! a call whose `approval.requested` is in the turn's log and not yet
//! resolved: a decision ahead of its call would let that call run without
//! asking anyone.

use std::collections::HashMap;

use super::{error::ApiError, typed};
use crate::{
    events::TurnEvent,
    protocols::Shared,
    service::{NewApproval, TurnRecord, TurnStatus},
};

/// Characters a decision's reason holds at most.
const REASON_MAX: usize = 1000;

/// A person's decision on one call.
#[derive(Debug, Clone)]
pub struct ClientDecision {
    pub call_id: String,
    pub approve: bool,
    /// Why (shown to the model); blank is none.
    pub reason: Option<String>,
}

impl ClientDecision {
    /// A decision whose reason is checked: at most 1,000 characters, no
    /// U+0000 (`invalid_field` for `field`).
    pub fn new(
        call_id: &str,
        approve: bool,
        reason: Option<String>,
        field: &str,
    ) -> Result<Self, ApiError> {
        let reason = reason.filter(|r| !r.trim().is_empty());
        if reason
            .as_deref()
            .is_some_and(|r| r.chars().count() > REASON_MAX || r.contains('\0'))
        {
            return Err(ApiError::InvalidField {
                field: field.to_owned(),
                detail: format!(
                    "`{field}` is longer than {REASON_MAX} characters or contains U+0000"
                ),
            });
        }
        Ok(Self {
            call_id: call_id.to_owned(),
            approve,
            reason,
        })
    }
}

/// Where a call of a turn stands with its approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalState {
    /// Its wait ended undecided (timed out, cancelled).
    Ended,
    /// `approval.requested`, not resolved yet.
    Waiting,
    /// Approved or denied.
    Decided,
}

/// The calls of `turn` that asked for approval, each with where it stands
/// and the seq of its first `approval.requested`.
pub async fn approvals(
    app: &Shared,
    turn: &TurnRecord,
) -> Result<HashMap<String, (ApprovalState, i64)>, ApiError> {
    let mut calls: HashMap<String, (ApprovalState, i64)> = HashMap::new();
    app.turns
        .read_turn(turn, |stored| {
            match typed(stored) {
                Some(TurnEvent::ApprovalRequested { call_id, .. }) => {
                    let (state, _) = calls
                        .entry(call_id.clone())
                        .or_insert((ApprovalState::Waiting, stored.seq));
                    *state = ApprovalState::Waiting;
                }
                Some(TurnEvent::ApprovalResolved {
                    call_id, outcome, ..
                }) => {
                    if let Some((state, _)) = calls.get_mut(call_id) {
                        *state = match outcome.as_str() {
                            "approved" | "denied" => ApprovalState::Decided,
                            _ => ApprovalState::Ended,
                        };
                    }
                }
                _ => {}
            }
            false
        })
        .await?;
    Ok(calls)
}

/// Records `decision` for a call of the running `turn` that waits for
/// one, and wakes the turn. A call that does not wait: `call_not_found`;
/// one decided already (here or in the store): `approval_already_decided`.
pub async fn decide(
    app: &Shared,
    turn: &TurnRecord,
    state: Option<ApprovalState>,
    decision: &ClientDecision,
) -> Result<(), ApiError> {
    if turn.status != TurnStatus::Running {
        return Err(ApiError::TurnNotRunning {
            turn_id: turn.id,
            status: turn.status,
        });
    }
    match state {
        Some(ApprovalState::Waiting) => {}
        Some(ApprovalState::Decided) => return Err(ApiError::ApprovalAlreadyDecided),
        Some(ApprovalState::Ended) | None => return Err(ApiError::CallNotFound),
    }
    let recorded = app
        .turns
        .decide_approval(&NewApproval {
            session_id: turn.session_id.clone(),
            turn_id: turn.id,
            call_id: decision.call_id.clone(),
            approved: decision.approve,
            reason: decision.reason.clone(),
        })
        .await?;
    if !recorded {
        return Err(ApiError::ApprovalAlreadyDecided);
    }
    app.turns.answered(turn.id).await;
    Ok(())
}
