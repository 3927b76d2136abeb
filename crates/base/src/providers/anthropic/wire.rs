//! The Messages API request as it goes on the wire, borrowed from the
//! [`ChatRequest`]: serialized once into the request's bytes, with no JSON
//! tree built first (which copied every message of the history and every
//! tool's schema on each call).

use std::sync::Arc;

use serde::{Serialize, Serializer, ser::SerializeMap};
use serde_json::Value;

use crate::providers::{Attachment, Base64, ChatMessage, ChatRequest, Piece, Role, ToolDefinition};

/// The body of one call.
#[derive(Serialize)]
pub(super) struct Body<'a> {
    model: &'a str,
    max_tokens: u32,
    messages: Vec<Turn<'a>>,
    stream: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    system: Vec<Block<'a>>,
    #[serde(skip_serializing_if = "Tools::is_empty")]
    tools: Tools<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<Thinking>,
    /// Anthropic's structured output: the answer held to a JSON schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    output_config: Option<OutputConfig<'a>>,
}

impl<'a> Body<'a> {
    /// The body of `request` on `model`: at most `max_tokens` of answer,
    /// and `budget` more of thinking when it thinks.
    pub(super) fn new(
        request: &'a ChatRequest,
        model: &'a str,
        max_tokens: u32,
        budget: Option<u32>,
    ) -> Self {
        Self {
            model,
            max_tokens: max_tokens + budget.unwrap_or(0),
            messages: turns(&request.messages),
            stream: true,
            system: request
                .messages
                .iter()
                .filter(|m| m.role == Role::System)
                .map(|m| Block::Text(&m.content))
                .collect(),
            tools: Tools(&request.tools),
            thinking: budget.map(|budget_tokens| Thinking {
                kind: "enabled",
                budget_tokens,
            }),
            output_config: request
                .output
                .as_ref()
                .filter(|format| format.strict && takes_output_format(model))
                .and_then(|format| format.schema.as_ref())
                .map(|schema| OutputConfig {
                    format: OutputSchema {
                        kind: "json_schema",
                        schema,
                    },
                }),
        }
    }
}

#[derive(Serialize)]
struct OutputConfig<'a> {
    format: OutputSchema<'a>,
}

#[derive(Serialize)]
struct OutputSchema<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    schema: &'a Value,
}

/// Whether `model` holds an answer to a JSON schema (`output_config`):
/// Claude 4.5 and later (`claude-{family}-{major}-{minor}`; a model of 4
/// named with a date after its major, `claude-sonnet-4-20250514`, is 4.0;
/// Claude 3's names start with their version).
pub(super) fn takes_output_format(model: &str) -> bool {
    let Some(rest) = model.strip_prefix("claude-") else {
        return false;
    };
    let mut parts = rest.split('-');
    let family = parts.next().unwrap_or_default();
    if family.is_empty() || family.chars().all(|c| c.is_ascii_digit()) {
        return false;
    }
    let number = |part: Option<&str>| {
        part.filter(|p| (1..=2).contains(&p.len()))
            .and_then(|p| p.parse::<u32>().ok())
    };
    let Some(major) = number(parts.next()) else {
        return false;
    };
    let minor = number(parts.next()).unwrap_or(0);
    (major, minor) >= (4, 5)
}

#[derive(Serialize)]
struct Thinking {
    #[serde(rename = "type")]
    kind: &'static str,
    budget_tokens: u32,
}

/// One message of strictly alternating roles.
#[derive(Serialize)]
struct Turn<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
}

/// The conversation without system messages, with strictly alternating
/// roles: consecutive user-side messages (user text, tool results) merge.
fn turns(messages: &[ChatMessage]) -> Vec<Turn<'_>> {
    let mut out: Vec<Turn<'_>> = Vec::new();
    for message in messages {
        let (role, blocks) = match message.role {
            Role::System => continue,
            Role::User if !message.attachments.is_empty() => (
                "user",
                message
                    .pieces()
                    .into_iter()
                    .map(|piece| match piece {
                        Piece::Text(text) => Block::Text(text),
                        Piece::Attachment(attachment) => Block::Attached(attachment),
                    })
                    .collect(),
            ),
            Role::User => ("user", vec![Block::Text(&message.content)]),
            Role::Tool => (
                "user",
                vec![Block::ToolResult {
                    id: message.tool_call_id.as_deref().unwrap_or_default(),
                    content: &message.content,
                }],
            ),
            Role::Assistant => {
                let mut blocks: Vec<Block<'_>> = message
                    .thinking
                    .iter()
                    .map(|t| match &t.redacted {
                        Some(data) => Block::RedactedThinking { data },
                        None => Block::Thinking {
                            thinking: &t.text,
                            signature: t.signature.as_deref(),
                        },
                    })
                    .collect();
                if !message.content.is_empty() {
                    blocks.push(Block::Text(&message.content));
                }
                blocks.extend(message.tool_calls.iter().map(|call| Block::ToolUse {
                    id: &call.id,
                    name: &call.name,
                    input: call.arguments.json(),
                }));
                ("assistant", blocks)
            }
        };
        match out.last_mut() {
            Some(last) if last.role == role => last.content.extend(blocks),
            _ => out.push(Turn {
                role,
                content: blocks,
            }),
        }
    }
    out
}

/// A content block.
enum Block<'a> {
    Text(&'a str),
    /// An `image` or a `document` (a PDF), its bytes as a base64 source.
    Attached(&'a Attachment),
    ToolResult {
        id: &'a str,
        content: &'a str,
    },
    Thinking {
        thinking: &'a str,
        signature: Option<&'a str>,
    },
    RedactedThinking {
        data: &'a str,
    },
    /// Its input is the call's arguments as parsed (`{}` for text that
    /// is not JSON, as `Arguments::or_empty_object` has it).
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Option<&'a Value>,
    },
}

impl Serialize for Block<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        match self {
            Self::Text(text) => {
                map.serialize_entry("type", "text")?;
                map.serialize_entry("text", text)?;
            }
            Self::Attached(attachment) => {
                let kind = if attachment.is_image() {
                    "image"
                } else {
                    "document"
                };
                map.serialize_entry("type", kind)?;
                let source = Source {
                    kind: "base64",
                    media_type: &attachment.media_type,
                    data: attachment.base64::<S::Error>()?,
                };
                map.serialize_entry("source", &source)?;
            }
            Self::ToolResult { id, content } => {
                map.serialize_entry("type", "tool_result")?;
                map.serialize_entry("tool_use_id", id)?;
                map.serialize_entry("content", content)?;
            }
            Self::Thinking {
                thinking,
                signature,
            } => {
                map.serialize_entry("type", "thinking")?;
                map.serialize_entry("thinking", thinking)?;
                map.serialize_entry("signature", signature)?;
            }
            Self::RedactedThinking { data } => {
                map.serialize_entry("type", "redacted_thinking")?;
                map.serialize_entry("data", data)?;
            }
            Self::ToolUse { id, name, input } => {
                map.serialize_entry("type", "tool_use")?;
                map.serialize_entry("id", id)?;
                map.serialize_entry("name", name)?;
                match input {
                    Some(input) => map.serialize_entry("input", input)?,
                    None => map.serialize_entry("input", &serde_json::Map::new())?,
                }
            }
        }
        map.end()
    }
}

/// A block's bytes.
#[derive(Serialize)]
struct Source<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    media_type: &'a str,
    #[serde(serialize_with = "as_text")]
    data: Base64<'a>,
}

fn as_text<S: Serializer>(
    value: &impl std::fmt::Display,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

struct Tools<'a>(&'a [Arc<ToolDefinition>]);

impl Tools<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Tools<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|tool| Tool {
            name: &tool.name,
            description: &tool.description,
            input_schema: &tool.parameters,
        }))
    }
}

#[derive(Serialize)]
struct Tool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use crate::providers::{
        ChatMessage, ChatRequest, ToolCall,
        anthropic::{AnthropicConfig, AnthropicProvider},
    };

    #[test]
    fn claude_4_5_and_later_take_an_output_format() {
        for (model, takes) in [
            ("claude-sonnet-4-5", true),
            ("claude-sonnet-4-5-20250929", true),
            ("claude-haiku-4-5", true),
            ("claude-opus-4-6", true),
            ("claude-sonnet-4-6", true),
            ("claude-opus-5", true),
            ("claude-opus-4-1-20250805", false),
            ("claude-sonnet-4-20250514", false),
            ("claude-3-5-sonnet-20241022", false),
            ("claude-3-7-sonnet-latest", false),
            ("gpt-4o", false),
            ("claude-", false),
        ] {
            assert_eq!(super::takes_output_format(model), takes, "{model}");
        }
    }

    /// The parts no recorded exchange has: an answer's length under the
    /// adapter's, results of two calls merged into one user message, and
    /// a call whose arguments were not JSON (sent back as `{}`).
    #[test]
    fn a_length_merged_results_and_unparsed_arguments_go_as_anthropic_takes_them() {
        let provider = AnthropicProvider::new(AnthropicConfig {
            base_url: "http://127.0.0.1:9".into(),
            api_key: None,
            model: "claude-sonnet-4-5".into(),
            max_tokens: 4096,
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            max_response_bytes: 1024,
        })
        .unwrap();
        let call = |id: &str, arguments: &str| ToolCall {
            id: id.into(),
            name: "lookup".into(),
            arguments: arguments.to_owned().into(),
        };
        let request = ChatRequest {
            max_output_tokens: Some(64),
            ..ChatRequest::new(
                "",
                vec![
                    ChatMessage::user("Hi"),
                    ChatMessage::assistant("", vec![call("a", "{not json"), call("b", "[1]")]),
                    ChatMessage::tool("a", "one"),
                    ChatMessage::tool("b", "two"),
                ],
                Duration::from_secs(1),
            )
        };
        assert_eq!(
            provider.request_body(&request),
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 64,
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "a", "name": "lookup", "input": {}},
                        {"type": "tool_use", "id": "b", "name": "lookup", "input": [1]}
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "a", "content": "one"},
                        {"type": "tool_result", "tool_use_id": "b", "content": "two"}
                    ]}
                ],
                "stream": true
            })
        );
    }
}
