//! LLM providers: the [`LlmProvider`] trait, the messages and stream events
//! it speaks, and the typed [`ProviderError`].
//!
//! An adapter turns its provider's wire format into [`ProviderEvent`]s:
//! text deltas as they arrive, tool calls once their arguments are whole,
//! usage, and the finish reason. The harness never sees a wire format.

pub mod anthropic;
pub mod catalogue;
pub mod chain;
pub mod demo;
mod drain;
pub mod embeddings;
pub mod error;
pub mod ollama;
pub mod openai;
mod parts;
pub mod pricing;
pub mod redact;
mod refusing;
pub mod scripted;
mod stream;
mod transport;

use std::{str::FromStr, sync::Arc, time::Duration};

pub use parts::{
    Attachment, Base64, OUTPUT_SCHEMA_MAX_BYTES, OUTPUT_SCHEMA_MAX_REFS, OutputFormat, Piece,
    value_has_nul,
};

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

pub use error::{ProviderError, ProviderFailure};

/// How much the model is asked to think (each adapter maps it: OpenAI
/// `reasoning_effort`, Anthropic extended thinking, Ollama `think`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThinkLevel {
    #[default]
    Off,
    Low,
    Medium,
    High,
}

impl FromStr for ThinkLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" => Ok(Self::Off),
            "low" => Ok(Self::Low),
            "medium" => Ok(Self::Medium),
            "high" => Ok(Self::High),
            other => Err(format!(
                "unknown think level {other:?} (off, low, medium, high)"
            )),
        }
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }

    /// A role of the conversation a prompt is made of (a tool's result is
    /// not one: it belongs to the step that called the tool).
    pub fn is_conversational(self) -> bool {
        self != Self::Tool
    }
}

/// A role name no chat API uses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {0:?}")]
pub struct UnknownRole(pub String);

/// A role by its name in the chat APIs: `developer` is the OpenAI API's
/// newer name for `system`.
impl std::str::FromStr for Role {
    type Err = UnknownRole;

    fn from_str(name: &str) -> Result<Self, UnknownRole> {
        match name {
            "system" | "developer" => Ok(Self::System),
            "user" => Ok(Self::User),
            "assistant" => Ok(Self::Assistant),
            "tool" => Ok(Self::Tool),
            other => Err(UnknownRole(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod role_tests {
    use super::Role;

    #[test]
    fn a_role_is_read_by_its_name_developer_as_system() {
        assert_eq!("system".parse(), Ok(Role::System));
        assert_eq!("developer".parse(), Ok(Role::System));
        assert_eq!("user".parse(), Ok(Role::User));
        assert_eq!("assistant".parse(), Ok(Role::Assistant));
        assert_eq!("tool".parse(), Ok(Role::Tool));
        assert!("function".parse::<Role>().is_err());
        assert!("System".parse::<Role>().is_err());
        for role in [Role::System, Role::User, Role::Assistant, Role::Tool] {
            assert_eq!(role.as_str().parse(), Ok(role));
        }
    }
}

/// A tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Arguments,
}

/// A tool call's arguments: the text the model sent (what goes back to it
/// in the conversation, and what is stored), parsed once, where the call
/// is made: every gate, the scheduler, replay and the events read the
/// parsed value. Text that is not JSON is one case, kept with why
/// ([`Arguments::json`] is `None`, [`Arguments::error`] says why).
#[derive(Debug, Clone)]
pub struct Arguments {
    raw: String,
    parsed: Result<serde_json::Value, String>,
}

impl Arguments {
    pub fn new(raw: String) -> Self {
        let parsed = serde_json::from_str(&raw).map_err(|e| e.to_string());
        Self { raw, parsed }
    }

    /// The text as the model sent it.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The text, for a call made anew from it.
    pub fn into_raw(self) -> String {
        self.raw
    }

    /// The arguments as JSON (any value: whether it is the object a tool
    /// takes is for validation to say); `None` for text that is not JSON.
    pub fn json(&self) -> Option<&serde_json::Value> {
        self.parsed.as_ref().ok()
    }

    /// Why the text is not JSON; `None` when it is.
    pub fn error(&self) -> Option<&str> {
        self.parsed.as_ref().err().map(String::as_str)
    }

    /// The arguments as an event shows them: the JSON, or the text as a
    /// JSON string when it is not JSON.
    pub fn shown(&self) -> serde_json::Value {
        self.json()
            .cloned()
            .unwrap_or_else(|| serde_json::Value::String(self.raw.clone()))
    }

    /// The arguments a provider's wire format sends back as an object:
    /// the JSON, or an empty object for text that is not JSON.
    pub fn or_empty_object(&self) -> serde_json::Value {
        self.json()
            .cloned()
            .unwrap_or_else(|| serde_json::Value::Object(serde_json::Map::new()))
    }
}

impl From<String> for Arguments {
    fn from(raw: String) -> Self {
        Self::new(raw)
    }
}

impl From<&str> for Arguments {
    fn from(raw: &str) -> Self {
        Self::new(raw.to_owned())
    }
}

/// Two calls' arguments are the same when the model sent the same text.
impl PartialEq for Arguments {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl Eq for Arguments {}

/// Stored and sent as the text the model sent.
impl Serialize for Arguments {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.raw)
    }
}

impl<'de> Deserialize<'de> for Arguments {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::new)
    }
}

#[cfg(test)]
mod arguments_tests {
    use serde_json::json;

    use super::{Arguments, ToolCall};

    #[test]
    fn arguments_are_parsed_where_the_call_is_made() {
        let call = Arguments::from(r#"{"q": "paris", "k": 2}"#);
        assert_eq!(call.json(), Some(&json!({"q": "paris", "k": 2})));
        assert_eq!(call.error(), None);
        assert_eq!(call.shown(), json!({"q": "paris", "k": 2}));
        assert_eq!(call.raw(), r#"{"q": "paris", "k": 2}"#);
    }

    #[test]
    fn text_that_is_not_json_is_one_case_with_its_reason() {
        let call = Arguments::from("{\"q\": ");
        assert_eq!(call.json(), None);
        assert!(
            call.error().is_some_and(|e| e.contains("EOF")),
            "{:?}",
            call.error()
        );
        // An event shows the text; a provider's wire gets an empty object.
        assert_eq!(call.shown(), json!("{\"q\": "));
        assert_eq!(call.or_empty_object(), json!({}));
    }

    /// A call is stored and sent back as the text the model sent, so
    /// records written before the arguments were typed read the same.
    #[test]
    fn a_call_is_stored_as_the_text_the_model_sent() {
        let call = ToolCall {
            id: "c1".into(),
            name: "search".into(),
            arguments: r#"{"k":1,  "q":"a"}"#.into(),
        };
        let stored = serde_json::to_string(&call).unwrap();
        assert_eq!(
            stored,
            r#"{"id":"c1","name":"search","arguments":"{\"k\":1,  \"q\":\"a\"}"}"#
        );
        let read: ToolCall = serde_json::from_str(&stored).unwrap();
        assert_eq!(read, call);
        assert_eq!(read.arguments.json(), Some(&json!({"k": 1, "q": "a"})));
    }
}

/// A provider's reasoning that must travel back with its assistant message
/// (Anthropic's thinking blocks, with their signature).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThinkingBlock {
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// A `redacted_thinking` block's data (its text is then empty): sent
    /// back as it came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redacted: Option<String>,
}

impl ThinkingBlock {
    /// A `redacted_thinking` block.
    pub fn redacted(data: String) -> Self {
        Self {
            text: String::new(),
            signature: None,
            redacted: Some(data),
        }
    }
}

/// One message of a prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
    /// What a user's message carries besides its text, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    /// Tool calls of an assistant message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Reasoning of an assistant message, sent back as the provider wants it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thinking: Vec<ThinkingBlock>,
    /// The call a tool message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            attachments: Vec::new(),
            tool_calls: Vec::new(),
            thinking: Vec::new(),
            tool_call_id: None,
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    pub fn assistant(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self {
            tool_calls,
            ..Self::new(Role::Assistant, content)
        }
    }

    pub fn tool(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            tool_call_id: Some(call_id.into()),
            ..Self::new(Role::Tool, content)
        }
    }
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments.
    pub parameters: serde_json::Value,
}

/// One generation request.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    /// Shared with the tool registry (schemas are not copied per turn).
    pub tools: Vec<Arc<ToolDefinition>>,
    /// The most this call may take, headers to last byte, retries included
    /// (the turn's remaining budget).
    pub timeout: Duration,
    /// How much the model should reason (provider-specific mapping).
    pub think_level: ThinkLevel,
    /// The provider the turn asked for by name (a chain picks it).
    pub provider: Option<String>,
    /// The most tokens the answer may take (`None`: the provider's and the
    /// adapter's defaults). Side calls (memory, judges) set it.
    pub max_output_tokens: Option<u32>,
    /// The JSON the answer must be, in the provider's own JSON mode where
    /// it has one.
    pub output: Option<OutputFormat>,
}

impl ChatRequest {
    /// The request's model, or `default` when it names none.
    pub fn model_or<'a>(&'a self, default: &'a str) -> &'a str {
        if self.model.is_empty() {
            default
        } else {
            &self.model
        }
    }

    pub fn new(model: &str, messages: Vec<ChatMessage>, timeout: Duration) -> Self {
        Self {
            model: model.to_owned(),
            messages,
            tools: Vec::new(),
            timeout,
            think_level: ThinkLevel::Off,
            provider: None,
            max_output_tokens: None,
            output: None,
        }
    }

    /// This request, its answer at most `tokens` long.
    pub fn with_max_output_tokens(mut self, tokens: u32) -> Self {
        self.max_output_tokens = Some(tokens);
        self
    }
}

/// Token counts reported by a provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_creation_tokens: u64,
    /// The output tokens the model reasoned with (among `output_tokens`,
    /// and priced as they are): as the provider reports them, else
    /// counted from the reasoning it streamed.
    #[serde(default)]
    pub reasoning_tokens: u64,
}

impl Usage {
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_creation_tokens += other.cache_creation_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
    }
}

/// The text and usage of a provider call made for the harness's own use
/// (a reflection, a compaction summary), not streamed to the client.
#[derive(Debug, Default)]
pub struct Collected {
    pub text: String,
    /// Every attempt's usage, failed ones included: they were billed.
    pub usage: Usage,
    /// What ended the call early, if anything did.
    pub error: Option<ProviderError>,
}

/// Sends `request` and reads its stream to the end.
pub async fn collect_text(provider: &dyn LlmProvider, request: ChatRequest) -> Collected {
    use futures::StreamExt;
    let mut collected = Collected::default();
    let mut stream = match provider.stream(request).await {
        Ok(stream) => stream,
        Err(e) => {
            collected.error = Some(e);
            return collected;
        }
    };
    while let Some(event) = stream.next().await {
        match event {
            Ok(ProviderEvent::TextDelta(delta)) => collected.text.push_str(&delta),
            Ok(ProviderEvent::Usage(usage)) => collected.usage.add(&usage),
            Ok(ProviderEvent::Restart { .. }) => collected.text.clear(),
            Ok(ProviderEvent::Finished(_)) => break,
            Ok(
                ProviderEvent::Thinking(_)
                | ProviderEvent::ReasoningDelta(_)
                | ProviderEvent::ToolCall(_),
            ) => {}
            Err(e) => {
                collected.error = Some(e);
                break;
            }
        }
    }
    collected
}

/// Why generation stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    ToolCalls,
    Length,
    ContentFilter,
    Other(String),
}

impl FinishReason {
    /// The OpenTelemetry GenAI name (`gen_ai.response.finish_reasons`).
    pub fn as_str(&self) -> &str {
        match self {
            Self::Stop => "stop",
            Self::ToolCalls => "tool_calls",
            Self::Length => "length",
            Self::ContentFilter => "content_filter",
            Self::Other(other) => other,
        }
    }

    pub fn from_wire(raw: &str) -> Self {
        match raw {
            "stop" | "end_turn" | "stop_sequence" => Self::Stop,
            "tool_calls" | "tool_use" | "function_call" => Self::ToolCalls,
            "length" | "max_tokens" => Self::Length,
            "content_filter" | "refusal" => Self::ContentFilter,
            other => Self::Other(other.to_owned()),
        }
    }
}

/// What a provider stream yields, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderEvent {
    TextDelta(String),
    /// A piece of the model's reasoning, as it streams (shown to the user
    /// unless the operator hides it).
    ReasoningDelta(String),
    /// A complete reasoning block (not shown to the user).
    Thinking(ThinkingBlock),
    /// The output so far is void: a retry (or the next provider of a chain)
    /// starts over. Text already passed on must be retracted.
    Restart {
        reason: String,
    },
    /// A complete tool call (arguments assembled across chunks).
    ToolCall(ToolCall),
    Usage(Usage),
    /// The last event of a successful stream.
    Finished(FinishReason),
}

impl ProviderEvent {
    /// This event with U+0000 in its texts replaced by U+FFFD: Postgres
    /// text cannot hold U+0000, and an answer must read the same from
    /// either database and from the live stream.
    pub fn without_nul(self) -> Self {
        match self {
            Self::TextDelta(text) => Self::TextDelta(without_nul(text)),
            Self::ReasoningDelta(text) => Self::ReasoningDelta(without_nul(text)),
            Self::Thinking(block) => Self::Thinking(ThinkingBlock {
                text: without_nul(block.text),
                signature: block.signature,
                redacted: block.redacted,
            }),
            Self::ToolCall(call) => Self::ToolCall(ToolCall {
                id: without_nul(call.id),
                name: without_nul(call.name),
                arguments: match call.arguments.raw().contains('\0') {
                    true => Arguments::new(without_nul(call.arguments.into_raw())),
                    false => call.arguments,
                },
            }),
            other => other,
        }
    }
}

/// `text` with U+0000 replaced by U+FFFD (the replacement character).
pub fn without_nul(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    }
}

/// A provider's answer as a stream; ends after `Finished` or an error.
pub type ProviderStream = BoxStream<'static, Result<ProviderEvent, ProviderError>>;

/// An LLM API.
#[async_trait]
pub trait LlmProvider: Send + Sync + 'static {
    /// Short provider name (`openai`, `anthropic`, `ollama`).
    fn name(&self) -> &str;

    /// The model used when a request names none.
    fn default_model(&self) -> &str;

    /// The default model of the provider named `provider`, for providers
    /// that front several (a chain). `None`: ask [`LlmProvider::default_model`].
    fn model_for(&self, _provider: &str) -> Option<String> {
        None
    }

    /// Starts a streamed generation. Errors before the first byte are
    /// returned here; later ones arrive in the stream.
    async fn stream(&self, request: ChatRequest) -> Result<ProviderStream, ProviderError>;
}
