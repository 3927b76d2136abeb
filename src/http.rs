//! The HTTP edge: routes, the OpenAPI document, middleware, error mapping.
//!
//! Each module exposes its own `router()`; handlers are thin and call the
//! runner or the store. `openapi.yaml` is generated from the same routes
//! (and a test keeps the checked-in copy equal to it).

pub(crate) mod admin;
mod auth;
mod conn_timer;
pub mod files;
mod health;
mod inflight;
mod limits;
#[macro_use]
pub mod listing;
pub mod memory;
mod origin;
mod page;
mod revocable;
pub mod server;
pub mod sessions;
pub mod tools;
mod usage;
mod users;
pub mod vault;
pub mod webhooks;

use std::sync::OnceLock;

use axum::{
    Extension, Router,
    extract::{DefaultBodyLimit, Request},
    http::{Method, header},
    response::{IntoResponse, Response},
};
use tower_http::{
    cors::{AllowOrigin, CorsLayer},
    request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer},
    trace::TraceLayer,
};
use utoipa::OpenApi;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::protocols::{
    self,
    endpoint::{known_session, not_found_in},
    error::{ApiError, Problem},
    json::{BodyLimit, BodyTimeout},
    native::{self as turns, stream::EventStream},
    paths::{ApiQuery, ArtifactPath, SessionPath, TurnPath},
};
use crate::{
    app::AppState,
    config::CorsOrigins,
    events::{EventEnvelope, TurnEvent},
    ids::SessionIdError,
};
pub use limits::HYPER_MAX_HEAD_BYTES;
pub use revocable::watch_revoked;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "agent-harness",
        description = "Runs one LLM agent turn per request and streams it over Server-Sent Events.",
        license(name = "Apache-2.0")
    ),
    tags(
        (name = "turns", description = "Start, follow and cancel turns"),
        (name = "sessions", description = "Sessions, their history and event log"),
        (name = "vault", description = "The notes folder the agent searches and edits"),
        (name = "memory", description = "What the service remembers of a user between turns"),
        (name = "a2a", description = "A2A 1.0 (JSON-RPC): a task is a turn, its context the session"),
        (name = "mcp", description = "The service as an MCP server (streamable HTTP): its `ask` tool runs a turn"),
        (name = "responses", description = "The OpenAI Responses API: a response is a turn, its conversation the session"),
        (name = "files", description = "A tenant's files: images, PDFs and text a turn's messages name"),
        (name = "operations", description = "Probes and the API description"),
    ),
    components(schemas(Problem, TurnEvent, EventEnvelope, EventStream))
)]
struct ApiDoc;

fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(turns::router())
        .merge(sessions::router())
        .merge(health::router())
        .merge(vault::router())
        .merge(tools::router())
        .merge(usage::router())
        .merge(webhooks::router())
        .merge(files::router())
        .merge(memory::router())
        .merge(users::router())
        .merge(admin::router())
        .merge(protocols::chat_completions::router())
        .merge(protocols::responses::router())
        .merge(protocols::mcp::router())
        .merge(protocols::a2a::router())
        .merge(protocols::ui_message::router())
        .merge(protocols::agui::router())
        .merge(page::router())
        .routes(routes!(openapi_document))
}

/// The OpenAPI document of the service.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, mut api) = api_router().split_for_parts();
    api.info.version = env!("CARGO_PKG_VERSION").to_owned();
    add_edge_responses(&mut api);
    webhooks::document(&mut api);
    api
}

/// Adds to every operation the answers the edge gives before (or around)
/// its handler, so that every status the server sends is documented
/// where it can be sent: any request can be malformed or too large in
/// its head; a route behind the key check can be refused or rate limited,
/// and its key check needs the database; a route with a body can get one
/// too large, too slow or of the wrong type.
fn add_edge_responses(api: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    let problem = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/problem+json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build()
    };
    let every: [(&str, &str); 5] = [
        ("400", "Bad request (see `code`)"),
        (
            "403",
            "A browser page of an origin that may not call the service (`origin_not_allowed`)",
        ),
        (
            "421",
            "With keys off, a `Host` that is not a loopback name (`host_not_allowed`)",
        ),
        ("414", "The path and query are too long (`uri_too_long`)"),
        ("431", "The headers are too large (`headers_too_large`)"),
    ];
    let keyed: [(&str, &str); 3] = [
        (
            "401",
            "With keys required: no key, or not a valid one (`unauthorized`)",
        ),
        (
            "429",
            "Too many (see `code`): the key's requests per minute (`rate_limited`), failed \
             authentications from this address (`too_many_auth_failures`), the tenant's \
             requests in flight (`too_many_streams`); where a turn starts, the tenant's running \
             turns (`tenant_busy`) or its tokens of the day (`quota_exceeded`)",
        ),
        ("503", "The service is unavailable (see `code`)"),
    ];
    let with_body: [(&str, &str); 4] = [
        ("408", "The body did not arrive in time (`request_timeout`)"),
        ("413", "The body is too large (`payload_too_large`)"),
        ("415", "The body is not JSON (`unsupported_media_type`)"),
        ("422", "JSON of the wrong shape (`invalid_body`)"),
    ];
    for (path, item) in api.paths.paths.iter_mut() {
        let open = OPEN_PATHS.contains(&path.as_str());
        for operation in [&mut item.get, &mut item.post, &mut item.delete]
            .into_iter()
            .flatten()
        {
            // Every error is a problem document: a route's annotation
            // says when, not what it is.
            for (status, response) in &mut operation.responses.responses {
                if let utoipa::openapi::RefOr::T(response) = response
                    && (status.starts_with('4') || status.starts_with('5'))
                    && response.content.is_empty()
                {
                    response.content.insert(
                        "application/problem+json".to_owned(),
                        ContentBuilder::new()
                            .schema(Some(Ref::from_schema_name("Problem")))
                            .build()
                            .into(),
                    );
                }
            }
            let has_body = operation.request_body.is_some();
            let statuses = every
                .iter()
                .chain(keyed.iter().filter(|_| !open))
                .chain(with_body.iter().filter(|_| has_body));
            for (status, description) in statuses {
                operation
                    .responses
                    .responses
                    .entry((*status).to_owned())
                    .or_insert_with(|| problem(description).into());
            }
        }
    }
}

/// The OpenAPI document of the service, as YAML.
pub fn openapi_yaml() -> &'static str {
    static YAML: OnceLock<String> = OnceLock::new();
    YAML.get_or_init(|| {
        openapi()
            .to_yaml()
            .unwrap_or_else(|e| format!("# cannot render the OpenAPI document: {e}\n"))
    })
}

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.yaml",
    tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 description (a YAML document: a map)", content_type = "application/yaml", body = Object))
)]
async fn openapi_document() -> Response {
    ([(header::CONTENT_TYPE, "application/yaml")], openapi_yaml()).into_response()
}

/// Request headers a browser may send (besides the CORS-safelisted ones).
const CORS_ALLOW_HEADERS: [header::HeaderName; 5] = [
    header::CONTENT_TYPE,
    header::AUTHORIZATION,
    header::HeaderName::from_static("last-event-id"),
    header::HeaderName::from_static("idempotency-key"),
    header::HeaderName::from_static("x-request-id"),
];

/// Response headers a browser script may read.
const CORS_EXPOSE_HEADERS: [header::HeaderName; 5] = [
    header::HeaderName::from_static("x-turn-id"),
    header::CONTENT_LOCATION,
    header::HeaderName::from_static("idempotent-replayed"),
    header::RETRY_AFTER,
    header::HeaderName::from_static("x-request-id"),
];

/// The CORS layer of the settings' origins (validated at start).
fn cors_layer(origins: &CorsOrigins) -> CorsLayer {
    let allow_origin = match origins {
        CorsOrigins::Any => AllowOrigin::any(),
        CorsOrigins::List(list) => AllowOrigin::list(
            list.iter()
                .filter_map(|o| header::HeaderValue::from_str(o).ok()),
        ),
    };
    CorsLayer::new()
        .allow_origin(allow_origin)
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers(CORS_ALLOW_HEADERS)
        .expose_headers(CORS_EXPOSE_HEADERS)
        .max_age(std::time::Duration::from_secs(600))
}

/// `/metrics` alone, for the listener `HARNESS_METRICS_LISTEN` names.
pub fn metrics_router(app: AppState) -> Router {
    let (routes, _) = OpenApiRouter::new()
        .merge(health::metrics_router())
        .split_for_parts();
    routes.with_state(app)
}

/// With `HARNESS_METRICS_LISTEN`, the main listener has no `/metrics`.
async fn metrics_elsewhere(request: Request, next: axum::middleware::Next) -> Response {
    if request.uri().path() == "/metrics" {
        return ApiError::NotFound.into_response();
    }
    next.run(request).await
}

/// Paths anyone may ask for: probes, metrics, the contract and the page.
const OPEN_PATHS: &[&str] = &[
    "/",
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.yaml",
    "/.well-known/agent-card.json",
    "/a2a/.well-known/agent-card.json",
];

/// The whole HTTP application.
pub fn router(app: AppState) -> Router {
    let body_limit = app.settings.server.body_limit_bytes;
    let body_timeout = std::time::Duration::from_secs(app.settings.server.body_read_timeout_s);
    let cors = app.settings.server.cors_origins.clone();
    let (routes, _) = api_router().split_for_parts();
    let max_connections = app
        .settings
        .server
        .max_connections
        .unwrap_or_else(server::default_max_connections);
    let in_flight = inflight::InFlight::new(max_connections);
    let auth = auth::Auth::new(&app, in_flight.clone());
    let routes = routes
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            auth::check_owner,
        ))
        .fallback(fallback)
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::middleware::from_fn_with_state(
            (app.clone(), in_flight),
            inflight::admit,
        ))
        .layer(axum::middleware::from_fn_with_state(
            (app.clone(), auth),
            auth::authenticate,
        ))
        .layer(axum::middleware::from_fn_with_state(
            std::sync::Arc::new(origin::OriginGuard::new(&app.settings)),
            origin::guard,
        ))
        .layer(Extension(BodyLimit(body_limit)))
        .layer(Extension(BodyTimeout(body_timeout)))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn_with_state(
            limits::BodyLimits {
                body: body_limit,
                file: app.settings.server.file_max_bytes,
            },
            limits::request_head,
        ))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(
            TraceLayer::new_for_http().make_span_with(|request: &Request| {
                let request_id = request
                    .headers()
                    .get("x-request-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let span = tracing::info_span!(
                    "http.request",
                    otel.kind = "server",
                    http.request.method = %request.method(),
                    url.path = %request.uri().path(),
                    request.id = %request_id,
                );
                // The caller's trace, when it sent one: the request and
                // the turn it starts are spans of it.
                if request.headers().contains_key("traceparent") {
                    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
                    let _ = span.set_parent(crate::telemetry::remote_context(request.headers()));
                }
                span
            }),
        )
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(axum::middleware::map_response(json_is_not_cached));
    let routes = if app.settings.server.metrics_listen.is_some() {
        routes.layer(axum::middleware::from_fn(metrics_elsewhere))
    } else {
        routes
    };
    // Outermost: a preflight is answered before routing, and every answer
    // (errors too) carries the CORS headers.
    match cors {
        Some(origins) => routes.layer(cors_layer(&origins)),
        None => routes,
    }
    .with_state(app)
}

/// JSON answers (turns, sessions, memories, keys, problems) hold a
/// conversation's content: never cached by a proxy or browser, never
/// sniffed as anything else.
async fn json_is_not_cached(mut response: Response) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.starts_with("application/json") || v.starts_with("application/problem+json")
        });
    if is_json {
        let headers = response.headers_mut();
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            header::HeaderValue::from_static("nosniff"),
        );
        headers.insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-store"),
        );
    }
    response
}

/// No route matched. A path with an empty session segment
/// (`/sessions//turns`) gets the session-id error it deserves.
async fn fallback(request: Request) -> ApiError {
    let path = request.uri().path();
    if let Some(rest) = path.strip_prefix("/sessions/")
        && (rest.is_empty() || rest.starts_with('/'))
    {
        return ApiError::InvalidSessionId(SessionIdError::Empty);
    }
    ApiError::NotFound
}
