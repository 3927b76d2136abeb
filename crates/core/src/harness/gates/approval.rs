//! Gate 5a: a person's approval, and what it binds: the arguments it is
//! for, edited or as asked (docs/client-tools-and-approvals.md).

use serde_json::Value;

use super::{CallEnv, DenyReason, Refused, ToolOutcome, denied, waits};
use crate::{
    events::TurnEvent,
    harness::{durable::PriorCall, validation, waits::Wait},
    hooks::{ApprovalDecision, ApprovalRequest},
    providers::ToolCall,
    tools::Tool,
};

/// What a person's approval let through (see [`approved`]).
pub(super) struct Approval {
    /// The arguments to run instead (JSON), when edited.
    pub edited: Option<String>,
    /// The SHA-256 of the arguments it is for.
    pub sha256: Option<String>,
}

/// Gate 5a: a person's approval, for the configured effect classes, until
/// the wait's deadline (the turn's own stands still meanwhile); a cancel
/// ends the wait, and a long one parks the turn. `None`: the call needs
/// none.
pub(super) async fn approved(
    env: &CallEnv<'_>,
    call: &ToolCall,
    tool: &dyn Tool,
    arguments: &Value,
) -> Result<Option<Approval>, Refused> {
    let harness = env.harness;
    let Some(gate) = harness.approvals.as_ref() else {
        return Ok(None);
    };
    if !harness
        .options
        .approval_effects
        .contains(&tool.spec().effect)
    {
        return Ok(None);
    }
    // Asked already (the turn goes on after a park or a take-over): not
    // asked again, and its wait keeps its deadline.
    let until = match env.prior.get(&call.id) {
        Some(PriorCall::Started {
            approval: Some(asked),
            ..
        }) => waits::deadline_of(*asked, &harness.options),
        _ => {
            let until = waits::new_deadline(&harness.options);
            let _ = env
                .sink
                .emit(TurnEvent::ApprovalRequested {
                    step: env.step,
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    arguments: arguments.clone(),
                    expires_at: Some(until),
                })
                .await;
            until
        }
    };
    let request = ApprovalRequest {
        session_id: env.request.session_id.clone(),
        turn_id: env.request.turn_id.to_string(),
        call_id: call.id.clone(),
        tool: call.name.clone(),
    };
    let decision = match waits::decision(env.waiter(), gate.as_ref(), &request, until).await {
        Wait::Ended(decision) => decision,
        Wait::Parked(until) => return Err(Box::new(ToolOutcome::Parked { until })),
    };
    let (outcome, reason) = resolved(env, call, &decision).await;
    if let ApprovalDecision::Approved {
        edited_arguments,
        arguments_sha256,
    } = decision
    {
        return Ok(Some(Approval {
            edited: edited_arguments,
            sha256: arguments_sha256,
        }));
    }
    Err(denied(
        DenyReason::Approval,
        match reason {
            Some(why) => format!("the user denied this call: {why}"),
            None => format!("this call was not approved ({outcome})"),
        },
    ))
}

/// Says how a call's wait for a person ended (`approval.resolved`): the
/// outcome, and the reason of a denial.
async fn resolved(
    env: &CallEnv<'_>,
    call: &ToolCall,
    decision: &ApprovalDecision,
) -> (&'static str, Option<String>) {
    let (outcome, reason) = match decision {
        ApprovalDecision::Approved { .. } => ("approved", None),
        ApprovalDecision::Denied { reason } => ("denied", Some(reason.clone())),
        ApprovalDecision::TimedOut => ("timed_out", None),
        ApprovalDecision::Cancelled => ("cancelled", None),
    };
    let edited_arguments = match decision {
        ApprovalDecision::Approved {
            edited_arguments: Some(text),
            ..
        } => serde_json::from_str(text).ok(),
        _ => None,
    };
    let _ = env
        .sink
        .emit(TurnEvent::ApprovalResolved {
            call_id: call.id.clone(),
            outcome: outcome.to_owned(),
            reason: reason.clone(),
            edited_arguments,
        })
        .await;
    (outcome, reason)
}

/// Gate 5b: an approval applies to the arguments it was made for alone
/// (their SHA-256; a decision made before approvals were bound has none,
/// and was for the arguments as asked).
pub(super) fn bound(arguments: &Value, sha256: Option<&str>) -> Result<(), Refused> {
    match sha256 {
        Some(expected) if validation::arguments_sha256(arguments) != expected => Err(denied(
            DenyReason::Approval,
            "this call's arguments are not the ones the approval was for; ask again",
        )),
        _ => Ok(()),
    }
}
