//! `POST /sessions/{session_id}/turns/{turn_id}/tool-results/{call_id}`:
//! the result of a call of a tool the client runs itself.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{
    protocols::Shared,
    protocols::{
        client_calls::{ClientAnswer, answer_calls},
        error::{ApiError, BadRequest, NotFound},
        json::ApiJson,
        paths::{CallPath, SessionPath},
    },
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
        (status = 409, description = "The turn is not running (`turn_not_running`) or the call has its result (`tool_result_already_posted`)"),
    )
)]
pub(super) async fn post_tool_result(
    State(app): State<Shared>,
    SessionPath { session_id }: SessionPath,
    CallPath { turn_id, call_id }: CallPath,
    ApiJson(body): ApiJson<ToolResultBody>,
) -> Result<axum::Json<ToolResultView>, ApiError> {
    if body.output.contains('\0') {
        return Err(ApiError::InvalidField {
            field: "output".into(),
            detail: "`output` contains U+0000, which is not accepted".into(),
        });
    }
    let Some(turn) = app.turns.get_turn(&session_id, turn_id).await? else {
        return Err(crate::protocols::endpoint::not_found_in(
            &app,
            &session_id,
            ApiError::TurnNotFound,
        )
        .await);
    };
    let is_error = body.is_error.unwrap_or(false);
    let answer = ClientAnswer {
        call_id: call_id.clone(),
        output: body.output,
        is_error,
    };
    if !answer_calls(&app, &turn, &[answer]).await?.all_new {
        return Err(ApiError::ToolResultAlreadyPosted);
    }
    Ok(axum::Json(ToolResultView { call_id, is_error }))
}
