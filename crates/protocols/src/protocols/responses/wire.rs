//! What the Responses API says: the `response` object, its output items
//! and the stream events (`ResponseStreamEvent`s), as OpenAI's types name
//! them.

use serde::Serialize;
use serde_json::Value;

/// A `response` object.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: i64,
    pub status: &'static str,
    pub background: bool,
    pub conversation: Conversation,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<Incomplete>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub metadata: Value,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: ReasoningShown,
    pub store: bool,
    pub temperature: Option<f64>,
    pub text: TextShown,
    pub tool_choice: &'static str,
    pub tools: Vec<FunctionTool>,
    pub top_p: Option<f64>,
    pub truncation: &'static str,
    pub usage: Option<Usage>,
    pub user: Option<String>,
}

/// `conversation`: the session.
#[derive(Debug, Clone, Serialize)]
pub struct Conversation {
    pub id: String,
}

/// A response's `error`.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseError {
    pub code: String,
    pub message: String,
}

/// `incomplete_details`.
#[derive(Debug, Clone, Serialize)]
pub struct Incomplete {
    pub reason: &'static str,
}

/// `reasoning`: the asked effort, shown back.
#[derive(Debug, Clone, Serialize)]
pub struct ReasoningShown {
    pub effort: Option<String>,
    pub summary: Option<String>,
}

/// `text`: plain text.
#[derive(Debug, Clone, Serialize)]
pub struct TextShown {
    pub format: TextFormat,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextFormat {
    Text,
}

/// A client's `function` tool, shown back.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename = "function")]
pub struct FunctionTool {
    pub name: String,
    pub description: String,
    pub parameters: Value,
    pub strict: bool,
}

/// A response's `usage`.
#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub input_tokens_details: InputDetails,
    pub output_tokens: u64,
    pub output_tokens_details: OutputDetails,
    pub total_tokens: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct InputDetails {
    pub cached_tokens: u64,
    pub cache_write_tokens: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct OutputDetails {
    pub reasoning_tokens: u64,
}

/// An output item.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Message {
        id: String,
        role: &'static str,
        status: &'static str,
        content: Vec<OutputText>,
    },
    /// A call of the service's own tools.
    McpCall {
        id: String,
        name: String,
        arguments: String,
        server_label: &'static str,
        status: &'static str,
        output: Option<String>,
        error: Option<McpError>,
        #[serde(skip_serializing_if = "Option::is_none")]
        approval_request_id: Option<String>,
    },
    /// A call that waits for a person.
    McpApprovalRequest {
        id: String,
        name: String,
        arguments: String,
        server_label: &'static str,
    },
    /// A call of the client's tool.
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
    /// The model's reasoning in a step: its text, as one `reasoning_text`
    /// part (no summary).
    Reasoning {
        id: String,
        summary: Vec<ReasoningText>,
        content: Vec<ReasoningText>,
        status: &'static str,
    },
}

/// A `reasoning_text` part.
#[derive(Debug, Clone, Serialize)]
pub struct ReasoningText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
}

impl OutputItem {
    pub fn id(&self) -> &str {
        match self {
            Self::Message { id, .. }
            | Self::McpCall { id, .. }
            | Self::McpApprovalRequest { id, .. }
            | Self::FunctionCall { id, .. }
            | Self::Reasoning { id, .. } => id,
        }
    }
}

/// A failed `mcp_call`'s error.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename = "mcp_tool_execution_error")]
pub struct McpError {
    pub content: String,
}

/// An `output_text` content part.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename = "output_text")]
pub struct OutputText {
    pub text: String,
    pub annotations: Vec<Annotation>,
    pub logprobs: NoLogprobs,
}

/// `logprobs`: none are given (`[]`).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoLogprobs;

impl Serialize for NoLogprobs {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(std::iter::empty::<()>())
    }
}

/// An annotation of the text: a source it cites.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Annotation {
    UrlCitation {
        url: String,
        title: String,
        start_index: usize,
        end_index: usize,
    },
    FileCitation {
        file_id: String,
        filename: String,
        index: usize,
    },
}

/// A stream event and its number.
#[derive(Debug, Serialize)]
pub struct Numbered {
    #[serde(flatten)]
    pub event: StreamEvent,
    pub sequence_number: u64,
}

/// A `ResponseStreamEvent`.
#[derive(Debug, Serialize)]
#[serde(tag = "type")]
pub enum StreamEvent {
    #[serde(rename = "response.created")]
    Created { response: Box<ResponseObject> },
    #[serde(rename = "response.in_progress")]
    InProgress { response: Box<ResponseObject> },
    #[serde(rename = "response.completed")]
    Completed { response: Box<ResponseObject> },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: Box<ResponseObject> },
    #[serde(rename = "response.failed")]
    Failed { response: Box<ResponseObject> },
    #[serde(rename = "response.output_item.added")]
    ItemAdded {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.output_item.done")]
    ItemDone {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    PartAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputText,
    },
    #[serde(rename = "response.content_part.done")]
    PartDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputText,
    },
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
        logprobs: NoLogprobs,
    },
    #[serde(rename = "response.output_text.done")]
    TextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
        logprobs: NoLogprobs,
    },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
    },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
    },
    #[serde(rename = "response.output_text.annotation.added")]
    AnnotationAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        annotation_index: usize,
        annotation: Annotation,
    },
    #[serde(rename = "response.mcp_call.in_progress")]
    McpCallInProgress {
        item_id: String,
        output_index: usize,
    },
    #[serde(rename = "response.mcp_call.completed")]
    McpCallCompleted {
        item_id: String,
        output_index: usize,
    },
    #[serde(rename = "response.mcp_call.failed")]
    McpCallFailed {
        item_id: String,
        output_index: usize,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone {
        item_id: String,
        output_index: usize,
        name: String,
        arguments: String,
    },
    #[serde(rename = "error")]
    Error {
        code: String,
        message: String,
        param: Option<String>,
    },
}

impl StreamEvent {
    /// The event's `type`, for the SSE `event:` line.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Created { .. } => "response.created",
            Self::InProgress { .. } => "response.in_progress",
            Self::Completed { .. } => "response.completed",
            Self::Incomplete { .. } => "response.incomplete",
            Self::Failed { .. } => "response.failed",
            Self::ItemAdded { .. } => "response.output_item.added",
            Self::ItemDone { .. } => "response.output_item.done",
            Self::PartAdded { .. } => "response.content_part.added",
            Self::PartDone { .. } => "response.content_part.done",
            Self::TextDelta { .. } => "response.output_text.delta",
            Self::TextDone { .. } => "response.output_text.done",
            Self::ReasoningTextDelta { .. } => "response.reasoning_text.delta",
            Self::ReasoningTextDone { .. } => "response.reasoning_text.done",
            Self::AnnotationAdded { .. } => "response.output_text.annotation.added",
            Self::McpCallInProgress { .. } => "response.mcp_call.in_progress",
            Self::McpCallCompleted { .. } => "response.mcp_call.completed",
            Self::McpCallFailed { .. } => "response.mcp_call.failed",
            Self::ArgumentsDelta { .. } => "response.function_call_arguments.delta",
            Self::ArgumentsDone { .. } => "response.function_call_arguments.done",
            Self::Error { .. } => "error",
        }
    }
}

/// A page of a response's input items.
#[derive(Debug, Serialize)]
pub struct ItemPage {
    pub object: &'static str,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
    pub data: Vec<InputItem>,
}

/// What `DELETE /v1/responses/{id}` answers.
#[derive(Debug, Serialize)]
pub struct Deleted {
    pub id: String,
    pub object: &'static str,
    pub deleted: bool,
}

/// An input item as `GET /v1/responses/{id}/input_items` shows it.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename = "message")]
pub struct InputItem {
    pub id: String,
    pub role: &'static str,
    pub status: &'static str,
    pub content: [ShownPart; 1],
}

/// The text of an input item.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ShownPart {
    InputText {
        text: String,
    },
    OutputText {
        text: String,
        annotations: [Annotation; 0],
    },
}
