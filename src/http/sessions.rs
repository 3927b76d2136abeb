//! `/sessions/{session_id}`, its messages and its event log.

use axum::{
    extract::{Path, State},
    http::header,
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::{
    ApiQuery, ArtifactPath, SessionPath,
    listing::{LimitQuery, Page, PageQuery, page_limit},
};
use crate::protocols::error::ApiError;
use crate::{
    app::AppState,
    events::EventEnvelope,
    protocols::error::{BadRequest, NotFound},
    store::{ArtifactRecord, CheckpointRecord, DecisionRecord, MessageRecord, SessionRecord},
};

pub(crate) mod erase;
pub mod export;
pub mod fork;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_session, erase::erase_session))
        .routes(routes!(
            export::import_session,
            export::get_named_import,
            export::delete_named_import
        ))
        .routes(routes!(export::export_session))
        .routes(routes!(fork::fork_session))
        .routes(routes!(list_messages))
        .routes(routes!(list_events))
        .routes(routes!(list_decisions))
        .routes(routes!(list_checkpoints))
        .routes(routes!(get_artifact))
}

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
    Ok(axum::Json(
        super::known_session(&app.protocols, &session_id).await?,
    ))
}

/// A page of a session's history.
pub type MessagePage = Page<MessageRecord, i64>;

/// Query of `GET /sessions/{session_id}/messages`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct MessageQuery {
    /// Return messages after this message id.
    #[param(minimum = 0)]
    after: Option<i64>,
    /// Messages per page, 1-1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The branch that ends at this turn of the session (its messages and
    /// its ancestors'); default: the current branch, the newest turn's.
    turn_id: Option<Uuid>,
}

session_list! {
    /// A branch of the session's history (what a turn after its last turn
    /// sees), oldest first: the current branch (the newest turn's and its
    /// ancestors'), or the one that ends at `turn_id`. A session never
    /// branched is one branch.
    list_messages: "/sessions/{session_id}/messages", MessageQuery => MessagePage,
    |app, session_id, query| {
        let (after, limit) = PageQuery { after: query.after, limit: query.limit }.parse()?;
        let session = super::known_session(&app.protocols, &session_id).await?;
        let head = match query.turn_id {
            // A fork's branch may end where it was forked.
            Some(turn_id) if session.forked_at == Some(turn_id) => Some(turn_id),
            Some(turn_id) => match app.store.get_turn(&session_id, turn_id).await? {
                Some(turn) => Some(turn.id),
                None => return Err(ApiError::TurnNotFound),
            },
            None if session.branched => app.store.newest_turn(&session_id).await?,
            None => None,
        };
        let messages = match head {
            Some(head) => app.store.list_branch_messages(head, after, limit).await?,
            None => app.store.list_messages(&session_id, after, limit).await?,
        };
        Ok(Page::of(messages, limit, |m| m.id))
    }
}

/// A page of a session's event log (its JSON is written by hand: the
/// envelopes are JSON already).
pub type EventPage = Page<EventEnvelope, i64>;

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
    let (after, limit) = query.parse()?;
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
pub type DecisionList = Page<DecisionRecord, String>;

session_list! {
    /// The session's decision records (`support.chat.turn`), oldest first,
    /// a page at a time.
    list_decisions: "/sessions/{session_id}/decisions", DecisionQuery => DecisionList,
    |app, session_id, query| {
        let limit = page_limit(query.limit)?;
        if let Some(after) = &query.after
            && Uuid::parse_str(after).is_err()
        {
            return Err(ApiError::InvalidQuery(
                "`after` must be a decision id".into(),
            ));
        }
        super::known_session(&app.protocols, &session_id).await?;
        let (after, strategy) = (query.after.as_deref(), query.strategy.as_deref());
        let decisions = app
            .store
            .list_decisions(&session_id, after, strategy, limit)
            .await?;
        Ok(Page::of(decisions, limit, |d| d.id.clone()))
    }
}

/// A session's checkpoints.
pub type CheckpointList = Page<CheckpointRecord>;

session_list! {
    /// The session's newest checkpoints, oldest first: each is a note as it
    /// was before a write of the session changed it (`POST
    /// /checkpoints/{checkpoint_id}/restore` undoes the write).
    list_checkpoints: "/sessions/{session_id}/checkpoints", LimitQuery => CheckpointList,
    |app, session_id, query| {
        let limit = query.limit()?;
        super::known_session(&app.protocols, &session_id).await?;
        let checkpoints = app.store.list_checkpoints(&session_id, limit).await?;
        Ok(Page::whole(checkpoints))
    }
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
    let Some(artifact) = app.store.get_artifact(&session_id, &artifact_id).await? else {
        return Err(
            super::not_found_in(&app.protocols, &session_id, ApiError::ArtifactNotFound).await,
        );
    };
    Ok(axum::Json(artifact))
}
