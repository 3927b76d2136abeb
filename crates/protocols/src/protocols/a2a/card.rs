//! The A2A agent card (`/.well-known/agent-card.json`): who this agent is,
//! its skills, and how to call it.

use axum::{
    extract::State,
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use super::{EXTENDED_AGENT_CARD_NOT_CONFIGURED, RpcError, VERSION};
use crate::{protocols::Shared, tools::EffectClass};

/// The extension that lets a client declare tools it runs itself.
pub const CLIENT_TOOLS_EXTENSION: &str = "urn:agent-harness:a2a:client-tools:v1";

/// The public agent card: who this agent is, the skills the operator
/// declares, and how to call it. It is built from `HARNESS_PUBLIC_URL`,
/// never from the request's `Host` (which a client chooses), and names no
/// tool: the inventory is in the extended card ([`extended_card`]).
#[utoipa::path(
    get,
    path = "/.well-known/agent-card.json",
    tag = "a2a",
    responses((status = 200, description = "The public A2A agent card (https://a2a-protocol.org/v1.0.0/specification/#agent-card): the declared skills, no tool names", body = Object))
)]
pub(super) async fn agent_card(State(app): State<Shared>) -> Response {
    axum::Json(public_card(&app)).into_response()
}

/// The public card again, under the JSON-RPC endpoint's own URL: clients
/// and suites given that URL (the TCK, `A2ACardResolver(base_url)`) look
/// for the card there.
#[utoipa::path(
    get,
    path = "/a2a/.well-known/agent-card.json",
    tag = "a2a",
    responses((status = 200, description = "The public A2A agent card, as at `/.well-known/agent-card.json`", body = Object))
)]
pub(super) async fn agent_card_at_endpoint(state: State<Shared>) -> Response {
    agent_card(state).await
}

/// The skills the operator declares (`HARNESS_AGENT_SKILLS`), else one
/// `chat` skill.
fn declared_skills(app: &Shared) -> Vec<Value> {
    match &app.settings.server.agent_skills {
        Some(skills) => skills.0.clone(),
        None => vec![json!({
            "id": "chat",
            "name": "Chat",
            "description": "Answers a message in a conversation (the context), searching the \
                            notes it holds and using its tools on the way; cites its sources.",
            "tags": ["chat", "research"],
            "examples": ["Plan a Paris trip", "What do my notes say about Lyon?"],
        })],
    }
}

fn public_card(app: &Shared) -> Value {
    let mut card = json!({
        "name": "agent-harness",
        "description": "An LLM agent: each message in a context runs one turn of a \
                        tool-using agent, streamed and kept in its log.",
        "version": env!("CARGO_PKG_VERSION"),
        "supportedInterfaces": [
            {
                "url": format!("{}/a2a", app.settings.server.public_url()),
                "protocolBinding": "JSONRPC",
                "protocolVersion": VERSION,
            },
            {
                // The HTTP+JSON routes are at the paths the specification
                // gives, from the root (`/message:send`, `/tasks/{id}`).
                "url": app.settings.server.public_url(),
                "protocolBinding": "HTTP+JSON",
                "protocolVersion": VERSION,
            },
        ],
        "capabilities": {
            "streaming": true,
            "pushNotifications": true,
            // Only where a caller can be authenticated: the tool inventory
            // is for callers with a key.
            "extendedAgentCard": app.settings.server.auth_required(),
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
        "skills": declared_skills(app),
    });
    if app.settings.server.auth_required() {
        card["securitySchemes"] = json!({"bearer": {"httpAuthSecurityScheme": {
            "scheme": "Bearer",
            "description": "An API key of the service (`agent-harness keys create`)",
        }}});
        card["securityRequirements"] = json!([{"schemes": {"bearer": {"list": []}}}]);
    }
    card
}

/// The extended card (`GetExtendedAgentCard`, behind the key): the
/// public card, and a skill for each tool the agent may use. With keys
/// off no caller can be authenticated, so there is none (the public card
/// does not announce it): `ExtendedAgentCardNotConfiguredError`.
pub(super) fn extended_card(app: &Shared) -> Result<Value, RpcError> {
    if !app.settings.server.auth_required() {
        return Err(RpcError::new(
            EXTENDED_AGENT_CARD_NOT_CONFIGURED,
            "no extended agent card: this service authenticates no caller (HARNESS_AUTH)",
        ));
    }
    let mut card = public_card(app);
    let registry = app.turns.tools();
    let tools = registry
        .all()
        .filter(|(_, permitted)| *permitted)
        .map(|(tool, _)| {
            let spec = tool.spec();
            let effect = match spec.effect {
                EffectClass::ReadOnly => "read_only",
                EffectClass::LocalWrite => "local_write",
                EffectClass::Network => "network",
                EffectClass::Destructive => "destructive",
            };
            json!({
                "id": spec.name,
                "name": spec.name,
                "description": spec.description,
                "tags": ["tool", effect],
            })
        });
    if let Some(skills) = card["skills"].as_array_mut() {
        skills.extend(tools);
    }
    Ok(card)
}
