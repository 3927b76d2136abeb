//! A turn's events folded into an OpenAI Responses `response`: the
//! stream events (`ResponseStreamEvent`s) each event adds, numbered, and
//! the `response` object as it stands.
//!
//! The fold is a function of the turn's log: the same events give the
//! same stream events with the same `sequence_number`s. A stream resumed
//! with `starting_after=N` folds the log from the turn's start and sends
//! what comes after `N`; `GET /v1/responses/{id}` folds what the log holds.
//!
//! - The text of a step is a `message` output item with one `output_text`
//!   part; a step that ends (its tool calls, the turn's end) closes it.
//! - A server-side tool call is an `mcp_call` item (server label
//!   `agent-harness`): `response.mcp_call.in_progress`, then
//!   `.completed` or `.failed` with its output or error.
//! - A call waiting for a person is an `mcp_approval_request` item, and
//!   the response ends with it (the next request's
//!   `mcp_approval_response` decides).
//! - A call of a tool the client runs is a `function_call` item, and the
//!   response ends with it (see [`crate::protocols::client_calls`]).
//! - Citations are annotations of the open message (`url_citation` for
//!   the web, `file_citation` for a vault anchor), at the text's end.
//! - Text the turn retracts and says differently (a provider retry, a
//!   take-over) closes its message `incomplete`; the new text opens a
//!   new message. Text said again the same is held back ([`StepText`]).

mod calls;

use serde_json::{Map, Value, json};

use crate::{
    events::TurnEvent,
    protocols::retraction::{Say, StepText, ends_text},
    turn::{StopReason, TurnResult},
};

/// What an `mcp_approval_request` item's id is: this, then the call's id.
pub const APPROVAL_PREFIX: &str = "mcpr_";

/// The label of the server that runs the service's own tools.
pub const SERVER_LABEL: &str = "agent-harness";

/// The fields of a `response` that do not change while it runs.
#[derive(Debug, Clone)]
pub struct Head {
    /// `resp_<turn id>`.
    pub id: String,
    pub created_at: i64,
    pub model: String,
    /// The session, shown as `conversation.id`.
    pub conversation: String,
    pub instructions: Option<String>,
    pub metadata: Value,
    pub max_output_tokens: Option<u32>,
    pub previous_response_id: Option<String>,
    pub background: bool,
    /// The asked `reasoning.effort`, shown back.
    pub effort: Option<String>,
    pub user: Option<String>,
    /// The client's `function` tools, shown back.
    pub tools: Value,
}

/// The message item being streamed.
struct OpenMessage {
    index: usize,
    step: u32,
    text: String,
    annotations: Vec<Value>,
}

/// The fold: feed it a turn's events in order.
pub struct ResponseFold {
    head: Head,
    next_sequence: u64,
    output: Vec<Value>,
    message: Option<OpenMessage>,
    messages: u32,
    said: StepText,
    /// The step of the last text.
    step: u32,
    status: &'static str,
    usage: Value,
    error: Value,
    incomplete: Value,
    ended: bool,
    /// Calls an earlier response of the turn began, which waited for a
    /// person (by call id: tool and arguments): this one shows their end
    /// (bounded by the turn's calls).
    earlier_calls: Vec<(String, String, Value)>,
}

impl ResponseFold {
    pub fn new(head: Head) -> Self {
        Self {
            head,
            next_sequence: 0,
            output: Vec::new(),
            message: None,
            messages: 0,
            said: StepText::default(),
            step: 0,
            status: "in_progress",
            usage: Value::Null,
            error: Value::Null,
            incomplete: Value::Null,
            ended: false,
            earlier_calls: Vec::new(),
        }
    }

    /// A call an earlier response of the turn began (its `tool.started`
    /// before this response's start): an approved call ends in this one.
    pub fn began_earlier(&mut self, call_id: &str, tool: &str, arguments: &Value) {
        self.earlier_calls
            .push((call_id.to_owned(), tool.to_owned(), arguments.clone()));
    }

    /// Whether the turn ended.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// When the turn began (Unix seconds) and the model it asked for.
    pub fn begin(&mut self, created_at: i64, model: Option<&str>) {
        self.head.created_at = created_at;
        if let Some(model) = model {
            model.clone_into(&mut self.head.model);
        }
    }

    /// An `error` stream event, numbered as the next one.
    pub fn error_event(&mut self, code: &str, message: &str) -> Value {
        self.numbered(
            "error",
            json!({"code": code, "message": message, "param": null}),
        )
    }

    /// The stream events before the turn's first event.
    pub fn start(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        let response = self.response();
        out.push(self.numbered("response.created", json!({ "response": response })));
        out.push(self.numbered("response.in_progress", json!({ "response": response })));
        out
    }

    /// The stream events of one of the turn's events.
    pub fn event(&mut self, event: &TurnEvent) -> Vec<Value> {
        let mut out = Vec::new();
        if ends_text(event) {
            let said = self.said.other();
            self.say(said, self.step, &mut out);
        }
        match event {
            TurnEvent::MessageDelta { step, text } => {
                self.step = *step;
                let said = self.said.delta(*step, text);
                self.say(said, *step, &mut out);
            }
            TurnEvent::MessageRetracted { step, reason } => self.said.retracted(*step, reason),
            TurnEvent::ToolStarted {
                call_id,
                tool,
                arguments,
                ..
            } => {
                self.close_message("completed", &mut out);
                let index = self.add_item(running_call(call_id, tool, arguments), &mut out);
                let id = call_item_id(call_id);
                out.push(self.numbered(
                    "response.mcp_call.in_progress",
                    json!({"item_id": id, "output_index": index}),
                ));
            }
            TurnEvent::ToolFinished { .. } => {
                if let Some((call_id, shown)) = crate::protocols::finished_call(event) {
                    self.finish_call(call_id, shown, &mut out);
                }
            }
            TurnEvent::Citations { local, web } => self.cite(local, web, &mut out),
            TurnEvent::TurnCompleted { result } => {
                let (status, kind, incomplete) = match result.stop_reason {
                    StopReason::Answer => ("completed", "response.completed", None),
                    StopReason::Budget => (
                        "incomplete",
                        "response.incomplete",
                        Some("max_output_tokens"),
                    ),
                    StopReason::Deadline => ("incomplete", "response.incomplete", Some("deadline")),
                    StopReason::MaxSteps => {
                        ("incomplete", "response.incomplete", Some("max_steps"))
                    }
                };
                self.close_message(
                    if incomplete.is_some() {
                        "incomplete"
                    } else {
                        "completed"
                    },
                    &mut out,
                );
                self.usage = usage_of(result);
                if let Some(reason) = incomplete {
                    self.incomplete = json!({ "reason": reason });
                }
                self.end(status, kind, &mut out);
            }
            TurnEvent::TurnFailed { code, message, .. } => {
                self.error = json!({"code": code, "message": message});
                self.close_message("incomplete", &mut out);
                self.end("failed", "response.failed", &mut out);
            }
            TurnEvent::TurnCancelled { reason } => {
                self.error = json!({"code": "cancelled", "message": reason});
                self.close_message("incomplete", &mut out);
                self.end("cancelled", "response.failed", &mut out);
            }
            TurnEvent::TurnInterrupted { reason } => {
                self.error = json!({"code": "interrupted", "message": reason});
                self.close_message("incomplete", &mut out);
                self.end("failed", "response.failed", &mut out);
            }
            _ => {}
        }
        out
    }

    /// Names the response this one goes on from.
    pub fn follows(&mut self, previous_response_id: Option<String>) {
        self.head.previous_response_id = previous_response_id;
    }

    /// The `response` object as it stands.
    pub fn response(&self) -> Value {
        let head = &self.head;
        let mut output = self.output.clone();
        if let Some(message) = &self.message
            && let Some(item) = output.get_mut(message.index)
        {
            *item = message_item(item, "in_progress", &message.text, &message.annotations);
        }
        json!({
            "id": head.id,
            "object": "response",
            "created_at": head.created_at,
            "status": self.status,
            "background": head.background,
            "conversation": {"id": head.conversation},
            "error": self.error,
            "incomplete_details": self.incomplete,
            "instructions": head.instructions,
            "max_output_tokens": head.max_output_tokens,
            "metadata": head.metadata,
            "model": head.model,
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": head.previous_response_id,
            "reasoning": {"effort": head.effort, "summary": null},
            "store": true,
            "temperature": null,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": head.tools,
            "top_p": null,
            "truncation": "disabled",
            "usage": self.usage,
            "user": head.user,
        })
    }

    /// `body` as the stream event `kind`, numbered as the next one.
    fn numbered(&mut self, kind: &str, mut body: Value) -> Value {
        if let Some(fields) = body.as_object_mut() {
            fields.insert("type".into(), kind.into());
            fields.insert("sequence_number".into(), self.next_sequence.into());
        }
        self.next_sequence += 1;
        body
    }

    fn add_item(&mut self, item: Value, out: &mut Vec<Value>) -> usize {
        let index = self.output.len();
        self.output.push(item.clone());
        out.push(self.numbered(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        index
    }

    fn say(&mut self, said: Vec<Say>, step: u32, out: &mut Vec<Value>) {
        for say in said {
            match say {
                Say::Text(text) => self.text(step, &text, out),
                Say::Retract { .. } => self.close_message("incomplete", out),
            }
        }
    }

    fn text(&mut self, step: u32, text: &str, out: &mut Vec<Value>) {
        if self.message.as_ref().is_some_and(|m| m.step != step) {
            self.close_message("completed", out);
        }
        let index = match &self.message {
            Some(message) => message.index,
            None => {
                self.messages += 1;
                let id = format!(
                    "msg_{}_{}",
                    self.head.id.trim_start_matches("resp_"),
                    self.messages
                );
                let item = json!({
                    "type": "message",
                    "id": id,
                    "role": "assistant",
                    "status": "in_progress",
                    "content": [],
                });
                let index = self.add_item(item, out);
                out.push(self.numbered(
                    "response.content_part.added",
                    json!({
                        "item_id": id,
                        "output_index": index,
                        "content_index": 0,
                        "part": text_part("", &[]),
                    }),
                ));
                self.message = Some(OpenMessage {
                    index,
                    step,
                    text: String::new(),
                    annotations: Vec::new(),
                });
                index
            }
        };
        if let Some(message) = self.message.as_mut() {
            message.text.push_str(text);
        }
        let id = self.item_id(index);
        out.push(self.numbered(
            "response.output_text.delta",
            json!({
                "item_id": id,
                "output_index": index,
                "content_index": 0,
                "delta": text,
                "logprobs": [],
            }),
        ));
    }

    fn item_id(&self, index: usize) -> Value {
        self.output
            .get(index)
            .map_or(Value::Null, |item| item["id"].clone())
    }

    fn close_message(&mut self, status: &str, out: &mut Vec<Value>) {
        let Some(message) = self.message.take() else {
            return;
        };
        let index = message.index;
        let id = self.item_id(index);
        out.push(self.numbered(
            "response.output_text.done",
            json!({
                "item_id": id,
                "output_index": index,
                "content_index": 0,
                "text": message.text,
                "logprobs": [],
            }),
        ));
        out.push(self.numbered(
            "response.content_part.done",
            json!({
                "item_id": id,
                "output_index": index,
                "content_index": 0,
                "part": text_part(&message.text, &message.annotations),
            }),
        ));
        let item = self.output.get(index).map_or(Value::Null, |item| {
            message_item(item, status, &message.text, &message.annotations)
        });
        if let Some(slot) = self.output.get_mut(index) {
            *slot = item.clone();
        }
        out.push(self.numbered(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
    }

    fn finish_call(
        &mut self,
        call_id: &str,
        shown: crate::protocols::CallResult<'_>,
        out: &mut Vec<Value>,
    ) {
        let id = call_item_id(call_id);
        let found = self.output.iter().position(|item| item["id"] == id);
        let index = match found {
            Some(index) => index,
            // Begun in the response that asked for its approval.
            None => {
                let Some((_, tool, arguments)) =
                    self.earlier_calls.iter().find(|(c, ..)| c == call_id)
                else {
                    return;
                };
                let mut item = running_call(call_id, tool, arguments);
                item["approval_request_id"] = format!("{APPROVAL_PREFIX}{call_id}").into();
                self.close_message("completed", out);
                self.add_item(item, out)
            }
        };
        let Some(item) = self.output.get_mut(index) else {
            return;
        };
        let completed = shown.is_ok();
        match shown {
            Ok(output) => {
                item["status"] = "completed".into();
                item["output"] = output.into();
            }
            Err((status, why)) => {
                item["status"] = "failed".into();
                item["error"] = json!({
                    "type": "mcp_tool_execution_error",
                    "content": format!("{}: {}", status.as_str(), why.unwrap_or_default()),
                });
            }
        }
        let item = item.clone();
        let kind = if completed {
            "response.mcp_call.completed"
        } else {
            "response.mcp_call.failed"
        };
        out.push(self.numbered(kind, json!({"item_id": id, "output_index": index})));
        out.push(self.numbered(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
    }

    fn cite(&mut self, local: &[String], web: &[crate::turn::WebCitation], out: &mut Vec<Value>) {
        let Some(message) = self.message.as_mut() else {
            return;
        };
        let at = message.text.chars().count();
        let mut added = Vec::new();
        for source in web {
            added.push(json!({
                "type": "url_citation",
                "url": source.url,
                "title": source.title,
                "start_index": at,
                "end_index": at,
            }));
        }
        for anchor in local {
            added.push(json!({
                "type": "file_citation",
                "file_id": anchor,
                "filename": anchor,
                "index": at,
            }));
        }
        let index = message.index;
        let first = message.annotations.len();
        message.annotations.extend(added.iter().cloned());
        let id = self.item_id(index);
        for (i, annotation) in added.into_iter().enumerate() {
            out.push(self.numbered(
                "response.output_text.annotation.added",
                json!({
                    "item_id": id,
                    "output_index": index,
                    "content_index": 0,
                    "annotation_index": first + i,
                    "annotation": annotation,
                }),
            ));
        }
    }

    fn end(&mut self, status: &'static str, kind: &str, out: &mut Vec<Value>) {
        self.status = status;
        self.ended = true;
        let response = self.response();
        out.push(self.numbered(kind, json!({ "response": response })));
    }
}

/// An output item of the service's own tools (`server_label`
/// [`SERVER_LABEL`]) naming a call of `tool`.
fn server_item(kind: &str, id: String, tool: &str, arguments: &Value) -> Value {
    json!({
        "type": kind,
        "id": id,
        "name": tool,
        "arguments": arguments.to_string(),
        "server_label": SERVER_LABEL,
    })
}

/// A server-side tool call's `mcp_call` item as it starts.
fn running_call(call_id: &str, tool: &str, arguments: &Value) -> Value {
    let mut item = server_item("mcp_call", call_item_id(call_id), tool, arguments);
    item["status"] = "in_progress".into();
    item["output"] = Value::Null;
    item["error"] = Value::Null;
    item
}

/// The item id of a server-side tool call.
fn call_item_id(call_id: &str) -> String {
    format!("mcp_{call_id}")
}

fn text_part(text: &str, annotations: &[Value]) -> Value {
    json!({"type": "output_text", "text": text, "annotations": annotations, "logprobs": []})
}

fn message_item(item: &Value, status: &str, text: &str, annotations: &[Value]) -> Value {
    let mut item: Map<String, Value> = item.as_object().cloned().unwrap_or_default();
    item.insert("status".into(), status.into());
    item.insert("content".into(), json!([text_part(text, annotations)]));
    Value::Object(item)
}

/// The `usage` of a turn's result.
pub fn usage_of(result: &TurnResult) -> Value {
    json!({
        "input_tokens": result.input_tokens,
        "input_tokens_details": {
            "cached_tokens": result.cache_read_tokens,
            "cache_write_tokens": result.cache_creation_tokens,
        },
        "output_tokens": result.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": result.input_tokens + result.output_tokens,
    })
}
