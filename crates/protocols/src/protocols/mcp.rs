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
mod state;
mod tools;
mod watch;
mod wire;

pub use state::{McpCallGuard, McpCalls, McpListen, McpListens, McpSessions, McpState};

use axum::{Extension, extract::State, http::HeaderMap, response::Response};
use serde_json::Value;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::{
    ids::Tenant,
    protocols::Shared,
    protocols::{error::ApiError, json::ApiJson},
};

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    crate::protocols::Shared: axum::extract::FromRef<S>,
{
    OpenApiRouter::new().routes(routes!(mcp, mcp_stream))
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
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    ApiJson(message): ApiJson<Value>,
) -> Result<Response, ApiError> {
    // Both are echoed (the progress token on every progress frame), in
    // every version: bounded before anything reads them.
    let envelope = wire::Envelope::read(&message);
    let id = envelope.id.as_ref();
    let progress = envelope.progress_token();
    if !id.is_none_or(super::jsonrpc::valid_id) || !super::jsonrpc::valid_id(&progress) {
        let refused = axum::Json(super::jsonrpc::invalid_id());
        return Ok(axum::response::IntoResponse::into_response((
            axum::http::StatusCode::BAD_REQUEST,
            refused,
        )));
    }
    if current::asks_for(&headers, &message) {
        return current::answer(app, tenant, headers, &message).await;
    }
    legacy::answer(app, tenant, &headers, envelope).await
}

/// The notifications of an MCP session (versions up to 2025-11-25): that
/// a resource it subscribed to changed.
#[utoipa::path(
    get,
    path = "/mcp",
    tag = "mcp",
    params(
        ("Mcp-Session-Id" = String, Header, description = "The session `initialize` began (on this replica: it keeps the session's subscriptions)"),
    ),
    responses(
        (status = 200, description = "A stream of JSON-RPC notifications (`notifications/resources/updated`), until the client leaves or another `GET` of the session takes over", content_type = "text/event-stream", body = crate::protocols::native::stream::EventStream),
        (status = 400, description = "No `Mcp-Session-Id` (`invalid_header`)"),
        (status = 404, description = "A session this replica did not begin, or forgot (past 10,000 sessions, the idle ones) (`mcp_session_not_found`): send `initialize` again"),
    )
)]
async fn mcp_stream(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let session = headers
        .get("mcp-session-id")
        .ok_or(ApiError::InvalidHeader {
            name: "Mcp-Session-Id",
            detail: "the session `initialize` began is required".into(),
        })?;
    // A value that is not text names no session this process began.
    watch::stream(app, tenant, session.to_str().unwrap_or_default())
}
