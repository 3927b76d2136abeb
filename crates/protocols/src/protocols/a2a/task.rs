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

use serde_json::{Value, json};

use crate::{
    events::{StoredEvent, TurnEvent},
    protocols::retraction::{Say, StepText, ends_text},
};

pub const WORKING: &str = "TASK_STATE_WORKING";
pub const COMPLETED: &str = "TASK_STATE_COMPLETED";
pub const FAILED: &str = "TASK_STATE_FAILED";
pub const CANCELED: &str = "TASK_STATE_CANCELED";
pub const INPUT_REQUIRED: &str = "TASK_STATE_INPUT_REQUIRED";

/// The id of the answer's artifact.
const ANSWER: &str = "answer";

/// The fold of one turn.
pub struct TaskFold {
    task_id: String,
    context_id: String,
    /// The user's message that began the task.
    asked: Option<String>,
    state: &'static str,
    status_message: Option<Value>,
    timestamp: String,
    answer: String,
    /// Whether the answer's artifact has a chunk on the wire.
    answer_sent: bool,
    citations: Option<Value>,
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

fn text_part(text: &str) -> Value {
    json!({"text": text})
}

fn agent_message(task_id: &str, context_id: &str, id: &str, parts: Vec<Value>) -> Value {
    json!({
        "messageId": id,
        "contextId": context_id,
        "taskId": task_id,
        "role": "ROLE_AGENT",
        "parts": parts,
    })
}

impl TaskFold {
    pub fn new(task_id: String, context_id: String) -> Self {
        Self {
            task_id,
            context_id,
            asked: None,
            state: "TASK_STATE_SUBMITTED",
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

    /// Back to `working` when nothing waits for the client any more.
    fn unblock(&mut self, out: &mut Vec<Value>) {
        if self.pending.is_empty() && self.client_calls.is_empty() && self.state == INPUT_REQUIRED {
            out.push(self.set(WORKING, None));
        }
    }

    /// Whether a stream of the task stops here: the turn ended, or waits
    /// for the client (A2A streams close on an interrupted state).
    pub fn pauses(&self) -> bool {
        self.ended || self.state == INPUT_REQUIRED
    }

    fn status(&self) -> Value {
        let mut status = json!({"state": self.state});
        if !self.timestamp.is_empty() {
            status["timestamp"] = self.timestamp.clone().into();
        }
        if let Some(message) = &self.status_message {
            status["message"] = message.clone();
        }
        status
    }

    fn status_update(&self) -> Value {
        json!({"statusUpdate": {
            "taskId": self.task_id,
            "contextId": self.context_id,
            "status": self.status(),
        }})
    }

    fn artifact(&self, parts: Vec<Value>) -> Value {
        json!({"artifactId": ANSWER, "name": ANSWER, "parts": parts})
    }

    fn chunk(&mut self, text: &str, append: bool, last: bool) -> Value {
        self.answer_sent = true;
        json!({"artifactUpdate": {
            "taskId": self.task_id,
            "contextId": self.context_id,
            "artifact": self.artifact(vec![text_part(text)]),
            "append": append,
            "lastChunk": last,
        }})
    }

    fn set(&mut self, state: &'static str, message: Option<Value>) -> Value {
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
    pub fn event(&mut self, stored: &StoredEvent, event: &TurnEvent) -> Vec<Value> {
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
                self.state = WORKING;
                out.push(json!({"task": self.task(None)}));
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
                let id = format!("{}-client-{call_id}", self.task_id);
                let parts = vec![
                    text_part(&format!(
                        "Run {tool} and answer in this task: a data part with call_id and output."
                    )),
                    json!({"data": {
                        "call_id": call_id,
                        "tool": tool,
                        "arguments": arguments,
                        "runs": "client",
                    }}),
                ];
                let message = agent_message(&self.task_id, &self.context_id, &id, parts);
                out.push(self.set(INPUT_REQUIRED, Some(message)));
            }
            TurnEvent::ToolFinished { call_id, .. } if self.client_calls.contains(call_id) => {
                self.client_calls.retain(|c| c != call_id);
                self.unblock(&mut out);
            }
            TurnEvent::ToolStarted {
                call_id,
                tool,
                arguments,
                ..
            } => {
                let id = format!("{}-tool-{call_id}", self.task_id);
                let parts = vec![
                    text_part(&format!("calling {tool}")),
                    json!({"data": {"call_id": call_id, "tool": tool, "arguments": arguments}}),
                ];
                let message = agent_message(&self.task_id, &self.context_id, &id, parts);
                out.push(self.set(WORKING, Some(message)));
            }
            TurnEvent::ApprovalRequested {
                call_id,
                tool,
                arguments,
                ..
            } => {
                self.pending.push(call_id.clone());
                let id = format!("{}-approval-{call_id}", self.task_id);
                let parts = vec![
                    text_part(&format!(
                        "May I call {tool}? Answer in this task: approve or deny."
                    )),
                    json!({"data": {"call_id": call_id, "tool": tool, "arguments": arguments}}),
                ];
                let message = agent_message(&self.task_id, &self.context_id, &id, parts);
                out.push(self.set(INPUT_REQUIRED, Some(message)));
            }
            TurnEvent::ApprovalResolved { call_id, .. } => {
                self.pending.retain(|p| p != call_id);
                self.unblock(&mut out);
            }
            TurnEvent::Citations { local, web } => {
                self.citations = Some(json!({"local": local, "web": web}));
            }
            TurnEvent::TurnCompleted { result } => {
                if result.text != self.answer {
                    self.answer.clone_from(&result.text);
                    out.push(self.chunk(&result.text, false, false));
                }
                let data = self
                    .citations
                    .clone()
                    .unwrap_or_else(|| json!({"local": [], "web": []}));
                self.answer_sent = true;
                out.push(json!({"artifactUpdate": {
                    "taskId": self.task_id,
                    "contextId": self.context_id,
                    "artifact": self.artifact(vec![json!({"data": {"citations": data}})]),
                    "append": true,
                    "lastChunk": true,
                }}));
                self.ended = true;
                let id = format!("{}-answer", self.task_id);
                let message = agent_message(
                    &self.task_id,
                    &self.context_id,
                    &id,
                    vec![text_part(&result.text)],
                );
                out.push(self.set(COMPLETED, Some(message)));
            }
            TurnEvent::TurnFailed { code, message, .. } => {
                out.push(self.end(FAILED, &format!("{code}: {message}")));
            }
            TurnEvent::TurnCancelled { reason } => out.push(self.end(CANCELED, reason)),
            TurnEvent::TurnInterrupted { reason } => {
                out.push(self.end(FAILED, &format!("interrupted: {reason}")));
            }
            _ => {}
        }
        out
    }

    fn end(&mut self, state: &'static str, why: &str) -> Value {
        self.ended = true;
        self.pending.clear();
        self.client_calls.clear();
        let id = format!("{}-end", self.task_id);
        let message = agent_message(&self.task_id, &self.context_id, &id, vec![text_part(why)]);
        self.set(state, Some(message))
    }

    fn say(&mut self, said: Vec<Say>, out: &mut Vec<Value>) {
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
    pub fn task(&self, history_length: Option<usize>) -> Value {
        let mut history = Vec::new();
        if let Some(asked) = &self.asked {
            history.push(json!({
                "messageId": format!("{}-user", self.task_id),
                "contextId": self.context_id,
                "taskId": self.task_id,
                "role": "ROLE_USER",
                "parts": [text_part(asked)],
            }));
        }
        if self.state == COMPLETED {
            history.push(agent_message(
                &self.task_id,
                &self.context_id,
                &format!("{}-answer", self.task_id),
                vec![text_part(&self.answer)],
            ));
        }
        if let Some(keep) = history_length {
            let drop = history.len().saturating_sub(keep);
            history.drain(..drop);
        }
        let mut task = json!({
            "id": self.task_id,
            "contextId": self.context_id,
            "status": self.status(),
            "history": history,
        });
        if self.answer_sent || !self.answer.is_empty() {
            let mut parts = vec![text_part(&self.answer)];
            if let Some(citations) = &self.citations {
                parts.push(json!({"data": {"citations": citations}}));
            }
            task["artifacts"] = json!([self.artifact(parts)]);
        }
        task
    }
}
