//! `/sessions/{session_id}/turns...`: start, read, follow and cancel turns.

use axum::{
    extract::State,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::{
    approvals::{ClientDecision, approvals, decide},
    endpoint::{Started, completed, name_turn},
    error::ApiError,
    json::ApiJson,
    multitask,
    paths::{ApiQuery, CallPath, SessionPath, TurnPath},
};
use crate::{
    protocols::Shared,
    protocols::error::{BadRequest, NotFound, TurnAlreadyRunning},
    service::{CancelError, CancelOutcome},
    service::{TurnRecord, TurnStatus},
    turn::{TurnRequest, TurnResult},
};

mod body;
pub mod steer;
pub mod stream;
mod tool_results;
mod tree;
mod waiting;

use stream::{self as sse, EventStream};

use body::admit;
pub use body::{
    ClientToolBody, HistoryMessage, HistoryRole, Multitask, TurnBody, checked_client_tools,
    checked_content, checked_message, checked_user_id,
};

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    crate::protocols::Shared: axum::extract::FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(start_turn))
        .routes(routes!(get_turn))
        .routes(routes!(turn_events))
        .routes(routes!(cancel_turn))
        .routes(routes!(decide_approval))
        .routes(routes!(tool_results::post_tool_result))
        .routes(routes!(tree::regenerate_turn))
        .routes(routes!(tree::list_siblings))
        .routes(routes!(steer::steer_turn))
}

/// The JSON answer of a completed turn: its ids and the `TurnResult`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TurnResponse {
    pub session_id: String,
    pub turn_id: Uuid,
    pub status: TurnStatus,
    #[serde(flatten)]
    pub result: TurnResult,
}

/// A turn's status and, once it ended, its result or error.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TurnView {
    pub turn_id: Uuid,
    pub session_id: String,
    pub status: TurnStatus,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Seq of the turn's `turn.started` event.
    pub first_seq: i64,
    pub result: Option<TurnResult>,
    pub error: Option<TurnErrorView>,
    /// A running turn parked in the database while it waits for an answer
    /// (a person's decision, a client's result; no process runs it
    /// meanwhile): when the wait ends unanswered, or, once an answer has
    /// come, the moment it did (until a process takes the turn up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked_until: Option<DateTime<Utc>>,
    /// The turn this one continues (its parent in the session's tree);
    /// `null`: the first turn of a branch from the root.
    #[serde(default)]
    pub parent_turn_id: Option<Uuid>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TurnErrorView {
    pub code: String,
    pub message: Option<String>,
}

impl From<TurnRecord> for TurnView {
    fn from(r: TurnRecord) -> Self {
        Self {
            turn_id: r.id,
            session_id: r.session_id.id().to_owned(),
            status: r.status,
            created_at: r.created_at,
            finished_at: r.finished_at,
            first_seq: r.first_seq,
            result: r.result,
            error: r.error_code.map(|code| TurnErrorView {
                code,
                message: r.error_message,
            }),
            parked_until: r.parked_until,
            parent_turn_id: r.parent_turn_id,
        }
    }
}

fn wants_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| {
            v.split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

/// The request's `Idempotency-Key`, checked (400 `invalid_header`).
pub(crate) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(raw) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let bad = |detail: &str| ApiError::InvalidHeader {
        name: "Idempotency-Key",
        detail: detail.into(),
    };
    let key = raw.to_str().map_err(|_| bad("must be visible ASCII"))?;
    if key.is_empty() || key.len() > 255 {
        return Err(bad("must be 1 to 255 characters"));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad("must be visible ASCII without spaces"));
    }
    Ok(Some(key.to_owned()))
}

/// Start a turn.
///
/// With `Accept: text/event-stream` the turn's events are streamed as they
/// happen (SSE `id:` is the seq); otherwise the answer is the turn's result
/// once it ends. The turn does not depend on this connection: a client that
/// goes away can re-attach through `GET .../events`.
#[utoipa::path(
    post,
    path = "/sessions/{session_id}/turns",
    tag = "turns",
    params(
        SessionPath,
        ("Idempotency-Key" = Option<String>, Header, description = "Repeating a request with the same key returns the same turn: 1-255 visible ASCII characters", pattern = r"^[\x21-\x7E]{1,255}$", nullable = false),
    ),
    request_body = TurnBody,
    responses(
        (status = 200, description = "The turn's result, or its event stream", content(
            (TurnResponse = "application/json"),
            (EventStream = "text/event-stream"),
        )),
        (status = 202, description = "JSON: a call of the turn waits for an answer (a person's decision, the client's result), and the turn goes on once it is answered; or, with `multitask: \"steer\"`, the message was steered into the running turn", body = steer::TurnAccepted),
        (status = 400, description = "Malformed JSON, bad session id or header"),
        (status = 404, description = "`parent_turn_id` names no turn the session may continue (`turn_not_found`)"),
        TurnAlreadyRunning,
        (status = 413, description = "Body over the limit"),
        (status = 415, description = "Body is not JSON"),
        (status = 422, description = "Invalid field or reused idempotency key"),
        (status = 502, description = "The provider failed (JSON mode)"),
        (status = 408, description = "The body did not arrive in time"),
        (status = 503, description = "Shutting down (`shutting_down`), the database is unavailable (`store_unavailable`), or the turn was interrupted",
            headers(("Retry-After" = String, description = "Seconds to wait before trying again (`store_unavailable`: 1, `shutting_down`: 5)"))),
    )
)]
async fn start_turn(
    State(app): State<Shared>,
    SessionPath { session_id }: SessionPath,
    headers: HeaderMap,
    ApiJson(body): ApiJson<TurnBody>,
) -> Result<Response, ApiError> {
    let multitask = body.multitask.unwrap_or_default();
    let spec = TurnRequest::try_from(body)?;
    answer_turn(&app, session_id, &headers, spec, multitask).await
}

/// Starts the turn `spec` as `multitask` asks, and answers as a turn does:
/// its event stream, or its result (or the call it waits on) as JSON.
async fn answer_turn(
    app: &Shared,
    session_id: crate::ids::SessionKey,
    headers: &HeaderMap,
    spec: TurnRequest,
    multitask: Multitask,
) -> Result<Response, ApiError> {
    let app = app.clone();
    let key = idempotency_key(headers)?;
    admit(&spec, &app)?;
    let started = if multitask == Multitask::Steer {
        match multitask::start_or_steer(&app, &session_id, spec, key).await? {
            multitask::Begun::Started(started) => started,
            multitask::Begun::Steered { turn_id, steer_id } => {
                return Ok(steer::SteerAccepted::response(
                    &session_id,
                    turn_id,
                    steer_id,
                ));
            }
        }
    } else {
        multitask::start_as_asked(&app, &session_id, spec, key, multitask).await?
    };
    let started = Started::of(session_id, started);
    let (turn_id, replayed) = (started.turn_id, started.replayed);
    let location = format!("/sessions/{}/turns/{turn_id}", started.session.id());
    let response = if wants_event_stream(headers) {
        let turn = sse::TurnRef {
            session_id: started.session.id().to_owned(),
            turn_id,
        };
        let metrics = app.turns.metrics().clone();
        sse::response(turn, started.events(&app), app.sse_keepalive(), metrics)
    } else {
        let session = started.session.id().to_owned();
        match waiting::ended_or_waiting(&app, started).await? {
            waiting::Ending::Ended(record) => {
                let (record, result) = completed(*record)?;
                axum::Json(TurnResponse {
                    session_id: record.session_id.id().to_owned(),
                    turn_id,
                    status: record.status,
                    result,
                })
                .into_response()
            }
            waiting::Ending::Waiting(call) => (
                StatusCode::ACCEPTED,
                axum::Json(waiting::TurnWaiting {
                    session_id: session,
                    turn_id,
                    status: TurnStatus::Running,
                    waiting: call,
                }),
            )
                .into_response(),
        }
    };
    let mut response = name_turn(response, None, turn_id);
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&location) {
        headers.insert(header::CONTENT_LOCATION, value);
    }
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// A turn's status and result.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/turns/{turn_id}",
    tag = "turns",
    params(
        SessionPath, TurnPath
    ),
    responses(
        (status = 200, description = "Success", body = TurnView),
        BadRequest,
        NotFound,
    )
)]
async fn get_turn(
    State(app): State<Shared>,
    SessionPath { session_id }: SessionPath,
    TurnPath { turn_id }: TurnPath,
) -> Result<axum::Json<TurnView>, ApiError> {
    let Some(record) = app.turns.get_turn(&session_id, turn_id).await? else {
        return Err(super::endpoint::not_found_in(&app, &session_id, ApiError::TurnNotFound).await);
    };
    Ok(axum::Json(record.into()))
}

/// Query of `GET .../events`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AfterQuery {
    /// Resume after this seq (`Last-Event-ID` wins when both are given).
    #[param(minimum = 0)]
    after: Option<i64>,
}

/// Follow a turn's events.
///
/// Replays the persisted events after `Last-Event-ID` (or `?after=`), then
/// tails live ones, with no gap and no duplicate; ends after the terminal
/// event (`turn.completed`, `turn.failed`, `turn.cancelled`, `turn.interrupted`).
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/turns/{turn_id}/events",
    tag = "turns",
    params(
        ("session_id" = String, Path, description = "1-128 characters of `[A-Za-z0-9._:-]`", pattern = r"^[A-Za-z0-9._:-]{1,128}$", min_length = 1, max_length = 128),
        ("turn_id" = Uuid, Path, description = "The turn's id"),
        ("Last-Event-ID" = Option<i64>, Header, description = "The last seq received (a non-negative integer)", minimum = 0, nullable = false),
        AfterQuery,
    ),
    responses(
        (status = 200, description = "The turn's events", body = EventStream, content_type = "text/event-stream"),
        (status = 204, description = "The turn ended and nothing follows `Last-Event-ID`: a client stops reconnecting"),
        BadRequest,
        NotFound,
    )
)]
async fn turn_events(
    State(app): State<Shared>,
    SessionPath { session_id }: SessionPath,
    TurnPath { turn_id }: TurnPath,
    ApiQuery(query): ApiQuery<AfterQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    // A bad query is refused, even when the header would take its place.
    if query.after.is_some_and(|after| after < 0) {
        return Err(ApiError::InvalidQuery(
            "`after` must not be negative".into(),
        ));
    }
    let after = match headers.get("last-event-id") {
        Some(raw) => raw
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .filter(|v| *v >= 0)
            .ok_or(ApiError::InvalidHeader {
                name: "Last-Event-ID",
                detail: "must be a non-negative integer (an event seq)".into(),
            })?,
        None => query.after.unwrap_or(0),
    };
    let Some(turn) = app.turns.get_turn(&session_id, turn_id).await? else {
        return Err(super::endpoint::not_found_in(&app, &session_id, ApiError::TurnNotFound).await);
    };
    // Nothing of this turn comes before its first event.
    let after = after.max(turn.first_seq - 1);
    // A resume at or past the end of a turn that ended has nothing to send:
    // 204, which tells an EventSource to stop reconnecting.
    if turn.status != TurnStatus::Running
        && app
            .turns
            .list_events(&session_id, Some(turn_id), after, 1)
            .await?
            .is_empty()
    {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let events = app.turns.subscribe(session_id.clone(), turn_id, after);
    Ok(sse::response(
        sse::TurnRef {
            session_id: session_id.id().to_owned(),
            turn_id,
        },
        events,
        app.sse_keepalive(),
        app.turns.metrics().clone(),
    ))
}

/// Answer of a cancel that was handed to another replica.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CancelRequested {
    pub turn_id: Uuid,
    pub status: TurnStatus,
    pub cancel_requested: bool,
}

/// Cancel a running turn.
///
/// `200` with the turn once it ended (normally `cancelled`); `202` when the
/// turn runs on another replica, which stops it at once
/// (Postgres NOTIFY), at the latest at its next heartbeat.
#[utoipa::path(
    post,
    path = "/sessions/{session_id}/turns/{turn_id}/cancel",
    tag = "turns",
    params(
        SessionPath, TurnPath
    ),
    responses(
        (status = 200, description = "Success", body = TurnView),
        (status = 202, description = "Accepted: the turn runs on another replica, which stops it at once (Postgres NOTIFY), at the latest at its next heartbeat", body = CancelRequested),
        BadRequest,
        NotFound,
        (status = 409, description = "The turn is not running"),
    )
)]
async fn cancel_turn(
    State(app): State<Shared>,
    SessionPath { session_id }: SessionPath,
    TurnPath { turn_id }: TurnPath,
) -> Result<Response, ApiError> {
    match app.turns.cancel(&session_id, turn_id).await {
        Ok(CancelOutcome::Ended(record)) => Ok(axum::Json(TurnView::from(*record)).into_response()),
        Ok(CancelOutcome::Requested) => Ok((
            StatusCode::ACCEPTED,
            axum::Json(CancelRequested {
                turn_id,
                status: TurnStatus::Running,
                cancel_requested: true,
            }),
        )
            .into_response()),
        Err(CancelError::NotFound) => {
            Err(super::endpoint::not_found_in(&app, &session_id, ApiError::TurnNotFound).await)
        }
        Err(CancelError::NotRunning(status)) => Err(ApiError::TurnNotRunning { turn_id, status }),
        Err(CancelError::Store(e)) => Err(e.into()),
    }
}

/// A person's decision on a call waiting for approval.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalBody {
    /// Let the call run (true) or not.
    approve: bool,
    /// Why not, shown to the model (at most 1,000 characters).
    #[schema(max_length = 1000)]
    reason: Option<String>,
    /// With an approval: the arguments to run instead of the asked ones.
    /// They are checked against the tool's schema now (422
    /// `invalid_field` with the validator's message, and the call still
    /// waits), then go through every gate again; the approval holds for
    /// exactly these arguments.
    #[schema(value_type = Option<Object>)]
    edited_arguments: Option<serde_json::Value>,
}

/// The decision, as recorded.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApprovalView {
    pub call_id: String,
    pub approved: bool,
    /// Whether the call runs with arguments the decision edited.
    #[serde(default)]
    pub edited: bool,
}

/// Approves or denies a tool call that waits for a person (an
/// `approval.requested` event). The first decision stands; the turn's
/// deadline keeps running meanwhile.
#[utoipa::path(
    post,
    path = "/sessions/{session_id}/turns/{turn_id}/approvals/{call_id}",
    tag = "turns",
    params(
        SessionPath, CallPath
    ),
    request_body = ApprovalBody,
    responses(
        (status = 200, description = "Recorded", body = ApprovalView),
        BadRequest,
        (status = 404, description = "No such session or turn, or the call is not waiting for a decision (`call_not_found`)"),
        (status = 409, description = "The turn is not running (`turn_not_running`) or the call was decided (`approval_already_decided`)"),
        (status = 422, description = "`edited_arguments` fail the tool's schema, or come with a denial (`invalid_field`): the call still waits"),
    )
)]
async fn decide_approval(
    State(app): State<Shared>,
    SessionPath { session_id }: SessionPath,
    CallPath { turn_id, call_id }: CallPath,
    ApiJson(body): ApiJson<ApprovalBody>,
) -> Result<axum::Json<ApprovalView>, ApiError> {
    // As the harness makes them (`harness::call_ids`).
    let id_char = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':');
    if call_id.is_empty() || call_id.len() > 200 || !call_id.bytes().all(id_char) {
        return Err(ApiError::InvalidQuery("`call_id` is not a call id".into()));
    }
    let decision = ClientDecision::new(&call_id, body.approve, body.reason, "reason")?
        .with_edit(body.edited_arguments, "edited_arguments")?;
    let Some(turn) = app.turns.get_turn(&session_id, turn_id).await? else {
        return Err(super::endpoint::not_found_in(&app, &session_id, ApiError::TurnNotFound).await);
    };
    let state = if turn.status == TurnStatus::Running {
        approvals(&app, &turn).await?.get(&call_id).map(|(s, _)| *s)
    } else {
        None
    };
    let edited = decide(&app, &turn, state, &decision).await?;
    Ok(axum::Json(ApprovalView {
        call_id,
        approved: body.approve,
        edited,
    }))
}
