//! The model catalogue as a turn uses it: each model's context window
//! (compaction), its longest answer (`max_output`) and its prices (cost).

use serde_json::{Value, json};

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, spawn_app_with, test_settings},
    support::{Backend, TestDb},
};

async fn app_on(
    model: &str,
    configure: impl FnOnce(&mut harness_core::config::Settings),
) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.providers.model = model.into();
    configure(&mut settings);
    spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await
}

/// On an 8k model (`gpt-4`), a prompt past 90% of its window is compacted
/// after a tool step. (Before, every model had a 128,000-token window and
/// compaction never came.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_8k_model_is_compacted_at_its_own_window() {
    let app = app_on("gpt-4", |_| {}).await;
    // About 9,000 tokens of history (4 characters a token).
    let history: Vec<Value> = (0..12)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": format!("turn {i}: {}", "lorem ipsum ".repeat(250))})
        })
        .collect();
    app.provider.enqueue([
        Reply::openai_tool_call("call_1", "local_search", &json!({"query": "lorem"})),
        Reply::openai_text("A summary of the earlier conversation."),
        Reply::sse("openai/text.sse"),
    ]);
    let events = app
        .post_turn_sse("s-8k", json!({"message": "And now?", "history": history}))
        .await
        .read_to_end()
        .await;
    let compacted: Vec<_> = events
        .iter()
        .filter(|e| e.event == "context.compacted")
        .collect();
    assert_eq!(compacted.len(), 1, "{events:?}");
    let tokens_before = compacted[0].json()["tokens_before"].as_u64().unwrap();
    assert!(tokens_before > 8_192 * 9 / 10, "{tokens_before}");
    assert_eq!(events.last().unwrap().event, "turn.completed");
}

/// A turn's calls ask for no more than the model's longest answer: the
/// catalogue's (`gpt-4`: 8,192), or the setting's over it. A model the
/// catalogue does not know asks for nothing (the provider's default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_ask_for_the_models_longest_answer() {
    for (model, models, expected) in [
        ("gpt-4", "{}", json!(8_192)),
        ("gpt-4", r#"{"gpt-4": {"max_output": 1000}}"#, json!(1_000)),
        ("my-finetune", "{}", Value::Null),
    ] {
        let app = app_on(model, |s| s.providers.models = models.parse().unwrap()).await;
        app.provider.enqueue([Reply::sse("openai/text.sse")]);
        let response = app.post_turn("s-max", json!({"message": "Hi"})).await;
        assert_eq!(response.status(), 200);
        let sent = &app.provider.requests()[0].body;
        assert_eq!(sent["model"], model);
        assert_eq!(sent["max_completion_tokens"], expected, "{model} {models}");
    }
}

/// A built-in model is priced without `HARNESS_PRICING`: the recorded
/// answer's 21 prompt and 10 answer tokens on gpt-4o-mini ($0.15 and
/// $0.60 a million). (Before, no model had a price unless one was set.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_built_in_model_is_priced_without_settings() {
    let app = app_on("gpt-4o-mini", |_| {}).await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let response = app.post_turn("s-priced", json!({"message": "Hi"})).await;
    let body: Value = response.json().await.unwrap();
    let cost = body["cost_usd"]
        .as_f64()
        .unwrap_or_else(|| panic!("{body}"));
    let expected = (21.0 * 0.15 + 10.0 * 0.6) / 1_000_000.0;
    assert!((cost - expected).abs() < 1e-12, "{cost} != {expected}");
}

/// The operator chooses the models: a name outside the chain and
/// `[providers.models]` is 422 `model_not_allowed` on every route that
/// names one, with the allowed names, before any provider request.
/// (Before, the native route and chat completions passed any name to the
/// provider on the operator's account, and Responses ran the chain.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_operators_models_may_be_named() {
    let app = app_on("gpt-4o-mini", |s| {
        s.providers.models = r#"{"gpt-4.1-mini": {"context_window": 1000000}}"#.parse().unwrap();
    })
    .await;
    let post = |path: &'static str, body: Value| app.client.post(app.url(path)).json(&body).send();
    for (path, body) in [
        (
            "/sessions/s-models/turns",
            json!({"message": "Hi", "runtime_model": "o9-ultra"}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "o9-ultra", "messages": [{"role": "user", "content": "Hi"}]}),
        ),
        ("/v1/responses", json!({"model": "o9-ultra", "input": "Hi"})),
    ] {
        let refused = post(path, body).await.unwrap();
        assert_eq!(refused.status(), 422, "{path}");
        let problem: Value = refused.json().await.unwrap();
        assert_eq!(problem["code"], "model_not_allowed", "{path}: {problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains("o9-ultra") && detail.contains("gpt-4o-mini, gpt-4.1-mini"),
            "{detail}"
        );
    }
    assert!(app.provider.requests().is_empty(), "no provider request");
    // The configured ones run.
    app.provider
        .enqueue([Reply::openai_text("One."), Reply::openai_text("Two.")]);
    let native = post(
        "/sessions/s-models/turns",
        json!({"message": "Hi", "runtime_model": "gpt-4.1-mini"}),
    )
    .await
    .unwrap();
    assert_eq!(native.status(), 200);
    let chat = post(
        "/v1/chat/completions",
        json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await
    .unwrap();
    assert_eq!(chat.status(), 200);
    let sent: Vec<Value> = app
        .provider
        .requests()
        .iter()
        .map(|r| r.body["model"].clone())
        .collect();
    assert_eq!(sent, [json!("gpt-4.1-mini"), json!("gpt-4o-mini")]);
}

/// The operator's ceilings: `HARNESS_MAX_THINK_LEVEL` lowers a request's
/// reasoning effort, `HARNESS_MAX_OUTPUT_TOKENS` caps every call, an
/// unknown model's too. (Before, a request asked for what it liked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_ceilings_hold_whatever_the_request_asks() {
    let app = app_on("my-finetune", |s| {
        s.harness.max_think_level = "low".parse().unwrap();
        s.harness.max_output_tokens = Some(300);
    })
    .await;
    app.provider
        .enqueue([Reply::openai_text("Thought a little.")]);
    let (status, _) = app.post_body("/v1/responses", json!({"model": "my-finetune", "input": "Think hard.", "reasoning": {"effort": "high"}})).await;
    assert_eq!(status, 200);
    let sent = &app.provider.requests()[0].body;
    assert_eq!(sent["reasoning_effort"], "low", "{sent}");
    assert_eq!(sent["max_completion_tokens"], 300, "{sent}");
}
