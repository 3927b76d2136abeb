//! `POST /v1/ui/chat`: the Vercel AI SDK's UI message stream (v1), so that
//! `useChat` (its default transport, `api: "/v1/ui/chat"`) talks to the
//! service directly. The request is `useChat`'s (`id`, `messages` with
//! `parts`); the answer streams the turn's events as UI message chunks.
//!
//! The service's own tools are `providerExecuted` (the client does not
//! run them). Tools the client runs are declared in the body's
//! `clientTools`; a call of one is `tool-input-available` (for `onToolCall`)
//! and the stream finishes while the turn waits; the next request's last
//! (assistant) message carries the result in that tool part
//! (`output-available` or `output-error`, as `addToolResult` leaves it),
//! and its stream is the same turn after the call.
//!
//! A call that waits for a person's approval is `tool-approval-request`
//! (`approvalId`, `toolCallId`) and the stream finishes while the turn
//! waits; the next request's last (assistant) message carries the
//! decision in that tool part (`approval-responded`, `approval: {id,
//! approved, reason?}`, as `addToolApprovalResponse` leaves it), and its
//! stream is the same turn after the decision.

mod placement;
mod said;

use axum::{
    Extension,
    body::Bytes,
    extract::State,
    http::{HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};
use futures::StreamExt;
use said::said;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    ConversationTurn, ToolDeclaration,
    client_calls::{EndsAtClientCall, Replies, SegmentEncoder, SegmentStream, client_name},
    endpoint::Placement,
    retraction::{Say, StepText, ends_text},
    stream_for,
};
use crate::{
    events::TurnEvent,
    ids::Tenant,
    protocols::Shared,
    protocols::{
        error::{ApiError, BadRequest, InvalidBody, TurnAlreadyRunning},
        json::ApiJson,
        paths::SessionPath,
    },
};

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    crate::protocols::Shared: axum::extract::FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(ui_chat))
        .routes(routes!(ui_chat_resume))
}

/// `useChat`'s request (the fields read; the others are ignored).
#[derive(Debug, Deserialize, ToSchema)]
pub struct UiChatRequest {
    /// The chat: the service's session.
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    id: String,
    /// The conversation, the new user message last.
    #[schema(min_items = 1, max_items = 1000)]
    messages: Vec<UiMessage>,
    /// Tools the client runs itself (at most 32): `name`, `description`,
    /// `parameters` (a JSON schema).
    #[serde(default, rename = "clientTools")]
    client_tools: Vec<ToolDeclaration>,
    /// `submit-message` (the default) or `regenerate-message`: a new
    /// answer in place of the assistant message `messageId` (a sibling of
    /// its turn; the old answer stays readable).
    #[schema(pattern = "^(submit-message|regenerate-message)$")]
    trigger: Option<String>,
    /// The message a `regenerate-message` replaces.
    #[serde(rename = "messageId")]
    message_id: Option<String>,
    /// What the message does while the chat's turn runs (`sendMessage`'s
    /// `body`), as on `POST /sessions/{session_id}/turns`: `reject` (the
    /// default), `enqueue`, `interrupt`, or `steer` (the message joins
    /// the running turn, and the answer streams the rest of it).
    multitask: Option<crate::protocols::multitask::Multitask>,
}

/// A UI message: its text parts are read, and its tool parts' results
/// and decisions.
#[derive(Debug, Deserialize, ToSchema)]
pub struct UiMessage {
    /// An assistant message's id is its turn's.
    id: Option<String>,
    #[schema(pattern = "^(system|user|assistant)$")]
    role: String,
    #[serde(default)]
    #[schema(schema_with = crate::protocols::schemas::typed_parts)]
    parts: Vec<UiPart>,
}

/// A part of a UI message: the fields read of text and tool parts (other
/// parts are kept out of the turn).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct UiPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    /// A tool part's state: `output-available`, `output-error`,
    /// `approval-responded`, …
    state: Option<String>,
    tool_call_id: Option<String>,
    #[serde(default)]
    output: Value,
    #[serde(default)]
    error_text: Value,
    /// A tool part's input: on an `approval-responded` part, the
    /// arguments the person approved (edited when they differ from the
    /// asked ones).
    input: Option<Value>,
    approval: Option<Approval>,
    /// A `file` part's type, its `url` (`https` or `data:`) and its name.
    media_type: Option<String>,
    url: Option<String>,
    filename: Option<String>,
}

/// A tool part's `approval`, as `addToolApprovalResponse` leaves it.
#[derive(Debug, Deserialize)]
struct Approval {
    approved: Option<bool>,
    reason: Option<String>,
}

/// A UI message chunk (the AI SDK's `UIMessageChunk`).
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
enum Chunk {
    #[serde(rename_all = "camelCase")]
    Start {
        #[serde(skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
    },
    StartStep,
    TextStart {
        id: String,
    },
    TextDelta {
        id: String,
        delta: String,
    },
    TextEnd {
        id: String,
    },
    /// A reasoning part: the model's reasoning as it streams.
    ReasoningStart {
        id: String,
    },
    ReasoningDelta {
        id: String,
        delta: String,
    },
    ReasoningEnd {
        id: String,
    },
    /// A text part the turn took back.
    #[serde(rename = "data-message-retracted")]
    MessageRetracted {
        id: String,
        data: Retracted,
    },
    /// The turn went on on another replica.
    #[serde(rename = "data-turn-resumed")]
    TurnResumed {
        data: Resumed,
        transient: bool,
    },
    /// `provider_executed` when the service runs it, so that the client's
    /// `onToolCall` runs only its own.
    #[serde(rename_all = "camelCase")]
    ToolInputAvailable {
        tool_call_id: String,
        tool_name: String,
        input: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        provider_executed: Option<bool>,
    },
    #[serde(rename_all = "camelCase")]
    ToolApprovalRequest {
        approval_id: String,
        tool_call_id: String,
    },
    #[serde(rename_all = "camelCase")]
    ToolOutputAvailable {
        tool_call_id: String,
        output: String,
        provider_executed: bool,
    },
    #[serde(rename_all = "camelCase")]
    ToolOutputError {
        tool_call_id: String,
        error_text: String,
        provider_executed: bool,
    },
    #[serde(rename_all = "camelCase")]
    SourceUrl {
        source_id: String,
        url: String,
        title: String,
    },
    #[serde(rename_all = "camelCase")]
    SourceDocument {
        source_id: String,
        media_type: &'static str,
        title: String,
    },
    FinishStep,
    Finish,
    #[serde(rename_all = "camelCase")]
    Error {
        error_text: String,
    },
    Abort,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Retracted {
    text_id: String,
    step: u32,
    reason: String,
}

#[derive(Debug, Serialize)]
struct Resumed {
    owner: String,
    attempt: u32,
    from_step: u32,
}

/// A tool call's `tool-input-available`.
fn tool_input(call_id: &str, tool: &str, arguments: &Value, by_service: bool) -> Chunk {
    Chunk::ToolInputAvailable {
        tool_call_id: call_id.to_owned(),
        tool_name: tool.to_owned(),
        input: arguments.clone(),
        provider_executed: by_service.then_some(true),
    }
}

/// Turns the turn's events into UI message chunks.
///
/// A text part cannot be taken back: a step the turn retracts and says
/// again is held back while it repeats what was sent ([`StepText`]); one
/// said otherwise ends its text part and is named void by a
/// `data-message-retracted` part (`textId`, `step`, `reason`) before its
/// new text opens a new part.
#[derive(Default)]
struct Encoder {
    /// The id of the text part being streamed, if one is open.
    text: Option<String>,
    /// The id of the newest text part.
    last_text: Option<String>,
    parts: u32,
    said: StepText,
    /// The id of the reasoning part being streamed, if one is open.
    reasoning: Option<String>,
    /// The answer is the rest of a turn the request's message was steered
    /// into: a message of its own (the client names it), not the turn's
    /// (which the client that began the turn holds).
    steered: bool,
}

impl Encoder {
    fn close_text(&mut self, out: &mut Vec<Chunk>) {
        self.close_reasoning(out);
        if let Some(id) = self.text.take() {
            out.push(Chunk::TextEnd { id });
        }
    }

    /// A piece of reasoning, in the open reasoning part or a new one.
    fn reason(&mut self, delta: &str, out: &mut Vec<Chunk>) {
        let id = match &self.reasoning {
            Some(id) => id.clone(),
            None => {
                self.parts += 1;
                let id = format!("reasoning-{}", self.parts);
                out.push(Chunk::ReasoningStart { id: id.clone() });
                self.reasoning = Some(id.clone());
                id
            }
        };
        out.push(Chunk::ReasoningDelta {
            id,
            delta: delta.to_owned(),
        });
    }

    fn close_reasoning(&mut self, out: &mut Vec<Chunk>) {
        if let Some(id) = self.reasoning.take() {
            out.push(Chunk::ReasoningEnd { id });
        }
    }

    fn say(&mut self, said: Vec<Say>, out: &mut Vec<Chunk>) {
        for say in said {
            match say {
                Say::Text(delta) => {
                    let id = match &self.text {
                        Some(id) => id.clone(),
                        None => {
                            self.parts += 1;
                            let id = format!("text-{}", self.parts);
                            out.push(Chunk::TextStart { id: id.clone() });
                            self.text = Some(id.clone());
                            self.last_text = Some(id.clone());
                            id
                        }
                    };
                    out.push(Chunk::TextDelta { id, delta });
                }
                Say::Retract { step, reason } => {
                    self.close_text(out);
                    let void = self.last_text.clone().unwrap_or_default();
                    out.push(Chunk::MessageRetracted {
                        id: format!("retracted-{void}"),
                        data: Retracted {
                            text_id: void,
                            step,
                            reason,
                        },
                    });
                }
            }
        }
    }

    /// Says what is held back and ends the open text part.
    fn flush(&mut self, out: &mut Vec<Chunk>) {
        let said = self.said.other();
        self.say(said, out);
        self.close_text(out);
    }
}

impl SegmentEncoder for Encoder {
    fn headers(&self, headers: &mut HeaderMap) {
        headers.insert(
            "x-vercel-ai-ui-message-stream",
            HeaderValue::from_static("v1"),
        );
    }

    fn start(&mut self, turn_id: uuid::Uuid) -> Vec<Chunk> {
        vec![
            Chunk::Start {
                message_id: (!self.steered).then(|| turn_id.to_string()),
            },
            Chunk::StartStep,
        ]
    }

    fn unreadable(&mut self) -> Chunk {
        Chunk::Error {
            error_text: "the event log cannot be read".to_owned(),
        }
    }

    fn end(&mut self) -> Vec<Bytes> {
        vec![Bytes::from_static(b"data: [DONE]\n\n")]
    }
}

impl EndsAtClientCall for Encoder {
    type Chunk = Chunk;

    /// A call of the client's tool: the stream ends with it.
    fn client_call(&mut self, call_id: &str, tool: &str, arguments: &Value) -> Vec<Chunk> {
        let mut out = Vec::new();
        self.flush(&mut out);
        out.push(tool_input(call_id, tool, arguments, false));
        out.extend([Chunk::FinishStep, Chunk::Finish]);
        out
    }

    /// A call that waits for approval: the stream ends with the request
    /// (after the call's `tool-input-available`, which a call of the
    /// client's has not had).
    fn approval(&mut self, call_id: &str, tool: &str, arguments: &Value) -> Vec<Chunk> {
        let mut out = Vec::new();
        self.flush(&mut out);
        if let (name, true) = client_name(tool) {
            out.push(tool_input(call_id, name, arguments, false));
        }
        out.push(Chunk::ToolApprovalRequest {
            approval_id: format!("approval-{call_id}"),
            tool_call_id: call_id.to_owned(),
        });
        out.extend([Chunk::FinishStep, Chunk::Finish]);
        out
    }

    /// The chunks of `event`; the second value is true when the stream ends.
    fn event(&mut self, event: &TurnEvent) -> (Vec<Chunk>, bool) {
        let mut out = Vec::new();
        if ends_text(event) {
            let said = self.said.other();
            self.say(said, &mut out);
        }
        match event {
            TurnEvent::ReasoningDelta { text, .. } => self.reason(text, &mut out),
            TurnEvent::ReasoningCompleted { .. } => self.close_reasoning(&mut out),
            TurnEvent::MessageDelta { step, text } => {
                self.close_reasoning(&mut out);
                let said = self.said.delta(*step, text);
                self.say(said, &mut out);
            }
            TurnEvent::MessageRetracted { step, reason } => self.said.retracted(*step, reason),
            TurnEvent::TurnResumed {
                owner,
                attempt,
                from_step,
            } => out.push(Chunk::TurnResumed {
                data: Resumed {
                    owner: owner.clone(),
                    attempt: *attempt,
                    from_step: *from_step,
                },
                transient: true,
            }),
            // A call a person's approval edited starts again: the client sent
            // the edit, and its first start stands.
            TurnEvent::ToolStarted { edited: true, .. } => {}
            TurnEvent::ToolStarted {
                call_id,
                tool,
                arguments,
                ..
            } => {
                self.close_text(&mut out);
                out.push(tool_input(call_id, tool, arguments, true));
            }
            TurnEvent::ToolFinished { .. } => match super::finished_call(event) {
                Some((call_id, Ok(output))) => out.push(Chunk::ToolOutputAvailable {
                    tool_call_id: call_id.to_owned(),
                    output,
                    provider_executed: true,
                }),
                Some((call_id, Err((status, why)))) => out.push(Chunk::ToolOutputError {
                    tool_call_id: call_id.to_owned(),
                    error_text: format!("{}: {}", status.as_str(), why.unwrap_or_default()),
                    provider_executed: true,
                }),
                None => {}
            },
            TurnEvent::Citations { local, web } => out.extend(sources(local, web)),
            TurnEvent::TurnCompleted { .. } => {
                self.close_text(&mut out);
                out.extend([Chunk::FinishStep, Chunk::Finish]);
                return (out, true);
            }
            TurnEvent::TurnFailed { code, message, .. } => {
                self.close_text(&mut out);
                out.push(Chunk::Error {
                    error_text: format!("{code}: {message}"),
                });
                return (out, true);
            }
            TurnEvent::TurnCancelled { .. } | TurnEvent::TurnInterrupted { .. } => {
                self.close_text(&mut out);
                out.push(Chunk::Abort);
                return (out, true);
            }
            _ => {}
        }
        (out, false)
    }
}

/// A turn's citations as the stream's sources: the web's as URLs, the
/// vault's as documents.
fn sources(local: &[String], web: &[crate::turn::WebCitation]) -> Vec<Chunk> {
    let urls = web.iter().enumerate().map(|(i, source)| Chunk::SourceUrl {
        source_id: format!("web-{}", i + 1),
        url: source.url.clone(),
        title: source.title.clone(),
    });
    let documents = local
        .iter()
        .enumerate()
        .map(|(i, anchor)| Chunk::SourceDocument {
            source_id: format!("local-{}", i + 1),
            media_type: "text/markdown",
            title: anchor.clone(),
        });
    urls.chain(documents).collect()
}

/// A turn for `useChat`, answered as a UI message stream (v1).
#[utoipa::path(
    post,
    path = "/v1/ui/chat",
    tag = "turns",
    request_body = UiChatRequest,
    responses(
        (status = 200, description = "UI message chunks (`data: {…}` lines, `x-vercel-ai-ui-message-stream: v1`), ending with `data: [DONE]`", content_type = "text/event-stream", body = crate::protocols::native::stream::EventStream),
        BadRequest,
        (status = 404, description = "A tool output answers a call the chat's turn did not ask for (`call_not_found`)"),
        TurnAlreadyRunning,
        InvalidBody,
    )
)]
async fn ui_chat(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    ApiJson(body): ApiJson<UiChatRequest>,
) -> Result<Response, ApiError> {
    let replies = match body.messages.last() {
        Some(last) if last.role == "assistant" => Replies {
            answers: last.tool_results(),
            decisions: last.decisions()?,
        },
        _ => Replies::default(),
    };
    let placement = Placement {
        multitask: body.multitask.unwrap_or_default(),
        ..body.placement(&app, &tenant).await?
    };
    let ConversationTurn {
        turn_id,
        after,
        events,
        steered,
        ..
    } = ConversationTurn::open(
        &app,
        &tenant,
        &body.id,
        said(&body.messages)?,
        replies,
        ("clientTools", body.client_tools),
        placement,
    )
    .await?;
    let encoder = Encoder {
        steered,
        ..Encoder::default()
    };
    let format = SegmentStream::new(turn_id, after, encoder);
    Ok(stream_for(&app, format, events))
}

/// `useChat`'s resume (`resume: true`, or `resumeStream()`, as its default
/// transport asks it: `GET {api}/{chat id}/stream`): the chat's running
/// turn as a UI message stream from its start (or after the last call of
/// the client's it answered), on any replica, or 204 when none runs (nor
/// when the chat is not the caller's).
#[utoipa::path(
    get,
    path = "/v1/ui/chat/{session_id}/stream",
    tag = "turns",
    params(SessionPath),
    responses(
        (status = 200, description = "The running turn's UI message chunks from its start, as `POST /v1/ui/chat` streams them", content_type = "text/event-stream", body = crate::protocols::native::stream::EventStream),
        (status = 204, description = "No turn of the chat is running"),
        BadRequest,
    )
)]
async fn ui_chat_resume(
    State(app): State<Shared>,
    SessionPath { session_id }: SessionPath,
) -> Result<Response, ApiError> {
    let running = app
        .turns
        .get_session(&session_id)
        .await?
        .and_then(|session| session.running_turn_id);
    let turn = match running {
        Some(id) => app.turns.get_turn(&session_id, id).await?,
        None => None,
    };
    let Some(turn) = turn else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let turn_id = turn.id;
    // A turn that went on after calls of the client's: from the last.
    let after = super::client_calls::answered_until(&app, &turn).await?;
    let events = app.turns.subscribe(session_id.clone(), turn_id, 0).boxed();
    let format = SegmentStream::new(turn_id, after, Encoder::default());
    Ok(stream_for(&app, format, events))
}
