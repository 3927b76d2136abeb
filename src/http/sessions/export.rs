//! `GET /sessions/{session_id}/export` streams a session as JSON Lines
//! (the format: [`crate::store::export`]); `POST /sessions/import`, for
//! an admin key, makes it again, in this deployment or another, on either
//! backend.

use axum::{
    Extension, Json,
    body::Body,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::SessionPath;
use crate::protocols::error::ApiError;

use crate::{
    app::AppState,
    http::{ApiQuery, admin::Admin},
    ids::Tenant,
    ids::{SessionId, SessionKey},
    protocols::error::{BadRequest, NotFound},
    protocols::json::JsonLines,
    store::{
        Imported,
        audit::{AuditEntry, kinds},
        export,
    },
};

/// The media type of an export.
const JSON_LINES: &str = "application/jsonl";

/// The session as JSON Lines: a line naming the format and its version,
/// the session, its turns, its events in order, its messages, decisions,
/// approvals, client tools' results, artifacts, checkpoints, judgements and
/// observations, then an `end` line counting the lines before it. A
/// session whose turn runs (or waits) is not exported: 409 `turn_running`.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/export",
    tag = "sessions",
    params(SessionPath),
    responses(
        (status = 200, description = "The session, one JSON object a line", content_type = "application/jsonl", body = String),
        BadRequest,
        NotFound,
        (status = 409, description = "A turn of the session runs (`turn_running`)"),
    )
)]
pub(super) async fn export_session(
    State(app): State<AppState>,
    SessionPath { session_id }: SessionPath,
) -> Result<Response, ApiError> {
    let session = crate::protocols::endpoint::known_session(&app.protocols, &session_id).await?;
    if let Some(turn) = session.running_turn_id {
        return Err(ApiError::TurnRunning(turn));
    }
    let entry =
        AuditEntry::new(session_id.tenant(), kinds::SESSION_EXPORTED).subject(session_id.id());
    app.store.record(entry).await;
    let lines = export::lines(app.store.clone(), session_id.clone(), session).map(|chunk| {
        chunk.map_err(|e| {
            tracing::warn!(error = %e, "an export stopped");
            std::io::Error::other(e.to_string())
        })
    });
    let file = format!("attachment; filename=\"{}.jsonl\"", session_id.id());
    Ok((
        [
            (header::CONTENT_TYPE, JSON_LINES.to_owned()),
            (header::CONTENT_DISPOSITION, file),
        ],
        Body::from_stream(lines),
    )
        .into_response())
}

/// Where an import goes.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ImportQuery {
    /// The tenant the session is made for [default: the key's].
    #[param(min_length = 1, max_length = 128, pattern = r"^[A-Za-z0-9._:-]+$")]
    tenant: Option<String>,
}

/// A session made from an export.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ImportedSession {
    pub session_id: String,
    pub tenant: String,
    /// Rows made besides the session's own.
    pub rows: usize,
}

/// Makes a session from an export (`GET /sessions/{session_id}/export`,
/// of this deployment or another, either backend), whole or not at all:
/// every line is checked first. The session keeps its id, in the tenant
/// asked for.
#[utoipa::path(
    post,
    path = "/sessions/import",
    tag = "sessions",
    params(ImportQuery),
    request_body(content = String, content_type = "application/jsonl", description = "An export"),
    responses(
        (status = 201, description = "Made", body = ImportedSession),
        BadRequest,
        (status = 403, description = "Not an admin key (`admin_required`)"),
        (status = 409, description = "The tenant has the session (`session_exists`), or its ids are taken here (`import_conflict`)"),
        (status = 413, description = "Larger than `HARNESS_BODY_LIMIT_BYTES` (`payload_too_large`): use `agent-harness import`"),
        (status = 415, description = "Not `application/jsonl` (`unsupported_media_type`)"),
        (status = 422, description = "Not an export this version reads (`invalid_import`, naming the line)"),
    )
)]
pub(super) async fn import_session(
    _: Admin,
    State(app): State<AppState>,
    Extension(caller): Extension<Tenant>,
    ApiQuery(query): ApiQuery<ImportQuery>,
    JsonLines(text): JsonLines,
) -> Result<Response, ApiError> {
    let tenant = match query.tenant {
        Some(tenant) => SessionId::parse(&tenant).map_err(ApiError::InvalidTenant)?,
        None => SessionId::parse(&caller.0).map_err(ApiError::InvalidTenant)?,
    };
    let made = import(&app.store, tenant.as_str(), &text).await?;
    Ok((StatusCode::CREATED, Json(made)).into_response())
}

/// Imports `text` for `tenant`, and says so in the audit trail: what the
/// route and `agent-harness import` do.
pub async fn import(
    store: &std::sync::Arc<dyn crate::store::Store>,
    tenant: &str,
    text: &str,
) -> Result<ImportedSession, ApiError> {
    let parsed = export::parse(text).map_err(|e| ApiError::InvalidImport(e.to_string()))?;
    let key = SessionKey::new(tenant, &parsed.id);
    match store.import_session(&key, &parsed).await? {
        Imported::Done => {}
        Imported::Exists => return Err(ApiError::SessionExists),
        Imported::Taken(table) => return Err(ApiError::ImportConflict(table)),
    }
    let entry = AuditEntry::new(tenant, kinds::SESSION_IMPORTED).subject(key.id());
    store.record(entry).await;
    Ok(ImportedSession {
        session_id: key.id().to_owned(),
        tenant: tenant.to_owned(),
        rows: parsed.rows.len(),
    })
}

/// The session whose id is `import` (this path is the import's; the
/// session is the one `/sessions/{session_id}` names `import`).
#[utoipa::path(
    get,
    path = "/sessions/import",
    tag = "sessions",
    responses(
        (status = 200, description = "Success", body = crate::store::SessionRecord),
        NotFound,
    )
)]
pub(super) async fn get_named_import(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
) -> Result<Response, ApiError> {
    let session_id = named_import(&tenant)?;
    super::get_session(State(app), SessionPath { session_id })
        .await
        .map(IntoResponse::into_response)
}

/// Erases the session whose id is `import`, as `DELETE
/// /sessions/{session_id}` erases one.
#[utoipa::path(
    delete,
    path = "/sessions/import",
    tag = "sessions",
    responses(
        (status = 204, description = "Erased"),
        NotFound,
        (status = 409, description = "The session's turn did not end in time (`turn_running`)"),
    )
)]
pub(super) async fn delete_named_import(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
) -> Result<Response, ApiError> {
    let session_id = named_import(&tenant)?;
    super::erase::erase_session(State(app), SessionPath { session_id }).await
}

/// The caller's session whose id is `import`.
fn named_import(tenant: &Tenant) -> Result<SessionKey, ApiError> {
    let id = SessionId::parse("import").map_err(ApiError::InvalidSessionId)?;
    Ok(SessionKey::new(&tenant.0, &id))
}
