//! `/v1/responses`: the OpenAI Responses API over the same turns, so that
//! the official `openai` SDKs (`client.responses`) and the tooling built on
//! them can call the service.
//!
//! A response is a turn: its id is `resp_` and the turn's id (32 hex
//! digits); its conversation is the turn's session. `previous_response_id`
//! continues that response's session, `conversation` names a session, and
//! neither starts a new one (`resp-…`, shown as `conversation.id`). The
//! stream is the turn's log folded into `ResponseStreamEvent`s
//! ([`fold`]); it resumes with `GET /v1/responses/{id}?stream=true&
//! starting_after=N` from any replica.
//!
//! A call of a tool the client runs (a `function` tool of the request)
//! ends the response with its `function_call` item while the turn waits.
//! The next request answers it (`function_call_output` items and
//! `previous_response_id`); its response, `resp_<turn id>_<seq>`, is the
//! same turn's stream after the call ([`Segment`]).

mod fold;
mod request;
mod stream;
mod wire;

use axum::{
    Extension,
    extract::State,
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use sha2::Digest as _;
use utoipa::IntoParams;
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::client_calls::{Replies, answer_turn};
use crate::{
    ids::{SessionKey, Tenant},
    protocols::Shared,
    protocols::{
        endpoint::{Started, name_turn, named_session},
        error::{ApiError, BadRequest, InvalidBody, NotFound, TurnAlreadyRunning},
        json::ApiJson,
        paths::ApiQuery,
    },
    service::CancelError,
    service::{TurnRecord, TurnStatus},
};
pub use request::CreateResponse;
use stream::{Folding, find, folded, head, response_id, streamed};

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    crate::protocols::Shared: axum::extract::FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(create_response))
        .routes(routes!(get_response, delete_response))
        .routes(routes!(cancel_response))
        .routes(routes!(input_items))
}

/// Creates a response: runs a turn.
#[utoipa::path(
    post,
    path = "/v1/responses",
    tag = "responses",
    request_body = CreateResponse,
    params(("Idempotency-Key" = Option<String>, Header, description = "Sending the request again with the same key answers the same response (its turn runs once): 1-255 visible ASCII characters", pattern = r"^[\x21-\x7E]{1,255}$", nullable = false)),
    responses(
        (status = 200, description = "A `response` object (its `status` says how the turn ended; with `background: true`, `in_progress` at once), or with `stream: true` its `ResponseStreamEvent`s (`event:` and `data:` lines)", content(
            (Object = "application/json"),
            (crate::protocols::native::stream::EventStream = "text/event-stream"),
        )),
        BadRequest,
        NotFound,
        TurnAlreadyRunning,
        InvalidBody,
        (status = 422, description = "The idempotency key was used for another request (`idempotency_key_reused`), or a field is invalid (see `code`)"),
    )
)]
async fn create_response(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CreateResponse>,
) -> Result<Response, ApiError> {
    let key = crate::protocols::native::idempotency_key(&headers)?;
    let replies = body.replies()?;
    if !replies.is_empty() {
        return answer_function_calls(&app, &tenant, &body, replies).await;
    }
    let mut asked = body.turn_request(&app)?;
    let session = match (&body.previous_response_id, body.conversation_id()?) {
        (Some(_), Some(_)) => {
            return Err(ApiError::InvalidField {
                field: "conversation".into(),
                detail: "give `previous_response_id` or `conversation`, not both".into(),
            });
        }
        (Some(previous), None) => {
            let (record, _) = find(&app, &tenant, previous).await?;
            if record.status == TurnStatus::Running
                && asked.metadata.get("multitask").map(String::as_str) == Some("steer")
                && let Some(steered) = steer_response(&app, &body, &record, &asked).await?
            {
                return Ok(steered);
            }
            asked.follows = Some(record.id);
            record.session_id.clone()
        }
        (None, Some(conversation)) => named_session(Some(conversation), "resp", &tenant)?,
        // A new conversation; one named by the request's key when it has
        // one, so that the request sent again finds its turn there.
        (None, None) => match &key {
            Some(key) => {
                let digest = sha2::Sha256::digest(key.as_bytes());
                let name = format!("resp-{}", hex::encode(&digest[..16]));
                named_session(Some(&name), "resp", &tenant)?
            }
            None => named_session(None, "resp", &tenant)?,
        },
    };
    let start_head = head(Uuid::nil(), &session, &asked);
    let (_, model) = app.turns.resolve_provider_model(
        asked.runtime_provider.as_deref(),
        asked.runtime_model.as_deref(),
    );
    let started = Started::start(&app, session.clone(), asked, key).await?;
    let turn_id = started.turn_id;
    let folding = Folding::new(start_head, turn_id, 0);
    if body.stream {
        let events = started.events(&app);
        return Ok(streamed(&app, folding, None, &session, turn_id, events));
    }
    let response = if started.replayed && body.background {
        // The request again: its response as the log has it now.
        let (record, _) = find(&app, &tenant, &response_id(turn_id)).await?;
        folded(&app, &record, 0).await?
    } else if body.background {
        let mut folding = folding;
        folding
            .fold
            .begin(chrono::Utc::now().timestamp(), Some(&model));
        folding.fold.response()
    } else {
        folding.until_ended(started.events(&app)).await?
    };
    Ok(with_ids(response, &session, turn_id))
}

/// A response object, with the headers that name its session and turn.
fn with_ids(response: wire::ResponseObject, session: &SessionKey, turn_id: Uuid) -> Response {
    name_turn(axum::Json(response).into_response(), Some(session), turn_id)
}

/// A request that answers `previous_response_id` (`function_call_output`
/// items for the client's calls, `mcp_approval_response` items for calls
/// that wait for a person): the replies go to the waiting turn, and the
/// response is that turn after the calls.
async fn answer_function_calls(
    app: &Shared,
    tenant: &Tenant,
    body: &CreateResponse,
    replies: Replies,
) -> Result<Response, ApiError> {
    let previous = body.previous_response_id.as_deref().unwrap_or_default();
    let (record, _) = find(app, tenant, previous).await?;
    let answered = answer_turn(app, &record, replies).await?;
    let session = record.session_id.clone();
    if body.background && !body.stream {
        let response = folded(app, &record, answered.after).await?;
        return Ok(with_ids(response, &session, record.id));
    }
    let head = head(record.id, &record.session_id, &record.request);
    let folding = Folding::new(head, record.id, answered.after);
    let events = crate::protocols::endpoint::follow(app, &record);
    if body.stream {
        return Ok(streamed(app, folding, None, &session, record.id, events));
    }
    let response = folding.until_ended(events).await?;
    Ok(with_ids(response, &session, record.id))
}

/// A request that follows a response in progress with
/// `metadata.multitask: "steer"`: its message joins that response's turn
/// (applied at its next step, or its next turn if it ends first), and the
/// answer is that turn from now on, as a response of its own (its id the
/// turn's and the seq it starts after): streamed, in progress
/// (`background`), or once the turn ended. `None`: the turn ended
/// meanwhile (the request then starts one, as any other).
async fn steer_response(
    app: &Shared,
    body: &CreateResponse,
    record: &TurnRecord,
    asked: &crate::turn::TurnRequest,
) -> Result<Option<Response>, ApiError> {
    if !asked.attachments.is_empty() {
        return Err(ApiError::InvalidField {
            field: "metadata".into(),
            detail:
                "a message steered into a response in progress is text: it carries no image or file"
                    .into(),
        });
    }
    let session = record.session_id.clone();
    let steered =
        crate::protocols::multitask::steer_into(app, &session, record.id, asked.message.clone())
            .await;
    match steered {
        Ok(_) => {}
        Err(ApiError::TurnNotRunning { .. }) => return Ok(None),
        Err(e) => return Err(e),
    }
    let after = app
        .turns
        .get_session(&session)
        .await?
        .map_or(0, |session| session.last_seq);
    if body.background && !body.stream {
        let response = folded(app, record, after).await?;
        return Ok(Some(with_ids(response, &session, record.id)));
    }
    let head = head(record.id, &session, &record.request);
    let folding = Folding::new(head, record.id, after);
    let events = crate::protocols::endpoint::follow(app, record);
    if body.stream {
        return Ok(Some(streamed(
            app, folding, None, &session, record.id, events,
        )));
    }
    let response = folding.until_ended(events).await?;
    Ok(Some(with_ids(response, &session, record.id)))
}

/// A route's `{response_id}` (for the document; [`ResponseTurn`] reads it).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct ResponsePath {
    /// `resp_` and 32 hex digits (a turn's first response), then `_` and
    /// a seq (its response after a call the client answered)
    #[param(pattern = r"^resp_[0-9a-f]{32}(_[1-9][0-9]{0,18})?$")]
    #[expect(dead_code, reason = "describes the path; ResponseTurn reads it")]
    response_id: String,
}

/// The caller's turn a route's `{response_id}` names (404
/// `response_not_found` before the handler runs otherwise).
pub(crate) struct ResponseTurn {
    id: String,
    record: TurnRecord,
    /// Where the response starts in its turn (the seq it goes on after).
    after: i64,
    tenant: Tenant,
}

impl<S> axum::extract::FromRequestParts<S> for ResponseTurn
where
    S: Send + Sync,
    Shared: axum::extract::FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        let axum::extract::Path(id) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|_| ApiError::ResponseNotFound)?;
        let app: Shared = axum::extract::FromRef::from_ref(state);
        let tenant = parts
            .extensions
            .get::<Tenant>()
            .cloned()
            .ok_or_else(|| ApiError::Internal("no tenant for the request".into()))?;
        let (record, after) = find(&app, &tenant, &id).await?;
        Ok(Self {
            id,
            record,
            after,
            tenant,
        })
    }
}

/// How a response is read.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ReadQuery {
    /// Stream the response's events (from its start, or after
    /// `starting_after`) instead of answering its object.
    #[serde(default)]
    stream: bool,
    /// With `stream`: the `sequence_number` of the last event the client
    /// has; the stream goes on after it.
    starting_after: Option<u64>,
}

/// A response: its object as it stands, or its events.
#[utoipa::path(
    get,
    path = "/v1/responses/{response_id}",
    tag = "responses",
    params(ResponsePath, ReadQuery),
    responses(
        (status = 200, description = "The `response` object, or with `stream=true` its `ResponseStreamEvent`s after `starting_after`", content(
            (Object = "application/json"),
            (crate::protocols::native::stream::EventStream = "text/event-stream"),
        )),
        BadRequest,
        NotFound,
    )
)]
async fn get_response(
    State(app): State<Shared>,
    ApiQuery(query): ApiQuery<ReadQuery>,
    ResponseTurn { record, after, .. }: ResponseTurn,
) -> Result<Response, ApiError> {
    // A sequence number is an int64, as the document says.
    if query
        .starting_after
        .is_some_and(|n| i64::try_from(n).is_err())
    {
        return Err(ApiError::InvalidQuery(
            "`starting_after` must be at most 9223372036854775807".into(),
        ));
    }
    if !query.stream {
        return Ok(axum::Json(folded(&app, &record, after).await?).into_response());
    }
    let session = record.session_id.clone();
    let head = head(record.id, &record.session_id, &record.request);
    let folding = Folding::new(head, record.id, after);
    let events = crate::protocols::endpoint::follow(&app, &record);
    Ok(streamed(
        &app,
        folding,
        query.starting_after,
        &session,
        record.id,
        events,
    ))
}

/// Hides a response from these routes (and from `previous_response_id`);
/// its turn stays in its session's history and log.
#[utoipa::path(
    delete,
    path = "/v1/responses/{response_id}",
    tag = "responses",
    params(ResponsePath),
    responses(
        (status = 200, description = "`{id, object: \"response\", deleted: true}`", body = Object),
        BadRequest,
        NotFound,
        (status = 409, description = "The response is still in progress (`response_in_progress`): cancel it first"),
    )
)]
async fn delete_response(
    State(app): State<Shared>,
    ResponseTurn { id, record, .. }: ResponseTurn,
) -> Result<Response, ApiError> {
    if !app.turns.hide_turn(record.id).await? {
        return Err(match app.turns.find_turn(record.id).await? {
            Some(r) if r.status == TurnStatus::Running => ApiError::ResponseInProgress(r.id),
            _ => ApiError::ResponseNotFound,
        });
    }
    Ok(axum::Json(wire::Deleted {
        id,
        object: "response",
        deleted: true,
    })
    .into_response())
}

/// Cancels a response in progress; answers its object.
#[utoipa::path(
    post,
    path = "/v1/responses/{response_id}/cancel",
    tag = "responses",
    params(ResponsePath),
    responses(
        (status = 200, description = "The `response` object (`cancelled`, or how it ended first; `in_progress` while another replica stops it)", body = Object),
        BadRequest,
        NotFound,
        (status = 409, description = "The response is not in progress (`turn_not_running`)"),
    )
)]
async fn cancel_response(
    State(app): State<Shared>,
    ResponseTurn {
        id,
        record,
        after,
        tenant,
    }: ResponseTurn,
) -> Result<Response, ApiError> {
    let session = record.session_id.clone();
    match app.turns.cancel(&session, record.id).await {
        Ok(_) => {}
        Err(CancelError::NotFound) => return Err(ApiError::ResponseNotFound),
        Err(CancelError::NotRunning(status)) => {
            return Err(ApiError::TurnNotRunning {
                turn_id: record.id,
                status,
            });
        }
        Err(CancelError::Store(e)) => return Err(e.into()),
    }
    let (record, _) = find(&app, &tenant, &id).await?;
    Ok(axum::Json(folded(&app, &record, after).await?).into_response())
}

/// How the input items of a response are listed.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ItemsQuery {
    /// `asc` or `desc` (the default: newest first).
    order: Option<String>,
    /// 1-100 (default 20).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<u32>,
    /// List the items after this item id.
    after: Option<String>,
}

/// The input items of a response: the messages its turn read (those of the
/// responses it follows, along its branch) and those it was asked with.
#[utoipa::path(
    get,
    path = "/v1/responses/{response_id}/input_items",
    tag = "responses",
    params(ResponsePath, ItemsQuery),
    responses(
        (status = 200, description = "A list: `{object: \"list\", data, first_id, last_id, has_more}`", body = Object),
        BadRequest,
        NotFound,
    )
)]
async fn input_items(
    State(app): State<Shared>,
    ApiQuery(query): ApiQuery<ItemsQuery>,
    ResponseTurn { record, .. }: ResponseTurn,
) -> Result<Response, ApiError> {
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::InvalidQuery(
            "`limit` must be between 1 and 100".into(),
        ));
    }
    let descending = match query.order.as_deref() {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return Err(ApiError::InvalidQuery(format!(
                "`order` must be asc or desc, not {other:?}"
            )));
        }
    };
    // What its turn read of its branch (the responses it follows), then
    // what it was asked.
    let earlier = match (&record.request.history, record.parent_turn_id) {
        (None, Some(parent)) => {
            app.turns
                .branch_history(&record.session_id, parent, request::EARLIER_ITEMS_MAX)
                .await?
        }
        _ => Vec::new(),
    };
    let mut items = request::input_items(record.id, &record.request, &earlier);
    if descending {
        items.reverse();
    }
    let start = match &query.after {
        Some(after) => items
            .iter()
            .position(|item| item.id == *after)
            .map_or(items.len(), |at| at + 1),
        None => 0,
    };
    let total = items.len();
    let page: Vec<wire::InputItem> = items.into_iter().skip(start).take(limit as usize).collect();
    let has_more = start + page.len() < total;
    Ok(axum::Json(wire::ItemPage {
        object: "list",
        first_id: page.first().map(|item| item.id.clone()),
        last_id: page.last().map(|item| item.id.clone()),
        has_more,
        data: page,
    })
    .into_response())
}
