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
    configure: impl FnOnce(&mut agent_harness::config::Settings),
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
