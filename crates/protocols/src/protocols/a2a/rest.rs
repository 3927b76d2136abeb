//! A2A's HTTP+JSON binding (A2A 1.0, §11): the tasks of the JSON-RPC
//! endpoint, behind the paths the specification gives, relative to the
//! interface URL the card names for it (the service's root). Answers are
//! the bare protobuf-JSON objects; a stream is SSE of `StreamResponse`s;
//! an error is `application/problem+json` with the A2A error's `type` URI
//! (§5.4) and this service's stable `code`.
//!
//! A task's action rides on its id (`/tasks/{id}:cancel`); the router
//! takes `/tasks/{id}` and reads the suffix here.

use axum::{
    Extension,
    extract::{Path, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Serialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    Binding, CONTENT_TYPE_NOT_SUPPORTED, Caller, EXTENDED_AGENT_CARD_NOT_CONFIGURED,
    PUSH_NOTIFICATION_NOT_SUPPORTED, RpcError, TASK_NOT_CANCELABLE, TASK_NOT_FOUND,
    UNSUPPORTED_OPERATION, card,
    wire::{
        ConfigQuery, ListTasksRequest, ProblemOut, PushConfigIn, SendMessageRequest, TaskQuery,
    },
};
use crate::{
    ids::Tenant,
    protocols::Shared,
    protocols::{
        error::{ApiError, BadRequest, NotFound},
        json::ApiJson,
        jsonrpc::INVALID_PARAMS,
        paths::ApiQuery,
    },
};

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    crate::protocols::Shared: axum::extract::FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(send_message))
        .routes(routes!(stream_message))
        .routes(routes!(list_tasks))
        .routes(routes!(get_task, act_on_task))
        .routes(routes!(create_push_config, list_push_configs))
        .routes(routes!(get_push_config, delete_push_config))
        .routes(routes!(extended_agent_card))
}

/// An A2A error as a problem document's fields: the HTTP status, the
/// name of its `type` URI (A2A 1.0 §5.4; none for JSON-RPC's own
/// errors), a title and this service's code.
fn kind(code: i64) -> (StatusCode, &'static str, &'static str, &'static str) {
    match code {
        TASK_NOT_FOUND => (
            StatusCode::NOT_FOUND,
            "task-not-found",
            "Task not found",
            "task_not_found",
        ),
        TASK_NOT_CANCELABLE => (
            StatusCode::CONFLICT,
            "task-not-cancelable",
            "Task not cancelable",
            "task_not_cancelable",
        ),
        PUSH_NOTIFICATION_NOT_SUPPORTED => (
            StatusCode::BAD_REQUEST,
            "push-notification-not-supported",
            "Push notifications not supported",
            "push_notification_not_supported",
        ),
        UNSUPPORTED_OPERATION => (
            StatusCode::BAD_REQUEST,
            "unsupported-operation",
            "Unsupported operation",
            "unsupported_operation",
        ),
        EXTENDED_AGENT_CARD_NOT_CONFIGURED => (
            StatusCode::BAD_REQUEST,
            "extended-agent-card-not-configured",
            "Extended agent card not configured",
            "extended_agent_card_not_configured",
        ),
        CONTENT_TYPE_NOT_SUPPORTED => (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "content-type-not-supported",
            "Content type not supported",
            "content_type_not_supported",
        ),
        INVALID_PARAMS => (
            StatusCode::BAD_REQUEST,
            "",
            "Invalid params",
            "invalid_params",
        ),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "",
            "Internal error",
            "internal",
        ),
    }
}

/// The problem document of an A2A error.
pub(super) fn problem_body(RpcError(code, detail): &RpcError) -> ProblemOut {
    let (status, name, title, stable) = kind(*code);
    let problem_type = if name.is_empty() {
        format!("urn:agent-harness:problem:{stable}")
    } else {
        format!("https://a2a-protocol.org/errors/{name}")
    };
    ProblemOut {
        problem_type,
        title,
        status: status.as_u16(),
        detail: detail.clone(),
        code: stable,
    }
}

fn problem(error: &RpcError) -> Response {
    let status = kind(error.0).0;
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        axum::Json(problem_body(error)),
    )
        .into_response()
}

/// A body or query that is not the request's: one that does not fit the
/// request's fields is A2A's `InvalidParams` problem; any other failure
/// (not JSON, too large, too slow) is the service's own.
fn refused(error: ApiError) -> Response {
    match error {
        ApiError::InvalidBody { detail, .. } | ApiError::InvalidQuery(detail) => {
            problem(&RpcError::new(INVALID_PARAMS, detail))
        }
        other => other.into_response(),
    }
}

fn caller(app: Shared, tenant: Tenant) -> Caller {
    Caller {
        app,
        tenant,
        binding: Binding::Rest,
    }
}

/// A method's answer, or its problem.
fn answer(result: Result<impl Serialize, RpcError>) -> Response {
    match result {
        Ok(value) => axum::Json(value).into_response(),
        Err(error) => problem(&error),
    }
}

/// Sends a message: begins a task, or answers the one it names that
/// waits for input; waits for the task to end or to wait again, unless
/// `configuration.returnImmediately`.
#[utoipa::path(
    post,
    path = "/message:send",
    tag = "a2a",
    request_body(content = SendMessageRequest, description = "A `SendMessageRequest` (A2A 1.0): `message`, optional `configuration` and `metadata`"),
    responses(
        (status = 200, description = "A `SendMessageResponse`: `{task}`", body = Object),
        (status = 400, description = "A2A error (`type` from A2A 1.0 §5.4, see `code`)"),
        (status = 404, description = "The task the message names is not the caller's (`task_not_found`)"),
        (status = 415, description = "A part that is not text (`content_type_not_supported`)"),
    )
)]
async fn send_message(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    request: Result<ApiJson<SendMessageRequest>, ApiError>,
) -> Response {
    let request = match request {
        Ok(ApiJson(request)) => request,
        Err(e) => return refused(e),
    };
    caller(app, tenant)
        .send(request, false)
        .await
        .unwrap_or_else(|e| problem(&e))
}

/// Sends a message and streams the task: the task first, then its status
/// and artifact updates, until it ends or waits for input.
#[utoipa::path(
    post,
    path = "/message:stream",
    tag = "a2a",
    request_body(content = SendMessageRequest, description = "A `SendMessageRequest` (A2A 1.0)"),
    responses(
        (status = 200, description = "Server-sent events, each `data:` a `StreamResponse`", body = crate::protocols::native::stream::EventStream, content_type = "text/event-stream"),
        (status = 400, description = "A2A error (see `code`)"),
        (status = 404, description = "The task the message names is not the caller's (`task_not_found`)"),
        (status = 415, description = "A part that is not text (`content_type_not_supported`)"),
    )
)]
async fn stream_message(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    request: Result<ApiJson<SendMessageRequest>, ApiError>,
) -> Response {
    let request = match request {
        Ok(ApiJson(request)) => request,
        Err(e) => return refused(e),
    };
    caller(app, tenant)
        .send(request, true)
        .await
        .unwrap_or_else(|e| problem(&e))
}

/// The caller's tasks, newest first, filtered and a page at a time.
#[utoipa::path(
    get,
    path = "/tasks",
    tag = "a2a",
    params(ListTasksRequest),
    responses(
        (status = 200, description = "A `ListTasksResponse`: `tasks`, `nextPageToken`, `pageSize`, `totalSize`", body = Object),
        BadRequest,
    )
)]
async fn list_tasks(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    query: Result<ApiQuery<ListTasksRequest>, ApiError>,
) -> Response {
    match query {
        Ok(ApiQuery(query)) => answer(caller(app, tenant).list(&query).await),
        Err(e) => refused(e),
    }
}

/// `GET /tasks/{id}`'s query.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
struct HistoryQuery {
    /// Messages of the history kept, the newest.
    #[param(maximum = 2147483647)]
    history_length: Option<u32>,
}

/// `{id}` of `/tasks/{id}`: a task's id, and the action after a `:`.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
struct TaskPath {
    /// The task's id; after it `:cancel` or `:subscribe` on `POST` (and
    /// `:subscribe` on `GET`, as the proto's binding has it).
    id: String,
}

/// `{id}` split at its action.
fn split(id: &str) -> (&str, Option<&str>) {
    match id.rsplit_once(':') {
        Some((task, action)) => (task, Some(action)),
        None => (id, None),
    }
}

/// `/tasks/{id}` with an action the method does not take: the route
/// that is not there.
fn no_such_route() -> Response {
    ApiError::NotFound.into_response()
}

/// `GET /tasks/{id}` reads a task (`historyLength` in the query);
/// `GET /tasks/{id}:subscribe` streams it.
#[utoipa::path(
    get,
    path = "/tasks/{id}",
    tag = "a2a",
    params(TaskPath, HistoryQuery),
    responses(
        (status = 200, description = "The `Task`, or for `{id}:subscribe` server-sent events of `StreamResponse`s", body = Object),
        BadRequest,
        NotFound,
    )
)]
async fn get_task(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    Path(TaskPath { id }): Path<TaskPath>,
    query: Result<ApiQuery<HistoryQuery>, ApiError>,
) -> Response {
    let query = match query {
        Ok(ApiQuery(query)) => query,
        Err(e) => return refused(e),
    };
    let caller = caller(app, tenant);
    match split(&id) {
        (task, None) => {
            let params = TaskQuery {
                history_length: query.history_length,
                ..TaskQuery::of(task)
            };
            answer(caller.get(&params).await)
        }
        (task, Some("subscribe")) => caller
            .subscribe(&TaskQuery::of(task))
            .await
            .unwrap_or_else(|e| problem(&e)),
        _ => no_such_route(),
    }
}

/// `POST /tasks/{id}:cancel` cancels a task; `POST /tasks/{id}:subscribe`
/// streams it until it ends or waits for input.
#[utoipa::path(
    post,
    path = "/tasks/{id}",
    tag = "a2a",
    params(TaskPath),
    responses(
        (status = 200, description = "`{id}:cancel`: the `Task`, canceled; `{id}:subscribe`: server-sent events of `StreamResponse`s", body = Object),
        (status = 400, description = "The task ended: there is nothing to subscribe to (`unsupported_operation`)"),
        NotFound,
        (status = 409, description = "The task ended: it cannot be canceled (`task_not_cancelable`)"),
    )
)]
async fn act_on_task(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    Path(TaskPath { id }): Path<TaskPath>,
) -> Response {
    let caller = caller(app, tenant);
    match split(&id) {
        (task, Some("cancel")) => answer(caller.cancel(&TaskQuery::of(task)).await),
        (task, Some("subscribe")) => caller
            .subscribe(&TaskQuery::of(task))
            .await
            .unwrap_or_else(|e| problem(&e)),
        _ => no_such_route(),
    }
}

/// `{id}` and `{config_id}` of a configuration's route.
#[derive(Debug, serde::Deserialize)]
struct ConfigPath {
    id: String,
    config_id: String,
}

/// Makes a push notification configuration for the task: its updates
/// from now on are POSTed to the URL (see docs/a2a.md).
#[utoipa::path(
    post,
    path = "/tasks/{id}/pushNotificationConfigs",
    tag = "a2a",
    params(("id" = String, Path, description = "The task's id")),
    request_body(content = PushConfigIn, description = "A `TaskPushNotificationConfig` (its `taskId` is the path's)"),
    responses(
        (status = 200, description = "The `TaskPushNotificationConfig` made (its `id` given or made)", body = Object),
        (status = 400, description = "A URL refused, or a field that is not valid (`invalid_params`)"),
        (status = 404, description = "No such task of the caller's (`task_not_found`)"),
    )
)]
async fn create_push_config(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
    config: Result<ApiJson<PushConfigIn>, ApiError>,
) -> Response {
    let config = match config {
        Ok(ApiJson(config)) => config,
        Err(e) => return refused(e),
    };
    let config = PushConfigIn {
        task_id: Some(id),
        ..config
    };
    answer(caller(app, tenant).create_push(&config).await)
}

/// A task's push notification configurations.
#[utoipa::path(
    get,
    path = "/tasks/{id}/pushNotificationConfigs",
    tag = "a2a",
    params(("id" = String, Path, description = "The task's id")),
    responses(
        (status = 200, description = "A `ListTaskPushNotificationConfigsResponse`: `configs`, `nextPageToken`", body = Object),
        NotFound,
    )
)]
async fn list_push_configs(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
) -> Response {
    let params = ConfigQuery {
        task_id: Some(id),
        id: None,
    };
    answer(caller(app, tenant).list_pushes(&params).await)
}

/// One push notification configuration of a task.
#[utoipa::path(
    get,
    path = "/tasks/{id}/pushNotificationConfigs/{config_id}",
    tag = "a2a",
    params(
        ("id" = String, Path, description = "The task's id"),
        ("config_id" = String, Path, description = "The configuration's id"),
    ),
    responses(
        (status = 200, description = "The `TaskPushNotificationConfig`", body = Object),
        NotFound,
    )
)]
async fn get_push_config(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    Path(ConfigPath { id, config_id }): Path<ConfigPath>,
) -> Response {
    let params = ConfigQuery {
        task_id: Some(id),
        id: Some(config_id),
    };
    answer(caller(app, tenant).get_push(&params).await)
}

/// Deletes a push notification configuration of a task: nothing more is
/// pushed to it.
#[utoipa::path(
    delete,
    path = "/tasks/{id}/pushNotificationConfigs/{config_id}",
    tag = "a2a",
    params(
        ("id" = String, Path, description = "The task's id"),
        ("config_id" = String, Path, description = "The configuration's id"),
    ),
    responses(
        (status = 200, description = "`{}`", body = Object),
        NotFound,
    )
)]
async fn delete_push_config(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    Path(ConfigPath { id, config_id }): Path<ConfigPath>,
) -> Response {
    let params = ConfigQuery {
        task_id: Some(id),
        id: Some(config_id),
    };
    answer(caller(app, tenant).delete_push(&params).await)
}

/// The extended agent card (behind the key): the public card, and a
/// skill for each tool the agent may use. With keys off there is none.
#[utoipa::path(
    get,
    path = "/extendedAgentCard",
    tag = "a2a",
    responses(
        (status = 200, description = "The extended `AgentCard`", body = Object),
        (status = 400, description = "Keys are off: no caller can be authenticated, so there is no extended card (`extended_agent_card_not_configured`)"),
    )
)]
async fn extended_agent_card(State(app): State<Shared>) -> Response {
    match card::extended_card(&app) {
        Ok(card) => axum::Json(card).into_response(),
        Err(error) => problem(&error),
    }
}
