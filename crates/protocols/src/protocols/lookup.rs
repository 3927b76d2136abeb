//! Answers for what a route names and the session does not hold.

use super::error::ApiError;
use crate::{ids::SessionKey, protocols::Shared};

/// The session, or 404 `session_not_found`.
pub async fn known_session(
    app: &Shared,
    session_id: &SessionKey,
) -> Result<crate::service::SessionRecord, ApiError> {
    app.turns
        .get_session(session_id)
        .await?
        .ok_or(ApiError::SessionNotFound)
}

/// What a route answers when the thing it names is not in the session:
/// `session_not_found` when the session itself does not exist (looked up
/// only on this path, so a found turn costs one read), else `missing`.
pub async fn not_found_in(app: &Shared, session_id: &SessionKey, missing: ApiError) -> ApiError {
    match app.turns.get_session(session_id).await {
        Ok(Some(_)) => missing,
        Ok(None) => ApiError::SessionNotFound,
        Err(e) => e.into(),
    }
}
