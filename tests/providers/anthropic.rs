//! The Anthropic Messages adapter.

use std::time::Duration;

use harness_base::providers::{
    ChatMessage, FinishReason, ProviderError, ProviderEvent, ThinkingBlock, ToolCall, Usage,
    anthropic::{AnthropicConfig, AnthropicProvider},
};
use harness_core::harness::thinking::ThinkLevel;
use serde_json::json;

use crate::{
    collect, conversation,
    fake_provider::{FakeProvider, Reply},
    text,
};

fn provider(fake: &FakeProvider) -> AnthropicProvider {
    AnthropicProvider::new(AnthropicConfig {
        base_url: fake.root.clone(),
        api_key: Some("sk-ant-test".into()),
        model: "claude-sonnet-4-6".into(),
        max_tokens: 4096,
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(10),
        max_response_bytes: 1 << 20,
    })
    .unwrap()
}

#[tokio::test]
async fn a_text_stream_parses_and_the_request_is_exact() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::sse("anthropic/text.sse")]);
    let (events, error) = collect(&provider(&fake), conversation()).await;
    assert_eq!(error, None);
    assert_eq!(text(&events), "Hello! How can I help you today?");
    crate::ends_with_usage(&events, 25, 12);
    let sent = &fake.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.headers["x-api-key"], "sk-ant-test");
    assert_eq!(sent.headers["anthropic-version"], "2023-06-01");
    assert_eq!(
        sent.body,
        json!({
            "model": "claude-sonnet-4-6",
            "max_tokens": 4096,
            "system": [
                {"type": "text", "text": "You are helpful."},
                {"type": "text", "text": "Context: none."}
            ],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"location": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "18°C, sunny"},
                    {"type": "text", "text": "And tomorrow?"}
                ]}
            ],
            "stream": true,
            "tools": [{
                "name": "get_weather",
                "description": "Weather of a place.",
                "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}
            }]
        })
    );
}

#[tokio::test]
async fn tool_use_blocks_assemble_from_input_json_deltas_with_cache_usage() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::sse("anthropic/tool_use.sse")]);
    let (events, error) = collect(&provider(&fake), conversation()).await;
    assert_eq!(error, None);
    assert_eq!(
        events,
        [
            ProviderEvent::TextDelta("Let me check both.".into()),
            ProviderEvent::ToolCall(ToolCall {
                id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
                name: "get_weather".into(),
                arguments: r#"{"location": "Paris, France"}"#.into(),
            }),
            ProviderEvent::ToolCall(ToolCall {
                id: "toolu_01Xk9mPqRt5yVw2zAb3cDe4F".into(),
                name: "get_time".into(),
                arguments: r#"{"timezone":"Europe/Paris"}"#.into(),
            }),
            ProviderEvent::Usage(Usage {
                input_tokens: 472 + 1200 + 300,
                output_tokens: 89,
                cache_read_tokens: 1200,
                cache_creation_tokens: 300,
                reasoning_tokens: 0,
            }),
            ProviderEvent::Finished(FinishReason::ToolCalls),
        ]
    );
}

#[tokio::test]
async fn extended_thinking_is_requested_returned_and_sent_back() {
    let fake = FakeProvider::start().await;
    fake.enqueue([
        Reply::sse("anthropic/thinking.sse"),
        Reply::sse("anthropic/text.sse"),
    ]);
    let anthropic = provider(&fake);
    let mut request = conversation();
    request.think_level = ThinkLevel::Low;
    let (events, error) = collect(&anthropic, request).await;
    assert_eq!(error, None);
    let block = ThinkingBlock {
        text: "The user wants a greeting. Keep it short.".into(),
        signature: Some("EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds".into()),
        redacted: None,
    };
    // The reasoning streams as it comes, then the whole block.
    let at = events
        .iter()
        .position(|e| matches!(e, ProviderEvent::Thinking(_)))
        .unwrap();
    assert_eq!(events[at], ProviderEvent::Thinking(block.clone()));
    let reasoned: String = events[..at]
        .iter()
        .map(|e| match e {
            ProviderEvent::ReasoningDelta(text) => text.as_str(),
            other => panic!("before the block: {other:?}"),
        })
        .collect();
    assert_eq!(reasoned, block.text);
    assert_eq!(text(&events), "Hi!");
    let sent = &fake.requests()[0].body;
    assert_eq!(
        sent["thinking"],
        json!({"type": "enabled", "budget_tokens": 1024})
    );
    assert_eq!(sent["max_tokens"], 4096 + 1024);

    // The next request carries the thinking block back, first.
    let mut next = conversation();
    next.messages.push(ChatMessage {
        thinking: vec![block],
        ..ChatMessage::assistant("Hi!", vec![])
    });
    next.messages.push(ChatMessage::user("Thanks"));
    collect(&anthropic, next).await;
    let messages = fake.requests()[1].body["messages"].clone();
    assert_eq!(
        messages[3]["content"][0],
        json!({"type": "thinking", "thinking": "The user wants a greeting. Keep it short.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"})
    );
}

#[tokio::test]
async fn errors_in_answers_and_in_streams_are_typed() {
    let fake = FakeProvider::start().await;
    let anthropic = provider(&fake);
    let cases: Vec<(Reply, crate::Check)> = vec![
        (
            Reply::sse("anthropic/overloaded.sse"),
            |e| matches!(e, ProviderError::Overloaded(f) if f.message == "Overloaded"),
        ),
        (
            Reply::body(401, "application/json", "anthropic/error_401.json"),
            |e| matches!(e, ProviderError::Auth(f) if f.message == "invalid x-api-key"),
        ),
        (
            Reply::body(529, "application/json", "anthropic/error_529.json"),
            |e| matches!(e, ProviderError::Overloaded(f) if f.status == 529),
        ),
        (
            Reply::body(
                400,
                "application/json",
                "anthropic/error_prompt_too_long.json",
            ),
            |e| matches!(e, ProviderError::ContextLengthExceeded(_)),
        ),
    ];
    for (reply, check) in cases {
        fake.enqueue([reply]);
        let (events, error) = collect(&anthropic, conversation()).await;
        let error = error.expect("an error");
        assert!(check(&error), "{error:?}");
        assert!(text(&events).is_empty());
        assert!(error.code().starts_with("provider_"));
    }
    // Cut before message_stop: an interrupted answer (retryable), not a
    // silent success.
    let body = crate::fake_provider::fixture("anthropic/text.sse");
    let cut = body.find("event: message_delta").unwrap();
    fake.enqueue([Reply::raw_sse(&body[..cut])]);
    let (events, error) = collect(&anthropic, conversation()).await;
    assert_eq!(text(&events), "Hello! How can I help you today?");
    assert!(
        matches!(error, Some(ProviderError::Interrupted(ref m)) if m.contains("message_stop")),
        "{error:?}"
    );
}

#[tokio::test]
async fn images_and_pdfs_go_as_base64_blocks() {
    let fake = FakeProvider::start().await;
    fake.enqueue([Reply::sse("anthropic/text.sse")]);
    let (_, error) = collect(&provider(&fake), crate::with_attachments(true)).await;
    assert_eq!(error, None);
    let sent = &fake.requests()[0].body;
    assert_eq!(sent["messages"][0], crate::attachments_fixture("anthropic"));
}

#[tokio::test]
async fn redacted_thinking_travels_back_unchanged_with_the_signed_block() {
    let fake = FakeProvider::start().await;
    fake.enqueue([
        Reply::sse("anthropic/redacted_thinking_tool_use.sse"),
        Reply::sse("anthropic/text.sse"),
    ]);
    let anthropic = provider(&fake);
    let mut request = conversation();
    request.think_level = ThinkLevel::Low;
    let (events, error) = collect(&anthropic, request).await;
    assert_eq!(error, None);
    let blocks: Vec<ThinkingBlock> = events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Thinking(block) => Some(block.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(blocks.len(), 2, "{events:?}");
    assert_eq!(blocks[0].text, "");
    assert!(
        blocks[0]
            .redacted
            .as_deref()
            .unwrap()
            .starts_with("EmwKAhgB")
    );
    assert_eq!(
        blocks[1].text,
        "The user asks about an earlier trip. Search the history first."
    );
    let call = events
        .iter()
        .find_map(|e| match e {
            ProviderEvent::ToolCall(call) => Some(call.clone()),
            _ => None,
        })
        .unwrap();
    // The next step sends both back first, in order, byte for byte.
    let mut next = conversation();
    next.messages.push(ChatMessage {
        thinking: blocks,
        ..ChatMessage::assistant("", vec![call])
    });
    next.messages
        .push(ChatMessage::tool("toolu_01Hj2Kl3Mn4Op5Qr6St7Uv8W", "found"));
    collect(&anthropic, next).await;
    let sent = &fake.requests()[1].body["messages"];
    let content = &sent[3]["content"];
    assert_eq!(
        content[0],
        json!({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDxH4mPnZ5sQ7vB5URj2pSmxaQ8X9S3vXWm9ExfHvTsmmfd3gD"})
    );
    assert_eq!(content[1]["type"], "thinking");
    assert_eq!(
        content[1]["signature"],
        "ErUBCkYIBRgCIkDx7qv2NmTzQ3Lr9Hb5PwK1yJd8Vc4Xs6Ra0Ze2GfUo"
    );
    assert_eq!(content[2]["type"], "tool_use");
}
