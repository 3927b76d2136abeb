//! `POST /v1/chat/completions`: the OpenAI chat completions wire format
//! over the same turns, so that the official `openai` SDKs (and anything
//! that speaks the format) can call the service.
//!
//! The last message is the turn's message (it must be the user's); the
//! ones before it are the turn's history. The session is the
//! `X-Session-Id` header, else `user`, else a new one per request (answered
//! in `X-Session-Id`). `model` picks the model (`agent-harness` or none:
//! the configured one). Parameters the service decides itself (tools,
//! temperature, …) are accepted and ignored. Streaming sends
//! `chat.completion.chunk`s, then `data: [DONE]`.

use axum::{
    Extension,
    body::Bytes,
    extract::State,
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    Encoded, WireFormat,
    parts::Content,
    retraction::{Say, StepText, ends_text},
    typed,
};
use crate::{
    events::{StoredEvent, TurnEvent},
    ids::Tenant,
    protocols::Shared,
    protocols::{
        endpoint::{Started, completed, name_turn, named_session},
        error::{ApiError, BadRequest, InvalidBody, TurnAlreadyRunning},
        json::ApiJson,
    },
    turn::{TurnRequest, TurnResult},
};

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    crate::protocols::Shared: axum::extract::FromRef<S>,
{
    OpenApiRouter::new().routes(routes!(chat_completions))
}

/// A chat completions request (the fields the service reads; the others
/// are accepted and ignored).
#[derive(Debug, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    /// `agent-harness` (or absent) for the configured model, else a model
    /// name passed on as the turn's `runtime_model`.
    model: Option<String>,
    /// The conversation; the last message is the user's new one.
    #[schema(min_items = 1, max_items = 1000)]
    messages: Vec<CompatMessage>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    /// The session, when no `X-Session-Id` header names one.
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    user: Option<String>,
    /// `json_schema` (`{name, schema, strict}`) or `json_object`: the
    /// answer is JSON, checked (and repaired) by the service.
    response_format: Option<crate::protocols::parts::ResponseFormatIn>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// A message: `content` a string or an array of parts (`text`,
/// `image_url` and `file` parts).
#[derive(Debug, Deserialize, ToSchema)]
pub struct CompatMessage {
    #[schema(pattern = "^(system|developer|user|assistant|tool|function)$")]
    role: String,
    #[schema(schema_with = crate::protocols::schemas::text_or_parts)]
    content: Option<Content>,
}

fn invalid(field: &str, detail: impl Into<String>) -> ApiError {
    ApiError::InvalidField {
        field: field.into(),
        detail: detail.into(),
    }
}

impl ChatCompletionRequest {
    fn spec(&self, allow_system: bool) -> Result<TurnRequest, ApiError> {
        // Tool results of a client's own tools mean nothing here (they are
        // left out of the history); any other role is refused.
        const ROLES: [&str; 6] = [
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
            "function",
        ];
        let mut roles = self.messages.iter().map(|m| m.role.as_str());
        if let Some(other) = roles.find(|r| !ROLES.contains(r)) {
            return Err(invalid("messages", format!("unknown role {other:?}")));
        }
        let (messages, attachments) = crate::protocols::parts::said(
            self.messages
                .iter()
                .map(|m| (m.role.as_str(), m.content.as_ref())),
            "messages",
        )?;
        let spec =
            crate::protocols::endpoint::conversation_turn(&messages, attachments, allow_system)?;
        let model = self
            .model
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty() && *m != "agent-harness");
        if model.is_some_and(|m| m.len() > 200 || m.chars().any(char::is_control)) {
            return Err(invalid("model", "`model` is not a model name"));
        }
        let output = match self.response_format.clone() {
            Some(format) => format.output("response_format")?,
            None => None,
        };
        Ok(TurnRequest {
            runtime_model: model.map(str::to_owned),
            output,
            ..spec
        })
    }
}

/// `chat.completion` and `chat.completion.chunk` objects.
struct Completion {
    id: String,
    created: i64,
    model: String,
}

/// A `chat.completion` or a `chat.completion.chunk`.
#[derive(Debug, Serialize)]
struct CompletionOut<'a, C> {
    id: &'a str,
    object: &'static str,
    created: i64,
    model: &'a str,
    system_fingerprint: Option<String>,
    choices: Vec<C>,
    usage: Option<Usage>,
}

/// A chunk's choice: what it adds to the message.
#[derive(Debug, Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<String>,
    finish_reason: Option<&'static str>,
}

#[derive(Debug, Default, Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    /// The model's reasoning, as reasoning servers stream it.
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
}

/// A completion's choice: the whole message.
#[derive(Debug, Serialize)]
struct Choice<'a> {
    index: u32,
    message: AssistantMessage<'a>,
    logprobs: Option<String>,
    finish_reason: &'static str,
}

#[derive(Debug, Serialize)]
struct AssistantMessage<'a> {
    role: &'static str,
    content: &'a str,
    refusal: Option<String>,
}

/// A completion's `usage`.
#[derive(Debug, Serialize)]
struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: PromptDetails,
    completion_tokens_details: CompletionDetails,
}

#[derive(Debug, Serialize)]
struct PromptDetails {
    cached_tokens: u64,
}

/// The part of `completion_tokens` spent on reasoning.
#[derive(Debug, Serialize)]
struct CompletionDetails {
    reasoning_tokens: u64,
}

/// A stream's error.
#[derive(Debug, Serialize)]
struct StreamError<'a> {
    error: ErrorBody<'a>,
}

#[derive(Debug, Serialize)]
struct ErrorBody<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    code: &'a str,
}

impl Completion {
    fn out<C>(
        &self,
        object: &'static str,
        choices: Vec<C>,
        usage: Option<Usage>,
    ) -> CompletionOut<'_, C> {
        CompletionOut {
            id: &self.id,
            object,
            created: self.created,
            model: &self.model,
            system_fingerprint: None,
            choices,
            usage,
        }
    }

    /// A chunk of `delta` (or of `usage`, with no choice).
    fn chunk(&self, delta: Delta<'_>, finish: Option<&'static str>) -> Bytes {
        let choice = ChunkChoice {
            index: 0,
            delta,
            logprobs: None,
            finish_reason: finish,
        };
        super::data_frame(&self.out("chat.completion.chunk", vec![choice], None))
    }

    /// The chunk of the turn's `usage`.
    fn usage_chunk(&self, usage: Usage) -> Bytes {
        let none: Vec<ChunkChoice<'_>> = Vec::new();
        super::data_frame(&self.out("chat.completion.chunk", none, Some(usage)))
    }
}

struct ChunkStream {
    completion: Completion,
    include_usage: bool,
    text: StepText,
}

impl ChunkStream {
    fn error(message: &str, code: &str) -> Bytes {
        super::data_frame(&StreamError {
            error: ErrorBody {
                message,
                kind: "server_error",
                code,
            },
        })
    }
}

impl WireFormat for ChunkStream {
    fn start(&mut self) -> Vec<Bytes> {
        vec![self.completion.chunk(
            Delta {
                role: Some("assistant"),
                content: Some(""),
                reasoning_content: None,
            },
            None,
        )]
    }

    fn encode(&mut self, event: &StoredEvent) -> Encoded {
        let Some(event) = typed(event) else {
            return Encoded::default();
        };
        let said = match event {
            TurnEvent::MessageDelta { step, text } => self.text.delta(*step, text),
            TurnEvent::MessageRetracted { step, reason } => {
                self.text.retracted(*step, reason);
                Vec::new()
            }
            event if ends_text(event) => self.text.other(),
            _ => Vec::new(),
        };
        let mut frames: Vec<Bytes> = said
            .into_iter()
            .filter_map(|say| match say {
                Say::Text(text) => Some(self.completion.chunk(
                    Delta {
                        content: Some(&text),
                        ..Delta::default()
                    },
                    None,
                )),
                Say::Retract { .. } => None,
            })
            .collect();
        if let TurnEvent::ReasoningDelta { text, .. } = event {
            let delta = Delta {
                reasoning_content: Some(text),
                ..Delta::default()
            };
            frames.push(self.completion.chunk(delta, None));
        }
        match event {
            TurnEvent::TurnCompleted { result } => {
                frames.push(self.completion.chunk(Delta::default(), Some("stop")));
                if self.include_usage {
                    frames.push(self.completion.usage_chunk(usage_of(result)));
                }
                Encoded::last(frames)
            }
            TurnEvent::TurnFailed { code, message, .. } => {
                frames.push(Self::error(message, code));
                Encoded::last(frames)
            }
            TurnEvent::TurnCancelled { reason } | TurnEvent::TurnInterrupted { reason } => {
                frames.push(Self::error(reason, "turn_ended"));
                Encoded::last(frames)
            }
            _ => Encoded::frames(frames),
        }
    }

    fn unreadable(&mut self) -> Vec<Bytes> {
        Vec::new()
    }

    fn end(&mut self) -> Vec<Bytes> {
        vec![Bytes::from_static(b"data: [DONE]\n\n")]
    }
}

fn usage_of(result: &TurnResult) -> Usage {
    Usage {
        prompt_tokens: result.input_tokens,
        completion_tokens: result.output_tokens,
        total_tokens: result.input_tokens + result.output_tokens,
        prompt_tokens_details: PromptDetails {
            cached_tokens: result.cache_read_tokens,
        },
        completion_tokens_details: CompletionDetails {
            reasoning_tokens: result.reasoning_tokens,
        },
    }
}

/// An OpenAI-compatible chat completion, run as a turn.
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "turns",
    request_body = ChatCompletionRequest,
    params(("X-Session-Id" = Option<String>, Header, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The session (1-128 characters of `[A-Za-z0-9._:-]`)")),
    responses(
        (status = 200, description = "A `chat.completion`, or with `stream: true` a stream of `chat.completion.chunk`s ending with `[DONE]`", body = Object),
        BadRequest,
        TurnAlreadyRunning,
        InvalidBody,
        (status = 502, description = "The provider failed (JSON mode)"),
    )
)]
async fn chat_completions(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    let named = headers
        .get("x-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| body.user.clone());
    let session_id = named_session(named.as_deref(), "chatcmpl", &tenant)?;
    let spec = body.spec(app.settings.harness.allow_client_system_messages)?;
    let (_, model) = app
        .turns
        .resolve_provider_model(None, spec.runtime_model.as_deref());
    let started = Started::start(&app, session_id, spec, None).await?;
    let completion = Completion {
        id: format!("chatcmpl-{}", started.turn_id.simple()),
        created: chrono::Utc::now().timestamp(),
        model,
    };
    if body.stream {
        let include_usage = body.stream_options.is_some_and(|o| o.include_usage);
        let format = ChunkStream {
            completion,
            include_usage,
            text: StepText::default(),
        };
        return Ok(started.stream(&app, format));
    }
    let (_, result) = completed(started.ended(&app).await?)?;
    let choice = Choice {
        index: 0,
        message: AssistantMessage {
            role: "assistant",
            content: &result.text,
            refusal: None,
        },
        logprobs: None,
        finish_reason: "stop",
    };
    let response =
        axum::Json(completion.out("chat.completion", vec![choice], Some(usage_of(&result))))
            .into_response();
    Ok(name_turn(response, Some(&started.session), started.turn_id))
}
