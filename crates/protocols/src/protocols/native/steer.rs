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
        endpoint::not_found_in,
        error::{ApiError, BadRequest, NotFound},
        json::ApiJson,
        paths::{SessionPath, TurnPath},
    },
    service::SteerError,
};

/// A message for a running turn.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SteerBody {
    /// The user's message, not blank, without U+0000, at most 32,000
    /// characters.
    #[schema(pattern = r"^[^\u0000]*$", max_length = 32000)]
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

/// Steers `message` into the running turn `turn_id`: its id, once kept.
pub async fn steer_into(
    app: &Shared,
    session_id: &SessionKey,
    turn_id: Uuid,
    message: String,
) -> Result<Uuid, ApiError> {
    match app.turns.steer(session_id, turn_id, message).await {
        Ok(steer_id) => Ok(steer_id),
        Err(SteerError::NotFound) => {
            Err(not_found_in(app, session_id, ApiError::TurnNotFound).await)
        }
        Err(SteerError::NotRunning(status)) => Err(ApiError::TurnNotRunning { turn_id, status }),
        Err(SteerError::Full) => Err(ApiError::SteerLimit(turn_id)),
        Err(e @ SteerError::TooLong) => Err(ApiError::InvalidField {
            field: "message".into(),
            detail: e.to_string(),
        }),
        Err(SteerError::Store(e)) => Err(e.into()),
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

/// What a start with `multitask: "steer"` did.
pub enum Begun {
    /// No turn ran: this one began.
    Started(crate::service::StartedTurn),
    /// A turn ran: the message was steered into it.
    Steered { turn_id: Uuid, steer_id: Uuid },
}

/// Tries a session's start and its steer this many times: a turn that
/// ends between the two is raced by another's start at most this often.
const STEER_TRIES: usize = 3;

/// Starts `spec`, or, while the session runs a turn, steers its message
/// into that turn. A steered message is text: one that carries images or
/// files is refused while a turn runs.
pub async fn start_or_steer(
    app: &Shared,
    session_id: &SessionKey,
    spec: crate::turn::TurnRequest,
    key: Option<String>,
) -> Result<Begun, ApiError> {
    let mut running = None;
    for _ in 0..STEER_TRIES {
        match app.turns.start(session_id, spec.clone(), key.clone()).await {
            Err(crate::service::StartError::AlreadyRunning(turn_id)) => running = Some(turn_id),
            other => return Ok(Begun::Started(other?)),
        }
        let Some(turn_id) = running else { continue };
        if !spec.attachments.is_empty() {
            return Err(ApiError::InvalidField {
                field: "multitask".into(),
                detail:
                    "a message steered into a running turn is text: it carries no image or file"
                        .into(),
            });
        }
        match steer_into(app, session_id, turn_id, spec.message.clone()).await {
            Ok(steer_id) => return Ok(Begun::Steered { turn_id, steer_id }),
            // It ended meanwhile: the message starts a turn of its own.
            Err(ApiError::TurnNotRunning { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::TurnAlreadyRunning(running.unwrap_or_default()))
}

/// A turn route's `202`: a call of the new turn waits for an answer, or
/// (`multitask: "steer"`) the message was steered into the running turn.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum TurnAccepted {
    Waiting(super::waiting::TurnWaiting),
    Steered(SteerAccepted),
}
