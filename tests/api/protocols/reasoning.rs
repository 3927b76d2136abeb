//! A model's reasoning, streamed by its provider, reaches clients in each
//! protocol's own shape (and none of it with `HARNESS_REASONING=hidden`).

use serde_json::{Value, json};

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{spawn_app, spawn_app_with, test_settings, types},
    support::{Backend, TestDb},
};

/// The JSON of each `data:` line of an SSE body.
fn data_lines(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str(data).ok())
        .collect()
}

#[tokio::test]
async fn reasoning_is_shown_in_every_protocols_shape() {
    let app = spawn_app(Backend::Sqlite).await;
    let reasoning = "The user greets me. A short hello will do.";

    // Native: `reasoning.delta`s, then `reasoning.completed`, then the text.
    app.provider.enqueue([Reply::sse("openai/reasoning.sse")]);
    let mut stream = app
        .post_turn_sse("s-reason", json!({"message": "Hi"}))
        .await;
    let events = stream.read_to_end().await;
    let kinds = types(&events);
    let first_text = kinds.iter().position(|t| *t == "message.delta").unwrap();
    let completed = kinds
        .iter()
        .position(|t| *t == "reasoning.completed")
        .unwrap();
    assert!(completed < first_text, "{kinds:?}");
    let reasoned: String = events
        .iter()
        .filter(|e| e.event == "reasoning.delta")
        .map(|e| e.json()["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(reasoned, reasoning);
    let done = events
        .iter()
        .find(|e| e.event == "reasoning.completed")
        .unwrap()
        .json();
    assert_eq!(done["step"], 1);
    assert_eq!(done["tokens"], reasoning.len().div_ceil(4));

    // Chat completions: `reasoning_content` deltas.
    app.provider.enqueue([Reply::sse("openai/reasoning.sse")]);
    let body = app
        .post_text(
            "/v1/chat/completions",
            json!({"stream": true, "stream_options": {"include_usage": true},
               "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
    let chunks = data_lines(&body);
    let usage = chunks
        .iter()
        .find_map(|c| c.get("usage").filter(|u| !u.is_null()))
        .expect("the usage chunk");
    assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 17);
    let said: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["reasoning_content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(said, reasoning);

    // The AI SDK: a reasoning part before the text part.
    app.provider.enqueue([Reply::sse("openai/reasoning.sse")]);
    let body = app
        .post_text(
            "/v1/ui/chat",
            json!({"id": "ui-reason", "messages": [{"id": "m1", "role": "user",
               "parts": [{"type": "text", "text": "Hi"}]}]}),
        )
        .await;
    let chunks = data_lines(&body);
    let kinds: Vec<&str> = chunks.iter().filter_map(|c| c["type"].as_str()).collect();
    let at = |kind: &str| kinds.iter().position(|k| *k == kind).unwrap();
    assert!(at("reasoning-start") < at("reasoning-end"), "{kinds:?}");
    assert!(at("reasoning-end") < at("text-start"), "{kinds:?}");
    let said: String = chunks
        .iter()
        .filter(|c| c["type"] == "reasoning-delta")
        .map(|c| c["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(said, reasoning);

    // AG-UI: a reasoning span with its message.
    app.provider.enqueue([Reply::sse("openai/reasoning.sse")]);
    let body = app
        .post_text(
            "/v1/agui",
            json!({"threadId": "agui-reason", "runId": "r1",
               "messages": [{"id": "m1", "role": "user", "content": "Hi"}]}),
        )
        .await;
    let events = data_lines(&body);
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    let at = |kind: &str| kinds.iter().position(|k| *k == kind).unwrap();
    assert!(
        at("REASONING_START") < at("REASONING_MESSAGE_START"),
        "{kinds:?}"
    );
    assert!(
        at("REASONING_MESSAGE_END") < at("REASONING_END"),
        "{kinds:?}"
    );
    assert!(at("REASONING_END") < at("TEXT_MESSAGE_START"), "{kinds:?}");
    let said: String = events
        .iter()
        .filter(|e| e["type"] == "REASONING_MESSAGE_CONTENT")
        .map(|e| e["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(said, reasoning);

    // Responses: a `reasoning` item, its `reasoning_text` streamed.
    app.provider.enqueue([Reply::sse("openai/reasoning.sse")]);
    let body = app
        .post_text("/v1/responses", json!({"input": "Hi", "stream": true}))
        .await;
    let events = data_lines(&body);
    let said: String = events
        .iter()
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .map(|e| e["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(said, reasoning);
    let done = events.last().unwrap();
    assert_eq!(done["type"], "response.completed", "{done}");
    let output = &done["response"]["output"];
    assert_eq!(output[0]["type"], "reasoning", "{output}");
    assert_eq!(output[0]["content"][0]["text"], reasoning, "{output}");
    assert_eq!(
        done["response"]["usage"]["output_tokens_details"]["reasoning_tokens"],
        17
    );
    assert_eq!(output[1]["type"], "message", "{output}");
}

#[tokio::test]
async fn hidden_reasoning_leaves_nothing() {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.harness.reasoning = harness_core::harness::Reasoning::Hidden;
    let app = spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await;
    app.provider.enqueue([Reply::sse("openai/reasoning.sse")]);
    let mut stream = app
        .post_turn_sse("s-hidden", json!({"message": "Hi"}))
        .await;
    let events = stream.read_to_end().await;
    assert!(
        !types(&events).iter().any(|t| t.starts_with("reasoning")),
        "{:?}",
        types(&events)
    );
    let (_, log) = app.get_json("/sessions/s-hidden/events?limit=1000").await;
    assert!(!log.to_string().contains("greets"), "{log}");
    let result = &events.last().unwrap().json()["result"];
    assert_eq!(result["text"], "Hello!");
    // Still counted, as the provider reports them.
    assert_eq!(result["reasoning_tokens"], 17);
    let (_, usage) = app.get_json("/usage").await;
    assert_eq!(usage["today"]["reasoning_tokens"], 17, "{usage}");
}

/// A tenant's own choice overrides the operator's, either way.
#[tokio::test]
async fn a_tenant_may_hide_or_show_reasoning_against_the_operators_default() {
    use harness_store::store::TenantLimits;
    for operator in [
        harness_core::harness::Reasoning::Show,
        harness_core::harness::Reasoning::Hidden,
    ] {
        let provider = FakeProvider::start().await;
        let mut settings = test_settings(&provider);
        settings.harness.reasoning = operator;
        let app = spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await;
        let tenant_shows = operator == harness_core::harness::Reasoning::Hidden;
        let limits = TenantLimits {
            show_reasoning: Some(tenant_shows),
            ..TenantLimits::default()
        };
        app.db
            .open()
            .await
            .set_tenant_limits("default", &limits, chrono::Utc::now())
            .await
            .unwrap();
        app.provider.enqueue([Reply::sse("openai/reasoning.sse")]);
        let events = app
            .post_turn_sse("s-own", json!({"message": "Hi"}))
            .await
            .read_to_end()
            .await;
        let shown = types(&events).contains(&"reasoning.delta");
        assert_eq!(shown, tenant_shows, "operator {operator:?}");
        let result = &events.last().unwrap().json()["result"];
        assert_eq!(result["reasoning_tokens"], 17, "operator {operator:?}");
    }
}
