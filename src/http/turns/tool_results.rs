//! `POST /sessions/{session_id}/turns/{turn_id}/tool-results/{call_id}`:
//! the result of a call of a tool the client runs itself.

use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{
    app::AppState,
    events::TurnEvent,
    http::{
        CallPath, SessionPath,
        error::{ApiError, BadRequest, NotFound, Problem},
        formats::{read_turn, typed},
        json::ApiJson,
        parse_turn_id,
    },
    store::{NewToolResult, TurnStatus},
};

/// What the client's tool answered.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolResultBody {
    /// What the model is shown (without U+0000).
    #[schema(pattern = r"^[^\u0000]*$")]
    output: String,
    /// The tool failed: `output` says why (default false).
    is_error: Option<bool>,
}

/// The result, as recorded.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ToolResultView {
    pub call_id: String,
    pub is_error: bool,
}

/// Posts the result of a call of the client's own tool (a `tool.requested`
/// event); the turn goes on with it. The first result stands; the turn's
/// deadline keeps running while it waits.
#[utoipa::path(
    post,
    path = "/sessions/{session_id}/turns/{turn_id}/tool-results/{call_id}",
    tag = "turns",
    params(SessionPath, CallPath),
    request_body = ToolResultBody,
    responses(
        (status = 200, description = "Recorded", body = ToolResultView),
        BadRequest,
        NotFound,
        (status = 409, description = "The turn is not running (`turn_not_running`) or the call has its result (`tool_result_already_posted`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(super) async fn post_tool_result(
    State(app): State<AppState>,
    SessionPath { session_id }: SessionPath,
    Path(CallPath { turn_id, call_id }): Path<CallPath>,
    ApiJson(body): ApiJson<ToolResultBody>,
) -> Result<axum::Json<ToolResultView>, ApiError> {
    let turn_id = parse_turn_id(&turn_id)?;
    if body.output.contains('\0') {
        return Err(ApiError::InvalidField {
            field: "output".into(),
            detail: "`output` contains U+0000, which is not accepted".into(),
        });
    }
    let Some(turn) = app.store.get_turn(session_id.as_str(), turn_id).await? else {
        return Err(crate::http::not_found_in(&app, &session_id, ApiError::TurnNotFound).await);
    };
    if turn.status != TurnStatus::Running {
        return Err(ApiError::TurnNotRunning {
            turn_id,
            status: turn.status,
        });
    }
    // Only a call the turn asked the client for.
    let mut requested = false;
    read_turn(app.store.as_ref(), &turn, |stored| {
        requested = matches!(
            typed(stored),
            Some(TurnEvent::ToolRequested { call_id: id, .. }) if *id == call_id
        );
        requested
    })
    .await?;
    if !requested {
        return Err(ApiError::CallNotFound);
    }
    let is_error = body.is_error.unwrap_or(false);
    let recorded = app
        .store
        .post_tool_result(&NewToolResult {
            session_id: session_id.as_str().to_owned(),
            turn_id,
            call_id: call_id.clone(),
            output: body.output,
            is_error,
        })
        .await?;
    if !recorded {
        return Err(ApiError::ToolResultAlreadyPosted);
    }
    app.approvals_decided.notify_waiters();
    Ok(axum::Json(ToolResultView { call_id, is_error }))
}
