//! `DELETE /sessions/{session_id}`: the session and everything it owns,
//! erased (see [`crate::store::Erase`]).

use std::time::Duration;

use axum::{
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
};

use super::SessionPath;
use crate::protocols::error::ApiError;

use crate::{
    app::AppState,
    ids::SessionKey,
    protocols::error::{BadRequest, NotFound},
    store::{
        Erased,
        audit::{AuditEntry, kinds},
    },
};

/// How long an erase waits for the session's running turn to end once
/// cancelled.
const TURN_END_WAIT: Duration = Duration::from_secs(10);

/// Tries of an erase that finds a turn begun after its cancel (bounded).
const TRIES: usize = 3;

/// Erases a session: its turns (a running one is cancelled first), their
/// events, messages, decisions, artifacts, checkpoints, approvals,
/// client-tool results, background jobs, judgements and observations, its
/// queue tickets, push configurations and webhook deliveries, and the
/// memories extracted from it or kept in its own scope. Another tenant's
/// session, or one erased already, is 404; one that forks read through is
/// kept until they are erased (409 `session_forked`).
#[utoipa::path(
    delete,
    path = "/sessions/{session_id}",
    tag = "sessions",
    params(SessionPath),
    responses(
        (status = 204, description = "Erased"),
        BadRequest,
        NotFound,
        (status = 409, description = "The session's turn did not end in time (`turn_running`), or forks read through it (`session_forked`, naming them): erase them first"),
    )
)]
pub(super) async fn erase_session(
    State(app): State<AppState>,
    SessionPath { session_id }: SessionPath,
) -> Result<Response, ApiError> {
    if erase(&app, &session_id).await? {
        let entry =
            AuditEntry::new(session_id.tenant(), kinds::SESSION_ERASED).subject(session_id.id());
        app.store.record(entry).await;
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::SessionNotFound)
    }
}

/// Erases the session `key`, its running turn cancelled first; false when
/// there was no such session. 409 `turn_running` when the turn did not
/// end in time, 409 `session_forked` when forks read through it (nothing
/// of the session is erased then).
pub(crate) async fn erase(app: &AppState, key: &SessionKey) -> Result<bool, ApiError> {
    // First the requests queued behind its turn (`multitask: enqueue`):
    // none of them begins a turn once its running one is cancelled.
    app.store.clear_queue(key).await?;
    for _ in 0..TRIES {
        match app.store.erase_session(key).await? {
            Erased::Erased => {
                app.runner.stop_jobs_of(key.as_str());
                return Ok(true);
            }
            Erased::NotFound => return Ok(false),
            Erased::Forked(forks) => return Err(ApiError::SessionForked(forks)),
            Erased::Running(turn) => {
                // Ended already, or asked to end (a parked turn ends at
                // once): either way, wait for its end.
                let _ = app.runner.cancel(key, turn).await;
                let ended =
                    tokio::time::timeout(TURN_END_WAIT, app.runner.wait_for_end(key, turn)).await;
                if !matches!(ended, Ok(Ok(Some(_)))) {
                    return Err(ApiError::TurnRunning(turn));
                }
            }
        }
    }
    match app.store.erase_session(key).await? {
        Erased::Erased => {
            app.runner.stop_jobs_of(key.as_str());
            Ok(true)
        }
        Erased::NotFound => Ok(false),
        Erased::Running(turn) => Err(ApiError::TurnRunning(turn)),
        Erased::Forked(forks) => Err(ApiError::SessionForked(forks)),
    }
}

/// Forks of forks an erase of a user's or a tenant's sessions follows at
/// most from one session (a bound on the walk).
const FORKS_FOLLOWED: usize = 1_000;

/// Erases the session `key` and, first, every fork that reads through it
/// (and their forks): a user's or a tenant's erase leaves nothing of the
/// session behind, not even as a fork's history. How many sessions it
/// erased (0: there was no such session).
async fn erase_with_forks(app: &AppState, key: &SessionKey) -> Result<u64, ApiError> {
    // Depth first: a session is erased once no fork holds it.
    let mut stack = vec![key.clone()];
    let mut erased = 0;
    for _ in 0..FORKS_FOLLOWED {
        let Some(top) = stack.last().cloned() else {
            return Ok(erased);
        };
        let forks = app
            .store
            .forks_of(&top, crate::store::forks::FORKS_NAMED)
            .await?;
        if forks.is_empty() {
            stack.pop();
            if erase(app, &top).await? {
                erased += 1;
            }
        } else {
            stack.extend(forks);
        }
    }
    // Past the bound: the source stays (409 names its forks); the next
    // request goes on.
    Ok(erased + u64::from(erase(app, key).await?))
}

/// Whose sessions a paged erase takes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Whose<'a> {
    /// Those in which `user` asked a turn, in `tenant`.
    User { tenant: &'a str, user: &'a str },
    /// All of a tenant's.
    Tenant(&'a str),
}

/// Sessions a paged erase reads at a time.
const PAGE: u32 = 100;

/// Pages one request erases at most (10,000 sessions): past them, the
/// caller answers 202 and a second request goes on.
const PAGES: usize = 100;

/// A paged erase that has more to do (202).
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Erasing {
    /// Sessions this request erased.
    pub sessions_erased: u64,
    /// Always `false`: send the `DELETE` again to go on.
    pub done: bool,
}

/// Erases `whose` sessions, each as `DELETE /sessions/{id}` does, a page
/// at a time, at most [`PAGES`] pages: how many it erased, and whether
/// any remain.
pub(crate) async fn erase_sessions(
    app: &AppState,
    whose: Whose<'_>,
) -> Result<(u64, bool), ApiError> {
    let page = |limit| async move {
        match whose {
            Whose::User { tenant, user } => app.store.sessions_of_user(tenant, user, limit).await,
            Whose::Tenant(tenant) => app.store.sessions_of_tenant(tenant, limit).await,
        }
    };
    let mut erased = 0;
    for _ in 0..PAGES {
        let sessions = page(PAGE).await?;
        if sessions.is_empty() {
            return Ok((erased, false));
        }
        for id in &sessions {
            erased += erase_with_forks(app, &SessionKey::from_stored(id)).await?;
        }
    }
    Ok((erased, !page(1).await?.is_empty()))
}
