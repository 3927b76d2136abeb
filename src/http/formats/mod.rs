//! The wire formats a turn streams in, as encoders under one driver.
//!
//! A format turns the turn's events into frames ([`WireFormat`]);
//! [`stream_turn`] owns everything else: the response and its headers, the
//! loop over the events (live or replayed from the log), the keep-alive
//! comment after every quiet interval, the frames of a log that cannot be
//! read, and the end. Every format here is Server-Sent Events, so every one
//! gets the same keep-alive (`:` comment lines, which SSE parsers skip):
//! a gateway with an idle timeout keeps a stream open through a long tool
//! wave whatever its format. Adding a format is one file here and a route.

pub mod a2a;
pub mod agui;
pub mod chat_completions;
pub mod client_calls;
pub mod jsonrpc;
pub mod mcp;
pub mod native;
pub mod responses;
pub mod retraction;
pub mod ui_message;

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::{
    body::Body,
    http::{HeaderMap, HeaderValue, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::time::Instant;

use crate::{events::StoredEvent, metrics::Metrics, store::StoreError};

/// A keep-alive: an SSE comment line, skipped by SSE parsers.
pub const KEEP_ALIVE: &[u8] = b":\n\n";

/// What a format makes of one event.
#[derive(Debug, Default)]
pub struct Encoded {
    pub frames: Vec<Bytes>,
    /// The stream ends after these frames (the turn ended).
    pub done: bool,
}

impl Encoded {
    pub fn frames(frames: Vec<Bytes>) -> Self {
        Self {
            frames,
            done: false,
        }
    }

    pub fn last(frames: Vec<Bytes>) -> Self {
        Self { frames, done: true }
    }
}

/// One wire format: a turn's events as frames.
pub trait WireFormat: Send + 'static {
    /// Headers of the response beside `content-type: text/event-stream`
    /// and `cache-control: no-cache`.
    fn headers(&self, _headers: &mut HeaderMap) {}

    /// Frames before the first event.
    fn start(&mut self) -> Vec<Bytes> {
        Vec::new()
    }

    /// Frames of one event, typed where the format needs it
    /// ([`StoredEvent::event`]).
    fn encode(&mut self, event: &StoredEvent) -> Encoded;

    /// Frames that end a stream whose log cannot be read.
    fn unreadable(&mut self) -> Vec<Bytes>;

    /// Frames after the last event (a `[DONE]` line, say).
    fn end(&mut self) -> Vec<Bytes> {
        Vec::new()
    }
}

/// Counts an open stream while it lives.
struct OpenStream(Arc<Metrics>);

impl OpenStream {
    fn new(metrics: Arc<Metrics>) -> Self {
        metrics.stream_opened();
        Self(metrics)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.stream_closed();
    }
}

/// Streams `events` in `format`, with a keep-alive comment after every
/// `keepalive` without a frame.
pub fn stream_turn<F: WireFormat>(
    mut format: F,
    events: impl Stream<Item = Result<Arc<StoredEvent>, StoreError>> + Send + 'static,
    keepalive: Duration,
    metrics: Arc<Metrics>,
) -> Response {
    let mut headers = HeaderMap::new();
    format.headers(&mut headers);
    let open = OpenStream::new(metrics);
    let frames = async_stream::stream! {
        let _open = open;
        for frame in format.start() {
            yield Ok::<_, Infallible>(frame);
        }
        let mut events = std::pin::pin!(events);
        let quiet = tokio::time::sleep(keepalive);
        let mut quiet = std::pin::pin!(quiet);
        loop {
            tokio::select! {
                item = events.next() => match item {
                    Some(Ok(event)) => {
                        let encoded = format.encode(&event);
                        for frame in encoded.frames {
                            yield Ok(frame);
                        }
                        if encoded.done {
                            break;
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "the event log cannot be read; ending the stream");
                        for frame in format.unreadable() {
                            yield Ok(frame);
                        }
                        break;
                    }
                    None => break,
                },
                () = quiet.as_mut() => yield Ok(Bytes::from_static(KEEP_ALIVE)),
            }
            quiet.as_mut().reset(Instant::now() + keepalive);
        }
        for frame in format.end() {
            yield Ok(frame);
        }
    };
    let mut response = Body::from_stream(frames).into_response();
    let all = response.headers_mut();
    all.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    all.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Tell buffering proxies (nginx and friends) to pass events through.
    all.insert("x-accel-buffering", HeaderValue::from_static("no"));
    all.extend(headers);
    response
}

/// [`stream_turn`] with the service's keep-alive interval and metrics.
pub fn stream_for<F: WireFormat>(
    app: &crate::app::AppState,
    format: F,
    events: impl Stream<Item = Result<Arc<StoredEvent>, StoreError>> + Send + 'static,
) -> Response {
    stream_turn(
        format,
        events,
        app.sse_keepalive(),
        app.runner.metrics().clone(),
    )
}

/// A turn of the formats that send the whole conversation every time
/// (`/v1/ui/chat`, `/v1/agui`): started from `messages` (role and text, the
/// new user message last) in the session named `session`, or the
/// session's turn that waits for the results a request brings of calls of
/// the client's tools; followed from its first event, shown after `after`
/// (a [`client_calls::Segment`]).
pub(crate) struct ConversationTurn {
    pub session_id: crate::ids::SessionKey,
    pub turn_id: uuid::Uuid,
    /// The seq the answer's stream goes on after (0: the turn's start).
    pub after: i64,
    pub events: futures::stream::BoxStream<'static, Result<Arc<StoredEvent>, StoreError>>,
}

impl ConversationTurn {
    pub(crate) async fn start<'m>(
        app: &crate::app::AppState,
        tenant: &crate::http::Tenant,
        session: &str,
        messages: impl IntoIterator<Item = (&'m str, String)>,
        client_tools: Vec<crate::turn::ClientTool>,
    ) -> Result<Self, crate::http::error::ApiError> {
        let session_id = crate::http::parse_session_id(session, tenant)?;
        let messages: Vec<(&str, String)> = messages.into_iter().collect();
        let mut spec = crate::http::conversation_turn(
            &messages,
            app.settings.harness.allow_client_system_messages,
        )?;
        spec.client_tools = client_tools;
        let started = app.runner.start(&session_id, spec, None).await?;
        let turn_id = started.turn_id;
        let events = crate::http::follow_started(app, &session_id, started);
        Ok(Self {
            session_id,
            turn_id,
            after: 0,
            events,
        })
    }

    /// The turn a request of a format that sends the whole conversation
    /// asks for: the session's waiting turn given `answers` (the results
    /// of its client's calls the request brings), or else a new turn of
    /// `messages` that may call the client's `tools`.
    pub(crate) async fn open<'m>(
        app: &crate::app::AppState,
        tenant: &crate::http::Tenant,
        session: &str,
        messages: impl IntoIterator<Item = (&'m str, String)>,
        answers: Vec<client_calls::ClientAnswer>,
        tools: (&str, Vec<ToolDeclaration>),
    ) -> Result<Self, crate::http::error::ApiError> {
        if !answers.is_empty() {
            return Self::answered(app, tenant, session, answers).await;
        }
        let (field, tools) = tools;
        let tools = declared_tools(field, tools)?;
        Self::start(app, tenant, session, messages, tools).await
    }

    /// The turn of `session` that waits for `answers`, given them.
    pub(crate) async fn answered(
        app: &crate::app::AppState,
        tenant: &crate::http::Tenant,
        session: &str,
        answers: Vec<client_calls::ClientAnswer>,
    ) -> Result<Self, crate::http::error::ApiError> {
        let session_id = crate::http::parse_session_id(session, tenant)?;
        let (turn, answered) =
            client_calls::answer_waiting(app, session_id.as_str(), answers).await?;
        let events = app
            .runner
            .subscribe(turn.session_id.clone(), turn.id, turn.first_seq - 1)
            .boxed();
        Ok(Self {
            session_id,
            turn_id: turn.id,
            after: answered.after,
            events,
        })
    }
}

/// A tool the client runs, as AG-UI and the AI SDK declare one.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
pub struct ToolDeclaration {
    #[schema(pattern = "^[A-Za-z0-9_-]{1,56}$")]
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// JSON schema of the arguments (an object schema; none: any object).
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<serde_json::Value>,
}

/// The client tools a format's request declares, checked: at most 32,
/// each named once (`field` names the request's list). A tool without a
/// description is described by its name.
pub(crate) fn declared_tools(
    field: &str,
    tools: impl IntoIterator<Item = ToolDeclaration>,
) -> Result<Vec<crate::turn::ClientTool>, crate::http::error::ApiError> {
    let invalid = |detail: String| crate::http::error::ApiError::InvalidField {
        field: field.to_owned(),
        detail,
    };
    let mut declared: Vec<crate::turn::ClientTool> = Vec::new();
    for (at, tool) in tools.into_iter().enumerate() {
        if at == crate::turn::CLIENT_TOOLS_MAX {
            return Err(invalid(format!("`{field}` has more than 32 tools")));
        }
        let ToolDeclaration {
            name,
            description,
            parameters,
        } = tool;
        let description = if description.trim().is_empty() {
            format!("The client's tool {name}.")
        } else {
            description
        };
        let parameters = parameters.filter(|p| !p.is_null());
        let tool = crate::turn::ClientTool::checked(name, description, parameters, None)
            .map_err(|e| invalid(format!("{field}[{at}]: {e}")))?;
        if declared.iter().any(|other| other.name == tool.name) {
            return Err(invalid(format!("{:?} is named twice", tool.name)));
        }
        declared.push(tool);
    }
    Ok(declared)
}

/// What a finished call shows: the output of a completed one (its first
/// 2,000 characters, and where the whole is), else its status and why.
pub type CallResult<'a> = Result<String, (crate::events::ToolStatus, Option<&'a str>)>;

/// The call a `tool.finished` ends and what it shows; `None` for any
/// other event.
pub fn finished_call(event: &crate::events::TurnEvent) -> Option<(&str, CallResult<'_>)> {
    let crate::events::TurnEvent::ToolFinished {
        call_id,
        status,
        reason,
        error,
        output,
        artifact_id,
        ..
    } = event
    else {
        return None;
    };
    let shown = if *status == crate::events::ToolStatus::Completed {
        Ok(crate::http::shown_tool_output(
            output.clone(),
            artifact_id.as_deref(),
        ))
    } else {
        Err((*status, error.as_deref().or(reason.as_deref())))
    };
    Some((call_id, shown))
}

/// A `data:` line of JSON, the frame of the formats that are not native.
pub fn data_frame(value: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// The typed event of `stored`, or `None` (logged) for one this build
/// cannot read: a format skips it rather than end a stream over it.
pub fn typed(stored: &StoredEvent) -> Option<&crate::events::TurnEvent> {
    let event = stored.event();
    if event.is_none() {
        tracing::warn!(
            seq = stored.seq,
            event_type = %stored.event_type,
            "an event this build cannot read is left out of the stream"
        );
    }
    event
}

/// Feeds `feed` the events a turn's log holds now, in order, a page at a
/// time, until they run out or `feed` says it has what it needs (true).
pub(crate) async fn read_turn(
    store: &dyn crate::store::Store,
    turn: &crate::store::TurnRecord,
    mut feed: impl FnMut(&StoredEvent) -> bool,
) -> Result<(), StoreError> {
    const PER_READ: u32 = 1000;
    let mut after = turn.first_seq - 1;
    // Bounded: a turn's events are finite, and each page moves on.
    loop {
        let page = store
            .list_events(&turn.session_id, Some(turn.id), after, PER_READ)
            .await?;
        for event in &page {
            after = event.seq;
            if feed(event) {
                return Ok(());
            }
        }
        if page.len() < PER_READ as usize {
            return Ok(());
        }
    }
}
