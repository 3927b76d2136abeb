//! `/mcp`: the service as an MCP server (streamable HTTP, JSON-RPC), so
//! that MCP hosts (desktop assistants, IDEs) can use this agent as a tool.
//!
//! Tools: `ask` runs a turn (its text streamed as `notifications/progress`
//! when the call names a progress token, its answer the result);
//! `list_sessions` and `get_session` read the caller's sessions. The same
//! keys and tenants hold as on every route. Each `POST` is answered on its
//! own (no state is kept between requests, so any replica answers any of
//! them): `initialize` names an `Mcp-Session-Id` that only scopes request
//! ids, so that a `notifications/cancelled` finds the turn of the call it
//! names (on the replica that runs that call).

use std::collections::BTreeMap;

use axum::{
    Extension,
    body::Bytes,
    extract::State,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::{
    Encoded, WireFormat,
    jsonrpc::{
        self, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND,
        error as rpc_error, is_message, result as rpc_result,
    },
    stream_for, typed,
};
use crate::{
    app::{AppState, McpCallGuard, McpCalls},
    events::{StoredEvent, TurnEvent},
    ids::{SessionKey, Tenant},
    protocols::{
        endpoint::{Started, named_session},
        error::ApiError,
        json::ApiJson,
        native::{checked_message, checked_user_id},
        paths::parse_session_id,
    },
    store::{TurnRecord, TurnStatus},
    tools::EffectClass,
    turn::{TurnRequest, TurnResult},
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(mcp))
}

/// The protocol versions of the `initialize` handshake this server speaks,
/// newest first.
const VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// One JSON-RPC 2.0 message, as the document describes it (the handler
/// reads the JSON itself).
#[derive(utoipa::ToSchema)]
#[expect(dead_code, reason = "the OpenAPI document's schema of the body")]
struct McpMessage {
    #[schema(pattern = "^2\\.0$")]
    jsonrpc: String,
    #[schema(schema_with = crate::protocols::schemas::jsonrpc_id)]
    id: Option<Value>,
    method: Option<String>,
    /// Any JSON: a notification's is not read.
    params: Option<Value>,
}

/// Sessions `list_sessions` answers at most.
const LIST_MAX: u32 = 100;

const SESSION_HEADER: &str = "mcp-session-id";

fn json_answer(status: StatusCode, message: &Value) -> Response {
    (status, axum::Json(message)).into_response()
}

/// A tool result of text.
fn text_result(text: &str, is_error: bool) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": is_error})
}

/// One JSON-RPC message of the MCP endpoint.
#[utoipa::path(
    post,
    path = "/mcp",
    tag = "mcp",
    request_body(content = McpMessage, description = "One JSON-RPC 2.0 message of the Model Context Protocol (streamable HTTP transport, https://modelcontextprotocol.io/specification/2025-11-25/basic/transports)"),
    responses(
        (status = 200, description = "The JSON-RPC answer (`application/json`), or for `tools/call` of `ask` with `Accept: text/event-stream` a stream of JSON-RPC messages (`notifications/progress`, then the answer)", body = Object),
        (status = 202, description = "A notification or a response, taken"),
        (status = 400, description = "Not a JSON-RPC message (a JSON-RPC error, code -32600), or not JSON at all (a problem, `invalid_json`)", content(
            (Object = "application/json"),
            (crate::protocols::error::Problem = "application/problem+json"),
        )),
    )
)]
async fn mcp(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    ApiJson(message): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let Some(fields) = message.as_object().filter(|_| is_message(&message)) else {
        return Ok(json_answer(
            StatusCode::BAD_REQUEST,
            &rpc_error(&Value::Null, INVALID_REQUEST, "not a JSON-RPC 2.0 message"),
        ));
    };
    let mcp_session = headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    // A `method` that is not text is no request, no notification, no
    // response.
    if fields
        .get("method")
        .is_some_and(|m| !m.is_string() && !m.is_null())
    {
        return Ok(json_answer(
            StatusCode::BAD_REQUEST,
            &rpc_error(&Value::Null, INVALID_REQUEST, "`method` must be a string"),
        ));
    }
    let method = fields.get("method").and_then(Value::as_str);
    let params = fields.get("params").cloned().unwrap_or(Value::Null);
    // Both are echoed, the progress token on every progress frame.
    let progress = &params["_meta"]["progressToken"];
    if !fields.get("id").is_none_or(jsonrpc::valid_id) || !jsonrpc::valid_id(progress) {
        return Ok(json_answer(StatusCode::BAD_REQUEST, &jsonrpc::invalid_id()));
    }
    let Some(id) = fields.get("id").filter(|id| !id.is_null()).cloned() else {
        // A notification (or a client's response): taken, nothing to say.
        if method == Some("notifications/cancelled") {
            cancel(&app, &tenant, &mcp_session, &params["requestId"]).await;
        }
        return Ok(StatusCode::ACCEPTED.into_response());
    };
    let Some(method) = method else {
        // A response to a request of ours: this server asks nothing.
        return Ok(StatusCode::ACCEPTED.into_response());
    };
    let answer = match method {
        "initialize" => {
            let asked = params["protocolVersion"].as_str().unwrap_or_default();
            let version = VERSIONS
                .iter()
                .find(|v| **v == asked)
                .unwrap_or(&VERSIONS[0]);
            let result = json!({
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": false}},
                "serverInfo": {"name": "agent-harness", "version": env!("CARGO_PKG_VERSION")},
                "instructions": "Call `ask` with a message to run one turn of this agent; \
                                 pass the `session_id` it answers to go on with the conversation.",
            });
            let mut response = json_answer(StatusCode::OK, &rpc_result(&id, result));
            if let Ok(value) = HeaderValue::from_str(&Uuid::now_v7().to_string()) {
                response.headers_mut().insert(SESSION_HEADER, value);
            }
            return Ok(response);
        }
        "ping" => rpc_result(&id, json!({})),
        "tools/list" => rpc_result(&id, json!({"tools": tools(&app)})),
        "tools/call" => {
            let name = params["name"].as_str().unwrap_or_default();
            let arguments = &params["arguments"];
            match name {
                "ask" => {
                    let streams = headers
                        .get(header::ACCEPT)
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|v| v.contains("text/event-stream"));
                    let call = Call {
                        id,
                        tenant,
                        mcp_session,
                        progress: progress.clone(),
                    };
                    return ask(&app, call, arguments, streams).await;
                }
                "list_sessions" => list_sessions(&app, &tenant, &id, arguments).await?,
                "get_session" => get_session(&app, &tenant, &id, arguments).await?,
                other => rpc_error(&id, INVALID_PARAMS, &format!("unknown tool {other:?}")),
            }
        }
        other => rpc_error(
            &id,
            METHOD_NOT_FOUND,
            &format!("method {other:?} not found"),
        ),
    };
    Ok(json_answer(StatusCode::OK, &answer))
}

/// The tools, with honest annotations: `ask` reads only when every tool
/// the turn may run reads only.
fn tools(app: &AppState) -> Vec<Value> {
    let registry = app.runner.harness().tools();
    let effects: Vec<EffectClass> = registry
        .all()
        .filter(|(_, permitted)| *permitted)
        .map(|(tool, _)| tool.spec().effect)
        .collect();
    let writes = effects.iter().any(|e| *e != EffectClass::ReadOnly);
    let destroys = effects.contains(&EffectClass::Destructive);
    let open_world = effects.contains(&EffectClass::Network);
    let session_id = json!({"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$",
                            "description": "A session of the caller's"});
    vec![
        json!({
            "name": "ask",
            "title": "Ask the agent",
            "description": "Runs one turn of the agent on `message` and answers its reply, \
                            with its citations. `session_id` goes on with a conversation \
                            (new when absent: the answer names it); `user_id` names whose \
                            memories the turn reads and keeps.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "message": {"type": "string", "minLength": 1},
                    "session_id": session_id,
                    "user_id": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
                },
                "required": ["message"],
            },
            "annotations": {
                "title": "Ask the agent",
                "readOnlyHint": !writes,
                "destructiveHint": destroys,
                "idempotentHint": false,
                "openWorldHint": open_world,
            },
        }),
        json!({
            "name": "list_sessions",
            "title": "List sessions",
            "description": "The caller's sessions, the most recently used first.",
            "inputSchema": {
                "type": "object",
                "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": LIST_MAX}},
            },
            "annotations": {"title": "List sessions", "readOnlyHint": true, "openWorldHint": false},
        }),
        json!({
            "name": "get_session",
            "title": "Get a session",
            "description": "A session of the caller's: its turns, its running turn, and its \
                            last messages.",
            "inputSchema": {
                "type": "object",
                "properties": {"session_id": session_id},
                "required": ["session_id"],
            },
            "annotations": {"title": "Get a session", "readOnlyHint": true, "openWorldHint": false},
        }),
    ]
}

/// A `tools/call` of `ask`, and who made it.
struct Call {
    id: Value,
    tenant: Tenant,
    mcp_session: String,
    /// `_meta.progressToken` (null: no progress wanted).
    progress: Value,
}

async fn ask(
    app: &AppState,
    call: Call,
    arguments: &Value,
    streams: bool,
) -> Result<Response, ApiError> {
    let invalid = |detail: String| {
        Ok(json_answer(
            StatusCode::OK,
            &rpc_error(&call.id, INVALID_PARAMS, &detail),
        ))
    };
    let text = |field: &str| match &arguments[field] {
        Value::Null => Ok(None),
        Value::String(text) => Ok(Some(text.clone())),
        _ => Err(format!(
            "`ask` takes message, session_id, user_id: `{field}` must be a string"
        )),
    };
    let asked = text("message").and_then(|message| {
        let user_id = text("user_id")?;
        let checked = |e: ApiError| e.to_string();
        Ok(TurnRequest {
            user_id: checked_user_id(user_id).map_err(checked)?,
            ..TurnRequest::new(checked_message(message).map_err(checked)?)
        })
    });
    let asked = match asked {
        Ok(asked) => asked,
        Err(detail) => return invalid(detail),
    };
    let session = match named_session(arguments["session_id"].as_str(), "mcp", &call.tenant) {
        Ok(session) => session,
        Err(e) => return invalid(e.to_string()),
    };
    let started = match Started::start(app, session.clone(), asked, None).await {
        Ok(started) => started,
        Err(e) => {
            let e = ApiError::from(e);
            let answer = rpc_result(&call.id, text_result(&format!("{}: {e}", e.code()), true));
            return Ok(json_answer(StatusCode::OK, &answer));
        }
    };
    let turn_id = started.turn_id;
    let guard = McpCalls::track(
        app,
        &call.tenant.0,
        &call.mcp_session,
        &call.id,
        (session.clone(), turn_id),
    );
    if !streams {
        let record = app.runner.wait_for_end(&session, turn_id).await?;
        drop(guard);
        let record = record.ok_or(ApiError::ShuttingDown)?;
        let answer = rpc_result(&call.id, answer_of(&session, &record));
        return Ok(json_answer(StatusCode::OK, &answer));
    }
    let events = started.events(app);
    let format = AskStream {
        id: call.id,
        progress: call.progress,
        done: 0,
        session,
        turn_id,
        _guard: guard,
    };
    Ok(stream_for(app, format, events))
}

/// The result of `ask` for an ended turn.
fn answer_of(session: &SessionKey, record: &TurnRecord) -> Value {
    match (&record.status, &record.result) {
        (TurnStatus::Completed, Some(result)) => completed(session, record.id, result),
        (status, _) => {
            let why = record
                .error_message
                .clone()
                .unwrap_or_else(|| format!("the turn ended {status}"));
            text_result(&why, true)
        }
    }
}

fn completed(session: &SessionKey, turn_id: Uuid, result: &TurnResult) -> Value {
    json!({
        "content": [{"type": "text", "text": result.text}],
        "structuredContent": {
            "session_id": session.id(),
            "turn_id": turn_id,
            "text": result.text,
            "local_citations": result.local_citations,
            "web_citations": result.web_citations,
        },
        "isError": false,
    })
}

/// `ask`'s answer as a stream of JSON-RPC messages: each text delta a
/// `notifications/progress` (when the call named a progress token), then
/// the call's result.
struct AskStream {
    id: Value,
    progress: Value,
    done: u64,
    session: SessionKey,
    turn_id: Uuid,
    /// Untracks the call when the stream ends.
    _guard: McpCallGuard,
}

fn message_frame(message: &Value) -> Bytes {
    Bytes::from(format!("event: message\ndata: {message}\n\n"))
}

impl WireFormat for AskStream {
    fn encode(&mut self, event: &StoredEvent) -> Encoded {
        let Some(event) = typed(event) else {
            return Encoded::default();
        };
        let ended =
            |result: Value| Encoded::last(vec![message_frame(&rpc_result(&self.id, result))]);
        match event {
            TurnEvent::MessageDelta { text, .. } if !self.progress.is_null() => {
                self.done += 1;
                let note = json!({
                    "jsonrpc": "2.0",
                    "method": "notifications/progress",
                    "params": {"progressToken": self.progress, "progress": self.done, "message": text},
                });
                Encoded::frames(vec![message_frame(&note)])
            }
            TurnEvent::TurnCompleted { result } => {
                ended(completed(&self.session, self.turn_id, result))
            }
            TurnEvent::TurnFailed { code, message, .. } => {
                ended(text_result(&format!("{code}: {message}"), true))
            }
            TurnEvent::TurnCancelled { reason } => {
                ended(text_result(&format!("cancelled: {reason}"), true))
            }
            TurnEvent::TurnInterrupted { reason } => {
                ended(text_result(&format!("interrupted: {reason}"), true))
            }
            _ => Encoded::default(),
        }
    }

    fn unreadable(&mut self) -> Vec<Bytes> {
        vec![message_frame(&rpc_error(
            &self.id,
            INTERNAL_ERROR,
            "the event log cannot be read; the turn goes on: read it with get_session",
        ))]
    }
}

/// A `notifications/cancelled` of a call this process answers: its turn
/// is cancelled.
async fn cancel(app: &AppState, tenant: &Tenant, mcp_session: &str, request: &Value) {
    let Some((session, turn_id)) = app.mcp_calls.find(&tenant.0, mcp_session, request) else {
        return;
    };
    if let Err(e) = app.runner.cancel(&session, turn_id).await {
        tracing::debug!(error = %e, turn.id = %turn_id, "an MCP cancel found its turn ended");
    }
}

async fn list_sessions(
    app: &AppState,
    tenant: &Tenant,
    id: &Value,
    arguments: &Value,
) -> Result<Value, ApiError> {
    let limit = match &arguments["limit"] {
        Value::Null => 20,
        limit => match limit
            .as_u64()
            .filter(|l| (1..=u64::from(LIST_MAX)).contains(l))
        {
            Some(limit) => limit as u32,
            None => {
                return Ok(rpc_error(
                    id,
                    INVALID_PARAMS,
                    "`limit` must be between 1 and 100",
                ));
            }
        },
    };
    let sessions = app.store.list_sessions(&tenant.0, limit).await?;
    let sessions: Vec<Value> = sessions
        .into_iter()
        .map(|mut session| {
            session.id = SessionKey::from_stored(&session.id).id().to_owned();
            json!(session)
        })
        .collect();
    let text = serde_json::to_string_pretty(&sessions).unwrap_or_default();
    Ok(rpc_result(
        id,
        json!({
            "content": [{"type": "text", "text": text}],
            "structuredContent": {"sessions": sessions},
            "isError": false,
        }),
    ))
}

async fn get_session(
    app: &AppState,
    tenant: &Tenant,
    id: &Value,
    arguments: &Value,
) -> Result<Value, ApiError> {
    let Some(raw) = arguments["session_id"].as_str() else {
        return Ok(rpc_error(id, INVALID_PARAMS, "`session_id` is required"));
    };
    let session_id = match parse_session_id(raw, tenant) {
        Ok(session_id) => session_id,
        Err(e) => return Ok(rpc_error(id, INVALID_PARAMS, &e.to_string())),
    };
    let Some(mut session) = app.store.get_session(&session_id).await? else {
        return Ok(rpc_result(id, text_result("session not found", true)));
    };
    session.id = session_id.id().to_owned();
    let messages = app.store.recent_messages(&session_id, 20).await?;
    let messages: Vec<BTreeMap<&str, Value>> = messages
        .iter()
        .map(|m| BTreeMap::from([("role", json!(m.role)), ("content", json!(m.content))]))
        .collect();
    let view = json!({"session": session, "messages": messages});
    let text = serde_json::to_string_pretty(&view).unwrap_or_default();
    Ok(rpc_result(
        id,
        json!({"content": [{"type": "text", "text": text}], "structuredContent": view, "isError": false}),
    ))
}
