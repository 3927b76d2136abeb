//! What a request does when its session already runs a turn (`multitask`,
//! as every protocol that carries it asks): refused, queued behind it,
//! after cancelling it, or steered into it.

use serde::Deserialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::{error::ApiError, lookup::not_found_in};
use crate::{
    ids::SessionKey,
    protocols::Shared,
    service::{QueuedStartError, StartError, SteerError},
    turn::TurnRequest,
};

/// A request's answer to a running turn in its session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Multitask {
    /// 409 `turn_already_running`.
    #[default]
    Reject,
    /// Wait for the running turn (and any queued before this one) to end.
    Enqueue,
    /// Cancel the running turn, wait for it to end, then run.
    Interrupt,
    /// Add the message to the running turn (`202`, as
    /// `POST …/turns/{turn_id}/steer` answers); with none running, run.
    Steer,
}

/// Longest an `enqueue`d or `interrupt`ing request waits for the session.
pub(crate) const MULTITASK_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(600);

/// Starts the turn as `multitask` asks when the session already runs one:
/// refused, queued behind it, or after cancelling it. A running turn is
/// waited for up to the turn deadline and a margin, never longer than
/// [`MULTITASK_WAIT_MAX`].
pub async fn start_as_asked(
    app: &Shared,
    session_id: &crate::ids::SessionKey,
    spec: TurnRequest,
    key: Option<String>,
    multitask: Multitask,
) -> Result<crate::service::StartedTurn, ApiError> {
    // Bounded: every wait ends by the deadline.
    let deadline = tokio::time::Instant::now()
        + (app.settings.harness.turn_timeout() + std::time::Duration::from_secs(30))
            .min(MULTITASK_WAIT_MAX);
    loop {
        if multitask == Multitask::Enqueue {
            return match app
                .turns
                .start_queued(session_id, spec.clone(), key.clone(), deadline)
                .await
            {
                Ok(started) => Ok(started),
                Err(QueuedStartError::TimedOut(running)) => {
                    Err(ApiError::TurnAlreadyRunning(running))
                }
                Err(QueuedStartError::Start(e)) => Err(e.into()),
            };
        }
        match app.turns.start(session_id, spec.clone(), key.clone()).await {
            Err(StartError::AlreadyRunning(running)) if multitask != Multitask::Reject => {
                if multitask == Multitask::Interrupt {
                    // Ended already, or asked to end: either way, wait.
                    let _ = app.turns.cancel(session_id, running).await;
                }
                let waited =
                    tokio::time::timeout_at(deadline, app.turns.wait_for_end(session_id, running))
                        .await;
                if waited.is_err() {
                    return Err(ApiError::TurnAlreadyRunning(running));
                }
            }
            other => return Ok(other?),
        }
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
