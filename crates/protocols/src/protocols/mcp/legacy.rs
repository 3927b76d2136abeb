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
use rmcp::model::{
    CallToolRequestParams, CompleteRequestParams, GetPromptRequestParams,
    ReadResourceRequestParams, SubscribeRequestParams,
};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::Value;
use uuid::Uuid;

use super::state::{MCP_URIS_MAX, McpCallGuard, McpCalls, SubscribeRefused};
use super::{
    current::UriData,
    prompts,
    resources::{self, Unreadable},
    tools::{self, Asked},
    wire::{
        CancelParams, ElicitAnswer, Elicitation, Empty, Envelope, InitializeParams,
        InitializeResult, LevelParams, ListChanged, LogMessage, Notification, Progress, PromptList,
        Request, ResourceList, Resources, ServerCapabilities, ServerInfo, TemplateList, ToolList,
    },
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
            error_with, result as rpc_result, to_value,
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

const INSTRUCTIONS: &str = "Call `ask` with a message to run one turn of this agent; pass the \
                            `session_id` it answers to go on with the conversation.";

fn json_answer(status: StatusCode, message: &Value) -> Response {
    (status, axum::Json(message)).into_response()
}

/// A method's params, read as rmcp's (or this module's) type; absent
/// params are `{}`. `Err`: why not, for an invalid-params error.
fn params<T: DeserializeOwned>(params: Option<Value>) -> Result<T, String> {
    let params = params
        .filter(|p| !p.is_null())
        .unwrap_or_else(|| Value::Object(serde_json::Map::new()));
    serde_path_to_error::deserialize(params).map_err(|e| {
        let path = e.path().to_string();
        format!("`params.{path}`: {}", e.into_inner())
    })
}

/// The JSON-RPC answer of a result (or why its params were refused).
fn answered<T: Serialize>(id: &Value, answer: Result<T, String>) -> Value {
    match answer {
        Ok(result) => rpc_result(id, result),
        Err(detail) => rpc_error(id, INVALID_PARAMS, &detail),
    }
}

/// The `initialize` result of `asked` (a version this server speaks, or
/// its newest).
fn initialized(asked: Option<&str>) -> InitializeResult {
    let version = VERSIONS
        .iter()
        .find(|v| Some(**v) == asked)
        .unwrap_or(&VERSIONS[0]);
    let unchanging = ListChanged {
        list_changed: false,
    };
    InitializeResult {
        protocol_version: version,
        capabilities: ServerCapabilities {
            tools: ListChanged {
                list_changed: false,
            },
            resources: Resources {
                subscribe: true,
                list_changed: false,
            },
            prompts: unchanging,
            completions: Empty {},
            logging: Empty {},
        },
        server_info: ServerInfo {
            name: "agent-harness",
            version: env!("CARGO_PKG_VERSION"),
        },
        instructions: INSTRUCTIONS,
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
    envelope: Envelope,
) -> Result<Response, ApiError> {
    if !envelope.is_message() {
        return Ok(json_answer(
            StatusCode::BAD_REQUEST,
            &rpc_error(&Value::Null, INVALID_REQUEST, "not a JSON-RPC 2.0 message"),
        ));
    }
    // No id this process gives is longer: a longer one names no session.
    let mcp_session = headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|id| id.len() <= super::state::MCP_SESSION_ID_MAX)
        .unwrap_or_default()
        .to_owned();
    // A `method` that is not text is no request, no notification, no
    // response.
    let method = match &envelope.method {
        None | Some(Value::Null) => None,
        Some(Value::String(method)) => Some(method.clone()),
        Some(_) => {
            return Ok(json_answer(
                StatusCode::BAD_REQUEST,
                &rpc_error(&Value::Null, INVALID_REQUEST, "`method` must be a string"),
            ));
        }
    };
    // The id and the progress token were bounded (`super::mcp`).
    let progress = envelope.progress_token();
    let Some(id) = envelope.id.filter(|id| !id.is_null()) else {
        // A notification (or a client's response): taken, nothing to say.
        if method.as_deref() == Some("notifications/cancelled")
            && let Ok(CancelParams { request_id }) = params(envelope.params)
        {
            cancel(&app, &tenant, &mcp_session, &request_id).await;
        }
        return Ok(StatusCode::ACCEPTED.into_response());
    };
    let Some(method) = method else {
        // A response to a request of ours: an elicitation's answer.
        elicited(&app, &tenant, &mcp_session, &id, envelope.result).await;
        return Ok(StatusCode::ACCEPTED.into_response());
    };
    let given = envelope.params;
    let answer = match method.as_str() {
        "initialize" => {
            let asked: InitializeParams = params(given).unwrap_or_default();
            let result = initialized(asked.protocol_version.as_deref());
            let session = Uuid::now_v7().to_string();
            let elicits = asked
                .capabilities
                .and_then(|c| c.elicitation)
                .is_some_and(|e| e.is_object());
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
        "ping" => rpc_result(&id, Empty {}),
        "logging/setLevel" => {
            let level = params::<LevelParams>(given).ok().and_then(|p| p.level);
            match LOG_LEVELS.iter().position(|l| Some(*l) == level.as_deref()) {
                Some(index) => {
                    // Kept for a session this process began, and only then.
                    app.mcp.sessions.set_log_level(&tenant, &mcp_session, index);
                    rpc_result(&id, Empty {})
                }
                None => rpc_error(
                    &id,
                    INVALID_PARAMS,
                    &format!("`level` must be one of {}", LOG_LEVELS.join(", ")),
                ),
            }
        }
        "resources/list" => {
            let resources = resources::list(&app, &tenant).await?;
            rpc_result(&id, ResourceList { resources })
        }
        "resources/subscribe" | "resources/unsubscribe" => {
            match params::<SubscribeRequestParams>(given) {
                Ok(asked) => {
                    let follows = method == "resources/subscribe";
                    subscription(&app, &tenant, &mcp_session, &id, follows, &asked.uri)
                }
                Err(detail) => rpc_error(&id, INVALID_PARAMS, &detail),
            }
        }
        "resources/templates/list" => rpc_result(
            &id,
            TemplateList {
                resource_templates: resources::templates(),
            },
        ),
        "resources/read" => match params::<ReadResourceRequestParams>(given) {
            Err(detail) => rpc_error(&id, INVALID_PARAMS, &detail),
            Ok(asked) => match resources::read(&app, &tenant, &asked.uri).await {
                Ok(contents) => rpc_result(&id, contents),
                Err(Unreadable::NotFound(message)) => {
                    let data = to_value(&UriData { uri: &asked.uri });
                    error_with(&id, RESOURCE_NOT_FOUND, &message, Some(data))
                }
                Err(Unreadable::Failed(e)) => return Err(e),
            },
        },
        "completion/complete" => match params::<CompleteRequestParams>(given) {
            Ok(asked) => answered(&id, resources::complete(&app, &tenant, &asked).await?),
            Err(detail) => rpc_error(&id, INVALID_PARAMS, &detail),
        },
        "prompts/list" => rpc_result(
            &id,
            PromptList {
                prompts: prompts::list(&app),
            },
        ),
        "prompts/get" => answered(
            &id,
            params::<GetPromptRequestParams>(given)
                .and_then(|asked| prompts::get(&app, &asked.name, asked.arguments.as_ref())),
        ),
        "tools/list" => rpc_result(
            &id,
            ToolList {
                tools: tools::definitions(&app),
            },
        ),
        "tools/call" => {
            let asked = match params::<CallToolRequestParams>(given) {
                Ok(asked) => asked,
                Err(detail) => {
                    let refused = rpc_error(&id, INVALID_PARAMS, &detail);
                    return Ok(json_answer(StatusCode::OK, &refused));
                }
            };
            let arguments = asked.arguments.as_ref();
            match asked.name.as_ref() {
                "ask" => {
                    let streams = headers
                        .get(header::ACCEPT)
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|v| v.contains("text/event-stream"));
                    let call = Call {
                        id,
                        tenant,
                        mcp_session,
                        progress,
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

/// `resources/subscribe` (`follows`) and `resources/unsubscribe`: the
/// session's `GET /mcp` stream says when a followed resource changes.
fn subscription(
    app: &Shared,
    tenant: &Tenant,
    mcp_session: &str,
    id: &Value,
    follows: bool,
    uri: &str,
) -> Value {
    if !resources::is_ours(uri) {
        let message =
            format!("{uri:?} is not a resource of this server (vault:/// or session:///)");
        let data = to_value(&UriData { uri });
        return error_with(id, INVALID_PARAMS, &message, Some(data));
    }
    if !follows {
        app.mcp.sessions.unsubscribe(tenant, mcp_session, uri);
        return rpc_result(id, Empty {});
    }
    match app.mcp.sessions.subscribe(tenant, mcp_session, uri) {
        Ok(()) => rpc_result(id, Empty {}),
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
    arguments: Option<&rmcp::model::JsonObject>,
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
    fn log(&self, level: &'static str, data: impl Serialize) -> Encoded {
        let wanted = LOG_LEVELS
            .iter()
            .position(|l| *l == level)
            .zip(self.log_level)
            .is_some_and(|(at, least)| at >= least);
        if !wanted {
            return Encoded::default();
        }
        let note = Notification::new(
            "notifications/message",
            LogMessage {
                level,
                logger: "agent-harness",
                data,
            },
        );
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
        let request = Request {
            jsonrpc: crate::protocols::jsonrpc::Version::V2,
            id,
            method: "elicitation/create",
            params: Elicitation::approval(format!(
                "{tool} waits for your approval; its arguments: {arguments}"
            )),
        };
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
    result: Option<Value>,
) {
    let Some((session, turn_id, call_id)) = id
        .as_str()
        .and_then(|id| app.mcp.sessions.answered(tenant, mcp_session, id))
    else {
        return;
    };
    let result = result
        .and_then(|r| ElicitAnswer::deserialize(r).ok())
        .unwrap_or_default();
    let content = result.content.unwrap_or_default();
    let (approve, reason) = match result.action.as_deref() {
        Some("accept") => (
            content.approve == Value::Bool(true),
            content.reason.as_str().map(str::to_owned),
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

/// A message on the `message` event of a stream.
pub(super) fn message_frame(message: &impl Serialize) -> Bytes {
    let mut frame = b"event: message\n".to_vec();
    frame.extend_from_slice(&crate::protocols::data_frame(message));
    Bytes::from(frame)
}

impl WireFormat for AskStream {
    fn encode(&mut self, event: &StoredEvent) -> Encoded {
        let Some(event) = typed(event) else {
            return Encoded::default();
        };
        let ended = |result: rmcp::model::CallToolResult| {
            Encoded::last(vec![message_frame(&rpc_result(&self.id, result))])
        };
        match event {
            TurnEvent::MessageDelta { text, .. } if !self.progress.is_null() => {
                self.done += 1;
                let note = Notification::new(
                    "notifications/progress",
                    Progress {
                        progress_token: &self.progress,
                        progress: self.done,
                        message: text,
                    },
                );
                Encoded::frames(vec![message_frame(&note)])
            }
            TurnEvent::ToolStarted { call_id, tool, .. } => self.log(
                "info",
                ToolLog {
                    event: "tool.started",
                    tool,
                    call_id,
                    status: None,
                    error: None,
                },
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
                let data = ToolLog {
                    event: "tool.finished",
                    tool,
                    call_id,
                    status: Some(*status),
                    error: error.as_deref(),
                };
                self.log(level, data)
            }
            TurnEvent::ApprovalRequested {
                call_id,
                tool,
                arguments,
                ..
            } => {
                let data = ToolLog {
                    event: "approval.requested",
                    tool,
                    call_id,
                    status: None,
                    error: None,
                };
                let mut out = self.log("notice", data);
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

/// What a `notifications/message` of a tool call says.
#[derive(Debug, Serialize)]
struct ToolLog<'a> {
    call_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    event: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<crate::events::ToolStatus>,
    tool: &'a str,
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
