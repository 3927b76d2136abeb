//! The Ollama adapter.

use std::time::Duration;

use harness_base::providers::{
    FinishReason, ProviderError, ProviderEvent, ToolCall, Usage,
    ollama::{OllamaConfig, OllamaProvider},
};
use harness_core::harness::thinking::ThinkLevel;
use serde_json::json;

use crate::{
    collect, conversation,
    fake_provider::{FakeProvider, Reply},
    text,
};

fn provider(fake: &FakeProvider) -> OllamaProvider {
    OllamaProvider::new(OllamaConfig {
        // OLLAMA_HOST is often given without a scheme.
        host: fake.root.trim_start_matches("http://").to_owned(),
        model: "llama3.2".into(),
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(10),
        max_response_bytes: 1 << 20,
    })
    .unwrap()
}

#[tokio::test]
async fn a_text_stream_parses_and_the_request_is_exact() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::ndjson("ollama/text.ndjson")]);
    let (events, error) = collect(&provider(&fake), conversation()).await;
    assert_eq!(error, None);
    assert_eq!(text(&events), "Hello! How can I help?");
    crate::ends_with_usage(&events, 26, 7);
    let sent = &fake.requests()[0];
    assert_eq!(sent.path, "/api/chat");
    assert_eq!(
        sent.body,
        json!({
            "model": "llama3.2",
            "messages": [
                {"role": "system", "content": "You are helpful."},
                {"role": "system", "content": "Context: none."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"location": "Paris"}}}
                ]},
                {"role": "tool", "content": "18°C, sunny"},
                {"role": "user", "content": "And tomorrow?"}
            ],
            "stream": true,
            "tools": [{"type": "function", "function": {
                "name": "get_weather",
                "description": "Weather of a place.",
                "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}
            }}]
        })
    );
}

#[tokio::test]
async fn tool_calls_arrive_whole_and_get_ids() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::ndjson("ollama/tool_calls.ndjson")]);
    let mut request = conversation();
    request.think_level = ThinkLevel::High;
    let (events, error) = collect(&provider(&fake), request).await;
    assert_eq!(error, None);
    assert_eq!(
        events,
        [
            ProviderEvent::ToolCall(ToolCall {
                id: "call_0".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into()
            }),
            ProviderEvent::ToolCall(ToolCall {
                id: "call_1".into(),
                name: "get_time".into(),
                arguments: r#"{"timezone":"Europe/Paris"}"#.into()
            }),
            ProviderEvent::Usage(Usage {
                input_tokens: 180,
                output_tokens: 41,
                cache_read_tokens: 0,
                cache_creation_tokens: 0,
                reasoning_tokens: 0,
            }),
            ProviderEvent::Finished(FinishReason::ToolCalls),
        ]
    );
    assert_eq!(fake.requests()[0].body["think"], true);
}

#[tokio::test]
async fn errors_are_typed_and_a_missing_done_line_is_an_interrupted_answer() {
    let fake = FakeProvider::start().await;
    let ollama = provider(&fake);
    fake.enqueue([Reply::body(
        404,
        "application/json",
        "ollama/error_404.json",
    )]);
    let (_, error) = collect(&ollama, conversation()).await;
    assert!(
        matches!(error, Some(ProviderError::BadRequest(ref f)) if f.message.contains("not found, try pulling it first")),
        "{error:?}"
    );

    fake.enqueue([Reply::ndjson("ollama/error_in_stream.ndjson")]);
    let (events, error) = collect(&ollama, conversation()).await;
    assert_eq!(text(&events), "Hel");
    assert!(
        matches!(error, Some(ProviderError::Server(ref f)) if f.message.contains("unexpected EOF")),
        "{error:?}"
    );

    let body = crate::fake_provider::fixture("ollama/text.ndjson");
    let without_done: String = body.lines().take(3).map(|l| format!("{l}\n")).collect();
    fake.enqueue([Reply::raw_ndjson(&without_done)]);
    let (events, error) = collect(&ollama, conversation()).await;
    assert_eq!(text(&events), "Hello! How");
    assert!(
        matches!(error, Some(ProviderError::Interrupted(ref m)) if m.contains("done")),
        "{error:?}"
    );
}

#[tokio::test]
async fn images_go_beside_the_text_as_ollama_takes_them() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::ndjson("ollama/text.ndjson")]);
    let (_, error) = collect(&provider(&fake), crate::with_attachments(false)).await;
    assert_eq!(error, None);
    let sent = &fake.requests()[0].body;
    assert_eq!(sent["messages"][0], crate::attachments_fixture("ollama"));
    // A PDF is nothing Ollama reads: refused, not dropped.
    let (_, error) = collect(&provider(&fake), crate::with_attachments(true)).await;
    assert!(error.is_some());
    assert_eq!(fake.requests().len(), 1, "nothing was sent");
}

#[tokio::test]
async fn thinking_streams_as_reasoning() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::ndjson("ollama/thinking.ndjson")]);
    let (events, error) = collect(&provider(&fake), conversation()).await;
    assert_eq!(error, None);
    assert_eq!(
        events[..2],
        [
            ProviderEvent::ReasoningDelta("The user greets me.".into()),
            ProviderEvent::ReasoningDelta(" A short hello will do.".into()),
        ]
    );
    assert_eq!(text(&events), "Hello!");
}
