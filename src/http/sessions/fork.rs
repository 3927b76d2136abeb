//! `POST /sessions/{session_id}/fork`: a new session whose history is the
//! source's branch up to a turn, read through the source rather than
//! copied (docs/conversation-trees.md).

use axum::{
    Json,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::SessionPath;
use crate::{
    app::AppState,
    ids::{SessionId, SessionKey},
    protocols::{
        error::{ApiError, BadRequest, NotFound},
        json::ApiJson,
    },
    store::{
        Forked,
        audit::{AuditEntry, kinds},
    },
};

/// Body of `POST /sessions/{session_id}/fork`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    /// The turn of the session the fork continues: its history is this
    /// turn's branch, this turn included. An ended turn of the session's
    /// own (not one it inherited as a fork).
    pub at_turn: Uuid,
    /// The new session's id [default: a new UUID].
    #[schema(min_length = 1, max_length = 128, pattern = r"^[A-Za-z0-9._:-]+$")]
    pub session_id: Option<String>,
}

/// A fork made.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ForkView {
    /// The new session's id.
    pub session_id: String,
    /// The session it was forked from.
    pub forked_from: String,
    /// The turn its first turn continues.
    pub forked_at: Uuid,
}

/// Forks a session at one of its turns: a new session of the same tenant
/// whose history is the branch that ends at `at_turn`. Nothing is copied
/// (one row is written, whatever the source's length); the fork's own
/// turns, memories and files never appear in the source. The source
/// cannot be erased while a fork reads through it (409
/// `session_forked`), and an export of the fork is whole.
#[utoipa::path(
    post,
    path = "/sessions/{session_id}/fork",
    tag = "sessions",
    params(SessionPath),
    request_body = ForkBody,
    responses(
        (status = 201, description = "Made", body = ForkView,
         headers(("Location" = String, description = "The new session"))),
        BadRequest,
        NotFound,
        (status = 409, description = "The turn still runs (`turn_running`), or the tenant has a session of the new id (`session_exists`)"),
        (status = 422, description = "A field is not valid (`invalid_body`, `invalid_session_id`)"),
    )
)]
pub(super) async fn fork_session(
    State(app): State<AppState>,
    SessionPath { session_id }: SessionPath,
    ApiJson(body): ApiJson<ForkBody>,
) -> Result<Response, ApiError> {
    let id = match body.session_id.as_deref() {
        Some(id) => SessionId::parse(id).map_err(ApiError::InvalidSessionId)?,
        None => {
            SessionId::parse(&Uuid::new_v4().to_string()).map_err(ApiError::InvalidSessionId)?
        }
    };
    let fork = SessionKey::new(session_id.tenant(), &id);
    match app
        .store
        .fork_session(&session_id, body.at_turn, &fork, chrono::Utc::now())
        .await?
    {
        Forked::Made => {}
        Forked::SourceNotFound => return Err(ApiError::SessionNotFound),
        Forked::TurnNotFound => return Err(ApiError::TurnNotFound),
        Forked::TurnRunning => return Err(ApiError::TurnRunning(body.at_turn)),
        Forked::Exists => return Err(ApiError::SessionExists),
    }
    let entry = AuditEntry::new(session_id.tenant(), kinds::SESSION_FORKED)
        .subject(fork.id())
        .outcome(format!("from {}", session_id.id()));
    app.store.record(entry).await;
    let location = format!("/sessions/{}", fork.id());
    let view = ForkView {
        session_id: fork.id().to_owned(),
        forked_from: session_id.id().to_owned(),
        forked_at: body.at_turn,
    };
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(view),
    )
        .into_response())
}
