//! The OpenAI-compatible adapter.

use std::time::Duration;

use harness_base::providers::{
    FinishReason, ProviderError, ProviderEvent, ToolCall, Usage,
    openai::{OpenAiConfig, OpenAiProvider},
};
use harness_core::harness::thinking::ThinkLevel;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::{
    collect, conversation,
    fake_provider::{FakeProvider, Reply},
    text,
};

fn provider(fake: &FakeProvider, max_bytes: usize, idle: Duration) -> OpenAiProvider {
    OpenAiProvider::new(OpenAiConfig {
        base_url: fake.base_url.clone(),
        api_key: Some("sk-test".into()),
        model: "gpt-4o-mini".into(),
        connect_timeout: Duration::from_secs(2),
        idle_timeout: idle,
        max_response_bytes: max_bytes,
    })
    .unwrap()
}

async fn default(fake: &FakeProvider) -> OpenAiProvider {
    provider(fake, 1 << 20, Duration::from_secs(10))
}

#[tokio::test]
async fn a_text_stream_parses_and_the_request_is_exact() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::sse("openai/text.sse")]);
    let (events, error) = collect(&default(&fake).await, conversation()).await;
    assert_eq!(error, None);
    assert_eq!(text(&events), "Hello! How can I help you today?");
    crate::ends_with_usage(&events, 21, 10);
    let sent = &fake.requests()[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.headers["authorization"], "Bearer sk-test");
    assert_eq!(
        sent.body,
        json!({
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "system", "content": "You are helpful."},
                {"role": "system", "content": "Context: none."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18°C, sunny"},
                {"role": "user", "content": "And tomorrow?"}
            ],
            "stream": true,
            "stream_options": {"include_usage": true},
            "tools": [{"type": "function", "function": {
                "name": "get_weather",
                "description": "Weather of a place.",
                "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}
            }}]
        })
    );
}

#[tokio::test]
async fn interleaved_tool_call_deltas_assemble_by_index() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::sse("openai/multi_tool_interleaved.sse")]);
    let (events, error) = collect(&default(&fake).await, conversation()).await;
    assert_eq!(error, None);
    let calls: Vec<&ToolCall> = events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::ToolCall(c) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (
            calls[0].id.as_str(),
            calls[0].name.as_str(),
            calls[0].arguments.raw()
        ),
        (
            "call_A1b2C3d4E5f6G7h8I9j0K1l2",
            "get_weather",
            r#"{"location":"Paris"}"#
        )
    );
    assert_eq!(
        (
            calls[1].id.as_str(),
            calls[1].name.as_str(),
            calls[1].arguments.raw()
        ),
        (
            "call_M3n4O5p6Q7r8S9t0U1v2W3x4",
            "get_time",
            r#"{"timezone":"Europe/Paris"}"#
        )
    );
    assert_eq!(
        events.last(),
        Some(&ProviderEvent::Finished(FinishReason::ToolCalls))
    );
}

#[tokio::test]
async fn think_levels_become_reasoning_effort() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::sse("openai/text.sse"), Reply::sse("openai/text.sse")]);
    let openai = default(&fake).await;
    collect(&openai, conversation()).await;
    let mut thinking = conversation();
    thinking.think_level = ThinkLevel::Medium;
    collect(&openai, thinking).await;
    let requests = fake.requests();
    assert_eq!(requests[0].body.get("reasoning_effort"), None);
    assert_eq!(requests[1].body["reasoning_effort"], "medium");
}

#[tokio::test]
async fn error_answers_become_typed_errors() {
    let fake = FakeProvider::start().await;
    let openai = default(&fake).await;
    let cases: Vec<(Reply, crate::Check)> = vec![
        (
            Reply::body(401, "application/json", "openai/error_401.json"),
            |e| matches!(e, ProviderError::Auth(f) if f.status == 401 && f.message.starts_with("Incorrect API key")),
        ),
        (
            Reply::body(429, "application/json", "openai/error_429.json")
                .header("retry-after", "2"),
            |e| matches!(e, ProviderError::RateLimited { retry_after: Some(d), .. } if *d == Duration::from_secs(2)),
        ),
        (
            Reply::body(400, "application/json", "openai/error_context_length.json"),
            |e| matches!(e, ProviderError::ContextLengthExceeded(_)),
        ),
        (
            Reply::body(502, "text/html", "openai/gateway_502.html"),
            |e| matches!(e, ProviderError::Server(f) if f.body.contains("Bad Gateway")),
        ),
        (
            Reply::body(503, "text/html", "openai/gateway_502.html"),
            |e| matches!(e, ProviderError::Overloaded(_)),
        ),
        (
            Reply::body(200, "text/html", "openai/gateway_502.html"),
            |e| matches!(e, ProviderError::Protocol(m) if m.contains("text/event-stream")),
        ),
        (
            Reply::sse("openai/invalid_chunk.sse"),
            |e| matches!(e, ProviderError::Protocol(m) if m.contains("invalid JSON")),
        ),
        (
            Reply::sse("openai/truncated.sse"),
            |e| matches!(e, ProviderError::Interrupted(m) if m.contains("ended before")),
        ),
    ];
    for (reply, check) in cases {
        fake.enqueue([reply]);
        let (_, error) = collect(&openai, conversation()).await;
        let error = error.expect("an error");
        assert!(check(&error), "{error:?}");
        assert!(
            !format!("{error:?}").contains("sk-test"),
            "the key never appears in errors"
        );
    }
}

#[tokio::test]
async fn an_oversized_or_stalled_stream_ends_with_an_error() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::sse("openai/text.sse")]);
    let (_, error) = collect(
        &provider(&fake, 1024, Duration::from_secs(10)),
        conversation(),
    )
    .await;
    assert!(
        matches!(error, Some(ProviderError::Protocol(ref m)) if m.contains("exceeds 1024 bytes")),
        "{error:?}"
    );

    let gate = CancellationToken::new();
    fake.enqueue([Reply::sse("openai/text.sse").hold_after(3, &gate)]);
    let started = tokio::time::Instant::now();
    let (events, error) = collect(
        &provider(&fake, 1 << 20, Duration::from_millis(300)),
        conversation(),
    )
    .await;
    assert!(
        matches!(error, Some(ProviderError::Timeout(_))),
        "{error:?}"
    );
    assert_eq!(text(&events), "Hello!");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn an_unreachable_server_is_a_network_error() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base_url = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let openai = OpenAiProvider::new(OpenAiConfig {
        base_url,
        api_key: None,
        model: "m".into(),
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(2),
        max_response_bytes: 1 << 20,
    })
    .unwrap();
    let (_, error) = collect(&openai, conversation()).await;
    assert!(
        matches!(error, Some(ProviderError::Network(_))),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_json_completion_to_a_stream_request_is_one_step() {
    let fake = FakeProvider::start().await;
    fake.enqueue([
        Reply::body(
            200,
            "application/json",
            "openai/completion_local_search.json",
        ),
        Reply::body(
            200,
            "application/json; charset=utf-8",
            "openai/completion_text.json",
        ),
    ]);
    let openai = default(&fake).await;
    let (events, error) = collect(&openai, conversation()).await;
    assert_eq!(error, None);
    assert_eq!(
        events,
        [
            ProviderEvent::ToolCall(ToolCall {
                id: "call_Xw4Tn9Lq2Pb7Vr5Kc8Md1Hs6".into(),
                name: "local_search".into(),
                arguments: r#"{"query":"Paris trip"}"#.into(),
            }),
            ProviderEvent::Usage(Usage {
                input_tokens: 212,
                output_tokens: 17,
                cache_read_tokens: 0,
                cache_creation_tokens: 0,
                reasoning_tokens: 0,
            }),
            ProviderEvent::Finished(FinishReason::ToolCalls),
        ]
    );
    let (events, error) = collect(&openai, conversation()).await;
    assert_eq!(error, None);
    assert_eq!(
        events,
        [
            ProviderEvent::TextDelta("You asked about a Paris trip before.".into()),
            ProviderEvent::Usage(Usage {
                input_tokens: 268,
                output_tokens: 9,
                cache_read_tokens: 128,
                cache_creation_tokens: 0,
                reasoning_tokens: 0,
            }),
            ProviderEvent::Finished(FinishReason::Stop),
        ]
    );
}

#[tokio::test]
async fn a_connection_reset_mid_answer_is_an_interrupted_answer() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::sse("openai/text.sse").abort_after(3)]);
    let (events, error) = collect(&default(&fake).await, conversation()).await;
    // What arrived before the reset (the last chunk may be lost with it).
    assert!(text(&events).starts_with("Hello"), "{events:?}");
    let error = error.expect("an error");
    assert!(matches!(error, ProviderError::Interrupted(_)), "{error:?}");
    assert!(error.is_retryable());
    assert_eq!(error.code(), "provider_stream_interrupted");
}

#[tokio::test]
async fn images_and_pdfs_go_as_content_parts_in_openais_shape() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::sse("openai/text.sse")]);
    let (_, error) = collect(&default(&fake).await, crate::with_attachments(true)).await;
    assert_eq!(error, None);
    let sent = &fake.requests()[0].body;
    assert_eq!(sent["messages"][0], crate::attachments_fixture("openai"));
    // Bytes never loaded are never sent as nothing: the call fails.
    let mut unloaded = crate::with_attachments(true);
    unloaded.messages[0].attachments[0].data = None;
    let (_, error) = collect(&default(&fake).await, unloaded).await;
    assert!(error.is_some());
    assert_eq!(fake.requests().len(), 1, "nothing was sent");
}

#[tokio::test]
async fn reasoning_content_streams_as_reasoning() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::sse("openai/reasoning.sse")]);
    let (events, error) = collect(&default(&fake).await, conversation()).await;
    assert_eq!(error, None);
    assert_eq!(
        events[..2],
        [
            ProviderEvent::ReasoningDelta("The user greets me.".into()),
            ProviderEvent::ReasoningDelta(" A short hello will do.".into()),
        ]
    );
    assert_eq!(text(&events), "Hello!");
    // Its tokens, as the provider counts them apart, among the output.
    let usage = events.iter().find_map(|e| match e {
        ProviderEvent::Usage(usage) => Some(*usage),
        _ => None,
    });
    let usage = usage.expect("the usage");
    assert_eq!((usage.output_tokens, usage.reasoning_tokens), (21, 17));
}

#[tokio::test]
async fn an_image_given_by_url_is_sent_by_it_when_the_operator_passes_urls() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::sse("openai/text.sse")]);
    let mut request = crate::with_attachments(false);
    let url = "https://images.example/cat.png?size=2";
    request.messages[0].attachments[0].url = Some(url.to_owned());
    let (_, error) = collect(&default(&fake).await, request).await;
    assert_eq!(error, None);
    let sent = &fake.requests()[0].body;
    let image = &sent["messages"][0]["content"][1];
    assert_eq!(image["type"], "image_url", "{sent}");
    assert_eq!(image["image_url"]["url"], url, "the URL, not the bytes");
    assert_eq!(image["image_url"]["detail"], "low");
}
