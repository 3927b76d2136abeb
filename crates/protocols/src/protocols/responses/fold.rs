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
mod reasoning;

use serde_json::Value;

use super::wire::{
    Annotation, Conversation, FunctionTool, Incomplete, InputDetails, McpError, NoLogprobs,
    Numbered, OutputDetails, OutputItem, OutputText, ReasoningShown, ResponseError, ResponseObject,
    StreamEvent, TextFormat, TextShown, Usage,
};
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
    pub tools: Vec<FunctionTool>,
}

/// The message item being streamed.
struct OpenMessage {
    index: usize,
    step: u32,
    text: String,
    annotations: Vec<Annotation>,
}

/// How a response ends: its status and the stream event that says it.
type End = fn(Box<ResponseObject>) -> StreamEvent;

/// The fold: feed it a turn's events in order.
pub struct ResponseFold {
    head: Head,
    next_sequence: u64,
    output: Vec<OutputItem>,
    message: Option<OpenMessage>,
    messages: u32,
    said: StepText,
    /// The step of the last text.
    step: u32,
    status: &'static str,
    usage: Option<Usage>,
    error: Option<ResponseError>,
    incomplete: Option<Incomplete>,
    ended: bool,
    /// Calls an earlier response of the turn began, which waited for a
    /// person (by call id: tool and arguments): this one shows their end
    /// (bounded by the turn's calls).
    earlier_calls: Vec<(String, String, Value)>,
    /// The reasoning item being streamed: its index and its text.
    reasoning: Option<(usize, String)>,
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
            usage: None,
            error: None,
            incomplete: None,
            ended: false,
            earlier_calls: Vec::new(),
            reasoning: None,
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
    pub fn error_event(&mut self, code: &str, message: &str) -> Numbered {
        self.numbered(StreamEvent::Error {
            code: code.to_owned(),
            message: message.to_owned(),
            param: None,
        })
    }

    /// The stream events before the turn's first event.
    pub fn start(&mut self) -> Vec<Numbered> {
        let response = Box::new(self.response());
        vec![
            self.numbered(StreamEvent::Created {
                response: response.clone(),
            }),
            self.numbered(StreamEvent::InProgress { response }),
        ]
    }

    /// The stream events of one of the turn's events.
    pub fn event(&mut self, event: &TurnEvent) -> Vec<Numbered> {
        let mut out = Vec::new();
        if ends_text(event) {
            let said = self.said.other();
            self.say(said, self.step, &mut out);
        }
        if !matches!(event, TurnEvent::ReasoningDelta { .. }) {
            self.close_reasoning(&mut out);
        }
        match event {
            TurnEvent::ReasoningDelta { text, .. } => self.reason(text, &mut out),
            TurnEvent::MessageDelta { step, text } => {
                self.step = *step;
                let said = self.said.delta(*step, text);
                self.say(said, *step, &mut out);
            }
            TurnEvent::MessageRetracted { step, reason } => self.said.retracted(*step, reason),
            // A call a person's approval edited starts again: the client sent
            // the edit, and its first start stands.
            TurnEvent::ToolStarted { edited: true, .. } => {}
            TurnEvent::ToolStarted {
                call_id,
                tool,
                arguments,
                ..
            } => {
                self.close_message("completed", &mut out);
                let index = self.add_item(running_call(call_id, tool, arguments, None), &mut out);
                out.push(self.numbered(StreamEvent::McpCallInProgress {
                    item_id: call_item_id(call_id),
                    output_index: index,
                }));
            }
            TurnEvent::ToolFinished { .. } => {
                if let Some((call_id, shown)) = crate::protocols::finished_call(event) {
                    self.finish_call(call_id, shown, &mut out);
                }
            }
            TurnEvent::Citations { local, web } => self.cite(local, web, &mut out),
            TurnEvent::TurnCompleted { result } => self.complete(result, &mut out),
            TurnEvent::TurnFailed { code, message, .. } => {
                self.fail("failed", code, message, &mut out);
            }
            TurnEvent::TurnCancelled { reason } => {
                self.fail("cancelled", "cancelled", reason, &mut out);
            }
            TurnEvent::TurnInterrupted { reason } => {
                self.fail("failed", "interrupted", reason, &mut out);
            }
            _ => {}
        }
        out
    }

    fn complete(&mut self, result: &TurnResult, out: &mut Vec<Numbered>) {
        let incomplete = match result.stop_reason {
            StopReason::Answer => None,
            StopReason::Budget => Some("max_output_tokens"),
            StopReason::Deadline => Some("deadline"),
            StopReason::MaxSteps => Some("max_steps"),
            StopReason::OutputInvalid => Some("output_invalid"),
        };
        self.usage = Some(usage_of(result));
        match incomplete {
            None => {
                self.close_message("completed", out);
                self.end(
                    "completed",
                    |response| StreamEvent::Completed { response },
                    out,
                );
            }
            Some(reason) => {
                self.close_message("incomplete", out);
                self.incomplete = Some(Incomplete { reason });
                self.end(
                    "incomplete",
                    |response| StreamEvent::Incomplete { response },
                    out,
                );
            }
        }
    }

    /// The turn failed, was cancelled or interrupted: `status`, with the
    /// error's `code` and `message`.
    fn fail(&mut self, status: &'static str, code: &str, message: &str, out: &mut Vec<Numbered>) {
        self.error = Some(ResponseError {
            code: code.to_owned(),
            message: message.to_owned(),
        });
        self.close_message("incomplete", out);
        self.end(status, |response| StreamEvent::Failed { response }, out);
    }

    /// Names the response this one goes on from.
    pub fn follows(&mut self, previous_response_id: Option<String>) {
        self.head.previous_response_id = previous_response_id;
    }

    /// The `response` object as it stands.
    pub fn response(&self) -> ResponseObject {
        let head = &self.head;
        let mut output = self.output.clone();
        if let Some(message) = &self.message
            && let Some(item) = output.get_mut(message.index)
        {
            *item = message_item(item, "in_progress", &message.text, &message.annotations);
        }
        ResponseObject {
            id: head.id.clone(),
            object: "response",
            created_at: head.created_at,
            status: self.status,
            background: head.background,
            conversation: Conversation {
                id: head.conversation.clone(),
            },
            error: self.error.clone(),
            incomplete_details: self.incomplete.clone(),
            instructions: head.instructions.clone(),
            max_output_tokens: head.max_output_tokens,
            metadata: head.metadata.clone(),
            model: head.model.clone(),
            output,
            parallel_tool_calls: true,
            previous_response_id: head.previous_response_id.clone(),
            reasoning: ReasoningShown {
                effort: head.effort.clone(),
                summary: None,
            },
            store: true,
            temperature: None,
            text: TextShown {
                format: TextFormat::Text,
            },
            tool_choice: "auto",
            tools: head.tools.clone(),
            top_p: None,
            truncation: "disabled",
            usage: self.usage.clone(),
            user: head.user.clone(),
        }
    }

    /// `event`, numbered as the next one.
    fn numbered(&mut self, event: StreamEvent) -> Numbered {
        let sequence_number = self.next_sequence;
        self.next_sequence += 1;
        Numbered {
            event,
            sequence_number,
        }
    }

    fn add_item(&mut self, item: OutputItem, out: &mut Vec<Numbered>) -> usize {
        let index = self.output.len();
        self.output.push(item.clone());
        out.push(self.numbered(StreamEvent::ItemAdded {
            output_index: index,
            item,
        }));
        index
    }

    fn say(&mut self, said: Vec<Say>, step: u32, out: &mut Vec<Numbered>) {
        for say in said {
            match say {
                Say::Text(text) => self.text(step, &text, out),
                Say::Retract { .. } => self.close_message("incomplete", out),
            }
        }
    }

    fn text(&mut self, step: u32, text: &str, out: &mut Vec<Numbered>) {
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
                let item = OutputItem::Message {
                    id: id.clone(),
                    role: "assistant",
                    status: "in_progress",
                    content: Vec::new(),
                };
                let index = self.add_item(item, out);
                out.push(self.numbered(StreamEvent::PartAdded {
                    item_id: id,
                    output_index: index,
                    content_index: 0,
                    part: text_part("", &[]),
                }));
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
        let item_id = self.item_id(index);
        out.push(self.numbered(StreamEvent::TextDelta {
            item_id,
            output_index: index,
            content_index: 0,
            delta: text.to_owned(),
            logprobs: NoLogprobs,
        }));
    }

    fn item_id(&self, index: usize) -> String {
        self.output
            .get(index)
            .map(|item| item.id().to_owned())
            .unwrap_or_default()
    }

    fn close_message(&mut self, status: &'static str, out: &mut Vec<Numbered>) {
        let Some(message) = self.message.take() else {
            return;
        };
        let index = message.index;
        let id = self.item_id(index);
        out.push(self.numbered(StreamEvent::TextDone {
            item_id: id.clone(),
            output_index: index,
            content_index: 0,
            text: message.text.clone(),
            logprobs: NoLogprobs,
        }));
        out.push(self.numbered(StreamEvent::PartDone {
            item_id: id,
            output_index: index,
            content_index: 0,
            part: text_part(&message.text, &message.annotations),
        }));
        let Some(slot) = self.output.get_mut(index) else {
            return;
        };
        *slot = message_item(slot, status, &message.text, &message.annotations);
        let item = slot.clone();
        out.push(self.numbered(StreamEvent::ItemDone {
            output_index: index,
            item,
        }));
    }

    fn finish_call(
        &mut self,
        call_id: &str,
        shown: crate::protocols::CallResult<'_>,
        out: &mut Vec<Numbered>,
    ) {
        let id = call_item_id(call_id);
        let found = self.output.iter().position(|item| item.id() == id);
        let index = match found {
            Some(index) => index,
            // Begun in the response that asked for its approval.
            None => {
                let Some((_, tool, arguments)) =
                    self.earlier_calls.iter().find(|(c, ..)| c == call_id)
                else {
                    return;
                };
                let approval = Some(format!("{APPROVAL_PREFIX}{call_id}"));
                let item = running_call(call_id, tool, arguments, approval);
                self.close_message("completed", out);
                self.add_item(item, out)
            }
        };
        let Some(OutputItem::McpCall {
            status,
            output,
            error,
            ..
        }) = self.output.get_mut(index)
        else {
            return;
        };
        let completed = shown.is_ok();
        match shown {
            Ok(shown) => {
                *status = "completed";
                *output = Some(shown);
            }
            Err((ended, why)) => {
                *status = "failed";
                *error = Some(McpError {
                    content: format!("{}: {}", ended.as_str(), why.unwrap_or_default()),
                });
            }
        }
        let item = self.output.get(index).cloned();
        out.push(self.numbered(if completed {
            StreamEvent::McpCallCompleted {
                item_id: id,
                output_index: index,
            }
        } else {
            StreamEvent::McpCallFailed {
                item_id: id,
                output_index: index,
            }
        }));
        if let Some(item) = item {
            out.push(self.numbered(StreamEvent::ItemDone {
                output_index: index,
                item,
            }));
        }
    }

    fn cite(
        &mut self,
        local: &[String],
        web: &[crate::turn::WebCitation],
        out: &mut Vec<Numbered>,
    ) {
        let Some(message) = self.message.as_mut() else {
            return;
        };
        let at = message.text.chars().count();
        let web = web.iter().map(|source| Annotation::UrlCitation {
            url: source.url.clone(),
            title: source.title.clone(),
            start_index: at,
            end_index: at,
        });
        let local = local.iter().map(|anchor| Annotation::FileCitation {
            file_id: anchor.clone(),
            filename: anchor.clone(),
            index: at,
        });
        let added: Vec<Annotation> = web.chain(local).collect();
        let index = message.index;
        let first = message.annotations.len();
        message.annotations.extend(added.iter().cloned());
        let id = self.item_id(index);
        for (i, annotation) in added.into_iter().enumerate() {
            out.push(self.numbered(StreamEvent::AnnotationAdded {
                item_id: id.clone(),
                output_index: index,
                content_index: 0,
                annotation_index: first + i,
                annotation,
            }));
        }
    }

    fn end(&mut self, status: &'static str, end: End, out: &mut Vec<Numbered>) {
        self.status = status;
        self.ended = true;
        let response = Box::new(self.response());
        out.push(self.numbered(end(response)));
    }
}

/// A server-side tool call's `mcp_call` item as it starts (with the id of
/// the approval it waited for, when it did).
fn running_call(
    call_id: &str,
    tool: &str,
    arguments: &Value,
    approval_request_id: Option<String>,
) -> OutputItem {
    OutputItem::McpCall {
        id: call_item_id(call_id),
        name: tool.to_owned(),
        arguments: arguments.to_string(),
        server_label: SERVER_LABEL,
        status: "in_progress",
        output: None,
        error: None,
        approval_request_id,
    }
}

/// The item id of a server-side tool call.
fn call_item_id(call_id: &str) -> String {
    format!("mcp_{call_id}")
}

fn text_part(text: &str, annotations: &[Annotation]) -> OutputText {
    OutputText {
        text: text.to_owned(),
        annotations: annotations.to_vec(),
        logprobs: NoLogprobs,
    }
}

/// A message item with `status` and its text whole.
fn message_item(
    item: &OutputItem,
    status: &'static str,
    text: &str,
    annotations: &[Annotation],
) -> OutputItem {
    OutputItem::Message {
        id: item.id().to_owned(),
        role: "assistant",
        status,
        content: vec![text_part(text, annotations)],
    }
}

/// The `usage` of a turn's result.
pub fn usage_of(result: &TurnResult) -> Usage {
    Usage {
        input_tokens: result.input_tokens,
        input_tokens_details: InputDetails {
            cached_tokens: result.cache_read_tokens,
            cache_write_tokens: result.cache_creation_tokens,
        },
        output_tokens: result.output_tokens,
        output_tokens_details: OutputDetails {
            reasoning_tokens: result.reasoning_tokens,
        },
        total_tokens: result.input_tokens + result.output_tokens,
    }
}
