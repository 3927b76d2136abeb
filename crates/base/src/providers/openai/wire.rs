//! The chat-completions request as it goes on the wire, borrowed from the
//! [`ChatRequest`]: serialized once into the request's bytes, with no JSON
//! tree built first (which copied every message of the history and every
//! tool's schema on each call).

use std::sync::Arc;

use serde::{Serialize, Serializer, ser::SerializeMap};
use serde_json::Value;

use crate::providers::{
    Attachment, Base64, ChatMessage, ChatRequest, Piece, Role, ThinkLevel, ToolCall, ToolDefinition,
};

/// The body of one call.
#[derive(Serialize)]
pub(super) struct Body<'a> {
    model: &'a str,
    messages: Messages<'a>,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) reasoning_effort: Option<&'static str>,
    #[serde(skip_serializing_if = "Tools::is_empty")]
    tools: Tools<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<ResponseFormat<'a>>,
}

/// The JSON the answer must be: `json_schema` (with the schema), or
/// `json_object`.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ResponseFormat<'a> {
    JsonSchema { json_schema: JsonSchema<'a> },
    JsonObject,
}

#[derive(Serialize)]
struct JsonSchema<'a> {
    name: &'a str,
    schema: &'a Value,
    strict: bool,
}

impl<'a> ResponseFormat<'a> {
    fn of(format: &'a crate::providers::OutputFormat) -> Self {
        match &format.schema {
            Some(schema) => Self::JsonSchema {
                json_schema: JsonSchema {
                    name: &format.name,
                    schema,
                    strict: format.strict,
                },
            },
            None => Self::JsonObject,
        }
    }
}

impl<'a> Body<'a> {
    /// The body of `request` on `model`, with an effort when `effort`.
    pub(super) fn new(request: &'a ChatRequest, model: &'a str, effort: bool) -> Self {
        Self {
            model,
            messages: Messages(&request.messages),
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
            },
            max_completion_tokens: request.max_output_tokens,
            reasoning_effort: if effort {
                reasoning_effort(request.think_level)
            } else {
                None
            },
            tools: Tools(&request.tools),
            response_format: request.output.as_ref().map(ResponseFormat::of),
        }
    }
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// The `reasoning_effort` of a think level.
fn reasoning_effort(level: ThinkLevel) -> Option<&'static str> {
    match level {
        ThinkLevel::Off => None,
        ThinkLevel::Low => Some("low"),
        ThinkLevel::Medium => Some("medium"),
        ThinkLevel::High => Some("high"),
    }
}

struct Messages<'a>(&'a [ChatMessage]);

impl Serialize for Messages<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(Message))
    }
}

/// One message: an assistant's with its tool calls, a tool's result with
/// the call it answers, or a role and its text.
struct Message<'a>(&'a ChatMessage);

impl Serialize for Message<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let message = self.0;
        let mut map = serializer.serialize_map(None)?;
        match message.role {
            Role::Assistant if !message.tool_calls.is_empty() => {
                map.serialize_entry("role", "assistant")?;
                let content = (!message.content.is_empty()).then_some(message.content.as_str());
                map.serialize_entry("content", &content)?;
                map.serialize_entry("tool_calls", &Calls(&message.tool_calls))?;
            }
            Role::Tool => {
                map.serialize_entry("role", "tool")?;
                map.serialize_entry(
                    "tool_call_id",
                    message.tool_call_id.as_deref().unwrap_or_default(),
                )?;
                map.serialize_entry("content", &message.content)?;
            }
            role if !message.attachments.is_empty() => {
                map.serialize_entry("role", role.as_str())?;
                map.serialize_entry("content", &Parts(message))?;
            }
            role => {
                map.serialize_entry("role", role.as_str())?;
                map.serialize_entry("content", &message.content)?;
            }
        }
        map.end()
    }
}

/// A message's text and attachments as content parts: `text`,
/// `image_url` (a data URL of the image's bytes, with its `detail`) and
/// `file` (a PDF's bytes as a data URL, with its name).
struct Parts<'a>(&'a ChatMessage);

impl Serialize for Parts<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.pieces().into_iter().map(Part))
    }
}

struct Part<'a>(Piece<'a>);

impl Serialize for Part<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        match self.0 {
            Piece::Text(text) => {
                map.serialize_entry("type", "text")?;
                map.serialize_entry("text", text)?;
            }
            Piece::Attachment(attachment) if attachment.is_image() => {
                map.serialize_entry("type", "image_url")?;
                map.serialize_entry(
                    "image_url",
                    &ImageUrl {
                        url: match &attachment.url {
                            Some(url) => Url::Given(url),
                            None => Url::Data(DataUrl::of::<S::Error>(attachment)?),
                        },
                        detail: attachment.detail.as_deref(),
                    },
                )?;
            }
            Piece::Attachment(attachment) => {
                map.serialize_entry("type", "file")?;
                map.serialize_entry(
                    "file",
                    &FileData {
                        filename: &attachment.filename,
                        file_data: DataUrl::of::<S::Error>(attachment)?,
                    },
                )?;
            }
        }
        map.end()
    }
}

#[derive(Serialize)]
struct ImageUrl<'a> {
    url: Url<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
}

#[derive(Serialize)]
struct FileData<'a> {
    filename: &'a str,
    file_data: DataUrl<'a>,
}

/// An image's URL: the one it came from (`HARNESS_FILE_URLS=pass`), or
/// its bytes.
#[derive(Serialize)]
#[serde(untagged)]
enum Url<'a> {
    Given(&'a str),
    Data(DataUrl<'a>),
}

/// `data:{media type};base64,{bytes}`, written as it is serialized.
struct DataUrl<'a> {
    media_type: &'a str,
    data: Base64<'a>,
}

impl<'a> DataUrl<'a> {
    fn of<E: serde::ser::Error>(attachment: &'a Attachment) -> Result<Self, E> {
        Ok(Self {
            media_type: &attachment.media_type,
            data: attachment.base64()?,
        })
    }
}

impl Serialize for DataUrl<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&format_args!(
            "data:{};base64,{}",
            self.media_type, self.data
        ))
    }
}

struct Calls<'a>(&'a [ToolCall]);

impl Serialize for Calls<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|call| Call {
            id: &call.id,
            kind: "function",
            function: Function {
                name: &call.name,
                arguments: call.arguments.raw(),
            },
        }))
    }
}

#[derive(Serialize)]
struct Call<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: Function<'a>,
}

#[derive(Serialize)]
struct Function<'a> {
    name: &'a str,
    arguments: &'a str,
}

/// The tools offered, in the shape OpenAI and Ollama share.
pub(in crate::providers) struct Tools<'a>(pub(in crate::providers) &'a [Arc<ToolDefinition>]);

impl Tools<'_> {
    pub(in crate::providers) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Tools<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|tool| Tool {
            kind: "function",
            function: Declared {
                name: &tool.name,
                description: &tool.description,
                parameters: &tool.parameters,
            },
        }))
    }
}

#[derive(Serialize)]
struct Tool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: Declared<'a>,
}

#[derive(Serialize)]
struct Declared<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}
