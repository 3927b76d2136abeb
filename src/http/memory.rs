//! `/memories` (inspect and forget), a turn's judgements, a session's
//! background jobs and research observations.

use axum::{Extension, extract::State};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    ApiQuery, SessionPath, TurnPath,
    listing::{LimitQuery, Page},
};
use crate::ids::Tenant;
use crate::protocols::error::ApiError;
use crate::{
    app::AppState,
    ids::{SessionId, tenant_scope},
    protocols::error::{BadRequest, NotFound},
    store::{JobSummary, JudgementRecord, MemoryRecord, ObservationRecord},
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_memories, forget_memories))
        .routes(routes!(list_judgements))
        .routes(routes!(list_jobs))
        .routes(routes!(list_observations))
}

/// Which memories.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct MemoryQuery {
    /// `user:{user_id}` or `session:{session_id}`.
    #[param(pattern = "^(user|session):[A-Za-z0-9._:-]{1,128}$")]
    scope: String,
    /// `fact` or `preference` (listing only).
    #[param(pattern = "^(fact|preference)$")]
    kind: Option<String>,
    /// One memory, by id (forgetting only; without it, all of the scope).
    #[param(min_length = 1)]
    id: Option<String>,
    /// At most this many, 1-1000 (default 100; listing only).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

impl MemoryQuery {
    fn parse(query: MemoryQuery) -> Result<Self, ApiError> {
        let valid_scope = query.scope.split_once(':').is_some_and(|(kind, id)| {
            matches!(kind, "user" | "session") && SessionId::parse(id).is_ok()
        });
        if !valid_scope {
            return Err(ApiError::InvalidQuery(
                "`scope` must be user:{user_id} or session:{session_id}".into(),
            ));
        }
        if query
            .kind
            .as_deref()
            .is_some_and(|k| !matches!(k, "fact" | "preference"))
        {
            return Err(ApiError::InvalidQuery(
                "`kind` must be fact or preference".into(),
            ));
        }
        // An empty `id` is a client's slip, not "all of them".
        if query.id.as_deref().is_some_and(str::is_empty) {
            return Err(ApiError::InvalidQuery("`id` must not be empty".into()));
        }
        if query.limit.is_some_and(|l| !(1..=1000).contains(&l)) {
            return Err(ApiError::InvalidQuery(
                "`limit` must be between 1 and 1000".into(),
            ));
        }
        Ok(query)
    }
}

/// A scope's memories.
pub type MemoryList = Page<MemoryRecord>;

/// What the service remembers of a user (or a session), newest first.
#[utoipa::path(
    get,
    path = "/memories",
    tag = "memory",
    params(MemoryQuery),
    responses(
        (status = 200, description = "Success", body = MemoryList),
        BadRequest,
    )
)]
async fn list_memories(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiQuery(query): ApiQuery<MemoryQuery>,
) -> Result<axum::Json<MemoryList>, ApiError> {
    let query = MemoryQuery::parse(query)?;
    let memories = app
        .store
        .list_memories(
            &tenant_scope(&tenant.0, &query.scope),
            query.kind.as_deref(),
            query.limit.unwrap_or(100),
        )
        .await?;
    Ok(axum::Json(Page::whole(memories)))
}

/// How many memories were forgotten.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Forgotten {
    pub deleted: u64,
}

/// Forgets one memory (`id`) or every memory of the scope: the user's
/// right to be forgotten. The memories are deleted from the store at once.
#[utoipa::path(
    delete,
    path = "/memories",
    tag = "memory",
    params(MemoryQuery),
    responses(
        (status = 200, description = "Forgotten", body = Forgotten),
        BadRequest,
    )
)]
async fn forget_memories(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiQuery(query): ApiQuery<MemoryQuery>,
) -> Result<axum::Json<Forgotten>, ApiError> {
    let query = MemoryQuery::parse(query)?;
    let scope = tenant_scope(&tenant.0, &query.scope);
    let deleted = app
        .store
        .delete_memories(&scope, query.id.as_deref())
        .await?;
    tracing::info!(%scope, deleted, "memories forgotten");
    Ok(axum::Json(Forgotten { deleted }))
}

/// A turn's judgements.
pub type JudgementList = Page<JudgementRecord>;

/// The judges' scores of a turn (they arrive after the turn ended).
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/turns/{turn_id}/judgements",
    tag = "sessions",
    params(
        SessionPath, TurnPath),
    responses(
        (status = 200, description = "Success", body = JudgementList),
        BadRequest,
        NotFound,
    )
)]
async fn list_judgements(
    State(app): State<AppState>,
    SessionPath { session_id }: SessionPath,
    TurnPath { turn_id }: TurnPath,
) -> Result<axum::Json<JudgementList>, ApiError> {
    let Some(_) = app.store.get_turn(&session_id, turn_id).await? else {
        return Err(super::not_found_in(&app.protocols, &session_id, ApiError::TurnNotFound).await);
    };
    let judgements = app.store.list_judgements(&session_id, turn_id).await?;
    Ok(axum::Json(Page::whole(judgements)))
}

/// A session's background jobs.
pub type JobList = Page<JobSummary>;

session_list! {
    /// The work the session's turns left behind (memory extraction, judges):
    /// status, tries, last error, and the model usage and cost it took.
    list_jobs: "/sessions/{session_id}/jobs", LimitQuery => JobList,
    |app, session_id, query| {
        let limit = query.limit()?;
        super::known_session(&app.protocols, &session_id).await?;
        Ok(Page::whole(app.store.list_jobs(&session_id, limit).await?))
    }
}

/// A session's research observations.
pub type ObservationList = Page<ObservationRecord>;

session_list! {
    /// The research learner's observations of the session's turns, oldest
    /// first: each turn's question and answer, its source the stored answer.
    list_observations: "/sessions/{session_id}/observations", LimitQuery => ObservationList,
    |app, session_id, query| {
        let limit = query.limit()?;
        super::known_session(&app.protocols, &session_id).await?;
        let observations = app.store.list_observations(&session_id, limit).await?;
        Ok(Page::whole(observations))
    }
}
