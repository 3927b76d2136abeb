//! The Anthropic Messages API adapter (`POST {base}/v1/messages`,
//! `stream: true`).
//!
//! System messages (wherever they are in the prompt) become the top-level
//! `system` blocks, in order; tool results become `tool_result` blocks of a
//! user message; consecutive messages of one role are merged, as the API
//! wants strictly alternating turns. Think levels above OFF turn on extended
//! thinking with a token budget; thinking blocks come back as
//! [`ProviderEvent::Thinking`] and are sent back with their signature.

mod wire;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use futures::StreamExt;
use reqwest::Url;
use serde::Deserialize;
use serde_json::Value;
use tokio::time::Instant;

use super::{
    ChatRequest, FinishReason, ProviderError, ProviderEvent, ProviderFailure, ThinkLevel,
    ThinkingBlock, ToolCall, Usage,
    drain::Drains,
    redact::{HttpAdapter, Opened, Redactor},
    transport,
};

/// The API version sent in `anthropic-version`.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Settings of the Anthropic endpoint.
#[derive(Debug, Clone)]
pub struct AnthropicConfig {
    /// e.g. `https://api.anthropic.com`; `/v1/messages` is appended.
    pub base_url: String,
    pub api_key: Option<String>,
    pub model: String,
    /// `max_tokens` of the answer (thinking budget comes on top).
    pub max_tokens: u32,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_response_bytes: usize,
}

/// The Anthropic provider.
#[derive(Debug, Clone)]
pub struct AnthropicProvider {
    client: reqwest::Client,
    endpoint: Url,
    api_key: Option<String>,
    model: String,
    max_tokens: u32,
    idle_timeout: Duration,
    max_response_bytes: usize,
    /// Reads each answer to its end after its `message_stop`.
    pub(super) drains: Drains,
    /// Masks the key (and secret query values of the base URL) in errors.
    redactor: Arc<Redactor>,
}

/// Thinking budget per level.
fn thinking_budget(level: ThinkLevel) -> Option<u32> {
    match level {
        ThinkLevel::Off => None,
        ThinkLevel::Low => Some(1024),
        ThinkLevel::Medium => Some(4096),
        ThinkLevel::High => Some(16384),
    }
}

impl AnthropicProvider {
    pub fn new(config: AnthropicConfig) -> Result<Self, ProviderError> {
        let redactor = Arc::new(Redactor::new(
            config.api_key.clone(),
            Url::parse(config.base_url.trim()).ok().as_ref(),
        ));
        let base = config.base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        let endpoint = Url::parse(&format!("{base}/v1/messages")).map_err(|e| {
            redactor.error(ProviderError::Protocol(format!(
                "invalid base URL {base:?}: {e}"
            )))
        })?;
        let client = transport::client(config.connect_timeout)?;
        Ok(Self {
            client,
            endpoint,
            api_key: config.api_key,
            model: config.model,
            max_tokens: config.max_tokens,
            idle_timeout: config.idle_timeout,
            max_response_bytes: config.max_response_bytes,
            drains: Drains::new(),
            redactor,
        })
    }

    /// The JSON body sent for `request`.
    pub fn request_body(&self, request: &ChatRequest) -> Value {
        serde_json::to_value(self.body(request)).unwrap_or(Value::Null)
    }

    /// The body sent for `request`, borrowed from it.
    fn body<'a>(&'a self, request: &'a ChatRequest) -> wire::Body<'a> {
        let max_tokens = request
            .max_output_tokens
            .map_or(self.max_tokens, |tokens| tokens.min(self.max_tokens));
        wire::Body::new(
            request,
            request.model_or(&self.model),
            max_tokens,
            thinking_budget(request.think_level),
        )
    }
}

#[async_trait]
impl HttpAdapter for AnthropicProvider {
    const NAME: &'static str = "anthropic";

    async fn open(&self, request: ChatRequest, deadline: Instant) -> Opened {
        let mut http = self
            .client
            .post(self.endpoint.clone())
            .header("anthropic-version", ANTHROPIC_VERSION)
            .json(&self.body(&request));
        if let Some(key) = &self.api_key {
            http = http.header("x-api-key", key);
        }
        let events =
            transport::open_events(http, deadline, self.idle_timeout, self.max_response_bytes)
                .await?;
        Ok(parse_stream(events, self.drains.clone()).boxed())
    }

    fn setup(&self) -> (&str, &Arc<Redactor>) {
        (&self.model, &self.redactor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Wire {
    MessageStart {
        message: WireMessage,
    },
    ContentBlockStart {
        index: u32,
        content_block: WireBlock,
    },
    ContentBlockDelta {
        index: u32,
        delta: WireDelta,
    },
    ContentBlockStop {
        index: u32,
    },
    MessageDelta {
        #[serde(default)]
        delta: WireMessageDelta,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: Value,
    },
}

#[derive(Debug, Deserialize)]
struct WireMessage {
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Debug, Default, Deserialize)]
struct WireMessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
    },
    /// Reasoning the API keeps encrypted: sent back as it came.
    RedactedThinking {
        data: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    SignatureDelta {
        signature: String,
    },
    #[serde(other)]
    Other,
}

/// A content block being assembled.
enum Block {
    Text,
    Tool {
        id: String,
        name: String,
        json: String,
    },
    Thinking {
        text: String,
        signature: Option<String>,
    },
    Other,
}

/// Turns the SSE events of a Messages stream into provider events; what
/// follows `message_stop` goes to `drains`.
#[expect(
    clippy::too_many_lines,
    reason = "one match over the Messages stream's event types, a few lines each"
)]
pub(crate) fn parse_stream<S>(
    events: S,
    drains: Drains,
) -> impl futures::Stream<Item = Result<ProviderEvent, ProviderError>> + Send + 'static
where
    S: futures::Stream<Item = Result<super::stream::SseEvent, ProviderError>> + Send + 'static,
{
    async_stream::try_stream! {
        let mut events = Box::pin(events);
        let mut blocks: BTreeMap<u32, Block> = BTreeMap::new();
        let mut input = WireUsage::default();
        let mut output_tokens = 0u64;
        let mut stop_reason: Option<String> = None;
        let mut stopped = false;
        while let Some(event) = events.next().await {
            let event = event?;
            if event.data.trim().is_empty() {
                continue;
            }
            let wire: Wire = serde_json::from_str(&event.data).map_err(|e| {
                ProviderError::Protocol(format!("invalid JSON in stream event {:?}: {e}", event.event))
            })?;
            match wire {
                Wire::MessageStart { message } => {
                    if let Some(usage) = message.usage {
                        input = usage;
                        output_tokens = usage.output_tokens.unwrap_or(0);
                    }
                }
                Wire::ContentBlockStart { index, content_block } => {
                    let block = match content_block {
                        WireBlock::Text { text } => {
                            if !text.is_empty() {
                                yield ProviderEvent::TextDelta(text);
                            }
                            Block::Text
                        }
                        WireBlock::ToolUse { id, name } => Block::Tool { id, name, json: String::new() },
                        WireBlock::Thinking { thinking } => {
                            if !thinking.is_empty() {
                                yield ProviderEvent::ReasoningDelta(thinking.clone());
                            }
                            Block::Thinking { text: thinking, signature: None }
                        }
                        WireBlock::RedactedThinking { data } => {
                            yield ProviderEvent::Thinking(ThinkingBlock::redacted(data));
                            Block::Other
                        }
                        WireBlock::Other => Block::Other,
                    };
                    blocks.insert(index, block);
                }
                Wire::ContentBlockDelta { index, delta } => {
                    match (blocks.get_mut(&index), delta) {
                        (Some(Block::Text), WireDelta::TextDelta { text }) if !text.is_empty() => {
                            yield ProviderEvent::TextDelta(text);
                        }
                        (Some(Block::Tool { json, .. }), WireDelta::InputJsonDelta { partial_json }) => {
                            json.push_str(&partial_json);
                        }
                        (Some(Block::Thinking { text, .. }), WireDelta::ThinkingDelta { thinking }) => {
                            text.push_str(&thinking);
                            if !thinking.is_empty() {
                                yield ProviderEvent::ReasoningDelta(thinking);
                            }
                        }
                        (Some(Block::Thinking { signature, .. }), WireDelta::SignatureDelta { signature: s }) => {
                            signature.get_or_insert_with(String::new).push_str(&s);
                        }
                        (None, _) => Err(ProviderError::Protocol(format!("delta for unknown block {index}")))?,
                        _ => {}
                    }
                }
                Wire::ContentBlockStop { index } => {
                    match blocks.remove(&index) {
                        Some(Block::Tool { id, name, json }) => {
                            let arguments = if json.trim().is_empty() { "{}".to_owned() } else { json };
                            serde_json::from_str::<Value>(&arguments).map_err(|e| {
                                ProviderError::Protocol(format!("tool input of {name} is not JSON: {e}"))
                            })?;
                            yield ProviderEvent::ToolCall(ToolCall { id, name, arguments: arguments.into() });
                        }
                        Some(Block::Thinking { text, signature }) => {
                            yield ProviderEvent::Thinking(ThinkingBlock { text, signature, redacted: None });
                        }
                        _ => {}
                    }
                }
                Wire::MessageDelta { delta, usage } => {
                    if let Some(reason) = delta.stop_reason {
                        stop_reason = Some(reason);
                    }
                    if let Some(out) = usage.and_then(|u| u.output_tokens) {
                        output_tokens = out;
                    }
                }
                Wire::MessageStop => {
                    stopped = true;
                    break;
                }
                Wire::Ping => {}
                Wire::Error { error } => Err(in_stream_error(&error))?,
            }
        }
        if !stopped {
            Err(ProviderError::Interrupted("the stream ended before message_stop".into()))?;
        }
        drains.hand_over(events);
        let cache_read = input.cache_read_input_tokens.unwrap_or(0);
        let cache_creation = input.cache_creation_input_tokens.unwrap_or(0);
        yield ProviderEvent::Usage(Usage {
            // All prompt tokens: Anthropic reports cached ones apart.
            input_tokens: input.input_tokens.unwrap_or(0) + cache_read + cache_creation,
            output_tokens,
            cache_read_tokens: cache_read,
            cache_creation_tokens: cache_creation,
            // Counted from the reasoning streamed (not reported apart).
            reasoning_tokens: 0,
        });
        yield ProviderEvent::Finished(FinishReason::from_wire(stop_reason.as_deref().unwrap_or("end_turn")));
    }
}

/// An `error` event inside a 200 stream (`overloaded_error`, ...).
fn in_stream_error(error: &Value) -> ProviderError {
    let kind = error["type"].as_str().unwrap_or("error");
    let failure = ProviderFailure {
        status: 200,
        message: error["message"].as_str().unwrap_or(kind).to_owned(),
        body: error.to_string(),
    };
    match kind {
        "overloaded_error" => ProviderError::Overloaded(failure),
        "rate_limit_error" => ProviderError::RateLimited {
            retry_after: None,
            failure,
        },
        "api_error" => ProviderError::Server(failure),
        "authentication_error" | "permission_error" => ProviderError::Auth(failure),
        "invalid_request_error" if failure.message.contains("prompt is too long") => {
            ProviderError::ContextLengthExceeded(failure)
        }
        "invalid_request_error" | "not_found_error" => ProviderError::BadRequest(failure),
        _ => ProviderError::Server(failure),
    }
}
