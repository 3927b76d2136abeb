//! A turn's events folded into an A2A `Task` (protobuf JSON, A2A 1.0):
//! the `StreamResponse`s each event adds, and the task as it stands.
//!
//! - The turn's text is one artifact (`answer`): its deltas are appended
//!   chunks; at the end, the answer whole replaces it when what streamed
//!   differs (a retraction said otherwise: `append: false` replaces), and
//!   a last chunk carries the citations as a data part.
//! - A tool call is a `working` status whose message names the call.
//! - A call waiting for a person is `input-required`: its status message
//!   names the call (a data part: `call_id`, `tool`, `arguments`); a
//!   message in the same task answers it.
//! - A call of a tool the client runs (declared in the request's
//!   `metadata.clientTools`) is `input-required` too: its status message
//!   names the call (a data part: `call_id`, `tool`, `arguments`,
//!   `runs: "client"`); a message in the same task answers it with a data
//!   part `{call_id, output, is_error}` (or, for one call, its text).
//! - The end: `completed`, `failed` (an interrupted turn too) or
//!   `canceled`.

use serde_json::Value;

use super::wire::{
    Artifact, ArtifactUpdate, Citations, Data, Message, Part, Role, StatusUpdate, StreamResponse,
    Task, TaskState, TaskStatus,
};
use crate::{
    events::{StoredEvent, TurnEvent},
    protocols::retraction::{Say, StepText, ends_text},
};

use TaskState::{Canceled, Completed, Failed, InputRequired, Working};

/// The id of the answer's artifact.
const ANSWER: &str = "answer";

/// The fold of one turn.
pub struct TaskFold {
    task_id: String,
    context_id: String,
    /// The user's message that began the task.
    asked: Option<String>,
    state: TaskState,
    status_message: Option<Message>,
    timestamp: String,
    answer: String,
    /// Whether the answer's artifact has a chunk on the wire.
    answer_sent: bool,
    citations: Option<Citations>,
    said: StepText,
    step: u32,
    /// The calls that wait for a person.
    pending: Vec<String>,
    /// The calls that wait for the client to run them.
    client_calls: Vec<String>,
    /// Every client call asked for (one asked again after a take-over is
    /// not asked twice).
    client_asked: Vec<String>,
    ended: bool,
}

fn text_part(text: &str) -> Part {
    Part::Text(text.to_owned())
}

/// A data part naming a call.
fn call_part(call_id: &str, tool: &str, arguments: &Value, runs: Option<&'static str>) -> Part {
    Part::Data(Data::Call {
        call_id: call_id.to_owned(),
        tool: tool.to_owned(),
        arguments: arguments.clone(),
        runs,
    })
}

impl TaskFold {
    pub fn new(task_id: String, context_id: String) -> Self {
        Self {
            task_id,
            context_id,
            asked: None,
            state: TaskState::Submitted,
            status_message: None,
            timestamp: String::new(),
            answer: String::new(),
            answer_sent: false,
            citations: None,
            said: StepText::default(),
            step: 0,
            pending: Vec::new(),
            client_calls: Vec::new(),
            client_asked: Vec::new(),
            ended: false,
        }
    }

    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The calls that wait for a person.
    pub fn pending(&self) -> &[String] {
        &self.pending
    }

    /// The calls that wait for the client to run them.
    pub fn client_calls(&self) -> &[String] {
        &self.client_calls
    }

    /// A message of the agent's in this task.
    fn agent_message(&self, id: &str, parts: Vec<Part>) -> Message {
        Message {
            message_id: format!("{}-{id}", self.task_id),
            context_id: self.context_id.clone(),
            task_id: self.task_id.clone(),
            role: Role::Agent,
            parts,
        }
    }

    /// Back to `working` when nothing waits for the client any more.
    fn unblock(&mut self, out: &mut Vec<StreamResponse>) {
        if self.pending.is_empty() && self.client_calls.is_empty() && self.state == InputRequired {
            out.push(self.set(Working, None));
        }
    }

    /// Whether a stream of the task stops here: the turn ended, or waits
    /// for the client (A2A streams close on an interrupted state).
    pub fn pauses(&self) -> bool {
        self.ended || self.state == InputRequired
    }

    fn status(&self) -> TaskStatus {
        TaskStatus {
            state: self.state,
            timestamp: Some(self.timestamp.clone()).filter(|t| !t.is_empty()),
            message: self.status_message.clone(),
        }
    }

    fn status_update(&self) -> StreamResponse {
        StreamResponse::StatusUpdate(StatusUpdate {
            task_id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            status: self.status(),
        })
    }

    fn artifact(parts: Vec<Part>) -> Artifact {
        Artifact {
            artifact_id: ANSWER,
            name: ANSWER,
            parts,
        }
    }

    /// An update of the answer's artifact.
    pub fn artifact_update(&self, artifact: Artifact, append: bool, last: bool) -> StreamResponse {
        StreamResponse::ArtifactUpdate(ArtifactUpdate {
            task_id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            artifact,
            append,
            last_chunk: last,
        })
    }

    fn chunk(&mut self, text: &str, append: bool, last: bool) -> StreamResponse {
        self.answer_sent = true;
        self.artifact_update(Self::artifact(vec![text_part(text)]), append, last)
    }

    fn set(&mut self, state: TaskState, message: Option<Message>) -> StreamResponse {
        self.state = state;
        self.status_message = message;
        self.status_update()
    }

    /// The `StreamResponse`s of one stored event (the first event also
    /// gives the task as it begins).
    #[expect(
        clippy::too_many_lines,
        reason = "one match over the turn's event types, a few lines each"
    )]
    pub fn event(&mut self, stored: &StoredEvent, event: &TurnEvent) -> Vec<StreamResponse> {
        self.timestamp = stored
            .created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let mut out = Vec::new();
        if ends_text(event) {
            let said = self.said.other();
            self.say(said, &mut out);
        }
        match event {
            TurnEvent::TurnStarted { message, .. } => {
                self.asked = Some(message.clone());
                self.state = Working;
                out.push(StreamResponse::Task(self.task(None)));
            }
            TurnEvent::MessageDelta { step, text } => {
                self.step = *step;
                let said = self.said.delta(*step, text);
                self.say(said, &mut out);
            }
            TurnEvent::MessageRetracted { step, reason } => self.said.retracted(*step, reason),
            TurnEvent::ToolStarted { tool, .. }
                if tool.starts_with(crate::turn::CLIENT_TOOL_PREFIX) => {}
            TurnEvent::ToolRequested {
                call_id,
                tool,
                arguments,
                ..
            } => {
                if self.client_asked.contains(call_id) {
                    return out;
                }
                self.client_asked.push(call_id.clone());
                self.client_calls.push(call_id.clone());
                let parts = vec![
                    text_part(&format!(
                        "Run {tool} and answer in this task: a data part with call_id and output."
                    )),
                    call_part(call_id, tool, arguments, Some("client")),
                ];
                let message = self.agent_message(&format!("client-{call_id}"), parts);
                out.push(self.set(InputRequired, Some(message)));
            }
            TurnEvent::ToolFinished { call_id, .. } if self.client_calls.contains(call_id) => {
                self.client_calls.retain(|c| c != call_id);
                self.unblock(&mut out);
            }
            // A call a person's approval edited starts again: the client sent
            // the edit, and its first start stands.
            TurnEvent::ToolStarted { edited: true, .. } => {}
            TurnEvent::ToolStarted {
                call_id,
                tool,
                arguments,
                ..
            } => {
                let parts = vec![
                    text_part(&format!("calling {tool}")),
                    call_part(call_id, tool, arguments, None),
                ];
                let message = self.agent_message(&format!("tool-{call_id}"), parts);
                out.push(self.set(Working, Some(message)));
            }
            TurnEvent::ApprovalRequested {
                call_id,
                tool,
                arguments,
                ..
            } => {
                self.pending.push(call_id.clone());
                let parts = vec![
                    text_part(&format!(
                        "May I call {tool}? Answer in this task: approve or deny."
                    )),
                    call_part(call_id, tool, arguments, None),
                ];
                let message = self.agent_message(&format!("approval-{call_id}"), parts);
                out.push(self.set(InputRequired, Some(message)));
            }
            TurnEvent::ApprovalResolved { call_id, .. } => {
                self.pending.retain(|p| p != call_id);
                self.unblock(&mut out);
            }
            TurnEvent::Citations { local, web } => {
                self.citations = Some(Citations {
                    local: local.clone(),
                    web: web.clone(),
                });
            }
            TurnEvent::TurnCompleted { result } => {
                if result.text != self.answer {
                    self.answer.clone_from(&result.text);
                    out.push(self.chunk(&result.text, false, false));
                }
                let citations = self.citations.clone().unwrap_or_default();
                self.answer_sent = true;
                let mut parts = vec![Part::Data(Data::Citations { citations })];
                // Asked for JSON: the answer is a data part too.
                let answer = match &result.output {
                    Some(output) => {
                        parts.push(Part::Data(Data::Output(output.clone())));
                        Part::Data(Data::Output(output.clone()))
                    }
                    None => text_part(&result.text),
                };
                out.push(self.artifact_update(Self::artifact(parts), true, true));
                self.ended = true;
                let message = self.agent_message("answer", vec![answer]);
                out.push(self.set(Completed, Some(message)));
            }
            TurnEvent::TurnFailed { code, message, .. } => {
                out.push(self.end(Failed, &format!("{code}: {message}")));
            }
            TurnEvent::TurnCancelled { reason } => out.push(self.end(Canceled, reason)),
            TurnEvent::TurnInterrupted { reason } => {
                out.push(self.end(Failed, &format!("interrupted: {reason}")));
            }
            _ => {}
        }
        out
    }

    fn end(&mut self, state: TaskState, why: &str) -> StreamResponse {
        self.ended = true;
        self.pending.clear();
        self.client_calls.clear();
        let message = self.agent_message("end", vec![text_part(why)]);
        self.set(state, Some(message))
    }

    fn say(&mut self, said: Vec<Say>, out: &mut Vec<StreamResponse>) {
        for say in said {
            match say {
                Say::Text(text) => {
                    let append = self.answer_sent;
                    self.answer.push_str(&text);
                    out.push(self.chunk(&text, append, false));
                }
                // The answer as it stands replaces what was sent; the new
                // text is appended to it as it comes.
                Say::Retract { .. } => {
                    self.answer.clear();
                    out.push(self.chunk("", false, false));
                }
            }
        }
    }

    /// The task as it stands, its history cut to `history_length`
    /// messages (the newest).
    pub fn task(&self, history_length: Option<usize>) -> Task {
        let mut history = Vec::new();
        if let Some(asked) = &self.asked {
            history.push(Message {
                role: Role::User,
                ..self.agent_message("user", vec![text_part(asked)])
            });
        }
        if self.state == Completed {
            history.push(self.agent_message("answer", vec![text_part(&self.answer)]));
        }
        if let Some(keep) = history_length {
            let drop = history.len().saturating_sub(keep);
            history.drain(..drop);
        }
        let artifacts = (self.answer_sent || !self.answer.is_empty()).then(|| {
            let mut parts = vec![text_part(&self.answer)];
            if let Some(citations) = &self.citations {
                parts.push(Part::Data(Data::Citations {
                    citations: citations.clone(),
                }));
            }
            vec![Self::artifact(parts)]
        });
        Task {
            id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            status: self.status(),
            history,
            artifacts,
        }
    }
}
