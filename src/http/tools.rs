//! `GET /tools`: the tool registry as the model is offered it.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::{app::AppState, tools::EffectClass};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_tools))
}

/// A registered tool.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ToolView {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments.
    #[schema(value_type = Object)]
    pub parameters: Value,
    pub effect: EffectClass,
    /// Whether the permission mode lets it run (a tool that may not run is
    /// not offered to the model).
    pub permitted: bool,
    /// `builtin`, `mcp:{server}` or `http`.
    pub source: String,
    /// Longest a call may run, in seconds.
    pub timeout_s: f64,
}

/// An MCP server the service connected to at start.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct McpServerView {
    pub name: String,
    /// False while it restarts (or reconnects).
    pub connected: bool,
    /// Restarts (or reconnections) since start.
    pub restarts: u64,
    /// Why it last failed, if it did.
    pub last_error: Option<String>,
}

/// The registry.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ToolList {
    /// `auto`, `read_only` or `none`.
    pub permission_mode: String,
    pub tools: Vec<ToolView>,
    pub mcp_servers: Vec<McpServerView>,
}

/// The tools of the service, in the order they are offered, and the MCP
/// servers they come from. `web_search`
/// and `fetch_url` are offered only to turns with `web_mode: on`.
#[utoipa::path(
    get,
    path = "/tools",
    tag = "operations",
    responses((status = 200, description = "Success", body = ToolList))
)]
async fn list_tools(State(app): State<AppState>) -> axum::Json<ToolList> {
    let registry = app.runner.harness().tools();
    let permission_mode = serde_json::to_value(registry.mode())
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let tools = registry
        .all()
        .map(|(tool, permitted)| {
            let spec = tool.spec();
            ToolView {
                name: spec.name.clone(),
                description: spec.description.clone(),
                parameters: spec.parameters.clone(),
                effect: spec.effect,
                permitted,
                source: spec.source.clone(),
                timeout_s: spec.timeout().as_secs_f64(),
            }
        })
        .collect();
    let mcp_servers = app
        .mcp
        .servers()
        .iter()
        .map(|server| {
            let status = server.status();
            McpServerView {
                name: server.name().to_owned(),
                connected: status.connected,
                restarts: status.restarts,
                last_error: status.last_error,
            }
        })
        .collect();
    axum::Json(ToolList {
        permission_mode,
        tools,
        mcp_servers,
    })
}
