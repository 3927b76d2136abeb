//! The parameters of a route's path and query, parsed before its handler
//! runs, each refused with its own 400.

use uuid::Uuid;

use super::error::ApiError;
use crate::ids::{SessionId, SessionKey, Tenant};

/// A route's query string as `T`; one that does not parse is refused with
/// 400 `invalid_query` (its reason in `detail`), before the handler runs.
pub struct ApiQuery<T>(pub T);

impl<S, T> axum::extract::FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(query)| Self(query))
            .map_err(|e| ApiError::InvalidQuery(e.body_text()))
    }
}

/// The session a route's `{session_id}` names, as the caller's tenant's
/// session (an id that is not one is refused with 400
/// `invalid_session_id`, before the handler runs).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SessionPath {
    /// 1-128 characters of `[A-Za-z0-9._:-]`
    #[param(value_type = String, pattern = r"^[A-Za-z0-9._:-]{1,128}$", min_length = 1, max_length = 128)]
    pub session_id: SessionKey,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for SessionPath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        let raw = path_param(parts, state, "session_id").await?;
        let tenant = parts
            .extensions
            .get::<Tenant>()
            .ok_or_else(|| ApiError::Internal("no tenant for the request".into()))?;
        Ok(Self {
            session_id: parse_session_id(&raw, tenant)?,
        })
    }
}

/// A route's `{turn_id}` beside its `{session_id}` (parsed by the handler:
/// 400 `invalid_turn_id`).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TurnPath {
    /// The turn's id
    #[param(value_type = Uuid)]
    pub turn_id: Uuid,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for TurnPath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        let raw = path_param(parts, state, "turn_id").await?;
        Ok(Self {
            turn_id: parse_turn_id(&raw)?,
        })
    }
}

/// A route's `{artifact_id}` beside its `{session_id}`.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ArtifactPath {
    pub artifact_id: String,
}

/// A route's `{turn_id}` and `{call_id}` (an approval's).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct CallPath {
    /// The turn's id
    #[param(value_type = Uuid)]
    pub turn_id: Uuid,
    /// The call's id, as `approval.requested` names it
    #[param(pattern = "^[A-Za-z0-9_.:-]{1,200}$")]
    pub call_id: String,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for CallPath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        let turn = path_param(parts, state, "turn_id").await?;
        let call_id = path_param(parts, state, "call_id").await?;
        Ok(Self {
            turn_id: parse_turn_id(&turn)?,
            call_id,
        })
    }
}

/// A path whose parameter is not UTF-8 once percent-decoded (`%FF`): the
/// parameter's own 400, named by axum's message (``… in `turn_id` ``).
fn not_utf8(rejection: axum::extract::rejection::RawPathParamsRejection) -> ApiError {
    let text = rejection.body_text();
    if text.contains("`session_id`") {
        ApiError::InvalidSessionId(crate::ids::SessionIdError::BadCharacter)
    } else if text.contains("`turn_id`") {
        ApiError::InvalidTurnId
    } else {
        ApiError::InvalidQuery(text)
    }
}

/// The route's path parameter `name`, as it was sent (decoded).
async fn path_param<S: Send + Sync>(
    parts: &mut axum::http::request::Parts,
    state: &S,
    name: &str,
) -> Result<String, ApiError> {
    use axum::extract::FromRequestParts as _;
    let params = axum::extract::RawPathParams::from_request_parts(parts, state)
        .await
        .map_err(not_utf8)?;
    params
        .iter()
        .find(|(param, _)| *param == name)
        .map(|(_, value)| value.to_owned())
        .ok_or_else(|| ApiError::Internal(format!("the route has no {{{name}}}")))
}

/// A turn id of a path, or 400 `invalid_turn_id`.
fn parse_turn_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::InvalidTurnId)
}

/// The caller's session of a client's id: ids are per tenant, so the
/// key alone can only ever reach the caller's own sessions.
pub(crate) fn parse_session_id(raw: &str, tenant: &Tenant) -> Result<SessionKey, ApiError> {
    let id = SessionId::parse(raw).map_err(ApiError::InvalidSessionId)?;
    Ok(SessionKey::new(&tenant.0, &id))
}
