//! MCP as versions up to 2025-11-25 speak it: an `initialize` handshake,
//! then one JSON-RPC message a `POST`. Any replica answers any of them:
//! `initialize` names an `Mcp-Session-Id` that scopes request ids, so
//! that a `notifications/cancelled` finds the turn of the call it names
//! (on the replica that runs that call). The one state is the session's
//! own, kept by the replica that began it (`app::McpSessions`): the
//! resources it follows (`resources/subscribe`, streamed by `GET /mcp`,
//! [`super::watch`]) and the approvals asked of it by elicitation.

use axum::{
    body::Bytes,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};
use uuid::Uuid;

use super::state::{MCP_URIS_MAX, McpCallGuard, McpCalls, SubscribeRefused};
use super::{
    prompts,
    resources::{self, Unreadable},
    tools::{self, Answer, Asked},
};
use crate::{
    events::{StoredEvent, TurnEvent},
    ids::{SessionKey, Tenant},
    protocols::Shared,
    protocols::{
        Encoded, WireFormat,
        approvals::{ClientDecision, approvals, decide},
        error::ApiError,
        jsonrpc::{
            INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, error as rpc_error,
            is_message, result as rpc_result,
        },
        stream_for, typed,
    },
};

/// The protocol versions of the `initialize` handshake, newest first.
pub(super) const VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

const SESSION_HEADER: &str = "mcp-session-id";

/// The levels `logging/setLevel` takes (RFC 5424's, as MCP names them).
const LOG_LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// MCP's code for a resource that is not there (up to 2025-11-25).
const RESOURCE_NOT_FOUND: i64 = -32002;

fn json_answer(status: StatusCode, message: &Value) -> Response {
    (status, axum::Json(message)).into_response()
}

/// The JSON-RPC answer of a tool call.
fn answered(id: &Value, answer: Answer) -> Value {
    match answer {
        Ok(result) => rpc_result(id, result),
        Err(detail) => rpc_error(id, INVALID_PARAMS, &detail),
    }
}

/// Answers one JSON-RPC message.
#[expect(
    clippy::too_many_lines,
    reason = "one match over the JSON-RPC methods of the versions up to 2025-11-25"
)]
pub(super) async fn answer(
    app: Shared,
    tenant: Tenant,
    headers: &HeaderMap,
    message: Value,
) -> Result<Response, ApiError> {
    let Some(fields) = message.as_object().filter(|_| is_message(&message)) else {
        return Ok(json_answer(
            StatusCode::BAD_REQUEST,
            &rpc_error(&Value::Null, INVALID_REQUEST, "not a JSON-RPC 2.0 message"),
        ));
    };
    // No id this process gives is longer: a longer one names no session.
    let mcp_session = headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|id| id.len() <= super::state::MCP_SESSION_ID_MAX)
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
    // The id and the progress token were bounded (`super::mcp`).
    let progress = &params["_meta"]["progressToken"];
    let Some(id) = fields.get("id").filter(|id| !id.is_null()).cloned() else {
        // A notification (or a client's response): taken, nothing to say.
        if method == Some("notifications/cancelled") {
            cancel(&app, &tenant, &mcp_session, &params["requestId"]).await;
        }
        return Ok(StatusCode::ACCEPTED.into_response());
    };
    let Some(method) = method else {
        // A response to a request of ours: an elicitation's answer.
        elicited(&app, &tenant, &mcp_session, &id, fields).await;
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
                "capabilities": {
                    "tools": {"listChanged": false},
                    "resources": {"subscribe": true, "listChanged": false},
                    "prompts": {"listChanged": false},
                    "completions": {},
                    "logging": {},
                },
                "serverInfo": {"name": "agent-harness", "version": env!("CARGO_PKG_VERSION")},
                "instructions": "Call `ask` with a message to run one turn of this agent; \
                                 pass the `session_id` it answers to go on with the conversation.",
            });
            let session = Uuid::now_v7().to_string();
            let elicits = params["capabilities"]["elicitation"].is_object();
            if !app.mcp.sessions.begin(&tenant, &session, elicits) {
                let refused = rpc_error(
                    &id,
                    INTERNAL_ERROR,
                    "this replica holds as many MCP sessions as it may: try again later",
                );
                return Ok(json_answer(StatusCode::SERVICE_UNAVAILABLE, &refused));
            }
            let mut response = json_answer(StatusCode::OK, &rpc_result(&id, result));
            if let Ok(value) = HeaderValue::from_str(&session) {
                response.headers_mut().insert(SESSION_HEADER, value);
            }
            return Ok(response);
        }
        "ping" => rpc_result(&id, json!({})),
        "logging/setLevel" => match params["level"].as_str() {
            Some(level) if LOG_LEVELS.contains(&level) => {
                // Kept for a session this process began, and only then.
                if let Some(index) = LOG_LEVELS.iter().position(|l| *l == level) {
                    app.mcp.sessions.set_log_level(&tenant, &mcp_session, index);
                }
                rpc_result(&id, json!({}))
            }
            _ => rpc_error(
                &id,
                INVALID_PARAMS,
                &format!("`level` must be one of {}", LOG_LEVELS.join(", ")),
            ),
        },
        "resources/list" => {
            let listed = resources::list(&app, &tenant).await?;
            rpc_result(&id, json!({"resources": listed}))
        }
        "resources/subscribe" | "resources/unsubscribe" => {
            subscription(&app, &tenant, &mcp_session, &id, method, &params)
        }
        "resources/templates/list" => {
            rpc_result(&id, json!({"resourceTemplates": resources::templates()}))
        }
        "resources/read" => match params["uri"].as_str() {
            None => rpc_error(&id, INVALID_PARAMS, "`uri` is required"),
            Some(uri) => match resources::read(&app, &tenant, uri).await {
                Ok(contents) => rpc_result(&id, contents),
                Err(Unreadable::NotFound(message)) => json!({"jsonrpc": "2.0", "id": id, "error": {
                    "code": RESOURCE_NOT_FOUND, "message": message, "data": {"uri": uri},
                }}),
                Err(Unreadable::Failed(e)) => return Err(e),
            },
        },
        "completion/complete" => answered(&id, resources::complete(&app, &tenant, &params).await?),
        "prompts/list" => rpc_result(&id, json!({"prompts": prompts::list(&app)})),
        "prompts/get" => match prompts::get(&app, &params) {
            Ok(prompt) => rpc_result(&id, prompt),
            Err(detail) => rpc_error(&id, INVALID_PARAMS, &detail),
        },
        "tools/list" => rpc_result(&id, json!({"tools": tools::definitions(&app)})),
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
                "list_sessions" => {
                    answered(&id, tools::list_sessions(&app, &tenant, arguments).await?)
                }
                "get_session" => answered(&id, tools::get_session(&app, &tenant, arguments).await?),
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

/// `resources/subscribe` and `resources/unsubscribe`: the session's
/// `GET /mcp` stream says when a followed resource changes.
fn subscription(
    app: &Shared,
    tenant: &Tenant,
    mcp_session: &str,
    id: &Value,
    method: &str,
    params: &Value,
) -> Value {
    let Some(uri) = params["uri"].as_str() else {
        return rpc_error(id, INVALID_PARAMS, "`uri` is required");
    };
    if !resources::is_ours(uri) {
        let message =
            format!("{uri:?} is not a resource of this server (vault:/// or session:///)");
        return json!({"jsonrpc": "2.0", "id": id, "error": {
            "code": INVALID_PARAMS, "message": message, "data": {"uri": uri},
        }});
    }
    if method == "resources/unsubscribe" {
        app.mcp.sessions.unsubscribe(tenant, mcp_session, uri);
        return rpc_result(id, json!({}));
    }
    match app.mcp.sessions.subscribe(tenant, mcp_session, uri) {
        Ok(()) => rpc_result(id, json!({})),
        Err(SubscribeRefused::UnknownSession) => rpc_error(
            id,
            INVALID_REQUEST,
            "resources/subscribe needs the Mcp-Session-Id that `initialize` gave, \
             sent to the replica that gave it",
        ),
        Err(SubscribeRefused::TooMany) => rpc_error(
            id,
            INVALID_PARAMS,
            &format!("a session follows at most {MCP_URIS_MAX} resources"),
        ),
    }
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
    app: &Shared,
    call: Call,
    arguments: &Value,
    streams: bool,
) -> Result<Response, ApiError> {
    let (session, started) = match tools::start_ask(app, &call.tenant, arguments).await {
        Asked::Started(session, started) => (session, started),
        Asked::Invalid(detail) => {
            let answer = rpc_error(&call.id, INVALID_PARAMS, &detail);
            return Ok(json_answer(StatusCode::OK, &answer));
        }
        Asked::Refused(result) => {
            return Ok(json_answer(StatusCode::OK, &rpc_result(&call.id, result)));
        }
    };
    let turn_id = started.turn_id;
    let guard = McpCalls::track(
        &app.mcp.calls,
        &call.tenant.0,
        &call.mcp_session,
        &call.id,
        (session.clone(), turn_id),
    );
    if !streams {
        let record = app.turns.wait_for_end(&session, turn_id).await?;
        drop(guard);
        let record = record.ok_or(ApiError::ShuttingDown)?;
        let answer = rpc_result(&call.id, tools::answer_of(&session, &record));
        return Ok(json_answer(StatusCode::OK, &answer));
    }
    let events = started.events(app);
    let format = AskStream {
        log_level: app.mcp.sessions.log_level(&call.tenant, &call.mcp_session),
        app: app.clone(),
        tenant: call.tenant,
        mcp_session: call.mcp_session,
        elicited: Vec::new(),
        id: call.id,
        progress: call.progress,
        done: 0,
        session,
        turn_id,
        _guard: guard,
    };
    Ok(stream_for(app, format, events))
}

/// `ask`'s answer as a stream of JSON-RPC messages: each text delta a
/// `notifications/progress` (when the call named a progress token), then
/// the call's result.
struct AskStream {
    /// The session's `logging/setLevel` (an index of [`LOG_LEVELS`]): the
    /// turn's log messages at or above it are sent.
    log_level: Option<usize>,
    app: Shared,
    tenant: Tenant,
    mcp_session: String,
    /// The calls whose approval was asked by elicitation (each once).
    elicited: Vec<String>,
    id: Value,
    progress: Value,
    done: u64,
    session: SessionKey,
    turn_id: Uuid,
    /// Untracks the call when the stream ends.
    _guard: McpCallGuard,
}

impl AskStream {
    /// A `notifications/message` of the turn, when the session asked for
    /// messages at `level` or above.
    fn log(&self, level: &str, data: Value) -> Encoded {
        let wanted = LOG_LEVELS
            .iter()
            .position(|l| *l == level)
            .zip(self.log_level)
            .is_some_and(|(at, least)| at >= least);
        if !wanted {
            return Encoded::default();
        }
        let note = json!({
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": level, "logger": "agent-harness", "data": data},
        });
        Encoded::frames(vec![message_frame(&note)])
    }
}

impl AskStream {
    /// An `elicitation/create` that asks the client to approve a call
    /// (once a call; none when the client takes no elicitation).
    fn elicit(&mut self, call_id: &str, tool: &str, arguments: &Value) -> Option<Bytes> {
        if self.elicited.iter().any(|c| c == call_id) {
            return None;
        }
        let asked = (self.session.clone(), self.turn_id, call_id.to_owned());
        let id = self
            .app
            .mcp
            .sessions
            .ask(&self.tenant, &self.mcp_session, asked)?;
        self.elicited.push(call_id.to_owned());
        let request = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": format!("{tool} waits for your approval; its arguments: {arguments}"),
                "requestedSchema": {
                    "type": "object",
                    "properties": {
                        "approve": {"type": "boolean", "title": "Approve",
                                    "description": "Let the call run"},
                        "reason": {"type": "string", "title": "Reason", "maxLength": 1000,
                                   "description": "Why not (the model is told)"},
                    },
                    "required": ["approve"],
                },
            },
        });
        Some(message_frame(&request))
    }
}

/// The client's answer to an `elicitation/create` of this session: the
/// call it asked about is approved (`accept` with `approve: true`, the
/// form 2026-07-28's input-required asks for too) or
/// denied (anything else, with its reason). An answer to no question of
/// the session's is taken and does nothing.
async fn elicited(
    app: &Shared,
    tenant: &Tenant,
    mcp_session: &str,
    id: &Value,
    answer: &serde_json::Map<String, Value>,
) {
    let Some((session, turn_id, call_id)) = id
        .as_str()
        .and_then(|id| app.mcp.sessions.answered(tenant, mcp_session, id))
    else {
        return;
    };
    let result = answer.get("result").unwrap_or(&Value::Null);
    let content = &result["content"];
    let (approve, reason) = match result["action"].as_str() {
        Some("accept") => (
            content["approve"] == true,
            content["reason"].as_str().map(str::to_owned),
        ),
        Some("decline") => (false, Some("the person declined".to_owned())),
        _ => (false, Some("the client did not ask anyone".to_owned())),
    };
    let decision = ClientDecision::new(&call_id, approve, reason, "content.reason")
        .or_else(|_| ClientDecision::new(&call_id, approve, None, "content.reason"));
    let decided = async {
        let decision = decision?;
        let turn = app
            .turns
            .get_turn(&session, turn_id)
            .await?
            .ok_or(ApiError::TurnNotFound)?;
        let state = approvals(app, &turn).await?.get(&call_id).map(|(s, _)| *s);
        decide(app, &turn, state, &decision).await
    };
    if let Err(e) = decided.await {
        tracing::debug!(error = %e, turn.id = %turn_id, "an elicited decision was not taken");
    }
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
            TurnEvent::ToolStarted { call_id, tool, .. } => self.log(
                "info",
                json!({"event": "tool.started", "tool": tool, "call_id": call_id}),
            ),
            TurnEvent::ToolFinished {
                call_id,
                tool,
                status,
                error,
                ..
            } => {
                let level = match status {
                    crate::events::ToolStatus::Completed => "info",
                    _ => "warning",
                };
                let mut data = json!({"event": "tool.finished", "tool": tool,
                                      "call_id": call_id, "status": status});
                if let Some(error) = error {
                    data["error"] = json!(error);
                }
                self.log(level, data)
            }
            TurnEvent::ApprovalRequested {
                call_id,
                tool,
                arguments,
                ..
            } => {
                let mut out = self.log(
                    "notice",
                    json!({"event": "approval.requested", "tool": tool, "call_id": call_id}),
                );
                out.frames.extend(self.elicit(call_id, tool, arguments));
                out
            }
            TurnEvent::TurnCompleted { result } => {
                ended(tools::completed(&self.session, self.turn_id, result))
            }
            TurnEvent::TurnFailed { code, message, .. } => {
                ended(tools::text_result(&format!("{code}: {message}"), true))
            }
            TurnEvent::TurnCancelled { reason } => {
                ended(tools::text_result(&format!("cancelled: {reason}"), true))
            }
            TurnEvent::TurnInterrupted { reason } => {
                ended(tools::text_result(&format!("interrupted: {reason}"), true))
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
async fn cancel(app: &Shared, tenant: &Tenant, mcp_session: &str, request: &Value) {
    let Some((session, turn_id)) = app.mcp.calls.find(&tenant.0, mcp_session, request) else {
        return;
    };
    if let Err(e) = app.turns.cancel(&session, turn_id).await {
        tracing::debug!(error = %e, turn.id = %turn_id, "an MCP cancel found its turn ended");
    }
}
