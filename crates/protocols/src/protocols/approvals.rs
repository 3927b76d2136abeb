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
    /// The arguments the person approved instead of the asked ones, and
    /// the request's field that carried them (named when they fail the
    /// tool's schema).
    pub edited: Option<(serde_json::Value, String)>,
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
            edited: None,
        })
    }

    /// The decision with the person's edit of the call's arguments (in
    /// the request's `field`): an approval's alone (`invalid_field` on a
    /// denial).
    pub fn with_edit(
        mut self,
        arguments: Option<serde_json::Value>,
        field: &str,
    ) -> Result<Self, ApiError> {
        let Some(arguments) = arguments else {
            return Ok(self);
        };
        if !self.approve {
            return Err(ApiError::InvalidField {
                field: field.to_owned(),
                detail: format!("`{field}` goes with an approval, not a denial"),
            });
        }
        self.edited = Some((arguments, field.to_owned()));
        Ok(self)
    }
}

/// The approval of `call_id` of `turn` as it is recorded: bound to the
/// arguments it is for (the asked ones, or `edited` once checked against
/// the tool's schema; Err: the validator's message).
pub async fn bound(
    app: &Shared,
    turn: &TurnRecord,
    call_id: &str,
    (approve, reason): (bool, Option<String>),
    edited: Option<&serde_json::Value>,
) -> Result<Result<NewApproval, String>, crate::service::StoreError> {
    let terms = if approve {
        match app.turns.approval_terms(turn, call_id, edited).await? {
            Ok(terms) => terms,
            Err(why) => return Ok(Err(why)),
        }
    } else {
        crate::service::ApprovalTerms::default()
    };
    Ok(Ok(NewApproval {
        session_id: turn.session_id.clone(),
        turn_id: turn.id,
        call_id: call_id.to_owned(),
        approved: approve,
        reason,
        edited_arguments: terms.edited_arguments,
        arguments_sha256: terms.arguments_sha256,
    }))
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
/// one, and wakes the turn: whether the call runs with edited arguments.
/// A call that does not wait: `call_not_found`; one decided already (here
/// or in the store): `approval_already_decided`.
pub async fn decide(
    app: &Shared,
    turn: &TurnRecord,
    state: Option<ApprovalState>,
    decision: &ClientDecision,
) -> Result<bool, ApiError> {
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
    let edited = decision.edited.as_ref();
    let approval = bound(
        app,
        turn,
        &decision.call_id,
        (decision.approve, decision.reason.clone()),
        edited.map(|(arguments, _)| arguments),
    )
    .await?
    // The call stays waiting: nothing was recorded.
    .map_err(|detail| ApiError::InvalidField {
        field: edited.map_or_else(|| "edited_arguments".to_owned(), |(_, f)| f.clone()),
        detail,
    })?;
    let edited = approval.edited_arguments.is_some();
    let recorded = app.turns.decide_approval(&approval).await?;
    if !recorded {
        return Err(ApiError::ApprovalAlreadyDecided);
    }
    app.turns.answered(turn.id).await;
    Ok(edited)
}
