//! The `demo` provider (`HARNESS_PROVIDERS=demo:echo`): a stand-in model
//! that needs no key and no network, so that a newcomer sees a streamed
//! turn, a tool call and citations at once. It echoes the message word by
//! word; a message asking to search (or about notes) first calls
//! `local_search` when it is offered, then reports what it found; a message
//! asking it to write a note calls `write_note` (`notes/demo.md`, the
//! message as its text) when it is offered, then says what the tool said
//! (a write an operator may make wait for approval); a message
//! asking it to answer slowly (or any message, as the model `slow`) waits
//! [`SLOW_PAUSE`] before its first word
//! (a slow model: the stream's keep-alives show); a turn that offers tools
//! the client runs calls the first of them and reports what it answered.
//! The side calls of memory and judges get the JSON they ask for, empty.
//! It reads images and PDFs (its models `echo` and `slow` are in the
//! catalogue as such), and says back what it was shown; a message asking
//! it to `think first` gets two pieces of reasoning before the answer.

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;

use super::{
    ChatRequest, FinishReason, LlmProvider, ProviderError, ProviderEvent, ProviderStream, Role,
    ToolCall, Usage,
};

/// Pause between streamed words, so that streaming shows.
const WORD_DELAY: Duration = Duration::from_millis(25);

/// The wait before the first word (or call) of a message that asks for
/// `slowly`.
const SLOW_PAUSE: Duration = Duration::from_millis(2500);

/// The note a message asking to write one writes.
const DEMO_NOTE: &str = "notes/demo.md";

/// The model (`HARNESS_PROVIDERS=demo:slow`) that answers every message
/// slowly: a conformance suite sees its tasks working, and can cancel them.
const SLOW_MODEL: &str = "slow";

/// Whether the user's last message asks for a slow answer.
fn asks_slowly(request: &ChatRequest) -> bool {
    request
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .is_some_and(|m| m.content.to_lowercase().contains("slowly"))
        && request
            .messages
            .last()
            .is_some_and(|m| m.role == Role::User)
}

/// The demo model.
pub struct DemoProvider {
    model: String,
}

impl DemoProvider {
    pub fn new(model: &str) -> Self {
        Self {
            model: model.to_owned(),
        }
    }
}

/// What the demo answers to `request`.
fn answer(request: &ChatRequest) -> (String, Vec<ToolCall>) {
    let system: String = request
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(|m| m.content.as_str())
        .collect();
    // The background side calls ask for JSON.
    if system.contains("{\"memories\"") {
        return ("{\"memories\": []}".to_owned(), Vec::new());
    }
    if system.contains("{\"score\"") {
        return (
            "{\"score\": 1, \"rationale\": \"The demo provider does not judge.\"}".to_owned(),
            Vec::new(),
        );
    }
    let last = request.messages.last();
    if let Some(tool) = last.filter(|m| m.role == Role::Tool) {
        return (after_tool(request, tool), Vec::new());
    }
    if let Some(format) = &request.output {
        return (json_answer(request, format), Vec::new());
    }
    let user = request.messages.iter().rev().find(|m| m.role == Role::User);
    let message = user.map(|m| m.content.clone()).unwrap_or_default();
    // What it was shown besides text, said back: a client sees its image
    // reached the model.
    let shown: String = user
        .into_iter()
        .flat_map(|m| &m.attachments)
        .map(|a| {
            let bytes = a.data.as_ref().map_or(0, |d| d.len());
            format!("\n[attached {}, {bytes} bytes]", a.media_type)
        })
        .collect();
    let lower = message.to_lowercase();
    if lower.contains("what did i say") {
        return (recall(request), Vec::new());
    }
    let searches = lower.contains("search") || lower.contains("notes");
    if searches && request.tools.iter().any(|t| t.name == "local_search") {
        let call = ToolCall {
            id: format!("call_demo_{}", uuid::Uuid::now_v7().simple()),
            name: "local_search".to_owned(),
            arguments: serde_json::json!({ "query": message }).to_string().into(),
        };
        return (String::new(), vec![call]);
    }
    let writes = lower.contains("write") && lower.contains("note");
    if writes && request.tools.iter().any(|t| t.name == "write_note") {
        let call = ToolCall {
            id: format!("call_demo_{}", uuid::Uuid::now_v7().simple()),
            name: "write_note".to_owned(),
            arguments: serde_json::json!({ "path": DEMO_NOTE, "content": message })
                .to_string()
                .into(),
        };
        return (String::new(), vec![call]);
    }
    // A tool the client runs, offered: the demo calls the first one.
    if let Some(tool) = request
        .tools
        .iter()
        .find(|t| t.name.starts_with(crate::ids::CLIENT_TOOL_PREFIX))
    {
        let call = ToolCall {
            id: format!("call_demo_{}", uuid::Uuid::now_v7().simple()),
            name: tool.name.clone(),
            arguments: serde_json::json!({}).to_string().into(),
        };
        return (String::new(), vec![call]);
    }
    (
        format!(
            "Echo: {message}{shown}\n\n(This is the demo provider. For a real model, set \
             OPENAI_API_KEY and HARNESS_PROVIDERS=openai:gpt-4o-mini.)"
        ),
        Vec::new(),
    )
}

/// What it was sent before, said back (the user's messages, and how many
/// answers it heard): a client sees which history, which branch of its
/// conversation, reached the model.
fn recall(request: &ChatRequest) -> String {
    let earlier: Vec<&str> = request
        .messages
        .iter()
        .filter(|m| m.role == Role::User)
        .map(|m| m.content.as_str())
        .filter(|text| !text.to_lowercase().contains("what did i say"))
        .collect();
    let answers = request
        .messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .count();
    format!(
        "You said: {} ({answers} answers heard)",
        earlier.join(" | ")
    )
}

/// The demo's JSON answer: an instance of the schema asked for (or `{}`).
/// A message that asks for `broken json first` gets broken JSON until the
/// service asks again; one that asks for `never json` never gets JSON.
fn json_answer(request: &ChatRequest, format: &super::OutputFormat) -> String {
    let asked = request
        .messages
        .iter()
        .filter(|m| m.role == Role::User)
        .map(|m| m.content.to_lowercase())
        .collect::<Vec<_>>();
    let first = asked
        .iter()
        .find(|m| !m.starts_with("your answer is not the json"))
        .cloned()
        .unwrap_or_default();
    let repairing = asked
        .last()
        .is_some_and(|m| m.starts_with("your answer is not the json"));
    if first.contains("never json") || (first.contains("broken json first") && !repairing) {
        return "{\"answer\": not quite json".to_owned();
    }
    let instance = match &format.schema {
        Some(schema) => instance_of(schema, schema, 0),
        None => serde_json::json!({"echo": first}),
    };
    instance.to_string()
}

/// A small instance of `schema` (`root` resolves its `$ref`s): required
/// properties each filled, the first of an enum or a choice.
fn instance_of(
    schema: &serde_json::Value,
    root: &serde_json::Value,
    depth: u32,
) -> serde_json::Value {
    use serde_json::{Value, json};
    if depth > 16 {
        return Value::Null;
    }
    if let Some(target) = schema.get("$ref").and_then(Value::as_str) {
        let pointer = target.trim_start_matches('#');
        return root
            .pointer(pointer)
            .map_or(Value::Null, |s| instance_of(s, root, depth + 1));
    }
    if let Some(first) = schema.get("enum").and_then(|e| e.get(0)) {
        return first.clone();
    }
    if let Some(constant) = schema.get("const") {
        return constant.clone();
    }
    for choice in ["anyOf", "oneOf", "allOf"] {
        if let Some(first) = schema.get(choice).and_then(|c| c.get(0)) {
            return instance_of(first, root, depth + 1);
        }
    }
    let kind = match schema.get("type") {
        Some(Value::Array(kinds)) => kinds.first().and_then(Value::as_str),
        Some(kind) => kind.as_str(),
        None if schema.get("properties").is_some() => Some("object"),
        None => None,
    };
    match kind {
        Some("object") => {
            let mut object = serde_json::Map::new();
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                for (name, property) in properties {
                    object.insert(name.clone(), instance_of(property, root, depth + 1));
                }
            }
            Value::Object(object)
        }
        Some("array") => json!([]),
        Some("integer" | "number") => json!(0),
        Some("boolean") => json!(false),
        Some("null") => Value::Null,
        _ => json!("echo"),
    }
}

/// What the demo says of a tool's result: the tool's own words, without
/// the harness's fence around them.
fn after_tool(request: &ChatRequest, tool: &super::ChatMessage) -> String {
    let found: String = tool
        .content
        .lines()
        .filter(|line| !line.starts_with("<<<") && !line.starts_with("Tool result ("))
        .collect::<Vec<_>>()
        .join("\n")
        .chars()
        .take(600)
        .collect();
    let call = request
        .messages
        .iter()
        .rev()
        .flat_map(|m| &m.tool_calls)
        .find(|c| tool.tool_call_id.as_deref() == Some(c.id.as_str()))
        .map(|c| c.name.as_str());
    let said = match call {
        Some(name) if name.starts_with(crate::ids::CLIENT_TOOL_PREFIX) => "Your tool answered",
        Some("write_note") => "The note tool said",
        _ => "Here is what the search found",
    };
    format!("{said}:\n\n{found}")
}

#[async_trait]
impl LlmProvider for DemoProvider {
    fn name(&self) -> &str {
        "demo"
    }

    fn default_model(&self) -> &str {
        &self.model
    }

    async fn stream(&self, request: ChatRequest) -> Result<ProviderStream, ProviderError> {
        let (text, calls) = answer(&request);
        let pause = if self.model == SLOW_MODEL || asks_slowly(&request) {
            SLOW_PAUSE
        } else {
            Duration::ZERO
        };
        let input_tokens: u64 = request
            .messages
            .iter()
            .map(|m| m.content.split_whitespace().count() as u64)
            .sum();
        let words: Vec<String> = text.split_inclusive(' ').map(str::to_owned).collect();
        // An answer that is calls alone waits before its first call.
        let call_pause = if words.is_empty() {
            pause
        } else {
            Duration::ZERO
        };
        let output_tokens = words.len() as u64;
        let finish = if calls.is_empty() {
            FinishReason::Stop
        } else {
            FinishReason::ToolCalls
        };
        // A message that asks it to think first gets its reasoning first.
        let thinks = request
            .messages
            .iter()
            .rev()
            .find(|m| m.role == Role::User)
            .is_some_and(|m| m.content.to_lowercase().contains("think first"))
            && request
                .messages
                .last()
                .is_some_and(|m| m.role == Role::User);
        let reasoning: Vec<Result<ProviderEvent, ProviderError>> = if thinks {
            ["The user wants me to think first. ", "Then I echo them."]
                .into_iter()
                .map(|piece| Ok(ProviderEvent::ReasoningDelta(piece.to_owned())))
                .collect()
        } else {
            Vec::new()
        };
        let stream = futures::stream::iter(reasoning)
            .chain(futures::stream::iter(words.into_iter().enumerate()).then(
                move |(i, word)| async move {
                    let wait = if i == 0 {
                        pause + WORD_DELAY
                    } else {
                        WORD_DELAY
                    };
                    tokio::time::sleep(wait).await;
                    Ok(ProviderEvent::TextDelta(word))
                },
            ))
            .chain(futures::stream::iter(calls.into_iter().enumerate()).then(
                move |(i, call)| async move {
                    if i == 0 {
                        tokio::time::sleep(call_pause).await;
                    }
                    Ok(ProviderEvent::ToolCall(call))
                },
            ))
            .chain(futures::stream::iter([
                Ok(ProviderEvent::Usage(Usage {
                    input_tokens,
                    output_tokens,
                    ..Usage::default()
                })),
                Ok(ProviderEvent::Finished(finish)),
            ]));
        Ok(stream.boxed())
    }
}
