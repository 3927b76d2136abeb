//! Steering a running turn: `POST …/turns/{turn_id}/steer`, and
//! `multitask: "steer"` on a turn's route (docs/conversation-trees.md).

use axum::{
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::checked_message;
use crate::{
    ids::SessionKey,
    protocols::{
        Shared,
        error::{ApiError, BadRequest, NotFound},
        json::ApiJson,
        multitask::steer_into,
        paths::{SessionPath, TurnPath},
    },
};

/// A message for a running turn.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SteerBody {
    /// The user's message (required): not blank, without U+0000, at most
    /// 32,000 characters.
    #[schema(
        required = true,
        value_type = String,
        min_length = 1,
        max_length = 32000,
        pattern = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"
    )]
    message: Option<String>,
}

/// A steer kept for its turn.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SteerAccepted {
    pub session_id: String,
    /// The turn steered.
    pub turn_id: Uuid,
    pub steer_id: Uuid,
    /// `accepted`.
    pub status: String,
}

impl SteerAccepted {
    /// The `202` answer of a steer.
    pub fn response(session_id: &SessionKey, turn_id: Uuid, steer_id: Uuid) -> Response {
        (
            StatusCode::ACCEPTED,
            axum::Json(Self {
                session_id: session_id.id().to_owned(),
                turn_id,
                steer_id,
                status: "accepted".to_owned(),
            }),
        )
            .into_response()
    }
}

/// Steer a running turn: add a message to it.
///
/// The message is kept before the answer (`202`, and `steer.accepted` in
/// the turn's log when the turn runs on the replica asked). It is applied
/// once, at the turn's next step boundary: the next provider request
/// carries it as a user message after the last tool results
/// (`steer.applied` with the step). If the turn ends before another step,
/// the message becomes the session's next turn as soon as it ends (that
/// turn's log begins with `steer.deferred`). A turn waiting for a person
/// or a client keeps it for the step after the answer.
#[utoipa::path(
    post,
    path = "/sessions/{session_id}/turns/{turn_id}/steer",
    tag = "turns",
    params(SessionPath, TurnPath),
    request_body = SteerBody,
    responses(
        (status = 202, description = "Kept for the turn", body = SteerAccepted),
        BadRequest,
        NotFound,
        (status = 409, description = "The turn is not running (`turn_not_running`), or keeps 1,000 steered messages waiting (`steer_limit_reached`)"),
        (status = 422, description = "The message is blank or invalid"),
    )
)]
pub(super) async fn steer_turn(
    State(app): State<Shared>,
    SessionPath { session_id }: SessionPath,
    TurnPath { turn_id }: TurnPath,
    ApiJson(body): ApiJson<SteerBody>,
) -> Result<Response, ApiError> {
    let message = checked_message(body.message)?;
    let steer_id = steer_into(&app, &session_id, turn_id, message).await?;
    Ok(SteerAccepted::response(&session_id, turn_id, steer_id))
}

/// A turn route's `202`: a call of the new turn waits for an answer, or
/// (`multitask: "steer"`) the message was steered into the running turn.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum TurnAccepted {
    Waiting(super::waiting::TurnWaiting),
    Steered(SteerAccepted),
}
