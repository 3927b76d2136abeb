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
        /// The run this one branches from (its `RunAgentInput.parentRunId`).
        #[serde(skip_serializing_if = "Option::is_none")]
        parent_run_id: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    RunFinished {
        thread_id: String,
        run_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<RunResult>,
        #[serde(skip_serializing_if = "Option::is_none")]
        outcome: Option<Outcome>,
        /// The run's own provider calls (AG-UI 1.0 `usage`: one entry per
        /// provider and model; this service's run is one entry).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        usage: Vec<TokenUsage>,
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

/// How a run that did not fail ended (AG-UI 1.0's `outcome`; absent:
/// it completed).
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Outcome {
    /// It completed, leaving calls of the client's tools for the client
    /// to answer in its next run.
    #[serde(rename_all = "camelCase")]
    Success { pending_tool_call_ids: Vec<String> },
    /// It waits for the person's decision.
    Interrupt { interrupts: Vec<Interrupt> },
    /// It was stopped (cancelled, or interrupted by a newer message) and
    /// did not fail.
    Cancelled,
}

/// Token counts of a run, in AG-UI 1.0's accounting: `inputTokens` and
/// `outputTokens` are totals, the others parts of them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct TokenUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    pub reasoning_tokens: u64,
    pub cached_input_tokens: u64,
    pub cache_write_input_tokens: u64,
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
