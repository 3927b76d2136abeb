//! A scripted provider: answers from a list, records every request. For the
//! harness's tests and benches, where the loop matters and the wire does
//! not (the adapters are tested against real wire bodies separately).

use std::{
    collections::VecDeque,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use async_trait::async_trait;
use futures::StreamExt;

use super::{
    ChatRequest, FinishReason, LlmProvider, ProviderError, ProviderEvent, ProviderStream, ToolCall,
    Usage,
};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Scripted {
    /// Text, streamed word by word.
    Text(String),
    /// Tool calls (optionally after some text).
    Calls(String, Vec<ToolCall>),
    /// An error before the first byte.
    Fail(ProviderError),
    /// Wait, then answer (never past the request's timeout).
    After(Duration, Box<Scripted>),
    /// Never answers: the request's timeout ends it with `Timeout`.
    Stall,
}

/// A text answer.
pub fn text(text: &str) -> Scripted {
    Scripted::Text(text.to_owned())
}

/// One tool call.
pub fn call(id: &str, name: &str, arguments: serde_json::Value) -> ToolCall {
    ToolCall {
        id: id.to_owned(),
        name: name.to_owned(),
        arguments: arguments.to_string().into(),
    }
}

/// An answer made of tool calls.
pub fn calls(calls: Vec<ToolCall>) -> Scripted {
    Scripted::Calls(String::new(), calls)
}

/// A provider that plays a script.
pub struct ScriptedProvider {
    name: String,
    model: String,
    usage: Usage,
    script: Mutex<VecDeque<Scripted>>,
    requests: Mutex<Vec<ChatRequest>>,
}

impl ScriptedProvider {
    pub fn new(script: impl IntoIterator<Item = Scripted>) -> Self {
        Self {
            name: "scripted".to_owned(),
            model: "scripted-model".to_owned(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                cache_read_tokens: 0,
                cache_creation_tokens: 0,
                reasoning_tokens: 0,
            },
            script: Mutex::new(script.into_iter().collect()),
            requests: Mutex::default(),
        }
    }

    /// Usage reported per answer (default 10 in, 5 out).
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = usage;
        self
    }

    pub fn with_names(mut self, name: &str, model: &str) -> Self {
        self.name = name.to_owned();
        self.model = model.to_owned();
        self
    }

    /// Appends answers to the script.
    pub fn push(&self, answers: impl IntoIterator<Item = Scripted>) {
        self.script
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(answers);
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn events(&self, answer: Scripted) -> Vec<Result<ProviderEvent, ProviderError>> {
        let mut events = Vec::new();
        let (text, calls) = match answer {
            Scripted::Text(text) => (text, Vec::new()),
            Scripted::Calls(text, calls) => (text, calls),
            Scripted::Fail(e) => return vec![Err(e)],
            Scripted::After(..) | Scripted::Stall => return events,
        };
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let cut = rest[1..].find(' ').map_or(rest.len(), |i| i + 1);
            events.push(Ok(ProviderEvent::TextDelta(rest[..cut].to_owned())));
            rest = &rest[cut..];
        }
        let reason = if calls.is_empty() {
            FinishReason::Stop
        } else {
            FinishReason::ToolCalls
        };
        events.extend(calls.into_iter().map(|c| Ok(ProviderEvent::ToolCall(c))));
        if !self.usage.is_zero() {
            events.push(Ok(ProviderEvent::Usage(self.usage)));
        }
        events.push(Ok(ProviderEvent::Finished(reason)));
        events
    }
}

#[async_trait]
impl LlmProvider for ScriptedProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn default_model(&self) -> &str {
        &self.model
    }

    async fn stream(&self, request: ChatRequest) -> Result<ProviderStream, ProviderError> {
        let timeout = request.timeout;
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(request);
        let mut answer = self
            .script
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
            .ok_or_else(|| ProviderError::Protocol("the script is exhausted".into()))?;
        let mut waited = Duration::ZERO;
        loop {
            match answer {
                Scripted::After(delay, next) => {
                    let left = timeout.saturating_sub(waited);
                    if delay >= left {
                        tokio::time::sleep(left).await;
                        return Err(ProviderError::Timeout("scripted delay".into()));
                    }
                    tokio::time::sleep(delay).await;
                    waited += delay;
                    answer = *next;
                }
                Scripted::Stall => {
                    tokio::time::sleep(timeout.saturating_sub(waited)).await;
                    return Err(ProviderError::Timeout("scripted stall".into()));
                }
                Scripted::Fail(e) => return Err(e),
                other => return Ok(futures::stream::iter(self.events(other)).boxed()),
            }
        }
    }
}
