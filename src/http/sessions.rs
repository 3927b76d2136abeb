//! `/sessions/{session_id}`, its messages and its event log.

use axum::{
    extract::{Path, State},
    http::header,
    response::{IntoResponse, Response},
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::{ApiQuery, ArtifactPath, SessionPath};
use crate::protocols::error::ApiError;
use crate::{
    app::AppState,
    events::EventEnvelope,
    protocols::error::{BadRequest, NotFound},
    store::{ArtifactRecord, CheckpointRecord, DecisionRecord, MessageRecord, SessionRecord},
};

pub(crate) mod erase;
pub mod export;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_session, erase::erase_session))
        .routes(routes!(
            export::import_session,
            export::get_named_import,
            export::delete_named_import
        ))
        .routes(routes!(export::export_session))
        .routes(routes!(list_messages))
        .routes(routes!(list_events))
        .routes(routes!(list_decisions))
        .routes(routes!(list_checkpoints))
        .routes(routes!(get_artifact))
}

/// Default and largest page size.
const PAGE_DEFAULT: u32 = 100;
const PAGE_MAX: u32 = 1000;

/// A session.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}",
    tag = "sessions",
    params(SessionPath),
    responses(
        (status = 200, description = "Success", body = SessionRecord),
        BadRequest,
        NotFound,
    )
)]
async fn get_session(
    State(app): State<AppState>,
    SessionPath { session_id }: SessionPath,
) -> Result<axum::Json<SessionRecord>, ApiError> {
    let mut session = super::known_session(&app.protocols, &session_id).await?;
    session.id = session_id.id().to_owned();
    Ok(axum::Json(session))
}

/// `limit`, defaulted and checked.
fn page_limit(limit: Option<u32>) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(PAGE_DEFAULT);
    if !(1..=PAGE_MAX).contains(&limit) {
        return Err(ApiError::InvalidQuery(format!(
            "`limit` must be between 1 and {PAGE_MAX}"
        )));
    }
    Ok(limit)
}

/// Paging of a list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// Return items after this cursor (a message id or an event seq).
    #[param(minimum = 0)]
    after: Option<i64>,
    /// Items per page, 1-1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

impl PageQuery {
    fn parse(query: PageQuery) -> Result<(i64, u32), ApiError> {
        let after = query.after.unwrap_or(0);
        if after < 0 {
            return Err(ApiError::InvalidQuery(
                "`after` must not be negative".into(),
            ));
        }
        Ok((after, page_limit(query.limit)?))
    }
}

/// A page of a session's history.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MessagePage {
    pub messages: Vec<MessageRecord>,
    /// Cursor for the next page; absent on the last one.
    pub next_after: Option<i64>,
}

/// The session's history (what later turns see), oldest first.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/messages",
    tag = "sessions",
    params(
        SessionPath,
        PageQuery),
    responses(
        (status = 200, description = "Success", body = MessagePage),
        BadRequest,
        NotFound,
    )
)]
async fn list_messages(
    State(app): State<AppState>,
    SessionPath { session_id }: SessionPath,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<axum::Json<MessagePage>, ApiError> {
    let (after, limit) = PageQuery::parse(query)?;
    super::known_session(&app.protocols, &session_id).await?;
    let messages = app.store.list_messages(&session_id, after, limit).await?;
    let next_after = (messages.len() == limit as usize)
        .then(|| messages.last().map(|m| m.id))
        .flatten();
    Ok(axum::Json(MessagePage {
        messages,
        next_after,
    }))
}

/// A page of a session's event log.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EventPage {
    pub events: Vec<EventEnvelope>,
    /// Cursor for the next page; absent on the last one.
    pub next_after: Option<i64>,
}

/// The session's event log, in seq order.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/events",
    tag = "sessions",
    params(
        SessionPath,
        PageQuery),
    responses(
        (status = 200, description = "Success", body = EventPage),
        BadRequest,
        NotFound,
    )
)]
async fn list_events(
    State(app): State<AppState>,
    SessionPath { session_id }: SessionPath,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<Response, ApiError> {
    let (after, limit) = PageQuery::parse(query)?;
    super::known_session(&app.protocols, &session_id).await?;
    let events = app
        .store
        .list_events(&session_id, None, after, limit)
        .await?;
    // The envelopes are already JSON: splice them instead of reparsing.
    let mut body = String::with_capacity(
        64 + events
            .iter()
            .map(|e| e.envelope_len_hint() + 1)
            .sum::<usize>(),
    );
    body.push_str("{\"events\":[");
    for (i, event) in events.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        event.write_envelope(&mut body);
    }
    body.push_str("],\"next_after\":");
    match events.last() {
        Some(last) if events.len() == limit as usize => body.push_str(&last.seq.to_string()),
        _ => body.push_str("null"),
    }
    body.push('}');
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// How many of the newest.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LimitQuery {
    /// How many of the newest records, 1-1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// Query of `GET /sessions/{session_id}/decisions`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DecisionQuery {
    /// Records after this one (its `id`; the last page's `next_after`).
    #[param(format = Uuid)]
    after: Option<String>,
    /// Only records of this strategy (`direct_answer`,
    /// `retrieval_augmented`, `web_augmented`, `tool_assisted`).
    strategy: Option<String>,
    /// Records per page, 1-1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// A page of a session's decision records.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DecisionList {
    pub decisions: Vec<DecisionRecord>,
    /// Cursor for the next page; absent on the last one.
    pub next_after: Option<String>,
}

/// The session's decision records (`support.chat.turn`), oldest first, a
/// page at a time.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/decisions",
    tag = "sessions",
    params(
        SessionPath,
        DecisionQuery),
    responses(
        (status = 200, description = "Success", body = DecisionList),
        BadRequest,
        NotFound,
    )
)]
async fn list_decisions(
    State(app): State<AppState>,
    SessionPath { session_id }: SessionPath,
    ApiQuery(query): ApiQuery<DecisionQuery>,
) -> Result<axum::Json<DecisionList>, ApiError> {
    let limit = page_limit(query.limit)?;
    if query
        .after
        .as_deref()
        .is_some_and(|a| Uuid::parse_str(a).is_err())
    {
        return Err(ApiError::InvalidQuery(
            "`after` must be a decision id".into(),
        ));
    }
    super::known_session(&app.protocols, &session_id).await?;
    let decisions = app
        .store
        .list_decisions(
            &session_id,
            query.after.as_deref(),
            query.strategy.as_deref(),
            limit,
        )
        .await?;
    let next_after = (decisions.len() == limit as usize)
        .then(|| decisions.last().map(|d| d.id.clone()))
        .flatten();
    Ok(axum::Json(DecisionList {
        decisions,
        next_after,
    }))
}

/// A session's checkpoints.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CheckpointList {
    pub checkpoints: Vec<CheckpointRecord>,
}

/// The session's newest checkpoints, oldest first: each is a note as it
/// was before a write of the session changed it (`POST
/// /checkpoints/{checkpoint_id}/restore` undoes the write).
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/checkpoints",
    tag = "sessions",
    params(
        SessionPath,
        LimitQuery),
    responses(
        (status = 200, description = "Success", body = CheckpointList),
        BadRequest,
        NotFound,
    )
)]
async fn list_checkpoints(
    State(app): State<AppState>,
    SessionPath { session_id }: SessionPath,
    ApiQuery(query): ApiQuery<LimitQuery>,
) -> Result<axum::Json<CheckpointList>, ApiError> {
    let limit = page_limit(query.limit)?;
    super::known_session(&app.protocols, &session_id).await?;
    let mut checkpoints = app.store.list_checkpoints(&session_id, limit).await?;
    for checkpoint in &mut checkpoints {
        checkpoint.session_id = session_id.id().to_owned();
    }
    Ok(axum::Json(CheckpointList { checkpoints }))
}

/// A tool output too large for the prompt, referenced from a tool message.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/artifacts/{artifact_id}",
    tag = "sessions",
    params(
        SessionPath, ArtifactPath),
    responses(
        (status = 200, description = "Success", body = ArtifactRecord),
        BadRequest,
        NotFound,
    )
)]
async fn get_artifact(
    State(app): State<AppState>,
    SessionPath { session_id }: SessionPath,
    Path(ArtifactPath { artifact_id }): Path<ArtifactPath>,
) -> Result<axum::Json<ArtifactRecord>, ApiError> {
    let Some(mut artifact) = app.store.get_artifact(&session_id, &artifact_id).await? else {
        return Err(
            super::not_found_in(&app.protocols, &session_id, ApiError::ArtifactNotFound).await,
        );
    };
    artifact.session_id = session_id.id().to_owned();
    Ok(axum::Json(artifact))
}
