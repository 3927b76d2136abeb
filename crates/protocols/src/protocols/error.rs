//! The one error type of the HTTP edge, rendered as `application/problem+json`
//! (RFC 9457) with a stable `code`.

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::{ids::SessionIdError, service::TurnStatus};

/// `400`: a bad request (see `code`), for the OpenAPI description of the
/// routes that answer it.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 400,
    description = "Bad request (see `code`)",
    content_type = "application/problem+json"
)]
pub struct BadRequest(pub Problem);

/// `404`: no such resource (see `code`).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 404,
    description = "Not found (see `code`)",
    content_type = "application/problem+json"
)]
pub struct NotFound(pub Problem);

/// `422`: a body that parses but is not valid (see `code`).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 422,
    description = "Invalid body (see `code`)",
    content_type = "application/problem+json"
)]
pub struct InvalidBody(pub Problem);

/// `409 turn_already_running`: a request for a turn in a session (a chat,
/// a thread, a conversation) that has one running.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 409,
    description = "The session already has a running turn (`turn_already_running`)",
    content_type = "application/problem+json"
)]
pub struct TurnAlreadyRunning(pub Problem);

/// A problem document (RFC 9457) with this service's extensions.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    /// `urn:agent-harness:problem:<code>`.
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Stable machine-readable code.
    pub code: String,
    /// The turn concerned, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<Uuid>,
    /// The request field at fault, as a path (`history[2].role`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// Every way a request can fail. Each variant documents its status and code.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 `invalid_json`: the body is not JSON.
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    /// 422 `invalid_body`: JSON of the wrong shape (wrong type, unknown field).
    #[error("{detail}")]
    InvalidBody {
        detail: String,
        field: Option<String>,
    },
    /// 422 `message_required`: `message` missing, null or blank.
    #[error("`message` is required and must not be empty")]
    MessageRequired,
    /// 422 `invalid_field`: a field with a value out of its range.
    #[error("{detail}")]
    InvalidField { field: String, detail: String },
    /// 422 `invalid_history_role`: a client's history holds a `system`
    /// (or `developer`) message, and the operator does not allow it.
    #[error("{0}")]
    InvalidHistoryRole(String),
    /// 400 `invalid_session_id`.
    #[error("invalid session id: {0}")]
    InvalidSessionId(SessionIdError),
    /// 400 `invalid_user_id`: a user id in a path.
    #[error("invalid user id: {0}")]
    InvalidUserId(SessionIdError),
    /// 400 `invalid_tenant`: a tenant's name is not valid.
    #[error("invalid tenant: {0}")]
    InvalidTenant(SessionIdError),
    /// 400 `invalid_turn_id`: not a UUID.
    #[error("turn id must be a UUID")]
    InvalidTurnId,
    /// 400 `invalid_query`.
    #[error("{0}")]
    InvalidQuery(String),
    /// 400 `invalid_header`.
    #[error("invalid {name} header: {detail}")]
    InvalidHeader { name: &'static str, detail: String },
    /// 400 `malformed_request`: not a request the service can read safely
    /// (a head hyper cannot parse, a body framed both by `Content-Length`
    /// and `Transfer-Encoding`); the connection is closed.
    #[error("{0}")]
    MalformedRequest(String),
    /// 415 `unsupported_media_type`.
    #[error("request body must be application/json")]
    UnsupportedMediaType,
    /// 413 `payload_too_large`.
    #[error("request body exceeds the limit of {0} bytes")]
    PayloadTooLarge(usize),
    /// 404 `session_not_found`.
    #[error("session not found")]
    SessionNotFound,
    /// 404 `turn_not_found`.
    #[error("turn not found in this session")]
    TurnNotFound,
    /// 404 `response_not_found`: no such response of the caller's (or it
    /// was deleted).
    #[error("response not found")]
    ResponseNotFound,
    /// 409 `response_in_progress`: a running response cannot be deleted.
    #[error("the response is in progress; cancel it first")]
    ResponseInProgress(Uuid),
    /// 422 `unsupported_parameter`: a client protocol's parameter the
    /// service does not take.
    #[error("{detail}")]
    Unsupported { field: String, detail: String },
    /// 422 `model_not_allowed`: the request names a model the operator
    /// did not configure (the chain's and `[providers.models]`'s).
    #[error("the model {model:?} is not offered here; allowed: {}", allowed.join(", "))]
    ModelNotAllowed { model: String, allowed: Vec<String> },
    /// 404 `call_not_found`: the turn asked the client for no such call.
    #[error("the turn asked for no such call")]
    CallNotFound,
    /// 409 `tool_result_already_posted`.
    #[error("the call already has its result")]
    ToolResultAlreadyPosted,
    /// 404 `artifact_not_found`.
    #[error("artifact not found in this session")]
    ArtifactNotFound,
    /// 404 `vault_not_found`: the configured vault folder does not exist.
    #[error("the vault folder {0} does not exist")]
    VaultNotFound(String),
    /// 409 `approval_already_decided`.
    #[error("the call was already approved or denied")]
    ApprovalAlreadyDecided,
    /// 429 `rate_limited`: the key used up its requests; retry after the
    /// seconds given.
    #[error("too many requests for this key; retry in {0} s")]
    RateLimited(u64),
    /// 429 `too_many_auth_failures`: this client address failed to
    /// authenticate too often; retry after the seconds given.
    #[error("too many failed authentications from this address; retry in {0} s")]
    AuthThrottled(u64),
    /// 429 `tenant_busy`: the tenant runs as many turns as it may
    /// (`HARNESS_TENANT_MAX_RUNNING_TURNS`, across replicas).
    #[error("this tenant runs {0} turns, as many as it may at once; retry when one ends")]
    TenantBusy(u32),
    /// 429 `too_many_streams`: the tenant has as many requests in flight
    /// in this process as it may (`HARNESS_TENANT_MAX_STREAMS`), or every
    /// connection left for requests is taken.
    #[error("{0}")]
    TooManyStreams(String),
    /// 429 `quota_exceeded`: the tenant used its tokens of the UTC day.
    #[error("this tenant used {used} of its {limit} tokens of today (UTC); retry after the reset")]
    QuotaExceeded {
        used: u64,
        limit: u64,
        retry_after: u64,
    },
    /// 421 `host_not_allowed`: with keys off, the request's `Host` is not
    /// a loopback name (a page that rebound its name to this service).
    #[error("the Host {0:?} is not served here: with keys off, use localhost, 127.0.0.1 or [::1]")]
    HostNotAllowed(String),
    /// 403 `origin_not_allowed`: a browser page of an origin that may not
    /// call the service.
    #[error("the origin {0:?} may not call this service (HARNESS_ALLOWED_ORIGINS)")]
    OriginNotAllowed(String),
    /// 403 `admin_required`: an admin route asked with a tenant's key
    /// (or, with keys off, without `HARNESS_ALLOW_LOCAL_ADMIN`).
    #[error("this route needs an admin key (agent-harness keys create --admin)")]
    AdminRequired,
    /// 422 `invalid_import`: an export that cannot be imported (its line
    /// and what is wrong).
    #[error("{0}")]
    InvalidImport(String),
    /// 409 `session_exists`: an import of a session the tenant has.
    #[error("the tenant has a session of that id already")]
    SessionExists,
    /// 409 `import_conflict`: an import whose ids (of `table`) are taken
    /// in this deployment.
    #[error("ids of the export's {0} are taken here (it was imported before, for another tenant)")]
    ImportConflict(&'static str),
    /// 401 `unauthorized`: no key, or not a valid one.
    #[error("a valid API key is required (Authorization: Bearer <key>)")]
    Unauthorized,
    /// 404 `checkpoint_not_found`.
    #[error("checkpoint not found")]
    CheckpointNotFound,
    /// 404 `webhook_not_found`: no such endpoint of the caller's.
    #[error("webhook not found")]
    WebhookNotFound,
    /// 404 `user_not_found`: no session and no memory of the user, in the
    /// caller's tenant.
    #[error("no such user")]
    UserNotFound,
    /// 409 `webhook_limit_reached`: the tenant has as many endpoints as it
    /// may.
    #[error("this tenant has {0} webhook endpoints, as many as it may; delete one first")]
    WebhookLimit(u32),
    /// 404 `mcp_session_not_found`: an MCP session (up to 2025-11-25)
    /// this process did not begin, or forgot; the client begins another.
    #[error("no such MCP session here: send `initialize` for a new one")]
    McpSessionNotFound,
    /// 409 `checkpoint_already_restored`.
    #[error("the checkpoint was already restored (its own restore made a checkpoint to undo it)")]
    CheckpointAlreadyRestored,
    /// 409 `note_refused`: the note cannot be changed now (its path leads
    /// out of the vault, it grew too large).
    #[error("{0}")]
    NoteRefused(String),
    /// 404 `not_found`: no such route.
    #[error("no such resource")]
    NotFound,
    /// 405 `method_not_allowed`.
    #[error("method not allowed on this resource")]
    MethodNotAllowed,
    /// 409 `turn_already_running`.
    #[error("the session already has a running turn {0}")]
    TurnAlreadyRunning(Uuid),
    /// 409 `turn_running`: the session's turn did not end in time for
    /// the session to be erased.
    #[error("the session's turn {0} is still running")]
    TurnRunning(Uuid),
    /// 409 `turn_not_running`.
    #[error("the turn is not running (status {status})")]
    TurnNotRunning { turn_id: Uuid, status: TurnStatus },
    /// 422 `idempotency_key_reused`.
    #[error("the idempotency key was already used for a different request")]
    IdempotencyKeyReused(Uuid),
    /// 502 for provider failures, 500 otherwise; `code` is the turn's.
    #[error("{message}")]
    TurnFailed {
        turn_id: Uuid,
        code: String,
        message: String,
    },
    /// 409 `turn_cancelled`.
    #[error("the turn was cancelled")]
    TurnCancelled(Uuid),
    /// 503 `turn_interrupted`.
    #[error("the turn was interrupted before it finished")]
    TurnInterrupted(Uuid),
    /// 408 `request_timeout`.
    #[error("the request body did not arrive within {0} s")]
    RequestTimeout(u64),
    /// 414 `uri_too_long`.
    #[error("the path and query are longer than {0} bytes")]
    UriTooLong(usize),
    /// 431 `headers_too_large`.
    #[error("the request headers are larger than {0} bytes")]
    HeadersTooLarge(usize),
    /// 503 `shutting_down`.
    #[error("the service is shutting down")]
    ShuttingDown,
    /// 503 `store_unavailable`.
    #[error("the database is unavailable")]
    StoreUnavailable(String),
    /// 500 `internal`.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidJson(_)
            | Self::InvalidSessionId(_)
            | Self::InvalidUserId(_)
            | Self::InvalidTenant(_)
            | Self::InvalidTurnId
            | Self::InvalidQuery(_)
            | Self::InvalidHeader { .. }
            | Self::MalformedRequest(_) => StatusCode::BAD_REQUEST,
            Self::InvalidBody { .. }
            | Self::MessageRequired
            | Self::InvalidField { .. }
            | Self::InvalidHistoryRole(_)
            | Self::Unsupported { .. }
            | Self::ModelNotAllowed { .. }
            | Self::InvalidImport(_)
            | Self::IdempotencyKeyReused(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::OriginNotAllowed(_) | Self::AdminRequired => StatusCode::FORBIDDEN,
            Self::HostNotAllowed(_) => StatusCode::MISDIRECTED_REQUEST,
            Self::RateLimited(_)
            | Self::AuthThrottled(_)
            | Self::TenantBusy(_)
            | Self::TooManyStreams(_)
            | Self::QuotaExceeded { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::UriTooLong(_) => StatusCode::URI_TOO_LONG,
            Self::HeadersTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::SessionNotFound
            | Self::TurnNotFound
            | Self::ResponseNotFound
            | Self::CallNotFound
            | Self::ArtifactNotFound
            | Self::VaultNotFound(_)
            | Self::CheckpointNotFound
            | Self::McpSessionNotFound
            | Self::WebhookNotFound
            | Self::UserNotFound
            | Self::NotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::TurnAlreadyRunning(_)
            | Self::TurnRunning(_)
            | Self::TurnNotRunning { .. }
            | Self::ResponseInProgress(_)
            | Self::ToolResultAlreadyPosted
            | Self::TurnCancelled(_)
            | Self::CheckpointAlreadyRestored
            | Self::ApprovalAlreadyDecided
            | Self::WebhookLimit(_)
            | Self::SessionExists
            | Self::ImportConflict(_)
            | Self::NoteRefused(_) => StatusCode::CONFLICT,
            Self::TurnFailed { code, .. } if code.starts_with("provider_") => {
                StatusCode::BAD_GATEWAY
            }
            Self::TurnFailed { .. } | Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::TurnInterrupted(_) | Self::ShuttingDown | Self::StoreUnavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    pub fn code(&self) -> &str {
        match self {
            Self::InvalidJson(_) => "invalid_json",
            Self::InvalidBody { .. } => "invalid_body",
            Self::MessageRequired => "message_required",
            Self::InvalidField { .. } => "invalid_field",
            Self::InvalidHistoryRole(_) => "invalid_history_role",
            Self::InvalidSessionId(_) => "invalid_session_id",
            Self::InvalidUserId(_) => "invalid_user_id",
            Self::InvalidTenant(_) => "invalid_tenant",
            Self::InvalidTurnId => "invalid_turn_id",
            Self::InvalidQuery(_) => "invalid_query",
            Self::InvalidHeader { .. } => "invalid_header",
            Self::MalformedRequest(_) => "malformed_request",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::RequestTimeout(_) => "request_timeout",
            Self::UriTooLong(_) => "uri_too_long",
            Self::HeadersTooLarge(_) => "headers_too_large",
            Self::PayloadTooLarge(_) => "payload_too_large",
            Self::SessionNotFound => "session_not_found",
            Self::TurnNotFound => "turn_not_found",
            Self::ArtifactNotFound => "artifact_not_found",
            Self::ResponseNotFound => "response_not_found",
            Self::CallNotFound => "call_not_found",
            Self::ModelNotAllowed { .. } => "model_not_allowed",
            Self::ToolResultAlreadyPosted => "tool_result_already_posted",
            Self::ResponseInProgress(_) => "response_in_progress",
            Self::Unsupported { .. } => "unsupported_parameter",
            Self::VaultNotFound(_) => "vault_not_found",
            Self::CheckpointNotFound => "checkpoint_not_found",
            Self::McpSessionNotFound => "mcp_session_not_found",
            Self::WebhookNotFound => "webhook_not_found",
            Self::UserNotFound => "user_not_found",
            Self::WebhookLimit(_) => "webhook_limit_reached",
            Self::Unauthorized => "unauthorized",
            Self::AdminRequired => "admin_required",
            Self::InvalidImport(_) => "invalid_import",
            Self::SessionExists => "session_exists",
            Self::ImportConflict(_) => "import_conflict",
            Self::RateLimited(_) => "rate_limited",
            Self::AuthThrottled(_) => "too_many_auth_failures",
            Self::TenantBusy(_) => "tenant_busy",
            Self::TooManyStreams(_) => "too_many_streams",
            Self::QuotaExceeded { .. } => "quota_exceeded",
            Self::HostNotAllowed(_) => "host_not_allowed",
            Self::OriginNotAllowed(_) => "origin_not_allowed",
            Self::ApprovalAlreadyDecided => "approval_already_decided",
            Self::CheckpointAlreadyRestored => "checkpoint_already_restored",
            Self::NoteRefused(_) => "note_refused",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::TurnAlreadyRunning(_) => "turn_already_running",
            Self::TurnRunning(_) => "turn_running",
            Self::TurnNotRunning { .. } => "turn_not_running",
            Self::IdempotencyKeyReused(_) => "idempotency_key_reused",
            Self::TurnFailed { code, .. } => code,
            Self::TurnCancelled(_) => "turn_cancelled",
            Self::TurnInterrupted(_) => "turn_interrupted",
            Self::ShuttingDown => "shutting_down",
            Self::StoreUnavailable(_) => "store_unavailable",
            Self::Internal(_) => "internal",
        }
    }

    fn turn_id(&self) -> Option<Uuid> {
        match self {
            Self::TurnAlreadyRunning(id)
            | Self::TurnRunning(id)
            | Self::IdempotencyKeyReused(id)
            | Self::TurnCancelled(id)
            | Self::TurnInterrupted(id)
            | Self::TurnNotRunning { turn_id: id, .. }
            | Self::ResponseInProgress(id)
            | Self::TurnFailed { turn_id: id, .. } => Some(*id),
            _ => None,
        }
    }

    fn field(&self) -> Option<String> {
        match self {
            Self::InvalidBody { field, .. } => field.clone(),
            Self::InvalidField { field, .. } | Self::Unsupported { field, .. } => {
                Some(field.clone())
            }
            Self::MessageRequired => Some("message".to_owned()),
            Self::InvalidHistoryRole(_) => Some("history".to_owned()),
            _ => None,
        }
    }

    /// `Retry-After` (seconds) of an answer worth repeating later: the
    /// database is down (it often is back within a second or two), or
    /// this instance is shutting down (another replica answers sooner).
    pub fn retry_after(&self) -> Option<&'static str> {
        match self {
            Self::StoreUnavailable(_) | Self::TenantBusy(_) | Self::TooManyStreams(_) => Some("1"),
            Self::ShuttingDown => Some("5"),
            _ => None,
        }
    }

    pub fn to_problem(&self) -> Problem {
        let status = self.status();
        let code = self.code().to_owned();
        Problem {
            problem_type: format!("urn:agent-harness:problem:{code}"),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: self.to_string(),
            code,
            turn_id: self.turn_id(),
            field: self.field(),
        }
    }
}

impl From<crate::service::StoreError> for ApiError {
    fn from(e: crate::service::StoreError) -> Self {
        use crate::service::StoreError;
        match e {
            StoreError::Database(
                sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::Io(_)
                | sqlx::Error::WorkerCrashed,
            )
            | StoreError::Unavailable(_) => Self::StoreUnavailable(e.to_string()),
            other => Self::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            Self::Internal(cause) => tracing::error!(error = %cause, "internal error"),
            Self::StoreUnavailable(cause) => tracing::warn!(error = %cause, "store unavailable"),
            _ => {}
        }
        let problem = self.to_problem();
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        // Also set here, not only by the router's layer: some problems are
        // answered outside the router (a request refused below it).
        let mut response = (
            self.status(),
            [
                (header::CONTENT_TYPE, "application/problem+json"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            body,
        )
            .into_response();
        if let Some(seconds) = self.retry_after() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static(seconds));
        }
        if let Self::RateLimited(seconds)
        | Self::AuthThrottled(seconds)
        | Self::QuotaExceeded {
            retry_after: seconds,
            ..
        } = self
            && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        if matches!(self, Self::Unauthorized) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if matches!(
            self,
            Self::RequestTimeout(_) | Self::MalformedRequest(_) | Self::PayloadTooLarge(_)
        ) {
            // The rest of the body may still be on its way (or its framing
            // cannot be trusted): do not reuse the connection.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// A note the vault refused, or could not write.
impl From<crate::vault::NoteError> for ApiError {
    fn from(e: crate::vault::NoteError) -> Self {
        match e {
            crate::vault::NoteError::Store(e) => e.into(),
            crate::vault::NoteError::Io(detail) => Self::Internal(detail),
            refused => Self::NoteRefused(refused.to_string()),
        }
    }
}

/// The vault folder or its index.
impl From<crate::vault::VaultError> for ApiError {
    fn from(e: crate::vault::VaultError) -> Self {
        match e {
            crate::vault::VaultError::Missing(path) => {
                Self::VaultNotFound(path.display().to_string())
            }
            crate::vault::VaultError::Store(e) => e.into(),
            crate::vault::VaultError::Io(detail) => Self::Internal(detail),
        }
    }
}
