//! A2A 1.0's messages as this agent reads and writes them (the protobuf
//! JSON mapping: camelCase names, enums as their full names). Both
//! bindings deserialize a method's params into the same types; a field
//! may also be named by its proto name (`task_id` for `taskId`), as the
//! mapping allows. The contents of `metadata` and of data parts are the
//! client's and are read as they are.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::turn::WebCitation;

/// A task's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = A2aTaskState)]
pub enum TaskState {
    #[serde(rename = "TASK_STATE_UNSPECIFIED", alias = "")]
    Unspecified,
    #[serde(rename = "TASK_STATE_SUBMITTED")]
    Submitted,
    #[serde(rename = "TASK_STATE_WORKING")]
    Working,
    #[serde(rename = "TASK_STATE_INPUT_REQUIRED")]
    InputRequired,
    #[serde(rename = "TASK_STATE_COMPLETED")]
    Completed,
    #[serde(rename = "TASK_STATE_FAILED")]
    Failed,
    #[serde(rename = "TASK_STATE_CANCELED")]
    Canceled,
    #[serde(rename = "TASK_STATE_REJECTED")]
    Rejected,
    #[serde(rename = "TASK_STATE_AUTH_REQUIRED")]
    AuthRequired,
}

/// Who says a message.
#[derive(Debug, Clone, Copy, Serialize)]
pub enum Role {
    #[serde(rename = "ROLE_USER")]
    User,
    #[serde(rename = "ROLE_AGENT")]
    Agent,
}

// ---- What a client sends ----

/// A `SendMessageRequest` as this agent takes it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = A2aSendMessageRequest)]
pub struct SendMessageRequest {
    pub message: MessageIn,
    #[serde(default)]
    pub configuration: SendConfiguration,
    #[serde(default)]
    pub metadata: SendMetadata,
}

/// A message a client sends: its parts, text (or, in a task that waits
/// for the client, data parts that answer it).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = A2aMessage)]
pub struct MessageIn {
    #[schema(min_items = 1)]
    pub parts: Vec<PartIn>,
    /// The context (a session of the caller's): a new one when not given.
    #[serde(default, alias = "context_id")]
    #[schema(pattern = "^[A-Za-z0-9._:-]{0,128}$")]
    pub context_id: Option<String>,
    /// The task this message answers (one waiting for the client).
    #[serde(default, alias = "task_id")]
    #[schema(
        pattern = "^$|^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub task_id: Option<String>,
}

/// A part of a client's message. The schema names text parts only,
/// what a new message takes; in a task that waits for the client, data
/// parts answer it; any other part (a file, raw bytes) is refused with
/// `ContentTypeNotSupported`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
#[schema(as = A2aPart)]
pub enum PartIn {
    Text {
        /// Not blank, without U+0000.
        #[schema(min_length = 1, pattern = r"^[^\u0000]*[^\s\u0000][^\u0000]*$")]
        text: String,
    },
    /// A file's bytes (base64), with its `mediaType` and `filename`: an
    /// image, a PDF or a text file the message carries.
    #[serde(rename_all = "camelCase")]
    Raw {
        raw: String,
        #[serde(alias = "media_type")]
        media_type: Option<String>,
        filename: Option<String>,
    },
    /// A file by its `url` (`https`, or a `data:` URL).
    #[serde(rename_all = "camelCase")]
    Url {
        url: String,
        #[serde(alias = "media_type")]
        media_type: Option<String>,
        filename: Option<String>,
    },
    /// `{call_id, output, is_error}` answers a client's call, `{call_id,
    /// approve, reason}` decides an approval.
    #[serde(skip_serializing)]
    Data { data: Value },
    #[serde(skip_serializing)]
    Other(serde::de::IgnoredAny),
}

/// What a data part answers: the fields this agent reads of it.
#[derive(Debug, Default, Deserialize)]
pub struct CallData {
    pub call_id: Option<String>,
    #[serde(default)]
    pub approve: Option<Value>,
    #[serde(default)]
    pub output: Value,
    #[serde(default)]
    pub is_error: Option<bool>,
    #[serde(default)]
    pub reason: Option<Value>,
}

/// A `SendMessageConfiguration`: the fields this agent reads.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = A2aSendConfiguration)]
pub struct SendConfiguration {
    /// Answer at once, with the task as it stands after its start.
    #[serde(default, alias = "return_immediately")]
    pub return_immediately: bool,
    /// Messages of the task's history kept, the newest.
    #[serde(default, alias = "history_length")]
    #[schema(maximum = 2147483647)]
    pub history_length: Option<u32>,
    /// Where the task's updates are pushed.
    #[serde(default, alias = "task_push_notification_config")]
    pub task_push_notification_config: Option<PushConfigIn>,
    /// The media types the client takes as the answer: `application/json`
    /// alone asks for a JSON object, answered as a data part.
    #[serde(default, alias = "accepted_output_modes")]
    pub accepted_output_modes: Vec<String>,
}

impl SendConfiguration {
    /// Whether the client takes JSON alone as the answer.
    pub fn json_only(&self) -> bool {
        !self.accepted_output_modes.is_empty()
            && self
                .accepted_output_modes
                .iter()
                .all(|mode| mode.eq_ignore_ascii_case("application/json"))
    }
}

/// A `SendMessageRequest`'s `metadata`: the client's tools (the client
/// tools extension).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = A2aSendMetadata)]
pub struct SendMetadata {
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub client_tools: Option<Value>,
}

/// `GetTask`, `CancelTask` and `SubscribeToTask`: a task, and how much of
/// its history.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskQuery {
    /// The task's id (required: its absence is refused by the method).
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default, alias = "history_length")]
    pub history_length: Option<u32>,
}

impl TaskQuery {
    pub fn of(id: &str) -> Self {
        Self {
            id: Some(id.to_owned()),
            history_length: None,
        }
    }
}

/// `ListTasks`'s params, and `GET /tasks`'s query.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct ListTasksRequest {
    /// Only this context's tasks.
    #[serde(default, alias = "context_id")]
    #[param(pattern = "^[A-Za-z0-9._:-]{0,128}$")]
    pub context_id: Option<String>,
    /// Only tasks in this state.
    #[serde(default)]
    #[param(inline)]
    pub status: Option<TaskState>,
    /// Tasks a page holds: 1-100, 50 when not given.
    #[serde(default, alias = "page_size")]
    #[param(minimum = 1, maximum = 100)]
    pub page_size: Option<u32>,
    /// The `nextPageToken` of the page before.
    #[serde(default, alias = "page_token")]
    #[param(
        pattern = "^$|^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub page_token: Option<String>,
    /// Messages of each task's history kept, the newest.
    #[serde(default, alias = "history_length")]
    #[param(maximum = 2147483647)]
    pub history_length: Option<u32>,
    /// Only tasks whose status changed at or after this (RFC 3339).
    #[serde(default, alias = "status_timestamp_after")]
    #[param(format = DateTime)]
    pub status_timestamp_after: Option<String>,
    /// Whether each task carries its artifacts (false when not given).
    #[serde(default, alias = "include_artifacts")]
    pub include_artifacts: Option<bool>,
}

/// A `TaskPushNotificationConfig` as a client gives it (its `taskId` is
/// the path's on the HTTP+JSON binding).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = A2aPushConfig)]
pub struct PushConfigIn {
    #[serde(default, alias = "task_id")]
    #[schema(ignore)]
    pub task_id: Option<String>,
    /// Where the task's updates are POSTed: http(s), a public address
    /// unless `HARNESS_OUTBOUND_ALLOW_PRIVATE=true`.
    #[schema(min_length = 1, max_length = 2048, pattern = "^https?://")]
    pub url: String,
    /// The configuration's id: made when not given.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9._:-]{0,128}$")]
    pub id: Option<String>,
    /// Sent as `X-A2A-Notification-Token`.
    #[serde(default)]
    #[schema(max_length = 512, pattern = "^[\\x20-\\x7E]*$")]
    pub token: Option<String>,
    /// Sent as the `Authorization` header of each push.
    #[serde(default)]
    pub authentication: Option<AuthenticationIn>,
}

/// An `AuthenticationInfo`: the scheme and credentials of each push.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = A2aAuthentication)]
pub struct AuthenticationIn {
    #[serde(default)]
    pub scheme: Option<String>,
    #[serde(default)]
    pub credentials: Option<String>,
}

/// `GetTaskPushNotificationConfig`, `DeleteTaskPushNotificationConfig`
/// and `ListTaskPushNotificationConfigs`: a task's configuration (its
/// `id`: all of them, to list).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigQuery {
    #[serde(default, alias = "task_id")]
    pub task_id: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
}

// ---- What this agent says ----

/// A `Task`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    pub id: String,
    pub context_id: String,
    pub status: TaskStatus,
    pub history: Vec<Message>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<Vec<Artifact>>,
}

/// A `TaskStatus`.
#[derive(Debug, Clone, Serialize)]
pub struct TaskStatus {
    pub state: TaskState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
}

/// A `Message` of the agent's, or the user's in a task's history.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    pub message_id: String,
    pub context_id: String,
    pub task_id: String,
    pub role: Role,
    pub parts: Vec<Part>,
}

/// A `Part` this agent says: text, or data.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Part {
    Text(String),
    Data(Data),
}

/// What a data part of this agent's holds.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Data {
    /// A call: of a tool, one waiting for a person, or one the client runs
    /// (`runs: "client"`).
    Call {
        call_id: String,
        tool: String,
        arguments: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        runs: Option<&'static str>,
    },
    /// The answer's sources.
    Citations { citations: Citations },
    /// The answer as JSON (a client that takes `application/json` alone).
    Output(Value),
}

/// The sources an answer cites.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Citations {
    pub local: Vec<String>,
    pub web: Vec<WebCitation>,
}

/// An `Artifact`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    pub artifact_id: &'static str,
    pub name: &'static str,
    pub parts: Vec<Part>,
}

/// A `StreamResponse` (and `SendMessageResponse`: its `task`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamResponse {
    Task(Task),
    StatusUpdate(StatusUpdate),
    ArtifactUpdate(ArtifactUpdate),
}

/// A `TaskStatusUpdateEvent`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusUpdate {
    pub task_id: String,
    pub context_id: String,
    pub status: TaskStatus,
}

/// A `TaskArtifactUpdateEvent`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactUpdate {
    pub task_id: String,
    pub context_id: String,
    pub artifact: Artifact,
    pub append: bool,
    pub last_chunk: bool,
}

/// A `ListTasksResponse`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskList {
    pub tasks: Vec<Task>,
    pub next_page_token: String,
    pub page_size: usize,
    pub total_size: u64,
}

/// A `TaskPushNotificationConfig` as this agent says it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PushConfigOut {
    pub id: String,
    pub task_id: String,
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authentication: Option<AuthenticationOut>,
}

/// An `AuthenticationInfo` as this agent says it.
#[derive(Debug, Serialize)]
pub struct AuthenticationOut {
    pub scheme: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
}

/// A `ListTaskPushNotificationConfigsResponse`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PushConfigList {
    pub configs: Vec<PushConfigOut>,
    pub next_page_token: String,
}

/// An A2A error as an HTTP+JSON problem document.
#[derive(Debug, Serialize)]
pub struct ProblemOut {
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    pub code: &'static str,
}
