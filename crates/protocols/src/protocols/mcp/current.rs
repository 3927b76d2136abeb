//! MCP 2026-07-28, served by the official Rust SDK's server (rmcp): no
//! handshake and no session, every request carries its `_meta` (protocol
//! version, client capabilities) and the `Mcp-Method`/`Mcp-Name` headers,
//! which rmcp validates, with `server/discover`, caching hints and
//! `resultType` on every result. This file is what the agent adds: its
//! tools, and tasks that are turns (the `io.modelcontextprotocol/tasks`
//! extension): `ask` from a client that declares the extension answers a
//! task at once, and `tasks/get` reads the turn from the store, on any
//! replica; and input-required results, for a turn that waits for a
//! person's approval (see `current/input.rs`).

mod input;
mod listen;

use std::sync::Arc;

use axum::{
    body::Body,
    http::{HeaderMap, Method, Request},
    response::Response,
};
use futures::StreamExt as _;
use rmcp::{
    ErrorData as McpError, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
        CompleteRequestParams, CompleteResult, CreateTaskResult, DetailedTask,
        GetPromptRequestParams, GetPromptResponse, GetTaskParams, GetTaskResult, Implementation,
        InputRequests, InputRequiredResult, ListPromptsResult, ListResourceTemplatesResult,
        ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
        ReadResourceRequestParams, ReadResourceResponse, ResultType, ServerCapabilities,
        ServerConfig, SubscriptionFilter, Task, TaskPayload, TaskStatus, Tool, UpdateTaskParams,
    },
    service::{RequestContext, RoleServer, SubscriptionContext},
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
    },
};
use serde::Deserialize;
use serde_json::Value;
use tower::ServiceExt as _;
use uuid::Uuid;

use super::{
    legacy::VERSIONS,
    prompts,
    resources::{self, Unreadable},
    tools::{self, Answer, Asked},
};
use crate::{
    events::TurnEvent,
    ids::{SessionKey, Tenant},
    protocols::Shared,
    protocols::{endpoint::TurnEvents, error::ApiError, jsonrpc::to_value, typed},
    service::{TurnRecord, TurnStatus},
};

/// How often a client should poll a task, in ms.
const POLL_INTERVAL_MS: u64 = 1_000;

const INSTRUCTIONS: &str = "Call `ask` with a message to run one turn of this agent; pass the \
                            `session_id` it answers to go on with the conversation.";

/// Whether a request speaks 2026-07-28 (or a version after the legacy
/// ones, which rmcp then refuses as unsupported): its
/// `MCP-Protocol-Version` header names no legacy version, or without the
/// header its `_meta` names a protocol version, or it is a discovery.
pub(super) fn asks_for(headers: &HeaderMap, message: &Value) -> bool {
    match headers
        .get("mcp-protocol-version")
        .map(|v| v.to_str().unwrap_or_default().trim())
    {
        Some(version) => !VERSIONS.contains(&version),
        None => {
            let probe = Probe::deserialize(message).unwrap_or_default();
            probe.method.as_deref() == Some("server/discover")
                || probe
                    .params
                    .and_then(|p| p.meta)
                    .is_some_and(|meta| meta.protocol_version.is_some())
        }
    }
}

/// What [`asks_for`] reads of a message.
#[derive(Debug, Default, Deserialize)]
struct Probe {
    method: Option<String>,
    params: Option<ProbeParams>,
}

#[derive(Debug, Deserialize)]
struct ProbeParams {
    #[serde(rename = "_meta")]
    meta: Option<ProbeMeta>,
}

#[derive(Debug, Deserialize)]
struct ProbeMeta {
    #[serde(rename = "io.modelcontextprotocol/protocolVersion")]
    protocol_version: Option<Value>,
}

/// Answers one request through rmcp's streamable HTTP server, statelessly.
pub(super) async fn answer(
    app: Shared,
    tenant: Tenant,
    headers: HeaderMap,
    message: &Value,
) -> Result<Response, ApiError> {
    let body = serde_json::to_vec(message).map_err(|e| ApiError::Internal(e.to_string()))?;
    let mut request = Request::new(Body::from(body));
    *request.method_mut() = Method::POST;
    *request.headers_mut() = headers;
    request.extensions_mut().insert(tenant);
    // The service's own layers check Host and Origin, and bound bodies.
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .disable_allowed_hosts();
    let server = Current { app };
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let response = service
        .oneshot(request)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(response.map(Body::new))
}

/// The agent as an rmcp server handler, for one request.
#[derive(Clone)]
struct Current {
    app: Shared,
}

/// The caller's tenant, which the auth layer put on the request.
fn tenant_of(context: &RequestContext<RoleServer>) -> Result<Tenant, McpError> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Tenant>())
        .cloned()
        .ok_or_else(|| McpError::internal_error("no tenant for the request", None))
}

fn internal(e: impl std::fmt::Display) -> McpError {
    McpError::internal_error(e.to_string(), None)
}

/// A tool result, complete (not a task, nor input asked).
fn tool_result(mut result: CallToolResult) -> Result<CallToolResult, McpError> {
    result.result_type = Some(ResultType::COMPLETE);
    Ok(result)
}

/// A tool call's answer as rmcp's response.
fn complete(answer: Result<Answer, ApiError>) -> Result<CallToolResponse, McpError> {
    match answer.map_err(internal)? {
        Ok(result) => Ok(CallToolResponse::Complete(tool_result(result)?)),
        Err(detail) => Err(McpError::invalid_params(detail, None)),
    }
}

fn task_not_found() -> McpError {
    McpError::invalid_params("task not found", None)
}

impl Current {
    /// `ask`: a task at once for a client that declared the tasks
    /// extension, else the turn's answer when it ends (its text as
    /// progress notifications when the call names a progress token).
    async fn ask(
        &self,
        tenant: &Tenant,
        arguments: Option<&rmcp::model::JsonObject>,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let (session, started) = match tools::start_ask(&self.app, tenant, arguments).await {
            Asked::Started(session, started) => (session, started),
            Asked::Invalid(detail) => return Err(McpError::invalid_params(detail, None)),
            Asked::Refused(result) => return Ok(CallToolResponse::Complete(tool_result(result)?)),
        };
        let tasks = context
            .client_capabilities()
            .is_some_and(|capabilities| capabilities.supports_tasks());
        if tasks {
            let now = chrono::Utc::now().to_rfc3339();
            let handle = task(started.turn_id, TaskStatus::Working, now.clone(), now);
            return Ok(CallToolResponse::Task(CreateTaskResult::new(handle)));
        }
        let turn_id = started.turn_id;
        let events = started.events(&self.app);
        self.settle(&session, turn_id, events, 0, context).await
    }

    /// Follows a turn until it ends, or until a call asks for a person's
    /// approval after `quiet_until` (a seq of its session's log): then the
    /// answer is an input-required result. Each text delta is a progress
    /// notification when the call names a progress token.
    async fn settle(
        &self,
        session: &SessionKey,
        turn_id: Uuid,
        mut events: TurnEvents,
        quiet_until: i64,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let token = context.meta.get_progress_token();
        let mut done = 0u32;
        let mut asked = false;
        while let Some(event) = events.next().await {
            let Ok(event) = event else { break };
            let fresh = event.seq > quiet_until;
            match typed(&event) {
                Some(TurnEvent::MessageDelta { text, .. }) if fresh => {
                    let Some(token) = &token else { continue };
                    done += 1;
                    let note = ProgressNotificationParam::new(token.clone(), f64::from(done))
                        .with_message(text.clone());
                    if context.peer.notify_progress(note).await.is_err() {
                        break;
                    }
                }
                Some(TurnEvent::ApprovalRequested { .. }) if fresh => {
                    asked = true;
                    break;
                }
                Some(event) if event.is_terminal() => break,
                _ => {}
            }
        }
        if asked
            && let Some(record) = self
                .app
                .turns
                .get_turn(session, turn_id)
                .await
                .map_err(internal)?
            && record.status == TurnStatus::Running
        {
            let waiting = input::waiting(&self.app, &record).await.map_err(internal)?;
            if !waiting.is_empty() {
                return input_required(turn_id, &waiting);
            }
        }
        let record = self
            .app
            .turns
            .wait_for_end(session, turn_id)
            .await
            .map_err(internal)?
            .ok_or_else(|| internal(ApiError::ShuttingDown))?;
        let result = tool_result(tools::answer_of(session, &record))?;
        Ok(CallToolResponse::Complete(result))
    }

    /// `ask` again with the answers to an input-required result: its
    /// `requestState` names the caller's running turn, and each response
    /// decides the call it is keyed by. Calls left undecided are asked
    /// again; once every call is decided, the turn goes on.
    async fn answer_input(
        &self,
        tenant: &Tenant,
        state: &str,
        responses: rmcp::model::InputResponses,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let record = self.turn(tenant, state).await.map_err(|_| {
            McpError::invalid_params(
                "`requestState` is not one this server gave to the caller",
                None,
            )
        })?;
        let session = record.session_id.clone();
        if record.status != TurnStatus::Running {
            let result = tool_result(tools::answer_of(&session, &record))?;
            return Ok(CallToolResponse::Complete(result));
        }
        let waiting = input::waiting(&self.app, &record).await.map_err(internal)?;
        let responses: serde_json::Map<String, Value> = responses.into_iter().collect();
        let (decided, undecided) = input::decisions(&responses, &waiting)
            .map_err(|why| McpError::invalid_params(why, None))?;
        let quiet_until = self
            .app
            .turns
            .get_session(&session)
            .await
            .map_err(internal)?
            .map_or(0, |s| s.last_seq);
        if !decided.is_empty() {
            input::decide(&self.app, &record, decided)
                .await
                .map_err(internal)?
                .map_err(|why| McpError::invalid_params(why, None))?;
        }
        if !undecided.is_empty() {
            return input_required(record.id, &undecided);
        }
        let events = crate::protocols::endpoint::follow(&self.app, &record);
        self.settle(&session, record.id, events, quiet_until, context)
            .await
    }

    /// The caller's turn of a task id; another tenant's is one that does
    /// not exist.
    async fn turn(&self, tenant: &Tenant, task_id: &str) -> Result<TurnRecord, McpError> {
        let turn_id = Uuid::parse_str(task_id).map_err(|_| task_not_found())?;
        let record = self
            .app
            .turns
            .find_turn(turn_id)
            .await
            .map_err(internal)?
            .ok_or_else(task_not_found)?;
        if record.session_id.clone().tenant() != tenant.0 {
            return Err(task_not_found());
        }
        Ok(record)
    }
}

/// An input-required result asking for a decision on each call that
/// waits; its `requestState` is the turn's id.
fn input_required(turn_id: Uuid, waiting: &[input::Waiting]) -> Result<CallToolResponse, McpError> {
    let requests: InputRequests =
        serde_json::from_value(to_value(&input::requests(waiting))).map_err(internal)?;
    Ok(CallToolResponse::InputRequired(InputRequiredResult::new(
        Some(requests),
        Some(turn_id.to_string()),
    )))
}

/// A task's metadata.
fn task(turn_id: Uuid, status: TaskStatus, created_at: String, updated_at: String) -> Task {
    // Kept as long as its turn is: no expiry of its own (`ttlMs: null`).
    Task::new(turn_id.to_string(), status, created_at, updated_at)
        .with_poll_interval_ms(POLL_INTERVAL_MS)
}

/// A turn as a task: working while it runs; a turn that ended otherwise
/// than completed is a tool error of a completed task (a task fails only
/// on a protocol error), and a cancelled one is cancelled.
fn detailed(record: &TurnRecord, waiting: &[input::Waiting]) -> Result<DetailedTask, McpError> {
    let payload = match record.status {
        TurnStatus::Running if !waiting.is_empty() => TaskPayload::InputRequired {
            input_requests: serde_json::from_value(to_value(&input::requests(waiting)))
                .map_err(internal)?,
        },
        TurnStatus::Running => TaskPayload::Working,
        TurnStatus::Cancelled => TaskPayload::Cancelled,
        _ => {
            let session = record.session_id.clone();
            match to_value(&tools::answer_of(&session, record)) {
                Value::Object(result) => TaskPayload::Completed { result },
                _ => return Err(internal("a tool result is an object")),
            }
        }
    };
    let updated = record.finished_at.unwrap_or(record.created_at).to_rfc3339();
    let meta = task(
        record.id,
        payload.status(),
        record.created_at.to_rfc3339(),
        updated,
    );
    Ok(DetailedTask::new(meta, payload))
}

impl ServerHandler for Current {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_completions()
                .enable_prompts()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_resources_list_changed()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new(
            "agent-harness",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools::definitions(
            &self.app,
        )))
    }

    /// A tool's definition, for rmcp's check of the `Mcp-Param-*`
    /// headers a 2026-07-28 request carries against its arguments.
    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools::definitions(&self.app)
            .into_iter()
            .find(|tool| tool.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let tenant = tenant_of(&context)?;
        if let Some(state) = &request.request_state
            && request.name == "ask"
        {
            let responses = request.input_responses.clone().unwrap_or_default();
            return self.answer_input(&tenant, state, responses, &context).await;
        }
        let arguments = request.arguments.as_ref();
        match request.name.as_ref() {
            "ask" => self.ask(&tenant, arguments, &context).await,
            "list_sessions" => complete(tools::list_sessions(&self.app, &tenant, arguments).await),
            "get_session" => complete(tools::get_session(&self.app, &tenant, arguments).await),
            other => Err(McpError::invalid_params(
                format!("unknown tool {other:?}"),
                None,
            )),
        }
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(prompts::list(&self.app)))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        match prompts::get(&self.app, &request.name, request.arguments.as_ref()) {
            Ok(mut result) => {
                result.result_type = Some(ResultType::COMPLETE);
                Ok(GetPromptResponse::Complete(result))
            }
            Err(detail) => Err(McpError::invalid_params(detail, None)),
        }
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        listen::accepted(requested)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        self.listen_until_cancelled(context).await
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let tenant = tenant_of(&context)?;
        let listed = resources::list(&self.app, &tenant)
            .await
            .map_err(internal)?;
        Ok(ListResourcesResult::with_all_items(listed))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(
            resources::templates(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let tenant = tenant_of(&context)?;
        match resources::read(&self.app, &tenant, &request.uri).await {
            Ok(mut result) => {
                result.result_type = Some(ResultType::COMPLETE);
                Ok(ReadResourceResponse::Complete(result))
            }
            Err(Unreadable::NotFound(message)) => Err(McpError::resource_not_found(
                message,
                Some(to_value(&super::wire::UriData { uri: &request.uri })),
            )),
            Err(Unreadable::Failed(e)) => Err(internal(e)),
        }
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let tenant = tenant_of(&context)?;
        match resources::complete(&self.app, &tenant, &request)
            .await
            .map_err(internal)?
        {
            Ok(mut result) => {
                result.result_type = Some(ResultType::COMPLETE);
                Ok(result)
            }
            Err(detail) => Err(McpError::invalid_params(detail, None)),
        }
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let tenant = tenant_of(&context)?;
        let record = self.turn(&tenant, &request.task_id).await?;
        let waiting = match record.status {
            TurnStatus::Running => input::waiting(&self.app, &record).await.map_err(internal)?,
            _ => Vec::new(),
        };
        Ok(GetTaskResult::new(detailed(&record, &waiting)?))
    }

    /// `tasks/update`: the answers to a task's input requests, each
    /// deciding the call it is keyed by; a key that is not an outstanding
    /// request is invalid params.
    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let tenant = tenant_of(&context)?;
        let record = self.turn(&tenant, &request.task_id).await?;
        let waiting = match record.status {
            TurnStatus::Running => input::waiting(&self.app, &record).await.map_err(internal)?,
            _ => Vec::new(),
        };
        if let Some(stray) = request
            .input_responses
            .keys()
            .find(|key| !waiting.iter().any(|w| &w.call_id == *key))
        {
            return Err(McpError::invalid_params(
                format!("{stray:?} is not an outstanding input request of the task"),
                None,
            ));
        }
        let responses: serde_json::Map<String, Value> =
            request.input_responses.into_iter().collect();
        let (decided, _) = input::decisions(&responses, &waiting)
            .map_err(|why| McpError::invalid_params(why, None))?;
        input::decide(&self.app, &record, decided)
            .await
            .map_err(internal)?
            .map_err(|why| McpError::invalid_params(why, None))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let tenant = tenant_of(&context)?;
        let record = self.turn(&tenant, &request.task_id).await?;
        if record.status == TurnStatus::Running
            && let Err(e) = self.app.turns.cancel(&record.session_id, record.id).await
        {
            tracing::debug!(error = %e, turn.id = %record.id, "a task cancel found its turn ended");
        }
        Ok(())
    }
}
