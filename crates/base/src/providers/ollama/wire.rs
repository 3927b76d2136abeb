//! The `/api/chat` request as it goes on the wire, borrowed from the
//! [`ChatRequest`]: serialized once into the request's bytes, with no JSON
//! tree built first (which copied every message of the history and every
//! tool's schema on each call).

use serde::{Serialize, Serializer, ser::SerializeMap as _};
use serde_json::Value;

use crate::providers::{Attachment, ChatMessage, ChatRequest, Role, openai::wire::Tools};

/// The body of one call.
#[derive(Serialize)]
pub(super) struct Body<'a> {
    model: &'a str,
    #[serde(serialize_with = "messages")]
    messages: &'a [ChatMessage],
    stream: bool,
    #[serde(skip_serializing_if = "Tools::is_empty")]
    tools: Tools<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) think: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    options: Option<Options>,
    /// The JSON the answer must be: its schema, or `json`.
    #[serde(skip_serializing_if = "Option::is_none")]
    format: Option<Format<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Format<'a> {
    Schema(&'a Value),
    Json(&'static str),
}

impl<'a> Body<'a> {
    /// The body of `request` on `model`, asking it to think when `think`.
    pub(super) fn new(request: &'a ChatRequest, model: &'a str, think: bool) -> Self {
        Self {
            model,
            messages: &request.messages,
            stream: true,
            tools: Tools(&request.tools),
            think: think.then_some(true),
            options: request
                .max_output_tokens
                .map(|num_predict| Options { num_predict }),
            format: request.output.as_ref().map(|format| match &format.schema {
                Some(schema) => Format::Schema(schema),
                None => Format::Json("json"),
            }),
        }
    }
}

#[derive(Serialize)]
struct Options {
    num_predict: u32,
}

fn messages<S: Serializer>(messages: &&[ChatMessage], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(messages.iter().map(Message::of))
}

/// One message: its role and text, a user's images (base64; Ollama takes
/// no other attachment), and an assistant's tool calls (their arguments
/// as parsed, `{}` for text that is not JSON).
#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
    #[serde(skip_serializing_if = "Images::is_empty")]
    images: Images<'a>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<Call<'a>>,
}

/// A message's attachments, as Ollama's `images`.
struct Images<'a>(&'a [Attachment]);

impl Images<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Images<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error as _, SerializeSeq as _};
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for attachment in self.0 {
            if !attachment.is_image() {
                return Err(S::Error::custom(format!(
                    "Ollama takes images only, not {}",
                    attachment.media_type
                )));
            }
            seq.serialize_element(&format_args!("{}", attachment.base64::<S::Error>()?))?;
        }
        seq.end()
    }
}

impl<'a> Message<'a> {
    fn of(message: &'a ChatMessage) -> Self {
        let tool_calls = match message.role {
            Role::Assistant => message
                .tool_calls
                .iter()
                .map(|call| Call {
                    function: Function {
                        name: &call.name,
                        arguments: Arguments(call.arguments.json()),
                    },
                })
                .collect(),
            _ => Vec::new(),
        };
        Self {
            role: message.role.as_str(),
            content: &message.content,
            images: Images(&message.attachments),
            tool_calls,
        }
    }
}

#[derive(Serialize)]
struct Call<'a> {
    function: Function<'a>,
}

#[derive(Serialize)]
struct Function<'a> {
    name: &'a str,
    arguments: Arguments<'a>,
}

/// Parsed arguments, or `{}`.
struct Arguments<'a>(Option<&'a Value>);

impl Serialize for Arguments<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(value) => value.serialize(serializer),
            None => serializer.serialize_map(Some(0))?.end(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use crate::providers::{
        ChatMessage, ChatRequest, ThinkLevel, ToolCall,
        ollama::{OllamaConfig, OllamaProvider},
    };

    /// The parts no recorded exchange has: the answer's length, and a
    /// call whose arguments were not JSON (sent back as `{}`).
    #[test]
    fn a_length_and_unparsed_arguments_go_as_ollama_takes_them() {
        let provider = OllamaProvider::new(OllamaConfig {
            host: "http://127.0.0.1:9".into(),
            model: "llama3.2".into(),
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            max_response_bytes: 1024,
        })
        .unwrap();
        let call = ToolCall {
            id: "call_0".into(),
            name: "lookup".into(),
            arguments: "{not json".to_owned().into(),
        };
        let request = ChatRequest {
            max_output_tokens: Some(64),
            think_level: ThinkLevel::Low,
            ..ChatRequest::new(
                "",
                vec![
                    ChatMessage::user("Hi"),
                    ChatMessage::assistant("", vec![call]),
                    ChatMessage::tool("call_0", "found"),
                ],
                Duration::from_secs(1),
            )
        };
        assert_eq!(
            provider.request_body(&request),
            json!({
                "model": "llama3.2",
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"function": {"name": "lookup", "arguments": {}}}
                    ]},
                    {"role": "tool", "content": "found"}
                ],
                "stream": true,
                "think": true,
                "options": {"num_predict": 64}
            })
        );
    }
}
