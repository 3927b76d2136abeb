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

/// When an error is worth asking again.
#[derive(Debug, Clone, Copy)]
enum RetryAfter {
    Never,
    Seconds(u64),
}

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

/// Every way a request can fail; [`ApiError::answered`] says each one's
/// status, code and `Retry-After`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON.
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    /// JSON of the wrong shape (wrong type, unknown field).
    #[error("{detail}")]
    InvalidBody {
        detail: String,
        field: Option<String>,
    },
    /// `message` missing, null or blank.
    #[error("`message` is required and must not be empty")]
    MessageRequired,
    /// A field with a value out of its range.
    #[error("{detail}")]
    InvalidField { field: String, detail: String },
    /// A client's history holds a `system`
    /// (or `developer`) message, and the operator does not allow it.
    #[error("{0}")]
    InvalidHistoryRole(String),
    /// A session id that is not one (1-128 characters of `[A-Za-z0-9._:-]`).
    #[error("invalid session id: {0}")]
    InvalidSessionId(SessionIdError),
    /// A user id in a path.
    #[error("invalid user id: {0}")]
    InvalidUserId(SessionIdError),
    /// A tenant's name is not valid.
    #[error("invalid tenant: {0}")]
    InvalidTenant(SessionIdError),
    /// Not a UUID.
    #[error("turn id must be a UUID")]
    InvalidTurnId,
    /// A query parameter that is not valid.
    #[error("{0}")]
    InvalidQuery(String),
    /// A header that is not valid.
    #[error("invalid {name} header: {detail}")]
    InvalidHeader { name: &'static str, detail: String },
    /// Not a request the service can read safely
    /// (a head hyper cannot parse, a body framed both by `Content-Length`
    /// and `Transfer-Encoding`); the connection is closed.
    #[error("{0}")]
    MalformedRequest(String),
    /// A body that is not `application/json`.
    #[error("request body must be application/json")]
    UnsupportedMediaType,
    /// A body over the limit (the limit given).
    #[error("request body exceeds the limit of {0} bytes")]
    PayloadTooLarge(usize),
    /// A file over `HARNESS_FILE_MAX_BYTES` (the limit given).
    #[error("a file has at most {0} bytes")]
    FileTooLarge(u64),
    /// A file whose bytes are not of a type files may be.
    #[error("{0}")]
    UnsupportedFile(String),
    /// A message's part the turn's model does not read (an image to a
    /// text-only model): refused before any provider call.
    #[error("{0}")]
    UnsupportedContent(String),
    /// The tenant's files would take more than
    /// `HARNESS_TENANT_FILE_BYTES`.
    #[error(
        "this tenant's files take {used} of its {limit} bytes; this one needs {size} more: delete files first"
    )]
    FileQuotaExceeded { used: u64, limit: u64, size: u64 },
    /// No such session of the caller's.
    #[error("session not found")]
    SessionNotFound,
    /// No such turn in the session.
    #[error("turn not found in this session")]
    TurnNotFound,
    /// No such response of the caller's (or it
    /// was deleted).
    #[error("response not found")]
    ResponseNotFound,
    /// A running response cannot be deleted.
    #[error("the response is in progress; cancel it first")]
    ResponseInProgress(Uuid),
    /// A client protocol's parameter the
    /// service does not take.
    #[error("{detail}")]
    Unsupported { field: String, detail: String },
    /// The request names a model the operator
    /// did not configure (the chain's and `[providers.models]`'s).
    #[error("the model {model:?} is not offered here; allowed: {}", allowed.join(", "))]
    ModelNotAllowed { model: String, allowed: Vec<String> },
    /// The turn asked the client for no such call.
    #[error("the turn asked for no such call")]
    CallNotFound,
    /// The call has its result already.
    #[error("the call already has its result")]
    ToolResultAlreadyPosted,
    /// No such artifact in the session.
    #[error("artifact not found in this session")]
    ArtifactNotFound,
    /// The configured vault folder does not exist.
    #[error("the vault folder {0} does not exist")]
    VaultNotFound(String),
    /// The call was approved or denied already.
    #[error("the call was already approved or denied")]
    ApprovalAlreadyDecided,
    /// The key used up its requests; retry after the
    /// seconds given.
    #[error("too many requests for this key; retry in {0} s")]
    RateLimited(u64),
    /// This client address failed to
    /// authenticate too often; retry after the seconds given.
    #[error("too many failed authentications from this address; retry in {0} s")]
    AuthThrottled(u64),
    /// The tenant runs as many turns as it may
    /// (`HARNESS_TENANT_MAX_RUNNING_TURNS`, across replicas).
    #[error("this tenant runs {0} turns, as many as it may at once; retry when one ends")]
    TenantBusy(u32),
    /// The tenant has as many requests in flight
    /// in this process as it may (`HARNESS_TENANT_MAX_STREAMS`), or every
    /// connection left for requests is taken.
    #[error("{0}")]
    TooManyStreams(String),
    /// The tenant used its tokens of the UTC day.
    #[error("this tenant used {used} of its {limit} tokens of today (UTC); retry after the reset")]
    QuotaExceeded {
        used: u64,
        limit: u64,
        retry_after: u64,
    },
    /// With keys off, the request's `Host` is not
    /// a loopback name (a page that rebound its name to this service).
    #[error("the Host {0:?} is not served here: with keys off, use localhost, 127.0.0.1 or [::1]")]
    HostNotAllowed(String),
    /// A browser page of an origin that may not
    /// call the service.
    #[error("the origin {0:?} may not call this service (HARNESS_ALLOWED_ORIGINS)")]
    OriginNotAllowed(String),
    /// An admin route asked with a tenant's key
    /// (or, with keys off, without `HARNESS_ALLOW_LOCAL_ADMIN`).
    #[error("this route needs an admin key (agent-harness keys create --admin)")]
    AdminRequired,
    /// An export that cannot be imported (its line
    /// and what is wrong).
    #[error("{0}")]
    InvalidImport(String),
    /// An import of a session the tenant has.
    #[error("the tenant has a session of that id already")]
    SessionExists,
    /// An import whose ids (of `table`) are taken
    /// in this deployment.
    #[error("ids of the export's {0} are taken here (it was imported before, for another tenant)")]
    ImportConflict(&'static str),
    /// No key, or not a valid one.
    #[error("a valid API key is required (Authorization: Bearer <key>)")]
    Unauthorized,
    /// No such checkpoint of the session's.
    #[error("checkpoint not found")]
    CheckpointNotFound,
    /// No such endpoint of the caller's.
    #[error("webhook not found")]
    WebhookNotFound,
    /// No such file of the caller's tenant.
    #[error("file not found")]
    FileNotFound,
    /// No session and no memory of the user, in the
    /// caller's tenant.
    #[error("no such user")]
    UserNotFound,
    /// The tenant has as many endpoints as it
    /// may.
    #[error("this tenant has {0} webhook endpoints, as many as it may; delete one first")]
    WebhookLimit(u32),
    /// An MCP session (up to 2025-11-25)
    /// this process did not begin, or forgot; the client begins another.
    #[error("no such MCP session here: send `initialize` for a new one")]
    McpSessionNotFound,
    /// The checkpoint was restored already.
    #[error("the checkpoint was already restored (its own restore made a checkpoint to undo it)")]
    CheckpointAlreadyRestored,
    /// The note cannot be changed now (its path leads
    /// out of the vault, it grew too large).
    #[error("{0}")]
    NoteRefused(String),
    /// No such route.
    #[error("no such resource")]
    NotFound,
    /// The route takes no such method.
    #[error("method not allowed on this resource")]
    MethodNotAllowed,
    /// The session runs a turn (its id given).
    #[error("the session already has a running turn {0}")]
    TurnAlreadyRunning(Uuid),
    /// A regenerate of a turn whose message can no longer be asked (a
    /// file it carried was deleted).
    #[error("turn {0}'s message can no longer be asked again: a file it carried was deleted")]
    TurnMessageErased(Uuid),
    /// Forks read through the session's turns (their ids, the first
    /// ten): they are erased first.
    #[error("forks read through this session: {}; erase them first", .0.join(", "))]
    SessionForked(Vec<String>),
    /// The turn keeps as many steered messages waiting as it may (1,000).
    #[error("turn {0} has as many steered messages waiting as it keeps")]
    SteerLimit(Uuid),
    /// The session's turn did not end in time for
    /// the session to be erased.
    #[error("the session's turn {0} is still running")]
    TurnRunning(Uuid),
    /// The turn ended (its status given).
    #[error("the turn is not running (status {status})")]
    TurnNotRunning { turn_id: Uuid, status: TurnStatus },
    /// The idempotency key named a different request.
    #[error("the idempotency key was already used for a different request")]
    IdempotencyKeyReused(Uuid),
    /// The turn failed; its code is the turn's (a provider's failure is the gateway's).
    #[error("{message}")]
    TurnFailed {
        turn_id: Uuid,
        code: String,
        message: String,
    },
    /// The turn was cancelled.
    #[error("the turn was cancelled")]
    TurnCancelled(Uuid),
    /// The turn was interrupted before it finished.
    #[error("the turn was interrupted before it finished")]
    TurnInterrupted(Uuid),
    /// The body did not arrive in time (the seconds given).
    #[error("the request body did not arrive within {0} s")]
    RequestTimeout(u64),
    /// The path and query are too long.
    #[error("the path and query are longer than {0} bytes")]
    UriTooLong(usize),
    /// The headers are too large.
    #[error("the request headers are larger than {0} bytes")]
    HeadersTooLarge(usize),
    /// This instance is shutting down.
    #[error("the service is shutting down")]
    ShuttingDown,
    /// The database cannot be reached.
    #[error("the database is unavailable")]
    StoreUnavailable(String),
    /// Anything else (logged, not shown).
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    /// How each error is answered: its status, its stable code, and when
    /// it is worth asking again (`Retry-After`). The one place that says.
    #[expect(clippy::too_many_lines, reason = "the table: one line a variant")]
    fn answered(&self) -> (StatusCode, &str, RetryAfter) {
        use RetryAfter::{Never, Seconds};
        use StatusCode as S;
        match self {
            Self::InvalidJson(_) => (S::BAD_REQUEST, "invalid_json", Never),
            Self::InvalidSessionId(_) => (S::BAD_REQUEST, "invalid_session_id", Never),
            Self::InvalidUserId(_) => (S::BAD_REQUEST, "invalid_user_id", Never),
            Self::InvalidTenant(_) => (S::BAD_REQUEST, "invalid_tenant", Never),
            Self::InvalidTurnId => (S::BAD_REQUEST, "invalid_turn_id", Never),
            Self::InvalidQuery(_) => (S::BAD_REQUEST, "invalid_query", Never),
            Self::InvalidHeader { .. } => (S::BAD_REQUEST, "invalid_header", Never),
            Self::MalformedRequest(_) => (S::BAD_REQUEST, "malformed_request", Never),
            Self::Unauthorized => (S::UNAUTHORIZED, "unauthorized", Never),
            Self::OriginNotAllowed(_) => (S::FORBIDDEN, "origin_not_allowed", Never),
            Self::AdminRequired => (S::FORBIDDEN, "admin_required", Never),
            Self::SessionNotFound => (S::NOT_FOUND, "session_not_found", Never),
            Self::TurnNotFound => (S::NOT_FOUND, "turn_not_found", Never),
            Self::ResponseNotFound => (S::NOT_FOUND, "response_not_found", Never),
            Self::CallNotFound => (S::NOT_FOUND, "call_not_found", Never),
            Self::ArtifactNotFound => (S::NOT_FOUND, "artifact_not_found", Never),
            Self::VaultNotFound(_) => (S::NOT_FOUND, "vault_not_found", Never),
            Self::CheckpointNotFound => (S::NOT_FOUND, "checkpoint_not_found", Never),
            Self::McpSessionNotFound => (S::NOT_FOUND, "mcp_session_not_found", Never),
            Self::WebhookNotFound => (S::NOT_FOUND, "webhook_not_found", Never),
            Self::FileNotFound => (S::NOT_FOUND, "file_not_found", Never),
            Self::UserNotFound => (S::NOT_FOUND, "user_not_found", Never),
            Self::NotFound => (S::NOT_FOUND, "not_found", Never),
            Self::MethodNotAllowed => (S::METHOD_NOT_ALLOWED, "method_not_allowed", Never),
            Self::RequestTimeout(_) => (S::REQUEST_TIMEOUT, "request_timeout", Never),
            Self::TurnAlreadyRunning(_) => (S::CONFLICT, "turn_already_running", Never),
            Self::TurnMessageErased(_) => (S::CONFLICT, "turn_message_erased", Never),
            Self::TurnRunning(_) => (S::CONFLICT, "turn_running", Never),
            Self::SessionForked(_) => (S::CONFLICT, "session_forked", Never),
            Self::SteerLimit(_) => (S::CONFLICT, "steer_limit_reached", Never),
            Self::TurnNotRunning { .. } => (S::CONFLICT, "turn_not_running", Never),
            Self::ResponseInProgress(_) => (S::CONFLICT, "response_in_progress", Never),
            Self::ToolResultAlreadyPosted => (S::CONFLICT, "tool_result_already_posted", Never),
            Self::TurnCancelled(_) => (S::CONFLICT, "turn_cancelled", Never),
            Self::CheckpointAlreadyRestored => (S::CONFLICT, "checkpoint_already_restored", Never),
            Self::ApprovalAlreadyDecided => (S::CONFLICT, "approval_already_decided", Never),
            Self::WebhookLimit(_) => (S::CONFLICT, "webhook_limit_reached", Never),
            Self::SessionExists => (S::CONFLICT, "session_exists", Never),
            Self::ImportConflict(_) => (S::CONFLICT, "import_conflict", Never),
            Self::NoteRefused(_) => (S::CONFLICT, "note_refused", Never),
            Self::PayloadTooLarge(_) => (S::PAYLOAD_TOO_LARGE, "payload_too_large", Never),
            Self::FileTooLarge(_) => (S::PAYLOAD_TOO_LARGE, "file_too_large", Never),
            Self::UnsupportedFile(_) => {
                (S::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", Never)
            }
            Self::UnsupportedContent(_) => {
                (S::UNSUPPORTED_MEDIA_TYPE, "unsupported_content", Never)
            }
            // Waiting does not help: files must be deleted first.
            Self::FileQuotaExceeded { .. } => (S::TOO_MANY_REQUESTS, "quota_exceeded", Never),
            Self::UriTooLong(_) => (S::URI_TOO_LONG, "uri_too_long", Never),
            Self::UnsupportedMediaType => {
                (S::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", Never)
            }
            Self::HostNotAllowed(_) => (S::MISDIRECTED_REQUEST, "host_not_allowed", Never),
            Self::InvalidBody { .. } => (S::UNPROCESSABLE_ENTITY, "invalid_body", Never),
            Self::MessageRequired => (S::UNPROCESSABLE_ENTITY, "message_required", Never),
            Self::InvalidField { .. } => (S::UNPROCESSABLE_ENTITY, "invalid_field", Never),
            Self::InvalidHistoryRole(_) => (S::UNPROCESSABLE_ENTITY, "invalid_history_role", Never),
            Self::Unsupported { .. } => (S::UNPROCESSABLE_ENTITY, "unsupported_parameter", Never),
            Self::ModelNotAllowed { .. } => (S::UNPROCESSABLE_ENTITY, "model_not_allowed", Never),
            Self::InvalidImport(_) => (S::UNPROCESSABLE_ENTITY, "invalid_import", Never),
            Self::IdempotencyKeyReused(_) => {
                (S::UNPROCESSABLE_ENTITY, "idempotency_key_reused", Never)
            }
            Self::RateLimited(after) => (S::TOO_MANY_REQUESTS, "rate_limited", Seconds(*after)),
            Self::AuthThrottled(after) => (
                S::TOO_MANY_REQUESTS,
                "too_many_auth_failures",
                Seconds(*after),
            ),
            Self::TenantBusy(_) => (S::TOO_MANY_REQUESTS, "tenant_busy", Seconds(1)),
            Self::TooManyStreams(_) => (S::TOO_MANY_REQUESTS, "too_many_streams", Seconds(1)),
            Self::QuotaExceeded { retry_after, .. } => (
                S::TOO_MANY_REQUESTS,
                "quota_exceeded",
                Seconds(*retry_after),
            ),
            Self::HeadersTooLarge(_) => (
                S::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "headers_too_large",
                Never,
            ),
            Self::Internal(_) => (S::INTERNAL_SERVER_ERROR, "internal", Never),
            // A provider's failure is the gateway's; the code is the turn's.
            Self::TurnFailed { code, .. } if code.starts_with("provider_") => {
                (S::BAD_GATEWAY, code, Never)
            }
            Self::TurnFailed { code, .. } => (S::INTERNAL_SERVER_ERROR, code, Never),
            Self::TurnInterrupted(_) => (S::SERVICE_UNAVAILABLE, "turn_interrupted", Never),
            // Another replica answers sooner.
            Self::ShuttingDown => (S::SERVICE_UNAVAILABLE, "shutting_down", Seconds(5)),
            // The database is often back within a second or two.
            Self::StoreUnavailable(_) => (S::SERVICE_UNAVAILABLE, "store_unavailable", Seconds(1)),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.answered().0
    }

    pub fn code(&self) -> &str {
        self.answered().1
    }

    /// `Retry-After` (seconds) of an answer worth repeating later.
    pub fn retry_after(&self) -> Option<u64> {
        match self.answered().2 {
            RetryAfter::Never => None,
            RetryAfter::Seconds(seconds) => Some(seconds),
        }
    }

    fn turn_id(&self) -> Option<Uuid> {
        match self {
            Self::TurnAlreadyRunning(id)
            | Self::TurnRunning(id)
            | Self::TurnMessageErased(id)
            | Self::SteerLimit(id)
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
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if matches!(self, Self::Unauthorized) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if matches!(
            self,
            Self::RequestTimeout(_)
                | Self::MalformedRequest(_)
                | Self::PayloadTooLarge(_)
                | Self::FileTooLarge(_)
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

/// A file refused, or not stored.
impl From<crate::files::FileError> for ApiError {
    fn from(e: crate::files::FileError) -> Self {
        use crate::files::FileError;
        match e {
            FileError::TooLarge { limit } => Self::FileTooLarge(limit),
            FileError::Unsupported(why) => Self::UnsupportedFile(why),
            FileError::OverQuota { used, limit, size } => {
                Self::FileQuotaExceeded { used, limit, size }
            }
            FileError::Empty => Self::InvalidField {
                field: "file".into(),
                detail: "the file is empty".into(),
            },
            FileError::Io(why) => Self::Internal(why),
            FileError::Store(e) => e.into(),
        }
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
