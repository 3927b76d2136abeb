//! Input-required results (MCP 2026-07-28, SEP-2322) for `ask`: a turn
//! that waits for a person's approval of a tool call answers the call with
//! an `input_required` result: one `elicitation/create` request per call
//! that waits (its key the call id, its form `{approve, reason?}`), and
//! `requestState`, the turn's id. The client calls `ask` again with
//! `inputResponses` and that `requestState`; the answers decide the calls
//! and the turn goes on, to its end or to the next approval. As a task,
//! the turn's `tasks/get` is `input_required` with the same requests, and
//! `tasks/update` answers them.
//!
//! `requestState` is checked, not trusted: it must name a running turn of
//! the caller's tenant (anything else is refused as invalid params), and
//! an answer decides only a call that waits in that turn. A response that
//! is `cancel` decides nothing (the call is asked again); `decline` denies.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::super::wire::{ElicitAnswer, Elicitation, InputRequest};
use crate::{
    events::TurnEvent,
    protocols::Shared,
    protocols::typed,
    service::{StoreError, TurnRecord},
};

/// The longest reason a decision may give (as on the native route).
const REASON_MAX_CHARS: usize = 1000;
/// The most of a call's arguments an elicitation's message shows.
const ARGUMENTS_SHOWN: usize = 2000;

/// A call that waits for a person's decision.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Waiting {
    pub call_id: String,
    pub tool: String,
    pub arguments: Value,
}

/// The calls of a turn that wait now, folded from its events.
#[derive(Debug, Default)]
pub(super) struct Approvals {
    waiting: Vec<Waiting>,
    ended: bool,
}

impl Approvals {
    pub fn event(&mut self, event: &TurnEvent) {
        match event {
            TurnEvent::ApprovalRequested {
                call_id,
                tool,
                arguments,
                ..
            } if !self.waiting.iter().any(|w| &w.call_id == call_id) => {
                self.waiting.push(Waiting {
                    call_id: call_id.clone(),
                    tool: tool.clone(),
                    arguments: arguments.clone(),
                });
            }
            TurnEvent::ApprovalResolved { call_id, .. } => {
                self.waiting.retain(|w| &w.call_id != call_id);
            }
            event if event.is_terminal() => {
                self.ended = true;
                self.waiting.clear();
            }
            _ => {}
        }
    }
}

/// The calls that wait in the turn now: asked for, and neither resolved
/// in its log nor decided already (a decision the turn has not taken up
/// yet is not asked for again).
pub(super) async fn waiting(app: &Shared, record: &TurnRecord) -> Result<Vec<Waiting>, StoreError> {
    let mut approvals = Approvals::default();
    app.turns
        .read_turn(record, |stored| {
            if let Some(event) = typed(stored) {
                approvals.event(event);
            }
            approvals.ended
        })
        .await?;
    let mut undecided = Vec::new();
    for call in approvals.waiting {
        if app
            .turns
            .get_approval(record.id, &call.call_id)
            .await?
            .is_none()
        {
            undecided.push(call);
        }
    }
    Ok(undecided)
}

/// The input requests of the calls that wait: an elicitation each, keyed
/// by its call id.
pub(super) fn requests(waiting: &[Waiting]) -> BTreeMap<String, InputRequest> {
    waiting
        .iter()
        .map(|call| {
            let mut arguments = call.arguments.to_string();
            if arguments.len() > ARGUMENTS_SHOWN {
                let cut = (0..=ARGUMENTS_SHOWN)
                    .rev()
                    .find(|i| arguments.is_char_boundary(*i))
                    .unwrap_or(0);
                arguments.truncate(cut);
                arguments.push('…');
            }
            let message = format!(
                "The agent asks to run {} with {arguments}. Approve it?",
                call.tool
            );
            let request = InputRequest {
                method: "elicitation/create",
                params: Elicitation::approval(message),
            };
            (call.call_id.clone(), request)
        })
        .collect()
}

/// What a person's response to a call's elicitation says.
#[derive(Debug, PartialEq)]
pub(super) enum Answer {
    Decided {
        approve: bool,
        reason: Option<String>,
        edited: Option<Value>,
    },
    /// `cancel`: no decision; the call is asked again.
    Undecided,
    Invalid(String),
}

pub(super) fn answer(response: &Value) -> Answer {
    let Ok(response) = ElicitAnswer::deserialize(response) else {
        return Answer::Invalid("a response is `{action, content}`".into());
    };
    match response.action.as_deref() {
        Some("accept") => {
            let content = response.content.unwrap_or_default();
            let edited = content.edited();
            let Value::Bool(approve) = content.approve else {
                return Answer::Invalid("`content.approve` must be true or false".into());
            };
            let reason = match content.reason {
                Value::Null => None,
                Value::String(r) if r.chars().count() <= REASON_MAX_CHARS && !r.contains('\0') => {
                    Some(r.trim().to_owned()).filter(|r| !r.is_empty())
                }
                _ => {
                    return Answer::Invalid(format!(
                        "`content.reason` must be text of at most {REASON_MAX_CHARS} characters \
                         without U+0000"
                    ));
                }
            };
            let edited = match edited {
                Ok(edited) if approve || edited.is_none() => edited,
                Ok(_) => {
                    return Answer::Invalid("`content.arguments` goes with an approval".into());
                }
                Err(why) => return Answer::Invalid(why),
            };
            Answer::Decided {
                approve,
                reason,
                edited,
            }
        }
        Some("decline") => Answer::Decided {
            approve: false,
            reason: None,
            edited: None,
        },
        Some("cancel") => Answer::Undecided,
        _ => Answer::Invalid("`action` must be accept, decline or cancel".into()),
    }
}

/// The responses' decisions on the calls that wait, and the calls they
/// leave undecided. `Err`: a response that cannot be read.
pub(super) fn decisions(
    responses: &serde_json::Map<String, Value>,
    waiting: &[Waiting],
) -> Result<(Vec<NewDecision>, Vec<Waiting>), String> {
    let mut decided = Vec::new();
    let mut undecided = Vec::new();
    for call in waiting {
        match responses.get(&call.call_id).map(answer) {
            Some(Answer::Decided {
                approve,
                reason,
                edited,
            }) => decided.push(NewDecision {
                call_id: call.call_id.clone(),
                approve,
                reason,
                edited,
            }),
            Some(Answer::Invalid(why)) => return Err(format!("{}: {why}", call.call_id)),
            Some(Answer::Undecided) | None => undecided.push(call.clone()),
        }
    }
    Ok((decided, undecided))
}

/// A decision on one call.
#[derive(Debug, PartialEq)]
pub(super) struct NewDecision {
    pub call_id: String,
    pub approve: bool,
    pub reason: Option<String>,
    /// The arguments to run instead (`content.arguments`).
    pub edited: Option<Value>,
}

/// Records the decisions and wakes the turn that waits on them. Err: an
/// edit that fails the tool's schema (the validator's message); none of
/// the decisions is recorded then, and the calls still wait.
pub(super) async fn decide(
    app: &Shared,
    record: &TurnRecord,
    decided: Vec<NewDecision>,
) -> Result<Result<(), String>, StoreError> {
    let mut approvals = Vec::with_capacity(decided.len());
    for decision in decided {
        let approval = crate::protocols::approvals::bound(
            app,
            record,
            &decision.call_id,
            (decision.approve, decision.reason),
            decision.edited.as_ref(),
        )
        .await?;
        match approval {
            Ok(approval) => approvals.push(approval),
            Err(why) => {
                return Ok(Err(format!(
                    "{}: content.arguments: {why}",
                    decision.call_id
                )));
            }
        }
    }
    for approval in &approvals {
        app.turns.decide_approval(approval).await?;
    }
    app.turns.answered(record.id).await;
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    fn call(id: &str) -> Waiting {
        Waiting {
            call_id: id.into(),
            tool: "write_note".into(),
            arguments: json(r#"{"path": "notes/a.md"}"#),
        }
    }

    fn responses(text: &str) -> serde_json::Map<String, Value> {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn only_an_accept_or_a_decline_decides() {
        let waiting = [call("c1"), call("c2"), call("c3")];
        let given = responses(
            r#"{
            "c1": {"action": "accept", "content": {"approve": true, "reason": " fine "}},
            "c2": {"action": "cancel"},
            "other": {"action": "accept", "content": {"approve": true}}
        }"#,
        );
        let (decided, undecided) = decisions(&given, &waiting).unwrap();
        assert_eq!(
            decided,
            [NewDecision {
                call_id: "c1".into(),
                approve: true,
                reason: Some("fine".into()),
                edited: None,
            }]
        );
        assert_eq!(undecided, [call("c2"), call("c3")]);
        let declined = responses(r#"{"c1": {"action": "decline"}}"#);
        let (decided, _) = decisions(&declined, &waiting).unwrap();
        assert!(!decided[0].approve);
        for bad in [
            r#"{"c1": {"action": "accept", "content": {"approve": "yes"}}}"#,
            r#"{"c1": {"action": "accept", "content": {}}}"#,
            r#"{"c1": {"action": "ok"}}"#,
            r#"{"c1": {"action": "accept", "content": {"approve": false, "reason": 3}}}"#,
        ] {
            assert!(decisions(&responses(bad), &waiting).is_err(), "{bad}");
        }
    }

    #[test]
    fn each_waiting_call_is_one_elicitation() {
        let requests = requests(&[call("c1"), call("c2")]);
        assert_eq!(requests.get("c1").unwrap().method, "elicitation/create");
        let said = serde_json::to_value(requests.get("c2").unwrap()).unwrap();
        let required = said.pointer("/params/requestedSchema/required").unwrap();
        assert_eq!(required, &json(r#"["approve"]"#));
        assert!(
            requests
                .get("c1")
                .unwrap()
                .params
                .message
                .contains("write_note"),
            "{said}"
        );
    }
}
