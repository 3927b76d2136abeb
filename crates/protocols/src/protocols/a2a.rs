//! A2A (the Agent2Agent protocol, 1.0, JSON-RPC binding): the agent card
//! at `/.well-known/agent-card.json` and the methods at `POST /a2a`, so
//! that other agents and orchestrators can delegate to this one.
//!
//! A task is a turn (its id the turn's), its context the turn's session.
//! `SendMessage` and `SendStreamingMessage` begin a turn, or answer the
//! call a task waits on (`input-required`: a pending approval, or a call
//! of a tool the client runs, declared in the request's
//! `metadata.clientTools`) with a message in that task; `GetTask`, `ListTasks` (the caller's tasks, filtered and paged),
//! `CancelTask` and `SubscribeToTask` (the task's log, from any replica)
//! read and stop them. Every answer is HTTP 200 with a JSON-RPC result or
//! error (the A2A codes), as the protocol's own server answers.

mod card;
mod params;
pub mod push;
mod rest;
mod task;
mod wire;

use axum::{
    Extension,
    body::Bytes,
    extract::State,
    response::{IntoResponse, Response},
};
use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::{
    Encoded, WireFormat,
    client_calls::answer_calls,
    jsonrpc::{
        self, Answer, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND,
        PARSE_ERROR, Version,
    },
    stream_for, typed,
};
use crate::{
    events::StoredEvent,
    ids::Tenant,
    protocols::Shared,
    protocols::{
        endpoint::{Started, named_session},
        error::ApiError,
        json::ApiJson,
        native::{ClientToolBody, checked_client_tools, checked_content},
    },
    service::CancelError,
    service::{TurnRecord, TurnStatus},
    turn::TurnRequest,
};
use params::{client_answers, decisions, history_length, message_content, parse, task_id};
use task::TaskFold;
use wire::{MessageIn, SendMessageRequest, StreamResponse, Task, TaskList, TaskQuery};

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    crate::protocols::Shared: axum::extract::FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(card::agent_card))
        .routes(routes!(card::agent_card_at_endpoint))
        .merge(rest::router())
        .routes(routes!(a2a))
}

/// The protocol version served.
const VERSION: &str = "1.0";

// A2A's error codes (beside JSON-RPC's).
const TASK_NOT_FOUND: i64 = -32001;
const TASK_NOT_CANCELABLE: i64 = -32002;
const PUSH_NOTIFICATION_NOT_SUPPORTED: i64 = -32003;
const UNSUPPORTED_OPERATION: i64 = -32004;
const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
const EXTENDED_AGENT_CARD_NOT_CONFIGURED: i64 = -32007;

/// A JSON-RPC error of a method.
#[derive(Debug)]
struct RpcError(i64, String);

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        Self(code, message.into())
    }
}

fn rpc_error(id: &Value, RpcError(code, message): RpcError) -> Value {
    jsonrpc::error(id, code, &message)
}

fn answer(message: &impl Serialize) -> Response {
    axum::Json(message).into_response()
}

/// One JSON-RPC request of A2A.
#[utoipa::path(
    post,
    path = "/a2a",
    tag = "a2a",
    request_body(content = Value, description = "Any JSON: one JSON-RPC 2.0 request of A2A 1.0 is answered, anything else gets a JSON-RPC error with HTTP 200, as the protocol says. One request of A2A 1.0 (https://a2a-protocol.org/v1.0.0/specification/#jsonrpc-transport): SendMessage, SendStreamingMessage, GetTask, ListTasks, CancelTask, SubscribeToTask"),
    responses(
        (status = 200, description = "The JSON-RPC result or error, or for the streaming methods a stream of JSON-RPC results (`StreamResponse`s)", body = Object),
    )
)]
async fn a2a(
    State(app): State<Shared>,
    Extension(tenant): Extension<Tenant>,
    body: Result<ApiJson<Value>, ApiError>,
) -> Result<Response, ApiError> {
    let message = match body {
        Ok(ApiJson(message)) => message,
        Err(ApiError::InvalidJson(detail) | ApiError::InvalidBody { detail, .. }) => {
            return Ok(answer(&rpc_error(
                &Value::Null,
                RpcError::new(PARSE_ERROR, detail),
            )));
        }
        Err(other) => return Err(other),
    };
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    if !jsonrpc::valid_id(&id) {
        return Ok(answer(&jsonrpc::invalid_id()));
    }
    let (Some(method), true) = (
        message.get("method").and_then(Value::as_str),
        jsonrpc::is_message(&message),
    ) else {
        let error = RpcError::new(INVALID_REQUEST, "not a JSON-RPC 2.0 request");
        return Ok(answer(&rpc_error(&id, error)));
    };
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    let caller = Caller {
        app: app.clone(),
        tenant,
        binding: Binding::JsonRpc(id.clone()),
    };
    let result = match method {
        "SendMessage" => match parse(params) {
            Ok(request) => caller.send(request, false).await,
            Err(e) => Err(e),
        },
        "SendStreamingMessage" => match parse(params) {
            Ok(request) => caller.send(request, true).await,
            Err(e) => Err(e),
        },
        "SubscribeToTask" => match parse::<TaskQuery>(params) {
            Ok(query) => caller.subscribe(&query).await,
            Err(e) => Err(e),
        },
        other => caller.call(other, params).await,
    };
    // A streaming method's error is a stream too: one event, the error
    // (as the protocol's own server answers, and its clients read).
    let streams = matches!(method, "SendStreamingMessage" | "SubscribeToTask");
    Ok(result.unwrap_or_else(|e| match streams {
        true => error_stream(&rpc_error(&id, e)),
        false => answer(&rpc_error(&id, e)),
    }))
}

/// A stream of one event: `error`.
fn error_stream(error: &Value) -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
        super::data_frame(error),
    )
        .into_response()
}

/// How a caller's answers are framed: JSON-RPC's (each result inside a
/// response with the request's id) or HTTP+JSON's (the bare object).
#[derive(Debug, Clone)]
enum Binding {
    JsonRpc(Value),
    Rest,
}

impl Binding {
    /// A result (a `Task`, a `StreamResponse`, …) as this binding says
    /// it, on a `data:` line.
    fn frame(&self, value: &impl Serialize) -> Bytes {
        match self {
            Self::JsonRpc(id) => super::data_frame(&Answer {
                jsonrpc: Version::V2,
                id,
                result: value,
            }),
            Self::Rest => super::data_frame(value),
        }
    }

    /// A result as this binding answers it.
    fn answer(&self, value: &impl Serialize) -> Response {
        match self {
            Self::JsonRpc(id) => answer(&Answer {
                jsonrpc: Version::V2,
                id,
                result: value,
            }),
            Self::Rest => answer(value),
        }
    }

    /// An error as this binding says it inside a stream.
    fn error_frame(&self, error: RpcError) -> Bytes {
        match self {
            Self::JsonRpc(id) => super::data_frame(&rpc_error(id, error)),
            Self::Rest => super::data_frame(&rest::problem_body(&error)),
        }
    }
}

/// Who called, and how the answer is framed.
struct Caller {
    app: Shared,
    tenant: Tenant,
    binding: Binding,
}

impl Caller {
    /// A method that answers one object (every one but those that send
    /// and stream), answered.
    async fn call(&self, method: &str, params: Value) -> Result<Response, RpcError> {
        let said = &self.binding;
        Ok(match method {
            "GetTask" => said.answer(&self.get(&parse(params)?).await?),
            "ListTasks" => said.answer(&self.list(&parse(params)?).await?),
            "CancelTask" => said.answer(&self.cancel(&parse(params)?).await?),
            // Behind the key like every method here: only when keys are on.
            "GetExtendedAgentCard" => said.answer(&card::extended_card(&self.app)?),
            "CreateTaskPushNotificationConfig" => {
                said.answer(&self.create_push(&parse(params)?).await?)
            }
            "GetTaskPushNotificationConfig" => said.answer(&self.get_push(&parse(params)?).await?),
            "ListTaskPushNotificationConfigs" => {
                said.answer(&self.list_pushes(&parse(params)?).await?)
            }
            "DeleteTaskPushNotificationConfig" => {
                said.answer(&self.delete_push(&parse(params)?).await?)
            }
            other => {
                return Err(RpcError::new(
                    METHOD_NOT_FOUND,
                    format!("method {other:?} not found"),
                ));
            }
        })
    }

    /// The caller's turn of a task id, or `TaskNotFound` (another
    /// tenant's is answered as one that does not exist).
    async fn turn(&self, turn_id: Uuid) -> Result<TurnRecord, RpcError> {
        let record = self
            .app
            .turns
            .find_turn(turn_id)
            .await?
            .ok_or_else(|| RpcError::new(TASK_NOT_FOUND, "task not found"))?;
        if record.session_id.clone().tenant() != self.tenant.0 {
            return Err(RpcError::new(TASK_NOT_FOUND, "task not found"));
        }
        Ok(record)
    }

    /// The task of a turn, folded from what its log holds now.
    async fn fold(&self, record: &TurnRecord) -> Result<TaskFold, RpcError> {
        let session = record.session_id.clone();
        let mut fold = TaskFold::new(record.id.to_string(), session.id().to_owned());
        self.app
            .turns
            .read_turn(record, |stored| {
                if let Some(event) = typed(stored) {
                    fold.event(stored, event);
                }
                fold.ended()
            })
            .await?;
        Ok(fold)
    }

    async fn get(&self, params: &TaskQuery) -> Result<Task, RpcError> {
        let record = self.turn(task_id(params.id.as_deref())?).await?;
        let history = history_length(params.history_length)?;
        Ok(self.fold(&record).await?.task(history))
    }

    /// The caller's tasks, newest first, that the params' filters take
    /// (`contextId`, `status`, `statusTimestampAfter`), a page at a time.
    async fn list(&self, params: &wire::ListTasksRequest) -> Result<TaskList, RpcError> {
        let query = params::list_query(params, &self.tenant)?;
        if query.state == Some(None) {
            return Ok(TaskList {
                tasks: Vec::new(),
                next_page_token: String::new(),
                page_size: 0,
                total_size: 0,
            });
        }
        let (mut turns, total) = self
            .app
            .turns
            .list_tenant_turns(&self.tenant.0, &query.filter, query.before, query.size + 1)
            .await?;
        // One more than the page: whether a next page exists.
        let more = turns.len() > query.size as usize;
        turns.truncate(query.size as usize);
        let mut tasks = Vec::new();
        for record in &turns {
            let mut task = self.fold(record).await?.task(query.history);
            if query
                .state
                .is_some_and(|state| state != Some(task.status.state))
            {
                continue;
            }
            if !query.artifacts {
                task.artifacts = None;
            }
            tasks.push(task);
        }
        let next = match (more, turns.last()) {
            (true, Some(last)) => last.id.to_string(),
            _ => String::new(),
        };
        Ok(TaskList {
            page_size: tasks.len(),
            tasks,
            next_page_token: next,
            total_size: total,
        })
    }

    async fn cancel(&self, params: &TaskQuery) -> Result<Task, RpcError> {
        let record = self.turn(task_id(params.id.as_deref())?).await?;
        let session = record.session_id.clone();
        match self.app.turns.cancel(&session, record.id).await {
            Ok(_) => {}
            Err(CancelError::NotFound) => {
                return Err(RpcError::new(TASK_NOT_FOUND, "task not found"));
            }
            Err(CancelError::NotRunning(status)) => {
                return Err(RpcError::new(
                    TASK_NOT_CANCELABLE,
                    format!("the task ended ({status}): it cannot be canceled"),
                ));
            }
            Err(CancelError::Store(e)) => return Err(e.into()),
        }
        let record = self.turn(record.id).await?;
        Ok(self.fold(&record).await?.task(None))
    }

    /// `SendMessage` / `SendStreamingMessage`.
    async fn send(&self, request: SendMessageRequest, streams: bool) -> Result<Response, RpcError> {
        let SendMessageRequest {
            message,
            configuration,
            metadata,
        } = request;
        let immediately = configuration.return_immediately;
        let history = history_length(configuration.history_length)?;
        let app = &self.app;
        // A configuration for the task's pushes, checked before anything
        // begins (its task id is the task's).
        let push = match &configuration.task_push_notification_config {
            None => None,
            Some(given) => Some(push::parse_config(&self.app, Uuid::nil(), given)?),
        };
        let (session, turn_id, events, quiet_until) =
            match message.task_id.as_deref().filter(|t| !t.is_empty()) {
                Some(task) => {
                    let turn_id = Uuid::try_parse(task)
                        .map_err(|_| RpcError::new(TASK_NOT_FOUND, "task not found"))?;
                    let (record, last_seq) = self.answer_pending(turn_id, &message).await?;
                    self.push_to(push.as_ref(), &record.session_id, turn_id, last_seq)
                        .await?;
                    let events = crate::protocols::endpoint::follow(app, &record);
                    let session = record.session_id.clone();
                    (session, turn_id, events, last_seq)
                }
                None => {
                    let content = message_content(&message)?;
                    let json = configuration.json_only();
                    let started = self
                        .begin(&message, content, metadata.client_tools, json)
                        .await?;
                    let (session, turn_id) = (started.session.clone(), started.turn_id);
                    // Every update of the task, from its start.
                    self.push_to(push.as_ref(), &session, turn_id, 0).await?;
                    (session, turn_id, started.events(app), 0)
                }
            };
        let fold = TaskFold::new(turn_id.to_string(), session.id().to_owned());
        let mut stream = TaskStream {
            binding: self.binding.clone(),
            fold,
            quiet_until,
        };
        if streams {
            return Ok(stream_for(app, stream, events));
        }
        // Blocking: until the task ends or waits for the client (or at
        // once, with `returnImmediately`, as it stands after its start).
        let mut events = events;
        while let Some(stored) = events.next().await {
            let stored = stored?;
            stream.encode(&stored);
            let fresh = stored.seq > stream.quiet_until;
            if fresh && (stream.fold.pauses() || immediately) {
                break;
            }
        }
        Ok(self
            .binding
            .answer(&StreamResponse::Task(stream.fold.task(history))))
    }

    /// Begins a turn of `message` in its context (a new one when it names
    /// none).
    async fn begin(
        &self,
        message: &MessageIn,
        content: crate::turn::Joined,
        client_tools: Option<Value>,
        json: bool,
    ) -> Result<Started, RpcError> {
        let context = message.context_id.as_deref().filter(|c| !c.is_empty());
        let session = named_session(context, "a2a", &self.tenant)?;
        let declared: Vec<ClientToolBody> = match client_tools {
            None | Some(Value::Null) => Vec::new(),
            Some(tools) => serde_json::from_value(tools).map_err(|e| {
                RpcError::new(INVALID_PARAMS, format!("`metadata.clientTools`: {e}"))
            })?,
        };
        let (text, attachments) = checked_content(Some(content.text), content.attachments)?;
        let output = json.then(|| crate::turn::OutputFormat {
            name: "output".into(),
            schema: None,
            strict: false,
        });
        let asked = TurnRequest {
            client_tools: checked_client_tools(declared)?,
            attachments,
            output,
            ..TurnRequest::new(text)
        };
        match Started::start(&self.app, session, asked, None).await {
            Ok(started) => Ok(started),
            Err(crate::service::StartError::AlreadyRunning(running)) => Err(RpcError::new(
                UNSUPPORTED_OPERATION,
                format!("the context already runs task {running}: wait for it, or cancel it"),
            )),
            Err(e) => Err(ApiError::from(e).into()),
        }
    }

    /// A message in a task that waits for the client: the results of the
    /// client's calls ([`client_answers`]), or decisions of the task's
    /// pending approvals ([`decisions`]).
    async fn answer_pending(
        &self,
        turn_id: Uuid,
        message: &MessageIn,
    ) -> Result<(TurnRecord, i64), RpcError> {
        let record = self.turn(turn_id).await?;
        let session = record.session_id.clone();
        if record.status != TurnStatus::Running {
            return Err(RpcError::new(
                UNSUPPORTED_OPERATION,
                format!(
                    "the task ended ({}): send a new message without its taskId",
                    record.status
                ),
            ));
        }
        // What the log holds before the answer: the stream of the answer
        // goes on after it.
        let last_seq = self
            .app
            .turns
            .get_session(&session)
            .await?
            .map_or(0, |s| s.last_seq);
        let fold = self.fold(&record).await?;
        if fold.pending().is_empty() && fold.client_calls().is_empty() {
            return Err(RpcError::new(
                UNSUPPORTED_OPERATION,
                "the task is working and waits for nothing",
            ));
        }
        let answers = client_answers(message, &fold)?;
        if !answers.is_empty() {
            answer_calls(&self.app, &record, &answers).await?;
            return Ok((record, last_seq));
        }
        for decision in decisions(message, fold.pending())? {
            let approval = crate::protocols::approvals::bound(
                &self.app,
                &record,
                &decision.call_id,
                (decision.approve, decision.reason),
                None,
            )
            .await?;
            if let Ok(approval) = approval {
                self.app.turns.decide_approval(&approval).await?;
            }
        }
        self.app.turns.answered(turn_id).await;
        Ok((record, last_seq))
    }

    async fn subscribe(&self, params: &TaskQuery) -> Result<Response, RpcError> {
        let record = self.turn(task_id(params.id.as_deref())?).await?;
        if record.status != TurnStatus::Running {
            return Err(RpcError::new(
                UNSUPPORTED_OPERATION,
                format!("the task ended ({}): read it with GetTask", record.status),
            ));
        }
        let session = record.session_id.clone();
        let quiet_until = self
            .app
            .turns
            .get_session(&session)
            .await?
            .map_or(0, |s| s.last_seq);
        let events = crate::protocols::endpoint::follow(&self.app, &record);
        let format = TaskStream {
            binding: self.binding.clone(),
            fold: TaskFold::new(record.id.to_string(), session.id().to_owned()),
            quiet_until,
        };
        Ok(stream_for(&self.app, format, events))
    }
}

/// A task's `StreamResponse`s, each a JSON-RPC result on a `data:` line;
/// the stream ends when the task ends or waits for the client. The events
/// up to `quiet_until` (what the client has seen: a subscription, or the
/// answer to a task that waited) are folded without a word, and the task
/// as it stands then is the first thing said.
struct TaskStream {
    binding: Binding,
    fold: TaskFold,
    quiet_until: i64,
}

impl WireFormat for TaskStream {
    fn encode(&mut self, stored: &StoredEvent) -> Encoded {
        let Some(event) = typed(stored) else {
            return Encoded::default();
        };
        let said = self.fold.event(stored, event);
        if stored.seq < self.quiet_until {
            return Encoded::default();
        }
        let said = if stored.seq == self.quiet_until {
            vec![StreamResponse::Task(self.fold.task(None))]
        } else {
            said
        };
        let frames = said
            .iter()
            .map(|result| self.binding.frame(result))
            .collect();
        Encoded {
            frames,
            done: stored.seq > self.quiet_until && self.fold.pauses()
                || stored.seq == self.quiet_until && self.fold.ended(),
        }
    }

    fn unreadable(&mut self) -> Vec<Bytes> {
        let error = RpcError::new(
            INTERNAL_ERROR,
            "the task's log cannot be read; subscribe again",
        );
        vec![self.binding.error_frame(error)]
    }
}
