//! The OpenAI-compatible Chat Completions adapter (`POST {base}/chat/completions`,
//! `stream: true`).
//!
//! Text deltas are passed on as they arrive; tool-call deltas are assembled
//! by their `index` across chunks and handed over whole when the stream
//! finishes; usage comes from the final chunk (`stream_options.include_usage`).
//!
//! Some compatible servers ignore `stream: true` (often when tools are
//! offered) and answer with one `application/json` chat completion. That
//! answer is taken as it is: its text as one delta, its tool calls, its
//! usage, as one step.

pub(super) mod wire;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use futures::StreamExt;
use reqwest::Url;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{
    ChatRequest, FinishReason, ProviderError, ProviderEvent, ToolCall, Usage,
    drain::Drains,
    redact::{HttpAdapter, Opened, Redactor},
    refusing::RefusingModels,
    transport,
};

/// Settings of an OpenAI-compatible endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// e.g. `https://api.openai.com/v1`; `/chat/completions` is appended.
    pub base_url: String,
    pub api_key: Option<String>,
    pub model: String,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_response_bytes: usize,
}

/// How the API key is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyHeader {
    /// `Authorization: Bearer` (OpenAI and most compatible servers).
    Bearer,
    /// `api-key` (Azure OpenAI).
    ApiKey,
}

/// An OpenAI-compatible provider.
#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    client: reqwest::Client,
    endpoint: Url,
    key_header: KeyHeader,
    api_key: Option<String>,
    model: String,
    idle_timeout: Duration,
    max_response_bytes: usize,
    /// Reads each answer to its end after its `[DONE]`.
    pub(super) drains: Drains,
    /// Models that answered 400 to `reasoning_effort`: they are not sent
    /// it again.
    no_effort: Arc<RefusingModels>,
    /// Masks the key (and secret query values of the base URL) in errors.
    redactor: Arc<Redactor>,
}

impl OpenAiProvider {
    pub fn new(config: OpenAiConfig) -> Result<Self, ProviderError> {
        let redactor = Arc::new(Redactor::new(
            config.api_key.clone(),
            Url::parse(config.base_url.trim()).ok().as_ref(),
        ));
        let endpoint = chat_completions_url(&config.base_url).map_err(|e| redactor.error(e))?;
        // Azure OpenAI wants its key in `api-key`, everyone else a bearer token.
        let key_header = if endpoint
            .host_str()
            .is_some_and(|h| h.ends_with(".openai.azure.com"))
        {
            KeyHeader::ApiKey
        } else {
            KeyHeader::Bearer
        };
        let client = transport::client(config.connect_timeout)?;
        Ok(Self {
            client,
            endpoint,
            key_header,
            api_key: config.api_key,
            model: config.model,
            idle_timeout: config.idle_timeout,
            max_response_bytes: config.max_response_bytes,
            drains: Drains::new(),
            no_effort: Arc::default(),
            redactor,
        })
    }

    /// The JSON body sent for `request`.
    pub fn request_body(&self, request: &ChatRequest) -> Value {
        serde_json::to_value(self.body(request)).unwrap_or(Value::Null)
    }

    /// The body sent for `request`, borrowed from it. Reasoning models
    /// take an effort; a model that refused it once is not sent it again
    /// (see `open`).
    fn body<'a>(&'a self, request: &'a ChatRequest) -> wire::Body<'a> {
        let model = request.model_or(&self.model);
        wire::Body::new(request, model, !self.no_effort.contains(model))
    }
}

/// Whether a 400 says the model does not take `reasoning_effort`
/// (`unsupported_parameter`, or an older server's "Unrecognized request
/// argument"): the request is worth sending again without it.
fn refuses_reasoning_effort(error: &ProviderError) -> bool {
    matches!(error, ProviderError::BadRequest(f)
        if f.status == 400 && (f.body.contains("reasoning_effort") || f.message.contains("reasoning_effort")))
}

/// `{base}/chat/completions`, keeping a query string of the base (Azure's
/// `?api-version=`).
fn chat_completions_url(base: &str) -> Result<Url, ProviderError> {
    let mut url = Url::parse(base.trim())
        .map_err(|e| ProviderError::Protocol(format!("invalid base URL {base:?}: {e}")))?;
    let path = format!("{}/chat/completions", url.path().trim_end_matches('/'));
    url.set_path(&path);
    Ok(url)
}

impl OpenAiProvider {
    /// A POST of `body` to the endpoint, with the key.
    fn post(&self, body: &impl serde::Serialize) -> reqwest::RequestBuilder {
        let http = self.client.post(self.endpoint.clone()).json(body);
        match (&self.api_key, self.key_header) {
            (None, _) => http,
            (Some(key), KeyHeader::Bearer) => http.bearer_auth(key),
            (Some(key), KeyHeader::ApiKey) => http.header("api-key", key),
        }
    }
}

#[async_trait]
impl HttpAdapter for OpenAiProvider {
    const NAME: &'static str = "openai";

    async fn open(&self, request: ChatRequest, deadline: Instant) -> Opened {
        // Serialized into the request's bytes here, from the request itself.
        let (first, sent_effort) = {
            let body = self.body(&request);
            (self.post(&body), body.reasoning_effort.is_some())
        };
        let response = match transport::open(first, deadline).await {
            Err(e) if sent_effort && refuses_reasoning_effort(&e) => {
                // Asked once more without it; remembered for this model.
                let model = request.model_or(&self.model).to_owned();
                tracing::info!(model = %model, "the model refuses reasoning_effort; sending without it");
                self.no_effort.remember(&model);
                transport::open(self.post(&self.body(&request)), deadline).await?
            }
            other => other?,
        };
        if transport::has_content_type(&response, "application/json") {
            let body = transport::read_body(
                response,
                self.max_response_bytes,
                self.idle_timeout,
                deadline,
            )
            .await?;
            let events = parse_completion(&body)?;
            return Ok(futures::stream::iter(events.into_iter().map(Ok)).boxed());
        }
        let events = transport::events_of(
            response,
            deadline,
            self.idle_timeout,
            self.max_response_bytes,
        )
        .await?;
        Ok(parse_stream(events, self.drains.clone()).boxed())
    }

    fn setup(&self) -> (&str, &Arc<Redactor>) {
        (&self.model, &self.redactor)
    }
}

/// A whole `chat.completion` (a server that did not stream), only the
/// fields we read.
#[derive(Debug, Deserialize)]
struct Completion {
    #[serde(default)]
    choices: Vec<CompletionChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct CompletionChoice {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    message: Option<CompletionMessage>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct CompletionMessage {
    /// A string, or (some compatible servers) a list of text parts.
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Vec<CompletionToolCall>,
}

#[derive(Debug, Deserialize)]
struct CompletionToolCall {
    #[serde(default)]
    id: Option<String>,
    function: CompletionFunction,
}

#[derive(Debug, Deserialize)]
struct CompletionFunction {
    name: String,
    /// JSON text (OpenAI), or an object (some compatible servers).
    #[serde(default)]
    arguments: Option<Value>,
}

/// The provider events of a whole chat completion: its text as one delta,
/// its tool calls, usage, and the finish reason.
fn parse_completion(body: &[u8]) -> Result<Vec<ProviderEvent>, ProviderError> {
    let completion: Completion = serde_json::from_slice(body)
        .map_err(|e| ProviderError::Protocol(format!("invalid JSON chat completion: {e}")))?;
    if let Some(error) = completion.error {
        return Err(in_stream_error(&error));
    }
    let choice = completion
        .choices
        .into_iter()
        .find(|c| c.index == 0)
        .ok_or_else(|| ProviderError::Protocol("a chat completion without choices".into()))?;
    let mut events = Vec::new();
    let message = choice.message.ok_or_else(|| {
        ProviderError::Protocol("a chat completion choice without a message".into())
    })?;
    let text = match message.content {
        Some(Value::String(text)) => text,
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    };
    if !text.is_empty() {
        events.push(ProviderEvent::TextDelta(text));
    }
    let had_calls = !message.tool_calls.is_empty();
    for (index, call) in message.tool_calls.into_iter().enumerate() {
        if call.function.name.is_empty() {
            return Err(ProviderError::Protocol(format!(
                "tool call {index} has no name"
            )));
        }
        let arguments = match call.function.arguments {
            Some(Value::String(text)) if !text.trim().is_empty() => text,
            None | Some(Value::Null | Value::String(_)) => "{}".to_owned(),
            Some(object) => object.to_string(),
        };
        events.push(ProviderEvent::ToolCall(ToolCall {
            id: call
                .id
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| format!("call_{index}")),
            name: call.function.name,
            arguments: arguments.into(),
        }));
    }
    if let Some(usage) = completion.usage {
        events.push(ProviderEvent::Usage(usage.into()));
    }
    let reason = choice
        .finish_reason
        .map(|r| FinishReason::from_wire(&r))
        .unwrap_or(if had_calls {
            FinishReason::ToolCalls
        } else {
            FinishReason::Stop
        });
    events.push(ProviderEvent::Finished(reason));
    Ok(events)
}

/// One `chat.completion.chunk`, only the fields we read.
#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    /// Reasoning, as compatible servers stream it (DeepSeek, vLLM, …:
    /// `reasoning_content`; others: `reasoning`).
    #[serde(default, alias = "reasoning")]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptTokensDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Deserialize)]
struct CompletionTokensDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct PromptTokensDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl From<WireUsage> for Usage {
    fn from(usage: WireUsage) -> Self {
        Self {
            input_tokens: usage.prompt_tokens,
            output_tokens: usage.completion_tokens,
            cache_read_tokens: usage
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            cache_creation_tokens: 0,
            reasoning_tokens: usage
                .completion_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
        }
    }
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Turns the SSE events of a chat-completions stream into provider events;
/// what follows `[DONE]` goes to `drains`.
pub(crate) fn parse_stream<S>(
    events: S,
    drains: Drains,
) -> impl futures::Stream<Item = Result<ProviderEvent, ProviderError>> + Send + 'static
where
    S: futures::Stream<Item = Result<super::stream::SseEvent, ProviderError>> + Send + 'static,
{
    async_stream::try_stream! {
        let mut events = Box::pin(events);
        let mut calls: BTreeMap<u32, PartialCall> = BTreeMap::new();
        let mut finish: Option<FinishReason> = None;
        let mut done = false;
        while let Some(event) = events.next().await {
            let event = event?;
            let data = event.data.trim();
            if data == "[DONE]" {
                done = true;
                break;
            }
            if data.is_empty() {
                continue;
            }
            let chunk: Chunk = serde_json::from_str(data).map_err(|e| {
                ProviderError::Protocol(format!("invalid JSON in stream chunk: {e}"))
            })?;
            if let Some(error) = chunk.error {
                Err(in_stream_error(&error))?;
            }
            for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
                if let Some(delta) = choice.delta {
                    if let Some(text) = delta.reasoning_content.filter(|t| !t.is_empty()) {
                        yield ProviderEvent::ReasoningDelta(text);
                    }
                    if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                        yield ProviderEvent::TextDelta(text);
                    }
                    for part in delta.tool_calls.unwrap_or_default() {
                        let index = part.index.unwrap_or(0);
                        let call = calls.entry(index).or_default();
                        if let Some(id) = part.id.filter(|id| !id.is_empty()) {
                            call.id = id;
                        }
                        if let Some(function) = part.function {
                            if let Some(name) = function.name {
                                call.name.push_str(&name);
                            }
                            if let Some(arguments) = function.arguments {
                                call.arguments.push_str(&arguments);
                            }
                        }
                    }
                }
                if let Some(reason) = choice.finish_reason {
                    finish = Some(FinishReason::from_wire(&reason));
                }
            }
            if let Some(usage) = chunk.usage {
                yield ProviderEvent::Usage(usage.into());
            }
        }
        if done {
            drains.hand_over(events);
        } else if finish.is_none() {
            Err(ProviderError::Interrupted(
                "the stream ended before the response was complete".into(),
            ))?;
        }
        let had_calls = !calls.is_empty();
        for (index, call) in calls {
            if call.name.is_empty() {
                Err(ProviderError::Protocol(format!("tool call {index} has no name")))?;
            }
            let id = if call.id.is_empty() { format!("call_{index}") } else { call.id };
            let arguments = if call.arguments.trim().is_empty() { "{}".to_owned() } else { call.arguments };
            yield ProviderEvent::ToolCall(ToolCall { id, name: call.name, arguments: arguments.into() });
        }
        let reason = finish.unwrap_or(if had_calls { FinishReason::ToolCalls } else { FinishReason::Stop });
        yield ProviderEvent::Finished(reason);
    }
}

/// An `error` object sent inside a 200 stream.
fn in_stream_error(error: &Value) -> ProviderError {
    let body = error.to_string();
    let (message, code) = transport::error_message(&json!({ "error": error }).to_string());
    let failure = super::ProviderFailure {
        status: 200,
        message: message.unwrap_or_else(|| "error in stream".to_owned()),
        body,
    };
    match code.as_deref() {
        Some("rate_limit_exceeded") => ProviderError::RateLimited {
            retry_after: None,
            failure,
        },
        Some("overloaded_error" | "server_overloaded" | "overloaded") => {
            ProviderError::Overloaded(failure)
        }
        Some("context_length_exceeded") => ProviderError::ContextLengthExceeded(failure),
        _ => ProviderError::Server(failure),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compatible_base_urls_keep_their_path_and_query() {
        let url = |base: &str| chat_completions_url(base).unwrap().to_string();
        assert_eq!(
            url("https://api.openai.com/v1"),
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            url("http://localhost:11434/v1/"),
            "http://localhost:11434/v1/chat/completions"
        );
        assert_eq!(
            url("https://res.openai.azure.com/openai/deployments/gpt4o?api-version=2024-10-21"),
            "https://res.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21"
        );
    }
}
