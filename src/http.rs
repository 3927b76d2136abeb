//! The HTTP edge: routes, the OpenAPI document, middleware, error mapping.
//!
//! Each module exposes its own `router()`; handlers are thin and call the
//! runner or the store. `openapi.yaml` is generated from the same routes
//! (and a test keeps the checked-in copy equal to it).

mod auth;
mod conn_timer;
pub mod error;
pub mod formats;
mod health;
mod inflight;
pub mod json;
mod limits;
pub mod memory;
mod origin;
mod page;
pub(crate) mod schemas;
pub mod server;
pub mod sessions;
pub mod tools;
pub mod turns;
mod usage;
pub mod vault;

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
use uuid::Uuid;

use crate::{
    app::AppState,
    config::CorsOrigins,
    events::{EventEnvelope, TurnEvent},
    ids::{SessionId, SessionIdError, SessionKey},
};
pub use auth::Tenant;
use error::{ApiError, Problem};
use json::{BodyLimit, BodyTimeout};
pub use limits::HYPER_MAX_HEAD_BYTES;

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
        .merge(memory::router())
        .merge(formats::chat_completions::router())
        .merge(formats::responses::router())
        .merge(formats::mcp::router())
        .merge(formats::a2a::router())
        .merge(formats::ui_message::router())
        .merge(formats::agui::router())
        .merge(page::router())
        .routes(routes!(openapi_document))
}

/// The OpenAPI document of the service.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, mut api) = api_router().split_for_parts();
    api.info.version = env!("CARGO_PKG_VERSION").to_owned();
    add_edge_responses(&mut api);
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
            body_limit,
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

/// One event of a `text/event-stream` body (the schema is of each event,
/// as OpenAPI 3.2's `itemSchema` says it and SSE clients read it). On the
/// native routes each event is an `id:` line (its `seq`), an `event:`
/// line (its `type`) and one `data:` line holding an `EventEnvelope` as
/// JSON, then a blank line; lines that start with `:` are keep-alive
/// comments. The stream ends after the turn's terminal event
/// (`turn.completed`, `turn.failed`, `turn.cancelled`,
/// `turn.interrupted`); a stream that cannot read the log ends with a
/// `turn.failed` (`event_log_unavailable`) without `id:`.
#[derive(utoipa::ToSchema)]
#[expect(dead_code, reason = "describes the stream; the SSE encoder writes it")]
pub(crate) struct EventStream {
    /// `event:`: the event's type, where the format names one.
    event: Option<String>,
    /// `data:`: the event, as JSON (`[DONE]` ends the AI SDK's stream).
    data: String,
    /// `id:`: the event's `seq`, where the format resumes.
    id: Option<String>,
    /// `retry:`, never sent.
    retry: Option<u64>,
}

/// A route's query string as `T`; one that does not parse is refused with
/// 400 `invalid_query` (its reason in `detail`), before the handler runs.
pub(crate) struct ApiQuery<T>(pub T);

impl<S, T> axum::extract::FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(query)| Self(query))
            .map_err(|e| ApiError::InvalidQuery(e.body_text()))
    }
}

/// The session a route's `{session_id}` names, as the caller's tenant's
/// session (an id that is not one is refused with 400
/// `invalid_session_id`, before the handler runs).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct SessionPath {
    /// 1-128 characters of `[A-Za-z0-9._:-]`
    #[param(value_type = String, pattern = r"^[A-Za-z0-9._:-]{1,128}$", min_length = 1, max_length = 128)]
    pub session_id: SessionKey,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for SessionPath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        let params = axum::extract::RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(not_utf8)?;
        let raw = params
            .iter()
            .find(|(name, _)| *name == "session_id")
            .map(|(_, value)| value.to_owned())
            .ok_or_else(|| ApiError::Internal("the route has no {session_id}".into()))?;
        let tenant = parts
            .extensions
            .get::<Tenant>()
            .ok_or_else(|| ApiError::Internal("no tenant for the request".into()))?;
        Ok(Self {
            session_id: parse_session_id(&raw, tenant)?,
        })
    }
}

/// A route's `{turn_id}` beside its `{session_id}` (parsed by the handler:
/// 400 `invalid_turn_id`).
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct TurnPath {
    /// The turn's id
    #[param(value_type = Uuid)]
    pub turn_id: String,
}

/// A route's `{artifact_id}` beside its `{session_id}`.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct ArtifactPath {
    pub artifact_id: String,
}

/// A route's `{turn_id}` and `{call_id}` (an approval's).
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct CallPath {
    /// The turn's id
    #[param(value_type = Uuid)]
    pub turn_id: String,
    /// The call's id, as `approval.requested` names it
    #[param(pattern = "^[A-Za-z0-9_.:-]{1,200}$")]
    pub call_id: String,
}

/// A path whose parameter is not UTF-8 once percent-decoded (`%FF`): the
/// parameter's own 400, named by axum's message (``… in `turn_id` ``).
fn not_utf8(rejection: axum::extract::rejection::RawPathParamsRejection) -> ApiError {
    let text = rejection.body_text();
    if text.contains("`session_id`") {
        ApiError::InvalidSessionId(crate::ids::SessionIdError::BadCharacter)
    } else if text.contains("`turn_id`") {
        ApiError::InvalidTurnId
    } else {
        ApiError::InvalidQuery(text)
    }
}

/// The caller's session of a client's id: ids are per tenant, so the
/// key alone can only ever reach the caller's own sessions.
pub(crate) fn parse_session_id(raw: &str, tenant: &Tenant) -> Result<SessionKey, ApiError> {
    let id = SessionId::parse(raw).map_err(ApiError::InvalidSessionId)?;
    Ok(SessionKey::new(&tenant.0, &id))
}

/// The problem a turn that could not start answers with.
impl From<crate::runner::StartError> for ApiError {
    fn from(e: crate::runner::StartError) -> Self {
        use crate::runner::StartError;
        match e {
            StartError::AlreadyRunning(id) => Self::TurnAlreadyRunning(id),
            StartError::IdempotencyMismatch(id) => Self::IdempotencyKeyReused(id),
            StartError::ShuttingDown => Self::ShuttingDown,
            StartError::SessionNotFound => Self::SessionNotFound,
            StartError::ModelNotAllowed { model, allowed } => {
                Self::ModelNotAllowed { model, allowed }
            }
            StartError::TenantBusy(most) => Self::TenantBusy(most),
            StartError::QuotaExceeded {
                used,
                limit,
                retry_after,
            } => Self::QuotaExceeded {
                used,
                limit,
                retry_after,
            },
            e @ StartError::ClientToolsTooLarge { .. } => Self::InvalidField {
                field: "client_tools".into(),
                detail: format!("{e} (HARNESS_CLIENT_TOOLS_MAX_BYTES)"),
            },
            StartError::Store(e) => e.into(),
        }
    }
}

/// A turn's committed events from its start, for the wire formats that
/// stream a turn they started.
pub(crate) fn follow_started(
    app: &AppState,
    session_id: &SessionKey,
    started: crate::runner::StartedTurn,
) -> futures::stream::BoxStream<
    'static,
    Result<std::sync::Arc<crate::events::StoredEvent>, crate::store::StoreError>,
> {
    use futures::StreamExt;
    let session = session_id.as_str().to_owned();
    match started.live {
        Some(start) => app.runner.subscribe_started(session, start).boxed(),
        None => app
            .runner
            .subscribe(session, started.turn_id, started.first_seq - 1)
            .boxed(),
    }
}

/// A client's history may carry `system` messages only when the operator
/// allows it (`HARNESS_ALLOW_CLIENT_SYSTEM_MESSAGES`): the model trusts a
/// system message, and a client's text is not to be trusted.
pub(crate) fn refuse_client_system(allowed: bool) -> Result<(), ApiError> {
    if allowed {
        return Ok(());
    }
    Err(ApiError::InvalidHistoryRole(
        "the history holds a `system` (or `developer`) message; the service takes instructions \
         only from its operator (HARNESS_ALLOW_CLIENT_SYSTEM_MESSAGES allows them)"
            .into(),
    ))
}

/// The turn a chat wire format asks for when it sends the whole
/// conversation (`messages` as role and text, at most 1,000): the newest
/// must be the user's and is the turn's message; the earlier user and
/// assistant messages are its history, and system (or developer) ones
/// too where the operator allows them (see [`refuse_client_system`]).
pub(crate) fn conversation_turn(
    messages: &[(&str, String)],
    allow_system: bool,
) -> Result<crate::turn::TurnRequest, ApiError> {
    use crate::providers::{ChatMessage, Role};
    let invalid = |detail: &str| ApiError::InvalidField {
        field: "messages".into(),
        detail: detail.into(),
    };
    let Some(((role, message), earlier)) = messages.split_last() else {
        return Err(invalid("`messages` must not be empty"));
    };
    if messages.len() > 1000 {
        return Err(invalid("`messages` has more than 1000 messages"));
    }
    if *role != "user" {
        return Err(invalid("the last message must be the user's"));
    }
    if message.trim().is_empty() {
        return Err(ApiError::MessageRequired);
    }
    if messages.iter().any(|(_, text)| text.contains('\0')) {
        return Err(invalid("a message contains U+0000"));
    }
    if earlier
        .iter()
        .any(|(role, _)| role.parse() == Ok(Role::System))
    {
        refuse_client_system(allow_system)?;
    }
    let history = earlier
        .iter()
        .filter_map(|(role, text)| {
            // A client's tool results (and unknown roles) are left out.
            let role = role
                .parse::<Role>()
                .ok()
                .filter(|r| r.is_conversational())?;
            Some(ChatMessage::new(role, text.clone()))
        })
        .collect();
    Ok(crate::turn::TurnRequest {
        history: Some(history),
        ..crate::turn::TurnRequest::new(message.clone())
    })
}

/// The turn once it ended, for a caller that waits for its answer
/// (503 `shutting_down` when the process stops first).
pub(crate) async fn ended_turn(
    app: &AppState,
    session_id: &SessionKey,
    turn_id: uuid::Uuid,
) -> Result<crate::store::TurnRecord, ApiError> {
    app.runner
        .wait_for_end(session_id, turn_id)
        .await?
        .ok_or(ApiError::ShuttingDown)
}

/// A chat message's text: its `content` string, or the `text` of each of
/// its parts, a line each.
pub(crate) fn content_text(content: &Option<serde_json::Value>) -> String {
    use serde_json::Value;
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A completed tool call's output as the wire formats carry it (one text):
/// its first 2,000 characters, and where the whole is when it is longer.
pub(crate) fn shown_tool_output(output: Option<String>, artifact_id: Option<&str>) -> String {
    let mut text = output.unwrap_or_default();
    if let Some(id) = artifact_id {
        text.push_str(&format!(
            "\n[the output goes on: the whole is artifact {id} of this session]"
        ));
    }
    text
}

/// The session, or 404 `session_not_found`.
pub(crate) async fn known_session(
    app: &AppState,
    session_id: &SessionKey,
) -> Result<crate::store::SessionRecord, ApiError> {
    app.store
        .get_session(session_id.as_str())
        .await?
        .ok_or(ApiError::SessionNotFound)
}

/// What a route answers when the thing it names is not in the session:
/// `session_not_found` when the session itself does not exist (looked up
/// only on this path, so a found turn costs one read), else `missing`.
pub(crate) async fn not_found_in(
    app: &AppState,
    session_id: &SessionKey,
    missing: ApiError,
) -> ApiError {
    match app.store.get_session(session_id.as_str()).await {
        Ok(Some(_)) => missing,
        Ok(None) => ApiError::SessionNotFound,
        Err(e) => e.into(),
    }
}

pub(crate) fn parse_turn_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::InvalidTurnId)
}
