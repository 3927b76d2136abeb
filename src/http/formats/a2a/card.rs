//! The A2A agent card (`/.well-known/agent-card.json`): who this agent is,
//! its skills, and how to call it.

use axum::{
    extract::State,
    http::{HeaderMap, header},
    response::{IntoResponse, Response},
};
use serde_json::json;

use super::VERSION;
use crate::{app::AppState, tools::EffectClass};

/// The extension that lets a client declare tools it runs itself.
pub const CLIENT_TOOLS_EXTENSION: &str = "urn:agent-harness:a2a:client-tools:v1";

/// The agent card: who this agent is and how to call it.
#[utoipa::path(
    get,
    path = "/.well-known/agent-card.json",
    tag = "a2a",
    responses((status = 200, description = "The A2A agent card (https://a2a-protocol.org/v1.0.0/specification/#agent-card)", body = Object))
)]
pub(super) async fn agent_card(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost");
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .filter(|p| *p == "https")
        .unwrap_or("http");
    let registry = app.runner.harness().tools();
    let mut skills = vec![json!({
        "id": "chat",
        "name": "Chat",
        "description": "Answers a message in a conversation (the context), searching the \
                        notes it holds and using its tools on the way; cites its sources.",
        "tags": ["chat", "research"],
        "examples": ["Plan a Paris trip", "What do my notes say about Lyon?"],
    })];
    for (tool, permitted) in registry.all() {
        let spec = tool.spec();
        if !permitted {
            continue;
        }
        let effect = match spec.effect {
            EffectClass::ReadOnly => "read_only",
            EffectClass::LocalWrite => "local_write",
            EffectClass::Network => "network",
            EffectClass::Destructive => "destructive",
        };
        skills.push(json!({
            "id": spec.name,
            "name": spec.name,
            "description": spec.description,
            "tags": ["tool", effect],
        }));
    }
    let mut card = json!({
        "name": "agent-harness",
        "description": "An LLM agent: each message in a context runs one turn of a \
                        tool-using agent, streamed and kept in its log.",
        "version": env!("CARGO_PKG_VERSION"),
        "supportedInterfaces": [{
            "url": format!("{scheme}://{host}/a2a"),
            "protocolBinding": "JSONRPC",
            "protocolVersion": VERSION,
        }],
        "capabilities": {
            "streaming": true,
            "pushNotifications": false,
            "extendedAgentCard": false,
            "extensions": [{
                "uri": CLIENT_TOOLS_EXTENSION,
                "description": "Tools the client runs: declare them in the request's \
                                metadata.clientTools ({name, description, parameters, \
                                effect}); a call of one puts the task in input-required \
                                (a data part: call_id, tool, arguments, runs: client), \
                                answered by a message in the task with a data part \
                                {call_id, output, is_error}.",
                "required": false,
            }],
        },
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": skills,
    });
    if app.settings.server.auth_required() {
        card["securitySchemes"] = json!({"bearer": {"httpAuthSecurityScheme": {
            "scheme": "Bearer",
            "description": "An API key of the service (`agent-harness keys create`)",
        }}});
        card["securityRequirements"] = json!([{"schemes": {"bearer": {"list": []}}}]);
    }
    axum::Json(card).into_response()
}
