//! The JSON-RPC messages `/mcp` reads and writes itself, beside rmcp's
//! model types (the params of the methods, the results of tools,
//! prompts and resources): the envelope of a message as it comes, and the
//! notifications, requests and results the versions up to 2025-11-25 say.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocols::jsonrpc::{JsonText, Version};

/// A JSON-RPC message as it comes, before it is known to be one: each
/// field as given (checked by who reads it).
#[derive(Debug, Default, Deserialize)]
pub struct Envelope {
    pub jsonrpc: Option<Value>,
    pub id: Option<Value>,
    pub method: Option<Value>,
    pub params: Option<Value>,
    pub result: Option<Value>,
}

/// What a request's `params._meta` says.
#[derive(Debug, Default, Deserialize)]
struct MetaOnly {
    #[serde(rename = "_meta")]
    meta: Option<Meta>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    progress_token: Option<Value>,
}

impl Envelope {
    /// `message` read as an envelope; anything that is not an object is an
    /// empty one.
    pub fn read(message: &Value) -> Self {
        Self::deserialize(message).unwrap_or_default()
    }

    /// Whether it says it is a JSON-RPC 2.0 message.
    pub fn is_message(&self) -> bool {
        self.jsonrpc.as_ref().and_then(Value::as_str) == Some("2.0")
    }

    /// `params._meta.progressToken` (null: none).
    pub fn progress_token(&self) -> Value {
        self.params
            .as_ref()
            .and_then(|p| MetaOnly::deserialize(p).ok())
            .and_then(|p| p.meta)
            .and_then(|m| m.progress_token)
            .unwrap_or(Value::Null)
    }
}

/// A message on the `message` event of a stream.
pub(super) fn message_frame(message: &impl Serialize) -> Bytes {
    let mut frame = b"event: message\n".to_vec();
    frame.extend_from_slice(&crate::protocols::data_frame(message));
    Bytes::from(frame)
}

/// A notification of the server's.
#[derive(Debug, Serialize)]
pub struct Notification<P> {
    pub jsonrpc: Version,
    pub method: &'static str,
    pub params: P,
}

impl<P> Notification<P> {
    pub fn new(method: &'static str, params: P) -> Self {
        Self {
            jsonrpc: Version::V2,
            method,
            params,
        }
    }
}

/// A request of the server's (an elicitation), with its id.
#[derive(Debug, Serialize)]
pub struct Request<P> {
    pub jsonrpc: Version,
    pub id: String,
    pub method: &'static str,
    pub params: P,
}

/// `notifications/progress`: a piece of the turn's text.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress<'a> {
    pub progress_token: &'a Value,
    pub progress: u64,
    pub message: &'a str,
}

/// `notifications/message`: one of the turn's log lines.
#[derive(Debug, Serialize)]
pub struct LogMessage<D> {
    pub level: &'static str,
    pub logger: &'static str,
    pub data: D,
}

/// A resource error's `data`: the URI asked for.
#[derive(Debug, Serialize)]
pub struct UriData<'a> {
    pub uri: &'a str,
}

/// `notifications/resources/updated`.
#[derive(Debug, Serialize)]
pub struct Updated<'a> {
    pub uri: &'a str,
}

/// `elicitation/create`'s params: a form asking whether a call may run.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Elicitation {
    pub mode: &'static str,
    pub message: String,
    pub requested_schema: JsonText,
}

/// An input request of 2026-07-28: an elicitation without an id.
#[derive(Debug, Serialize)]
pub struct InputRequest {
    pub method: &'static str,
    pub params: Elicitation,
}

/// The form of an approval's elicitation.
const APPROVAL_FORM: &str = r#"{"type":"object","properties":{"approve":{"type":"boolean","title":"Approve","description":"Run the call (true) or refuse it (false)"},"reason":{"type":"string","title":"Reason","maxLength":1000,"description":"Why, for the agent (optional)"},"arguments":{"type":"string","title":"Arguments","description":"With an approval: the call's arguments to run instead, as a JSON object (optional)"}},"required":["approve"]}"#;

impl Elicitation {
    /// A form asking a person to approve a call: `approve`, a `reason` of
    /// up to 1,000 characters, and `arguments` (JSON text) to run instead.
    pub fn approval(message: String) -> Self {
        Self {
            mode: "form",
            message,
            requested_schema: JsonText(APPROVAL_FORM),
        }
    }
}

/// A client's answer to an elicitation (`result` of its response, or a
/// 2026-07-28 input response).
#[derive(Debug, Default, Deserialize)]
pub struct ElicitAnswer {
    pub action: Option<String>,
    pub content: Option<ElicitContent>,
}

/// What an accepted form holds.
#[derive(Debug, Default, Deserialize)]
pub struct ElicitContent {
    #[serde(default)]
    pub approve: Value,
    #[serde(default)]
    pub reason: Value,
    /// The arguments to run instead, as JSON text (a form's fields are
    /// primitives).
    #[serde(default)]
    pub arguments: Value,
}

impl ElicitContent {
    /// The edited arguments the form gives: none, or a JSON value (Err:
    /// text that is not JSON).
    pub fn edited(&self) -> Result<Option<Value>, String> {
        match &self.arguments {
            Value::Null => Ok(None),
            Value::String(text) if text.trim().is_empty() => Ok(None),
            Value::String(text) => serde_json::from_str(text)
                .map(Some)
                .map_err(|e| format!("`content.arguments` is not JSON: {e}")),
            _ => Err("`content.arguments` must be the arguments as JSON text".into()),
        }
    }
}

/// `initialize`'s params: the fields read.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    pub protocol_version: Option<String>,
    pub capabilities: Option<ClientCapabilities>,
}

/// The client's capabilities: whether it takes elicitations.
#[derive(Debug, Default, Deserialize)]
pub struct ClientCapabilities {
    pub elicitation: Option<Value>,
}

/// `initialize`'s result.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    pub protocol_version: &'static str,
    pub capabilities: ServerCapabilities,
    pub server_info: ServerInfo,
    pub instructions: &'static str,
}

#[derive(Debug, Serialize)]
pub struct ServerCapabilities {
    pub tools: ListChanged,
    pub resources: Resources,
    pub prompts: ListChanged,
    pub completions: Empty,
    pub logging: Empty,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListChanged {
    pub list_changed: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    pub subscribe: bool,
    pub list_changed: bool,
}

pub use crate::protocols::jsonrpc::Empty;

#[derive(Debug, Serialize)]
pub struct ServerInfo {
    pub name: &'static str,
    pub version: &'static str,
}

/// `logging/setLevel`'s params.
#[derive(Debug, Default, Deserialize)]
pub struct LevelParams {
    pub level: Option<String>,
}

/// `notifications/cancelled`'s params.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelParams {
    #[serde(default)]
    pub request_id: Value,
}

/// `resources/list`'s result.
#[derive(Debug, Serialize)]
pub struct ResourceList {
    pub resources: Vec<rmcp::model::Resource>,
}

/// `resources/templates/list`'s result.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateList {
    pub resource_templates: Vec<rmcp::model::ResourceTemplate>,
}

/// `prompts/list`'s result.
#[derive(Debug, Serialize)]
pub struct PromptList {
    pub prompts: Vec<rmcp::model::Prompt>,
}

/// `tools/list`'s result.
#[derive(Debug, Serialize)]
pub struct ToolList {
    pub tools: Vec<rmcp::model::Tool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_approval_form_is_a_json_schema_object() {
        let form: serde_json::Map<String, Value> = serde_json::from_str(APPROVAL_FORM).unwrap();
        assert_eq!(form.get("type").and_then(Value::as_str), Some("object"));
        let elicitation = Elicitation::approval("May I?".into());
        let said = serde_json::to_value(&elicitation).unwrap();
        assert_eq!(said.get("requestedSchema"), Some(&Value::Object(form)));
    }
}
