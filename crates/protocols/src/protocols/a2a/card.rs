//! The A2A agent card (`/.well-known/agent-card.json`): who this agent is,
//! its skills, and how to call it.

use axum::{
    extract::State,
    response::{IntoResponse, Response},
};
use serde::Serialize;
use serde_json::Value;

use super::{EXTENDED_AGENT_CARD_NOT_CONFIGURED, RpcError, VERSION};
use crate::{protocols::Shared, tools::EffectClass};

/// The extension that lets a client declare tools it runs itself.
pub const CLIENT_TOOLS_EXTENSION: &str = "urn:agent-harness:a2a:client-tools:v1";

/// An `AgentCard` (A2A 1.0).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct AgentCard {
    name: &'static str,
    description: &'static str,
    version: &'static str,
    supported_interfaces: [AgentInterface; 2],
    capabilities: AgentCapabilities,
    default_input_modes: [&'static str; 1],
    default_output_modes: [&'static str; 2],
    skills: Vec<Skill>,
    #[serde(skip_serializing_if = "Option::is_none")]
    security_schemes: Option<SecuritySchemes>,
    #[serde(skip_serializing_if = "Option::is_none")]
    security_requirements: Option<[SecurityRequirement; 1]>,
}

/// An `AgentInterface`: where a binding is served.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct AgentInterface {
    url: String,
    protocol_binding: &'static str,
    protocol_version: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct AgentCapabilities {
    streaming: bool,
    push_notifications: bool,
    extended_agent_card: bool,
    extensions: [AgentExtension; 1],
}

#[derive(Debug, Serialize)]
struct AgentExtension {
    uri: &'static str,
    description: &'static str,
    required: bool,
}

/// A skill: one the operator declares (`HARNESS_AGENT_SKILLS`, its JSON
/// as given), or one of the service's own.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Skill {
    Declared(Value),
    Own(AgentSkill),
}

/// An `AgentSkill` of the service's own.
#[derive(Debug, Serialize)]
struct AgentSkill {
    id: String,
    name: String,
    description: String,
    tags: Vec<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    examples: Vec<&'static str>,
}

/// `securitySchemes`: a bearer key.
#[derive(Debug, Serialize)]
struct SecuritySchemes {
    bearer: SecurityScheme,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SecurityScheme {
    http_auth_security_scheme: HttpAuth,
}

#[derive(Debug, Serialize)]
struct HttpAuth {
    scheme: &'static str,
    description: &'static str,
}

/// `securityRequirements`: the bearer key, no scopes.
#[derive(Debug, Serialize)]
struct SecurityRequirement {
    schemes: RequiredSchemes,
}

#[derive(Debug, Serialize)]
struct RequiredSchemes {
    bearer: Scopes,
}

#[derive(Debug, Serialize)]
struct Scopes {
    list: [&'static str; 0],
}

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
fn declared_skills(app: &Shared) -> Vec<Skill> {
    match &app.settings.server.agent_skills {
        Some(skills) => skills.0.iter().cloned().map(Skill::Declared).collect(),
        None => vec![Skill::Own(AgentSkill {
            id: "chat".to_owned(),
            name: "Chat".to_owned(),
            description: "Answers a message in a conversation (the context), searching the \
                          notes it holds and using its tools on the way; cites its sources."
                .to_owned(),
            tags: vec!["chat", "research"],
            examples: vec!["Plan a Paris trip", "What do my notes say about Lyon?"],
        })],
    }
}

fn public_card(app: &Shared) -> AgentCard {
    let server = &app.settings.server;
    let interface = |url: String, protocol_binding| AgentInterface {
        url,
        protocol_binding,
        protocol_version: VERSION,
    };
    let keyed = server.auth_required();
    AgentCard {
        name: "agent-harness",
        description: "An LLM agent: each message in a context runs one turn of a tool-using \
                      agent, streamed and kept in its log.",
        version: env!("CARGO_PKG_VERSION"),
        supported_interfaces: [
            interface(format!("{}/a2a", server.public_url()), "JSONRPC"),
            // The HTTP+JSON routes are at the paths the specification
            // gives, from the root (`/message:send`, `/tasks/{id}`).
            interface(server.public_url(), "HTTP+JSON"),
        ],
        capabilities: AgentCapabilities {
            streaming: true,
            push_notifications: true,
            // Only where a caller can be authenticated: the tool inventory
            // is for callers with a key.
            extended_agent_card: keyed,
            extensions: [AgentExtension {
                uri: CLIENT_TOOLS_EXTENSION,
                description: "Tools the client runs: declare them in the request's \
                              metadata.clientTools ({name, description, parameters, effect}); \
                              a call of one puts the task in input-required (a data part: \
                              call_id, tool, arguments, runs: client), answered by a message \
                              in the task with a data part {call_id, output, is_error}.",
                required: false,
            }],
        },
        default_input_modes: ["text/plain"],
        default_output_modes: ["text/plain", "application/json"],
        skills: declared_skills(app),
        security_schemes: keyed.then_some(SecuritySchemes {
            bearer: SecurityScheme {
                http_auth_security_scheme: HttpAuth {
                    scheme: "Bearer",
                    description: "An API key of the service (`agent-harness keys create`)",
                },
            },
        }),
        security_requirements: keyed.then_some([SecurityRequirement {
            schemes: RequiredSchemes {
                bearer: Scopes { list: [] },
            },
        }]),
    }
}

/// The extended card (`GetExtendedAgentCard`, behind the key): the
/// public card, and a skill for each tool the agent may use. With keys
/// off no caller can be authenticated, so there is none (the public card
/// does not announce it): `ExtendedAgentCardNotConfiguredError`.
pub(super) fn extended_card(app: &Shared) -> Result<AgentCard, RpcError> {
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
            Skill::Own(AgentSkill {
                id: spec.name.clone(),
                name: spec.name.clone(),
                description: spec.description.clone(),
                tags: vec!["tool", effect],
                examples: Vec::new(),
            })
        });
    card.skills.extend(tools);
    Ok(card)
}
