//! `DELETE /users/{user_id}`: a user forgotten, within the caller's
//! tenant: every session in which they asked a turn (`user_id`), erased
//! whole as `DELETE /sessions/{id}` erases one, the memories of their
//! scope (`user:{user_id}`), and the files uploaded with their `user_id`.

use axum::{
    Extension,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::ids::Tenant;
use crate::protocols::error::ApiError;
use crate::{
    app::AppState,
    http::sessions::erase::{Erasing, Whose, erase_sessions},
    ids::{SessionId, tenant_scope},
    protocols::error::{BadRequest, NotFound},
    store::audit::{AuditEntry, kinds},
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(erase_user))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct UserPath {
    /// The user's id, as turns name it (`user_id`): 1-128 characters of
    /// `[A-Za-z0-9._:-]`.
    #[param(min_length = 1, max_length = 128, pattern = r"^[A-Za-z0-9._:-]+$")]
    user_id: String,
}

/// Erases a user: their sessions (a running turn cancelled first) and
/// their memories. 404 `user_not_found` when the tenant has neither; 202
/// when more sessions remain than one request erases (send it again).
#[utoipa::path(
    delete,
    path = "/users/{user_id}",
    tag = "memory",
    params(UserPath),
    responses(
        (status = 204, description = "Erased"),
        (status = 202, description = "Sessions remain: send the DELETE again", body = Erasing),
        BadRequest,
        NotFound,
        (status = 409, description = "A session's turn did not end in time (`turn_running`); the sessions erased before it stay erased"),
    )
)]
async fn erase_user(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(UserPath { user_id }): Path<UserPath>,
) -> Result<Response, ApiError> {
    let user = SessionId::parse(&user_id).map_err(ApiError::InvalidUserId)?;
    let whose = Whose::User {
        tenant: &tenant.0,
        user: user.as_str(),
    };
    let (erased, more) = erase_sessions(&app, whose).await?;
    if more {
        let entry = AuditEntry::new(&tenant.0, kinds::USER_ERASED)
            .subject(user.as_str())
            .outcome(format!("{erased} sessions, more remain"));
        app.store.record(entry).await;
        let body = Erasing {
            sessions_erased: erased,
            done: false,
        };
        return Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response());
    }
    let scope = tenant_scope(&tenant.0, &format!("user:{}", user.as_str()));
    let forgotten = app.store.delete_memories(&scope, None).await?;
    let files = app.store.erase_user_files(&tenant.0, user.as_str()).await?;
    tracing::info!(
        sessions = erased,
        memories = forgotten,
        files,
        "user erased"
    );
    if erased == 0 && forgotten == 0 && files == 0 {
        return Err(ApiError::UserNotFound);
    }
    let entry = AuditEntry::new(&tenant.0, kinds::USER_ERASED)
        .subject(user.as_str())
        .outcome(format!(
            "{erased} sessions, {forgotten} memories, {files} files"
        ));
    app.store.record(entry).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}
