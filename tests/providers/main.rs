//! Each adapter against its provider's wire format, served over real HTTP:
//! what we parse, and the exact request we send.

#![allow(
    clippy::disallowed_methods,
    reason = "a test's (the bench's) own servers and clients live as long as it does"
)]
#![allow(
    clippy::too_many_lines,
    reason = "a test (a scenario) is one story told whole; the lint holds in the service code"
)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly; the lint holds in the service code"
)]

#[path = "../support/mod.rs"]
mod support;

use support::fake_provider;

mod anthropic;
mod ollama;
mod openai;

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use harness_base::providers::{
    ChatMessage, ChatRequest, LlmProvider, ProviderError, ProviderEvent, ToolCall, ToolDefinition,
};
use serde_json::json;

/// A prompt with every kind of message: two system messages, a user
/// message, an assistant tool call, its result, and a new user message.
pub fn conversation() -> ChatRequest {
    let call = ToolCall {
        id: "call_1".into(),
        name: "get_weather".into(),
        arguments: r#"{"location":"Paris"}"#.into(),
    };
    ChatRequest {
        tools: vec![Arc::new(ToolDefinition {
            name: "get_weather".into(),
            description: "Weather of a place.".into(),
            parameters: json!({"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}),
        })],
        ..ChatRequest::new(
            "",
            vec![
                ChatMessage::system("You are helpful."),
                ChatMessage::system("Context: none."),
                ChatMessage::user("Weather in Paris?"),
                ChatMessage::assistant("", vec![call]),
                ChatMessage::tool("call_1", "18°C, sunny"),
                ChatMessage::user("And tomorrow?"),
            ],
            Duration::from_secs(10),
        )
    }
}

/// A user message with an image and a PDF between its text (loaded: as a
/// call sends them), and what the adapter's fixture says it becomes.
pub fn with_attachments(pdf: bool) -> ChatRequest {
    use harness_base::providers::Attachment;
    let attachment = |media_type: &str, bytes: &[u8], at: usize| Attachment {
        file_id: format!("file-{at}"),
        media_type: media_type.to_owned(),
        filename: if media_type == "application/pdf" {
            "report.pdf".to_owned()
        } else {
            String::new()
        },
        detail: media_type.starts_with("image/").then(|| "low".to_owned()),
        at,
        url: None,
        data: Some(std::sync::Arc::from(bytes)),
    };
    let png = b"\x89PNG\r\n\x1a\n".as_slice();
    let mut message = ChatMessage::user("What is this? And this?");
    message.attachments = vec![
        attachment("image/png", png, 13),
        if pdf {
            attachment("application/pdf", b"%PDF-1.7", 23)
        } else {
            attachment("image/png", png, 23)
        },
    ];
    ChatRequest::new("", vec![message], Duration::from_secs(10))
}

/// The fixture of what `provider` sends for [`with_attachments`].
pub fn attachments_fixture(provider: &str) -> serde_json::Value {
    let path = format!(
        "{}/tests/fixtures/{provider}/request_attachments.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A predicate on the error a case must end with.
pub type Check = fn(&ProviderError) -> bool;

/// All events of one call, or the error that ended it.
pub async fn collect(
    provider: &dyn LlmProvider,
    request: ChatRequest,
) -> (Vec<ProviderEvent>, Option<ProviderError>) {
    let mut stream = match provider.stream(request).await {
        Ok(stream) => stream,
        Err(e) => return (Vec::new(), Some(e)),
    };
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => events.push(event),
            Err(e) => return (events, Some(e)),
        }
    }
    (events, None)
}

/// The text of the deltas.
pub fn text(events: &[ProviderEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// The last two events of a stream that ended well: its usage (these
/// tokens, nothing cached), then `stop`.
pub fn ends_with_usage(events: &[ProviderEvent], input_tokens: u64, output_tokens: u64) {
    use harness_base::providers::{FinishReason, Usage};
    assert_eq!(
        events[events.len() - 2..],
        [
            ProviderEvent::Usage(Usage {
                input_tokens,
                output_tokens,
                cache_read_tokens: 0,
                cache_creation_tokens: 0,
                reasoning_tokens: 0,
            }),
            ProviderEvent::Finished(FinishReason::Stop),
        ]
    );
}
