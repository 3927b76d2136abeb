//! `POST /v1/ui/chat`: the Vercel AI SDK's UI message stream (v1), so that
//! `useChat` (its default transport, `api: "/v1/ui/chat"`) talks to the
//! service directly. The request is `useChat`'s (`id`, `messages` with
//! `parts`); the answer streams the turn's events as UI message chunks.

use axum::{
    Extension,
    body::{Body, Bytes},
    extract::State,
    http::{HeaderValue, header},
    response::{IntoResponse, Response},
};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{Tenant, error::ApiError, json::ApiJson, parse_session_id};
use crate::{
    app::AppState,
    events::{ToolStatus, TurnEvent},
    http::error::Problem,
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(ui_chat))
}

/// `useChat`'s request (the fields read; the others are ignored).
#[derive(Debug, Deserialize, ToSchema)]
pub struct UiChatRequest {
    /// The chat: the service's session.
    id: String,
    /// The conversation, the new user message last.
    #[schema(min_items = 1, max_items = 1000)]
    messages: Vec<UiMessage>,
}

/// A UI message: its text parts are read.
#[derive(Debug, Deserialize, ToSchema)]
pub struct UiMessage {
    role: String,
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    parts: Vec<Value>,
}

impl UiMessage {
    fn text(&self) -> String {
        self.parts
            .iter()
            .filter(|p| p["type"] == "text")
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Turns the turn's events into UI message chunks.
#[derive(Default)]
struct Encoder {
    /// The id of the text part being streamed, if one is open.
    text: Option<String>,
    parts: u32,
}

impl Encoder {
    fn close_text(&mut self, out: &mut Vec<Value>) {
        if let Some(id) = self.text.take() {
            out.push(json!({"type": "text-end", "id": id}));
        }
    }

    /// The chunks of `event`; the second value is true when the stream ends.
    fn encode(&mut self, event: TurnEvent) -> (Vec<Value>, bool) {
        let mut out = Vec::new();
        match event {
            TurnEvent::MessageDelta { text, .. } => {
                let id = match &self.text {
                    Some(id) => id.clone(),
                    None => {
                        self.parts += 1;
                        let id = format!("text-{}", self.parts);
                        out.push(json!({"type": "text-start", "id": id}));
                        self.text = Some(id.clone());
                        id
                    }
                };
                out.push(json!({"type": "text-delta", "id": id, "delta": text}));
            }
            TurnEvent::ToolStarted {
                call_id,
                tool,
                arguments,
                ..
            } => {
                self.close_text(&mut out);
                out.push(json!({
                    "type": "tool-input-available",
                    "toolCallId": call_id,
                    "toolName": tool,
                    "input": arguments,
                }));
            }
            TurnEvent::ToolFinished {
                call_id,
                status,
                reason,
                error,
                output,
                artifact_id,
                ..
            } => {
                if status == ToolStatus::Completed {
                    out.push(json!({
                        "type": "tool-output-available",
                        "toolCallId": call_id,
                        "output": super::shown_tool_output(output, artifact_id.as_deref()),
                    }));
                } else {
                    let why = error.or(reason).unwrap_or_default();
                    out.push(json!({
                        "type": "tool-output-error",
                        "toolCallId": call_id,
                        "errorText": format!("{}: {why}", status.as_str()),
                    }));
                }
            }
            TurnEvent::Citations { local, web } => {
                for (i, source) in web.into_iter().enumerate() {
                    out.push(json!({
                        "type": "source-url",
                        "sourceId": format!("web-{}", i + 1),
                        "url": source.url,
                        "title": source.title,
                    }));
                }
                for (i, anchor) in local.into_iter().enumerate() {
                    out.push(json!({
                        "type": "source-document",
                        "sourceId": format!("local-{}", i + 1),
                        "mediaType": "text/markdown",
                        "title": anchor,
                    }));
                }
            }
            TurnEvent::TurnCompleted { .. } => {
                self.close_text(&mut out);
                out.push(json!({"type": "finish-step"}));
                out.push(json!({"type": "finish"}));
                return (out, true);
            }
            TurnEvent::TurnFailed { code, message, .. } => {
                self.close_text(&mut out);
                out.push(json!({"type": "error", "errorText": format!("{code}: {message}")}));
                return (out, true);
            }
            TurnEvent::TurnCancelled { .. } | TurnEvent::TurnInterrupted { .. } => {
                self.close_text(&mut out);
                out.push(json!({"type": "abort"}));
                return (out, true);
            }
            _ => {}
        }
        (out, false)
    }
}

/// A turn for `useChat`, answered as a UI message stream (v1).
#[utoipa::path(
    post,
    path = "/v1/ui/chat",
    tag = "turns",
    request_body = UiChatRequest,
    responses(
        (status = 200, description = "UI message chunks (`data: {…}` lines, `x-vercel-ai-ui-message-stream: v1`), ending with `data: [DONE]`", content_type = "text/event-stream", body = super::EventStream),
        (status = 400, description = "Bad request (see `code`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The chat already has a running turn", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid body (see `code`)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn ui_chat(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiJson(body): ApiJson<UiChatRequest>,
) -> Result<Response, ApiError> {
    let session_id = parse_session_id(&body.id, &tenant)?;
    let messages: Vec<(&str, String)> = body
        .messages
        .iter()
        .map(|m| (m.role.as_str(), m.text()))
        .collect();
    let spec =
        super::conversation_turn(&messages, app.settings.harness.allow_client_system_messages)?;
    let started = app.runner.start(&session_id, spec, None).await?;
    let turn_id = started.turn_id;
    let events = super::follow_started(&app, &session_id, started);
    let frames = async_stream::stream! {
        let mut events = events;
        let mut encoder = Encoder::default();
        yield Ok::<_, std::convert::Infallible>(super::data_frame(&json!({"type": "start", "messageId": turn_id.to_string()})));
        yield Ok(super::data_frame(&json!({"type": "start-step"})));
        while let Some(item) = events.next().await {
            let Ok(stored) = item else {
                yield Ok(super::data_frame(&json!({"type": "error", "errorText": "the event log cannot be read"})));
                break;
            };
            let Ok(event) = serde_json::from_str::<TurnEvent>(&stored.payload) else { continue };
            let (chunks, done) = encoder.encode(event);
            for chunk in &chunks {
                yield Ok(super::data_frame(chunk));
            }
            if done {
                break;
            }
        }
        yield Ok(Bytes::from_static(b"data: [DONE]\n\n"));
    };
    let mut response = Body::from_stream(frames).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        "x-vercel-ai-ui-message-stream",
        HeaderValue::from_static("v1"),
    );
    if let Ok(value) = HeaderValue::from_str(&turn_id.to_string()) {
        headers.insert("x-turn-id", value);
    }
    Ok(response)
}
