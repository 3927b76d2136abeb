//! A turn's durable state: what each step leaves for the rest of the turn.
//!
//! A step that asks for tools writes two [`StepRecord`]s: `answered` once
//! the model has asked (its assistant message, before any tool runs) and
//! `finished` once its waves, reflection and compaction are done. The
//! records carry only what changed since the turn's previous one (the
//! messages added, the tool results added) beside a snapshot of the
//! turn's counters, so a turn of six tool steps writes its prompt once.
//! A step that answers writes none: the turn's end is its record.
//!
//! [`rebuild`] folds a turn's records back into the conversation and the
//! state the next step starts from: a pure function, so a turn taken over
//! by another process goes on from exactly where its owner left it.

use chrono::{DateTime, Utc};
use std::{collections::HashMap, sync::Arc};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use super::{
    budget::{BudgetLimits, TurnBudget},
    replay::ReplayControl,
    state::{StateSnapshot, ToolResultRecord, TurnRuntimeState},
};
use crate::{
    events::{ToolStatus, TurnEvent},
    providers::ChatMessage,
};

/// Where a step stood when its record was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepPhase {
    /// The model asked for tools; none of them has run yet.
    Answered,
    /// The step's waves, reflection and compaction are done.
    Finished,
}

impl StepPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::Finished => "finished",
        }
    }
}

/// What the turn prepared before its first step, kept for its end (the
/// decision record and the observation are made of it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prepared {
    pub provider: String,
    pub model: String,
    pub context_pack: Value,
    pub context_hash: String,
    pub prompt_render_hash: String,
    /// How many of the first record's messages are the prepared prompt.
    pub prompt_len: usize,
    /// The prepared prompt itself, when the first record's messages do
    /// not begin with it (a compaction rewrote the conversation before
    /// the turn's first record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<Vec<ChatMessage>>,
}

/// One step's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: u32,
    pub phase: StepPhase,
    /// The length of the conversation `messages` follow: what the
    /// previous record left, or 0 when they are the whole of it (the
    /// turn's first record, one after a compaction rewrote it).
    pub after: usize,
    pub messages: Vec<ChatMessage>,
    /// Where the user's question stands in the conversation.
    pub question_at: usize,
    /// Tool results added since the previous record.
    pub tool_results: Vec<ToolResultRecord>,
    pub state: StateSnapshot,
    /// In the turn's first record only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepared: Option<Prepared>,
}

/// A turn as its records leave it: where to go on from.
#[derive(Debug, Clone, PartialEq)]
pub struct Resumed {
    /// The last step recorded, and how far it got.
    pub step: u32,
    pub phase: StepPhase,
    pub messages: Vec<ChatMessage>,
    pub question_at: usize,
    pub tool_results: Vec<ToolResultRecord>,
    pub state: StateSnapshot,
    pub prepared: Prepared,
    /// The prepared prompt (the first record's first messages).
    pub prompt: Vec<ChatMessage>,
}

impl Resumed {
    /// The turn's live state, going on under `limits` until `deadline`
    /// with what its records say it used.
    pub fn runtime_state(
        &self,
        session_id: &str,
        limits: BudgetLimits,
        deadline: Instant,
    ) -> TurnRuntimeState {
        let used = [
            self.state.steps,
            self.state.tool_calls,
            self.state.reflections,
        ];
        TurnRuntimeState::restore(
            session_id,
            TurnBudget::resume(limits, deadline, used),
            &self.state,
            self.tool_results.clone(),
        )
    }

    /// The replay gate with the calls that completed.
    pub fn replay(&self) -> ReplayControl {
        ReplayControl::restore(&self.state.completed_calls)
    }
}

/// How a turn goes on from a step the process that began it did not end.
pub struct Resume {
    pub from: Resumed,
    /// What the log shows of the calls of `from`'s step, when its record
    /// left it answered.
    pub prior: PriorCalls,
    /// When the turn began (its elapsed time counts from there).
    pub started: Instant,
    /// The turn's state as its records left it (see
    /// [`Resumed::runtime_state`]).
    pub state: Arc<TurnRuntimeState>,
}

/// Why a turn's records do not make a turn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RebuildError {
    #[error("the turn's first record does not say what it prepared")]
    NotPrepared,
    #[error("record {step} {phase} follows {after} messages, but {have} were recorded")]
    Gap {
        step: u32,
        phase: &'static str,
        after: usize,
        have: usize,
    },
    #[error("record {step} {phase} is out of order")]
    OutOfOrder { step: u32, phase: &'static str },
}

/// Folds a turn's records, in the order they were written, into the
/// conversation and the state its next step starts from. `Ok(None)`: the
/// turn wrote none (it starts over from its preparation).
pub fn rebuild(records: &[StepRecord]) -> Result<Option<Resumed>, RebuildError> {
    let Some(first) = records.first() else {
        return Ok(None);
    };
    let prepared = first.prepared.clone().ok_or(RebuildError::NotPrepared)?;
    let mut resumed = Resumed {
        step: 0,
        phase: StepPhase::Finished,
        messages: Vec::new(),
        question_at: 0,
        tool_results: Vec::new(),
        state: StateSnapshot::default(),
        prompt: match &prepared.prompt {
            Some(prompt) => prompt.clone(),
            None => first
                .messages
                .get(..prepared.prompt_len)
                .unwrap_or_default()
                .to_vec(),
        },
        prepared,
    };
    for record in records {
        if (record.step, record.phase) <= (resumed.step, resumed.phase) {
            return Err(RebuildError::OutOfOrder {
                step: record.step,
                phase: record.phase.as_str(),
            });
        }
        if record.after > resumed.messages.len() {
            return Err(RebuildError::Gap {
                step: record.step,
                phase: record.phase.as_str(),
                after: record.after,
                have: resumed.messages.len(),
            });
        }
        resumed.messages.truncate(record.after);
        resumed.messages.extend(record.messages.iter().cloned());
        resumed
            .tool_results
            .extend(record.tool_results.iter().cloned());
        resumed.question_at = record.question_at;
        resumed.state = record.state.clone();
        resumed.step = record.step;
        resumed.phase = record.phase;
    }
    Ok(Some(resumed))
}

/// What the log shows of a call of the step a turn goes on from (the
/// one its last record left answered), written by a process that died or
/// by the same turn before it was parked.
#[derive(Debug, Clone, PartialEq)]
pub enum PriorCall {
    /// Its `tool.started` is there, its end is not.
    Started {
        /// It waits for a person's decision (asked, not resolved: it never
        /// ran).
        approval: Option<Asked>,
        /// The client was asked to run it (`tool.requested`).
        client: Option<Asked>,
    },
    /// Its `tool.finished` is there: it is not run again.
    Ended {
        status: ToolStatus,
        reason: Option<String>,
        error: Option<String>,
        output: Option<String>,
        artifact_id: Option<String>,
        latency_ms: u64,
    },
}

/// An answer the log shows was asked for: it is not asked again, and the
/// wait for it keeps its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    /// When the wait ends unanswered (`None`: a log from before waits had
    /// one).
    pub expires_at: Option<DateTime<Utc>>,
}

/// The calls of one step as the log shows them, by call id.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriorCalls(pub HashMap<String, PriorCall>);

impl PriorCalls {
    /// What `events` (a turn's, in seq order) show of the calls of `step`.
    pub fn of_step<'e>(events: impl IntoIterator<Item = &'e TurnEvent>, step: u32) -> Self {
        let mut calls = HashMap::new();
        let mut approvals: HashMap<String, Option<Asked>> = HashMap::new();
        let mut clients: HashMap<String, Asked> = HashMap::new();
        for event in events {
            match event {
                TurnEvent::ToolStarted {
                    step: s, call_id, ..
                } if *s == step => {
                    calls.insert(
                        call_id.clone(),
                        PriorCall::Started {
                            approval: None,
                            client: None,
                        },
                    );
                }
                TurnEvent::ApprovalRequested {
                    step: s,
                    call_id,
                    expires_at,
                    ..
                } if *s == step => {
                    approvals.insert(
                        call_id.clone(),
                        Some(Asked {
                            expires_at: *expires_at,
                        }),
                    );
                }
                TurnEvent::ApprovalResolved { call_id, .. } => {
                    approvals.insert(call_id.clone(), None);
                }
                TurnEvent::ToolRequested {
                    step: s,
                    call_id,
                    expires_at,
                    ..
                } if *s == step => {
                    clients.insert(
                        call_id.clone(),
                        Asked {
                            expires_at: *expires_at,
                        },
                    );
                }
                TurnEvent::ToolFinished {
                    step: s,
                    call_id,
                    status,
                    reason,
                    error,
                    output,
                    artifact_id,
                    latency_ms,
                    ..
                } if *s == step => {
                    calls.insert(
                        call_id.clone(),
                        PriorCall::Ended {
                            status: *status,
                            reason: reason.clone(),
                            error: error.clone(),
                            output: output.clone(),
                            artifact_id: artifact_id.clone(),
                            latency_ms: *latency_ms,
                        },
                    );
                }
                _ => {}
            }
        }
        for (call_id, prior) in &mut calls {
            if let PriorCall::Started { approval, client } = prior {
                *approval = approvals.get(call_id).copied().flatten();
                *client = clients.get(call_id).copied();
            }
        }
        Self(calls)
    }

    pub fn get(&self, call_id: &str) -> Option<&PriorCall> {
        self.0.get(call_id)
    }
}

/// What of the conversation and the tool results the turn has recorded,
/// so that each record carries only what came since.
#[derive(Debug, Default)]
pub(super) struct Recorded {
    /// Messages of the conversation already recorded (0 after a
    /// compaction: it is recorded whole again).
    pub messages: usize,
    pub tool_results: usize,
    /// Whether the turn's first record was written.
    pub any: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::Role;

    fn record(step: u32, phase: StepPhase, after: usize, texts: &[&str]) -> StepRecord {
        StepRecord {
            step,
            phase,
            after,
            messages: texts
                .iter()
                .map(|t| ChatMessage::new(Role::User, *t))
                .collect(),
            question_at: 0,
            tool_results: Vec::new(),
            state: StateSnapshot {
                steps: step,
                ..StateSnapshot::default()
            },
            prepared: (step == 1 && phase == StepPhase::Answered).then(|| Prepared {
                provider: "p".into(),
                model: "m".into(),
                context_pack: Value::Null,
                context_hash: "c".into(),
                prompt_render_hash: "r".into(),
                prompt_len: 1,
                prompt: None,
            }),
        }
    }

    fn texts(resumed: &Resumed) -> Vec<&str> {
        resumed
            .messages
            .iter()
            .map(|m| m.content.as_str())
            .collect()
    }

    #[test]
    fn records_add_to_the_conversation_and_a_rewrite_replaces_it() {
        use StepPhase::{Answered, Finished};
        assert_eq!(rebuild(&[]), Ok(None));
        let mut records = vec![
            record(1, Answered, 0, &["question", "call"]),
            record(1, Finished, 2, &["result"]),
            record(2, Answered, 3, &["call 2"]),
        ];
        let resumed = rebuild(&records).unwrap().unwrap();
        assert_eq!(texts(&resumed), ["question", "call", "result", "call 2"]);
        assert_eq!((resumed.step, resumed.phase), (2, Answered));
        assert_eq!(resumed.state.steps, 2);
        records.push(record(2, Finished, 0, &["summary", "question"]));
        let resumed = rebuild(&records).unwrap().unwrap();
        assert_eq!(texts(&resumed), ["summary", "question"]);
        assert_eq!(resumed.prepared.prompt_len, 1, "kept from the first record");
    }

    #[test]
    fn records_that_do_not_follow_each_other_are_refused() {
        use StepPhase::{Answered, Finished};
        let gap = [
            record(1, Answered, 0, &["question"]),
            record(1, Finished, 3, &["result"]),
        ];
        assert!(matches!(rebuild(&gap), Err(RebuildError::Gap { .. })));
        let twice = [
            record(1, Answered, 0, &["question"]),
            record(1, Answered, 1, &["again"]),
        ];
        assert!(matches!(
            rebuild(&twice),
            Err(RebuildError::OutOfOrder { .. })
        ));
        let unprepared = [record(2, Answered, 0, &["question"])];
        assert_eq!(rebuild(&unprepared), Err(RebuildError::NotPrepared));
    }
}
