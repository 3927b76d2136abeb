//! The Ollama adapter (`POST {host}/api/chat`, newline-delimited JSON).
//!
//! Tool calls arrive whole (arguments as a JSON object); Ollama may not
//! give them ids, so `call_{n}` is used. Usage comes from the final line's
//! `prompt_eval_count` and `eval_count`. Think levels above OFF send
//! `think: true`; a model without thinking refuses it (400 "does not
//! support thinking"), so the request is sent once more without it and the
//! model is remembered. The reasoning is not shown.

mod wire;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use futures::StreamExt;
use reqwest::Url;
use serde::Deserialize;
use serde_json::Value;
use tokio::time::Instant;

use super::{
    ChatRequest, FinishReason, ProviderError, ProviderEvent, ProviderFailure, ThinkLevel, ToolCall,
    Usage,
    drain::Drains,
    redact::{HttpAdapter, Opened, Redactor},
    refusing::RefusingModels,
    stream, transport,
};

/// Settings of an Ollama server.
#[derive(Debug, Clone)]
pub struct OllamaConfig {
    /// `OLLAMA_HOST`: `http://127.0.0.1:11434`, or `host:port`.
    pub host: String,
    pub model: String,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_response_bytes: usize,
}

/// The Ollama provider.
#[derive(Debug, Clone)]
pub struct OllamaProvider {
    client: reqwest::Client,
    endpoint: Url,
    model: String,
    idle_timeout: Duration,
    max_response_bytes: usize,
    /// Reads each answer to its end after its `done` line.
    pub(super) drains: Drains,
    /// Models that answered 400 to `think`: they are not sent it again.
    no_think: Arc<RefusingModels>,
    /// Masks secret query values of the host URL in errors.
    redactor: Arc<Redactor>,
}

impl OllamaProvider {
    pub fn new(config: OllamaConfig) -> Result<Self, ProviderError> {
        let host = config.host.trim().trim_end_matches('/');
        let host = if host.contains("://") {
            host.to_owned()
        } else {
            format!("http://{host}")
        };
        let redactor = Arc::new(Redactor::new(None, Url::parse(&host).ok().as_ref()));
        let endpoint = Url::parse(&format!("{host}/api/chat")).map_err(|e| {
            redactor.error(ProviderError::Protocol(format!(
                "invalid OLLAMA_HOST {host:?}: {e}"
            )))
        })?;
        let client = transport::client(config.connect_timeout)?;
        Ok(Self {
            client,
            endpoint,
            model: config.model,
            idle_timeout: config.idle_timeout,
            max_response_bytes: config.max_response_bytes,
            drains: Drains::new(),
            no_think: Arc::default(),
            redactor,
        })
    }

    /// The JSON body sent for `request`.
    pub fn request_body(&self, request: &ChatRequest) -> Value {
        serde_json::to_value(self.body(request)).unwrap_or(Value::Null)
    }

    /// The body sent for `request`, borrowed from it. A model that refused
    /// `think` once is not asked to think again (see `open`).
    fn body<'a>(&'a self, request: &'a ChatRequest) -> wire::Body<'a> {
        let model = request.model_or(&self.model);
        let think = request.think_level != ThinkLevel::Off && !self.no_think.contains(model);
        wire::Body::new(request, model, think)
    }
}

#[async_trait]
impl HttpAdapter for OllamaProvider {
    const NAME: &'static str = "ollama";

    async fn open(&self, request: ChatRequest, deadline: Instant) -> Opened {
        let body = self.body(&request);
        let sent_think = body.think.is_some();
        let response = match self.send(&body, deadline).await {
            Err(e) if sent_think && refuses_thinking(&e) => {
                // Asked once more without it; remembered for this model.
                let model = request.model_or(&self.model).to_owned();
                tracing::info!(model = %model, "the model does not think; sending without `think`");
                self.no_think.remember(&model);
                self.send(&self.body(&request), deadline).await?
            }
            other => other?,
        };
        let response =
            transport::expect_content_type(response, &["application/x-ndjson", "application/json"])
                .await?;
        let lines = stream::ndjson_lines(
            transport::limited_bytes(response, self.max_response_bytes),
            self.idle_timeout,
            deadline,
        );
        Ok(parse_stream(lines, self.drains.clone()).boxed())
    }

    fn setup(&self) -> (&str, &Arc<Redactor>) {
        (&self.model, &self.redactor)
    }
}

impl OllamaProvider {
    /// Posts `body`; an error answer is an error here.
    async fn send(
        &self,
        body: &wire::Body<'_>,
        deadline: Instant,
    ) -> Result<reqwest::Response, ProviderError> {
        let http = self.client.post(self.endpoint.clone()).json(body);
        let response = transport::send(http, deadline).await?;
        if !response.status().is_success() {
            return Err(transport::error_from_response(response).await);
        }
        Ok(response)
    }
}

/// Whether a 400 says the model has no thinking (`"llama3.2" does not
/// support thinking`): the request is worth sending again without `think`.
fn refuses_thinking(error: &ProviderError) -> bool {
    matches!(error, ProviderError::BadRequest(f)
        if f.status == 400 && f.message.contains("does not support thinking"))
}

#[derive(Debug, Deserialize)]
struct Line {
    #[serde(default)]
    message: Option<LineMessage>,
    #[serde(default)]
    done: bool,
    #[serde(default)]
    done_reason: Option<String>,
    #[serde(default)]
    prompt_eval_count: Option<u64>,
    #[serde(default)]
    eval_count: Option<u64>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct LineMessage {
    #[serde(default)]
    content: String,
    /// A thinking model's reasoning (`think: true`).
    #[serde(default)]
    thinking: String,
    #[serde(default)]
    tool_calls: Vec<LineToolCall>,
}

#[derive(Debug, Deserialize)]
struct LineToolCall {
    #[serde(default)]
    id: Option<String>,
    function: LineFunction,
}

#[derive(Debug, Deserialize)]
struct LineFunction {
    name: String,
    #[serde(default)]
    arguments: Value,
}

/// Turns the NDJSON lines of `/api/chat` into provider events; what
/// follows the `done` line goes to `drains`.
pub(crate) fn parse_stream<S>(
    lines: S,
    drains: Drains,
) -> impl futures::Stream<Item = Result<ProviderEvent, ProviderError>> + Send + 'static
where
    S: futures::Stream<Item = Result<String, ProviderError>> + Send + 'static,
{
    async_stream::try_stream! {
        let mut lines = Box::pin(lines);
        let mut calls = 0usize;
        let mut finished = None;
        while let Some(line) = lines.next().await {
            let line = line?;
            let parsed: Line = serde_json::from_str(&line)
                .map_err(|e| ProviderError::Protocol(format!("invalid JSON line: {e}")))?;
            if let Some(error) = parsed.error {
                let failure = ProviderFailure { status: 200, message: error.clone(), body: line.clone() };
                Err(if error.contains("context") && error.contains("length") {
                    ProviderError::ContextLengthExceeded(failure)
                } else {
                    ProviderError::Server(failure)
                })?;
            }
            if let Some(message) = parsed.message {
                if !message.thinking.is_empty() {
                    yield ProviderEvent::ReasoningDelta(message.thinking);
                }
                if !message.content.is_empty() {
                    yield ProviderEvent::TextDelta(message.content);
                }
                for call in message.tool_calls {
                    let id = call.id.filter(|id| !id.is_empty()).unwrap_or_else(|| format!("call_{calls}"));
                    calls += 1;
                    let arguments = match call.function.arguments {
                        Value::Null => "{}".to_owned(),
                        Value::String(text) => text,
                        other => other.to_string(),
                    };
                    yield ProviderEvent::ToolCall(ToolCall { id, name: call.function.name, arguments: arguments.into() });
                }
            }
            if parsed.done {
                yield ProviderEvent::Usage(Usage {
                    input_tokens: parsed.prompt_eval_count.unwrap_or(0),
                    output_tokens: parsed.eval_count.unwrap_or(0),
                    cache_read_tokens: 0,
                    cache_creation_tokens: 0,
                    // Counted from the reasoning streamed (not reported apart).
                    reasoning_tokens: 0,
                });
                let reason = if calls > 0 { "tool_calls".to_owned() } else { parsed.done_reason.unwrap_or_else(|| "stop".into()) };
                finished = Some(FinishReason::from_wire(&reason));
                break;
            }
        }
        match finished {
            // Handed over before the last event: the caller stops there.
            Some(reason) => {
                drains.hand_over(lines);
                yield ProviderEvent::Finished(reason);
            }
            None => Err(ProviderError::Interrupted("the stream ended before its `done` line".into()))?,
        }
    }
}
