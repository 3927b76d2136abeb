//! MCP as versions up to 2025-11-25 speak it: an `initialize` handshake,
//! then one JSON-RPC message a `POST`. Any replica answers any of them:
//! `initialize` names an `Mcp-Session-Id` that scopes request ids, so
//! that a `notifications/cancelled` finds the turn of the call it names
//! (on the replica that runs that call). The one state is the session's
//! own, kept by the replica that began it (`app::McpSessions`): the
//! resources it follows (`resources/subscribe`, streamed by `GET /mcp`,
//! [`super::watch`]) and the approvals asked of it by elicitation.

mod ask;

use ask::{Call, ask, elicited};
use axum::{
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use rmcp::model::{
    CallToolRequestParams, CompleteRequestParams, GetPromptRequestParams,
    ReadResourceRequestParams, SubscribeRequestParams,
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;
use uuid::Uuid;

use super::state::{MCP_URIS_MAX, SubscribeRefused};
use super::{
    prompts,
    resources::{self, Unreadable},
    tools,
    wire::{
        CancelParams, Empty, Envelope, InitializeParams, InitializeResult, LevelParams,
        ListChanged, PromptList, ResourceList, Resources, ServerCapabilities, ServerInfo,
        TemplateList, ToolList, UriData,
    },
};
use crate::{
    ids::Tenant,
    protocols::Shared,
    protocols::{
        error::ApiError,
        jsonrpc::{
            INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, error as rpc_error,
            error_with, result as rpc_result, to_value,
        },
    },
};

/// The protocol versions of the `initialize` handshake, newest first.
pub(super) const VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

const SESSION_HEADER: &str = "mcp-session-id";

/// The levels `logging/setLevel` takes (RFC 5424's, as MCP names them).
pub(super) const LOG_LEVELS: [&str; 8] = [
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
