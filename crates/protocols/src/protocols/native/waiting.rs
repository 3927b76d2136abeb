//! A JSON caller's turn that waits for an answer from outside (a person's
//! decision, the client's result): the caller is not kept until the wait
//! ends (a day, by default). It gets 202 with the call that waits and the
//! route that answers it; the turn goes on once it is answered, and `GET`
//! of the turn (or its events) tells the rest.

use chrono::{DateTime, Utc};
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::{
    events::TurnEvent,
    protocols::Shared,
    protocols::{endpoint::Started, error::ApiError},
    service::{TurnRecord, TurnStatus},
};

/// The JSON answer of a turn that waits for an answer (202).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TurnWaiting {
    pub session_id: String,
    pub turn_id: Uuid,
    /// `running`: the turn goes on once the call is answered.
    pub status: TurnStatus,
    /// The first of its calls that waits (`GET
    /// /sessions/{session_id}/turns/{turn_id}/events` shows every one).
    pub waiting: WaitingCall,
}

/// A call that waits for an answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WaitingCall {
    /// `approval` (a person's decision) or `client_tool` (the result of a
    /// tool the client runs).
    #[schema(pattern = "^(approval|client_tool)$")]
    pub waiting_for: String,
    pub call_id: String,
    /// The tool (a client's tool by the client's name for it).
    pub tool: String,
    #[schema(value_type = Object)]
    pub arguments: Value,
    /// When the wait ends unanswered: the call then ends `timed_out`.
    pub expires_at: Option<DateTime<Utc>>,
    /// The route (`POST`) that answers it.
    pub answer: String,
}

/// How a JSON caller's wait for its turn ended.
pub(super) enum Ending {
    /// The turn ended.
    Ended(Box<TurnRecord>),
    /// A call of the turn waits for an answer.
    Waiting(WaitingCall),
}

/// Follows `started` until it ends or one of its calls waits for an answer.
pub(super) async fn ended_or_waiting(app: &Shared, started: Started) -> Result<Ending, ApiError> {
    let (session, turn_id) = (started.session.clone(), started.turn_id);
    let mut events = started.events(app);
    // Bounded: the stream ends after the turn's terminal event.
    while let Some(event) = events.next().await {
        let event = event?;
        if event.is_terminal() {
            break;
        }
        let (waiting_for, route, call_id, tool, arguments, expires_at) = match event.event() {
            Some(TurnEvent::ApprovalRequested {
                call_id,
                tool,
                arguments,
                expires_at,
                ..
            }) => (
                "approval",
                "approvals",
                call_id,
                tool,
                arguments,
                expires_at,
            ),
            Some(TurnEvent::ToolRequested {
                call_id,
                tool,
                arguments,
                expires_at,
                ..
            }) => (
                "client_tool",
                "tool-results",
                call_id,
                tool,
                arguments,
                expires_at,
            ),
            _ => continue,
        };
        return Ok(Ending::Waiting(WaitingCall {
            waiting_for: waiting_for.to_owned(),
            call_id: call_id.clone(),
            tool: tool.clone(),
            arguments: arguments.clone(),
            expires_at: *expires_at,
            answer: format!(
                "/sessions/{}/turns/{turn_id}/{route}/{call_id}",
                session.id()
            ),
        }));
    }
    app.turns
        .wait_for_end(&session, turn_id)
        .await?
        .map(|record| Ending::Ended(Box::new(record)))
        .ok_or(ApiError::ShuttingDown)
}
