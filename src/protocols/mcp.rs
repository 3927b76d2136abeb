//! `/mcp`: the service as an MCP server (streamable HTTP, JSON-RPC), so
//! that MCP hosts (desktop assistants, IDEs) can use this agent as a tool.
//!
//! Tools: `ask` runs a turn (its text streamed as `notifications/progress`
//! when the call names a progress token, its answer the result);
//! `list_sessions` and `get_session` read the caller's sessions. The same
//! keys and tenants hold as on every route. Each request is answered on
//! its own, by the version it speaks: 2026-07-28 (no handshake, `_meta` on
//! every request) by the official SDK's server ([`current`]), the versions
//! up to 2025-11-25 by [`legacy`].

mod current;
mod legacy;
mod prompts;
mod resources;
mod tools;

use axum::{Extension, extract::State, http::HeaderMap, response::Response};
use serde_json::Value;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::{
    app::AppState,
    ids::Tenant,
    protocols::{error::ApiError, json::ApiJson},
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(mcp))
}

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
    if current::asks_for(&headers, &message) {
        return current::answer(app, tenant, headers, &message).await;
    }
    legacy::answer(app, tenant, &headers, message).await
}
