//! A session's turns as a tree: regenerate a turn (a sibling with the same
//! message and a new answer), and list a turn's siblings. A turn that goes
//! on from another than the newest is `parent_turn_id` on the turn's
//! own route (docs/conversation-trees.md).

use axum::{extract::State, http::HeaderMap, response::Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{EventStream, TurnBody, TurnResponse, TurnView, answer_turn};
use crate::protocols::{
    Shared,
    endpoint::not_found_in,
    error::{ApiError, BadRequest, NotFound, TurnAlreadyRunning},
    json::ApiJson,
    paths::{ApiQuery, SessionPath, TurnPath},
};

/// Most siblings one read lists.
const SIBLINGS_MAX: u32 = 1000;

/// The fields of a turn's body that a regenerate takes from its turn.
const TURNS_OWN: [&str; 3] = ["message", "parent_turn_id", "history"];

/// What the document says a regenerate's body is: a turn's body without
/// the fields that are the turn's own (its message, where it goes on, the
/// history it brought).
pub enum RegenerateBody {}

impl utoipa::PartialSchema for RegenerateBody {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::{RefOr, schema::Schema};
        let mut schema = <TurnBody as utoipa::PartialSchema>::schema();
        if let RefOr::T(Schema::Object(object)) = &mut schema {
            for field in TURNS_OWN {
                object.properties.remove(field);
            }
            object
                .required
                .retain(|name| !TURNS_OWN.contains(&name.as_str()));
            object.description = Some(
                "A turn's options for a regenerate (`{}` is enough): one not given is the \
                 earlier turn's"
                    .into(),
            );
        }
        schema
    }
}

impl ToSchema for RegenerateBody {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("RegenerateBody")
    }

    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        <TurnBody as ToSchema>::schemas(schemas);
    }
}

/// Regenerate a turn: a new answer to its message.
///
/// Starts a sibling of the turn: it continues the same turn (its history
/// is the same branch), asks the same message with the same images and
/// files, and answers as a turn does (stream or JSON, `multitask` as on
/// `POST /sessions/{session_id}/turns`). The earlier answer stays readable
/// (`GET …/siblings`, `GET /sessions/{session_id}/messages?turn_id=`);
/// the new turn is the session's newest, so the next turn goes on from it.
#[utoipa::path(
    post,
    path = "/sessions/{session_id}/turns/{turn_id}/regenerate",
    tag = "turns",
    params(
        SessionPath, TurnPath,
        ("Idempotency-Key" = Option<String>, Header, description = "Repeating a request with the same key returns the same turn: 1-255 visible ASCII characters", pattern = r"^[\x21-\x7E]{1,255}$", nullable = false),
    ),
    request_body(content = RegenerateBody, description = "The turn's options (`{}` is enough); `message`, `parent_turn_id` and `history` are the turn's own and not taken (422)"),
    responses(
        (status = 200, description = "The new turn's result, or its event stream", content(
            (TurnResponse = "application/json"),
            (EventStream = "text/event-stream"),
        )),
        (status = 202, description = "JSON: a call of the turn waits for an answer; or, with `multitask: \"steer\"`, the message was steered into the running turn", body = super::steer::TurnAccepted),
        BadRequest,
        NotFound,
        TurnAlreadyRunning,
        (status = 409, description = "The turn's message can no longer be asked again: a file it carried was deleted (`turn_message_erased`)"),
        (status = 422, description = "A field is invalid or not taken here"),
    )
)]
pub(super) async fn regenerate_turn(
    State(app): State<Shared>,
    SessionPath { session_id }: SessionPath,
    TurnPath { turn_id }: TurnPath,
    headers: HeaderMap,
    ApiJson(body): ApiJson<TurnBody>,
) -> Result<Response, ApiError> {
    let Some(earlier) = app.turns.get_turn(&session_id, turn_id).await? else {
        return Err(not_found_in(&app, &session_id, ApiError::TurnNotFound).await);
    };
    let multitask = body.multitask.unwrap_or_default();
    let spec = body.repeating(&earlier)?;
    match answer_turn(&app, session_id, &headers, spec, multitask).await {
        // A file the message carried is gone: it cannot be asked again.
        Err(ApiError::FileNotFound) => Err(ApiError::TurnMessageErased(turn_id)),
        other => other,
    }
}

/// Query of `GET …/siblings`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SiblingQuery {
    /// At most this many, 1-1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// The turns that continue the same turn.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SiblingList {
    /// Oldest first, the turn itself among them.
    pub turns: Vec<TurnView>,
}

/// A turn's siblings: the turns of the session that continue the same
/// turn as it (regenerates, edits), itself included, oldest first.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/turns/{turn_id}/siblings",
    tag = "turns",
    params(SessionPath, TurnPath, SiblingQuery),
    responses(
        (status = 200, description = "Success", body = SiblingList),
        BadRequest,
        NotFound,
    )
)]
pub(super) async fn list_siblings(
    State(app): State<Shared>,
    SessionPath { session_id }: SessionPath,
    TurnPath { turn_id }: TurnPath,
    ApiQuery(query): ApiQuery<SiblingQuery>,
) -> Result<axum::Json<SiblingList>, ApiError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=SIBLINGS_MAX).contains(&limit) {
        return Err(ApiError::InvalidQuery(format!(
            "`limit` must be between 1 and {SIBLINGS_MAX}"
        )));
    }
    let Some(turn) = app.turns.get_turn(&session_id, turn_id).await? else {
        return Err(not_found_in(&app, &session_id, ApiError::TurnNotFound).await);
    };
    let turns = app.turns.sibling_turns(&turn, limit).await?;
    Ok(axum::Json(SiblingList {
        turns: turns.into_iter().map(TurnView::from).collect(),
    }))
}
