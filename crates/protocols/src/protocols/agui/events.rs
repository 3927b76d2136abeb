//! AG-UI's events, as this service says them.

use serde::Serialize;
use serde_json::Value;

use crate::protocols::jsonrpc::JsonText;

/// An AG-UI event.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub(super) enum Event {
    #[serde(rename_all = "camelCase")]
    RunStarted {
        thread_id: String,
        run_id: String,
    },
    #[serde(rename_all = "camelCase")]
    RunFinished {
        thread_id: String,
        run_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<RunResult>,
        #[serde(skip_serializing_if = "Option::is_none")]
        outcome: Option<Outcome>,
    },
    RunError {
        message: String,
        code: String,
    },
    #[serde(rename_all = "camelCase")]
    StepStarted {
        step_name: String,
    },
    #[serde(rename_all = "camelCase")]
    StepFinished {
        step_name: String,
    },
    #[serde(rename_all = "camelCase")]
    TextMessageStart {
        message_id: String,
        role: &'static str,
    },
    #[serde(rename_all = "camelCase")]
    TextMessageContent {
        message_id: String,
        delta: String,
    },
    #[serde(rename_all = "camelCase")]
    TextMessageEnd {
        message_id: String,
    },
    /// A span of the model's reasoning, and its one message.
    #[serde(rename_all = "camelCase")]
    ReasoningStart {
        message_id: String,
    },
    #[serde(rename_all = "camelCase")]
    ReasoningMessageStart {
        message_id: String,
        /// Always `reasoning`.
        role: &'static str,
    },
    #[serde(rename_all = "camelCase")]
    ReasoningMessageContent {
        message_id: String,
        delta: String,
    },
    #[serde(rename_all = "camelCase")]
    ReasoningMessageEnd {
        message_id: String,
    },
    #[serde(rename_all = "camelCase")]
    ReasoningEnd {
        message_id: String,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallStart {
        tool_call_id: String,
        tool_call_name: String,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallArgs {
        tool_call_id: String,
        delta: String,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallEnd {
        tool_call_id: String,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallResult {
        message_id: String,
        tool_call_id: String,
        content: String,
        role: &'static str,
    },
    Custom {
        name: &'static str,
        value: Custom,
    },
}

/// A finished run's result: the turn's answer.
#[derive(Debug, Serialize)]
pub(super) struct RunResult {
    pub text: String,
    pub local_citations: Vec<String>,
    pub web_citations: Vec<crate::turn::WebCitation>,
}

/// A run that ends waiting: AG-UI's interrupt outcome.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename = "interrupt")]
pub(super) struct Outcome {
    pub interrupts: Vec<Interrupt>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Interrupt {
    pub id: String,
    pub reason: &'static str,
    pub message: String,
    pub tool_call_id: String,
    pub response_schema: JsonText,
    pub metadata: InterruptTool,
}

#[derive(Debug, Serialize)]
pub(super) struct InterruptTool {
    pub tool: String,
    pub arguments: Value,
}

/// What a `resume` payload holds, as the interrupt says it.
pub(super) const RESPONSE_SCHEMA: JsonText = JsonText(
    r#"{"type":"object","properties":{"approved":{"type":"boolean"},"reason":{"type":"string","maxLength":1000}},"required":["approved"]}"#,
);

/// A `CUSTOM` event's value.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(super) enum Custom {
    #[serde(rename_all = "camelCase")]
    Retracted {
        message_id: Option<String>,
        step: u32,
        reason: String,
    },
    Resumed {
        owner: String,
        attempt: u32,
        from_step: u32,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interrupts_response_schema_is_json_said_as_written() {
        let said = serde_json::to_value(RESPONSE_SCHEMA).unwrap();
        assert_eq!(said.pointer("/required/0"), Some(&Value::from("approved")));
    }
}
