//! The provider chain through the service: retries, fallover, fail-fast,
//! retraction of partial output, the deadline, each wire format, costs.

use std::time::Duration;

use harness_core::config::Settings;
use serde_json::json;
use tokio::time::Instant;

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, first_event, spawn_app_with, streamed_text, test_settings, types},
    support::{Backend, TestDb},
};

async fn app_with(configure: impl FnOnce(&mut Settings, &FakeProvider)) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.providers.chain = Some(
        "openai:gpt-4o-mini,anthropic:claude-sonnet-4-6"
            .parse()
            .unwrap(),
    );
    settings.providers.anthropic_base_url = provider.root.parse().unwrap();
    settings.providers.anthropic_api_key = Some("sk-ant-test".into());
    configure(&mut settings, &provider);
    spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await
}

fn closed_port_url() -> String {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}/v1", closed.local_addr().unwrap())
}

#[tokio::test]
async fn a_429_is_retried_after_its_retry_after() {
    let app = app_with(|s, _| s.providers.max_attempts = 2).await;
    app.provider.enqueue([
        Reply::body(429, "application/json", "openai/error_429.json").header("retry-after", "1"),
        Reply::sse("openai/text.sse"),
    ]);
    let started = Instant::now();
    let events = app
        .post_turn_sse("c-429", json!({"message": "Hi"}))
        .await
        .read_to_end()
        .await;
    assert_eq!(events.last().unwrap().event, "turn.completed");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After was honoured"
    );
    let paths: Vec<String> = app
        .provider
        .requests()
        .into_iter()
        .map(|r| r.path)
        .collect();
    assert_eq!(paths, ["/v1/chat/completions", "/v1/chat/completions"]);
    assert!(!types(&events).contains(&"message.retracted"));
}

#[tokio::test]
async fn a_primary_that_is_down_falls_over_to_the_next_provider() {
    let app =
        app_with(|s, _| s.providers.openai_base_url = closed_port_url().parse().unwrap()).await;
    app.provider.enqueue([Reply::sse("anthropic/text.sse")]);
    let events = app
        .post_turn_sse("c-down", json!({"message": "Hi"}))
        .await
        .read_to_end()
        .await;
    let result = &events.last().unwrap().json()["result"];
    assert_eq!(result["text"], "Hello! How can I help you today?");
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path, "/v1/messages");
    assert_eq!(requests[0].body["model"], "claude-sonnet-4-6");
}

#[tokio::test]
async fn a_non_retryable_error_fails_fast_without_fallover() {
    let app = app_with(|s, _| s.providers.max_attempts = 3).await;
    app.provider.enqueue([
        Reply::body(401, "application/json", "openai/error_401.json"),
        Reply::sse("anthropic/text.sse"),
    ]);
    let events = app
        .post_turn_sse("c-401", json!({"message": "Hi"}))
        .await
        .read_to_end()
        .await;
    let last = events.last().unwrap();
    assert_eq!(last.event, "turn.failed");
    assert_eq!(last.json()["code"], "provider_auth_failed");
    assert_eq!(app.provider.requests().len(), 1, "no retry, no fallover");
}

#[tokio::test]
async fn a_stream_that_fails_after_output_is_retracted_then_retried() {
    // Some text, then an in-stream server error (retryable).
    let app = app_with(|s, _| s.providers.max_attempts = 2).await;
    let partial = crate::fake_provider::fixture("openai/truncated.sse")
        + "data: {\"error\":{\"message\":\"The server had an error while processing your request.\",\"type\":\"server_error\",\"code\":\"server_error\"}}\n\n";
    app.provider
        .enqueue([Reply::raw_sse(&partial), Reply::sse("openai/text.sse")]);
    let events = app
        .post_turn_sse("c-partial", json!({"message": "Hi"}))
        .await
        .read_to_end()
        .await;
    let kinds = types(&events);
    let retracted = kinds
        .iter()
        .position(|t| *t == "message.retracted")
        .expect("a retraction");
    assert!(
        kinds[..retracted].contains(&"message.delta"),
        "partial text came first"
    );
    assert_eq!(events[retracted].json()["reason"], "provider_server_error");
    // What a client keeps: the deltas after the retraction.
    assert_eq!(
        streamed_text(&events[retracted..]),
        "Hello! How can I help you today?"
    );
    assert_eq!(
        events.last().unwrap().json()["result"]["text"],
        "Hello! How can I help you today?"
    );
    assert_eq!(app.provider.requests().len(), 2);
}

#[tokio::test]
async fn retries_never_wait_past_the_turn_deadline() {
    let app = app_with(|s, _| {
        s.providers.chain = Some("openai:gpt-4o-mini".parse().unwrap());
        s.harness.turn_timeout_s = 1;
        s.providers.max_attempts = 3;
        s.providers.retry_base_ms = 3000;
        s.providers.retry_max_ms = 5000;
    })
    .await;
    app.provider.enqueue([
        Reply::body(503, "text/html", "openai/gateway_502.html"),
        Reply::body(503, "text/html", "openai/gateway_502.html"),
    ]);
    let started = Instant::now();
    let events = app
        .post_turn_sse("c-deadline", json!({"message": "Hi"}))
        .await
        .read_to_end()
        .await;
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(events.last().unwrap().json()["code"], "provider_overloaded");
    assert_eq!(app.provider.requests().len(), 1);
}

#[tokio::test]
async fn runtime_provider_picks_a_provider_of_the_chain() {
    let app = app_with(|_, _| {}).await;
    app.provider.enqueue([Reply::sse("anthropic/text.sse")]);
    let events = app
        .post_turn_sse(
            "c-pick",
            json!({"message": "Hi", "runtime_provider": "anthropic"}),
        )
        .await
        .read_to_end()
        .await;
    let started = events[0].json();
    assert_eq!(
        (started["provider"].as_str(), started["model"].as_str()),
        (Some("anthropic"), Some("claude-sonnet-4-6"))
    );
    assert_eq!(app.provider.requests()[0].path, "/v1/messages");
    let metadata = app.provider.requests()[0].body["system"][1]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        metadata.contains("- provider: anthropic\n- model: claude-sonnet-4-6\n"),
        "{metadata}"
    );
}

#[tokio::test]
async fn a_tool_turn_completes_against_each_wire_format() {
    let cases = [
        (
            "openai:gpt-4o-mini",
            Reply::sse("openai/tool_call_local_search.sse"),
            Reply::sse("openai/after_local_search.sse"),
            "You asked about a Paris trip before.",
        ),
        (
            "anthropic:claude-sonnet-4-6",
            Reply::sse("anthropic/tool_use_local_search.sse"),
            Reply::sse("anthropic/text.sse"),
            "Hello! How can I help you today?",
        ),
        (
            "ollama:llama3.2",
            Reply::ndjson("ollama/tool_call_local_search.ndjson"),
            Reply::ndjson("ollama/text.ndjson"),
            "Hello! How can I help?",
        ),
    ];
    for (chain, call, answer, text) in cases {
        let app = app_with(|s, p| {
            s.providers.chain = Some(chain.parse().unwrap());
            s.providers.ollama_host = p.root.parse().unwrap();
        })
        .await;
        app.provider.enqueue([call, answer]);
        let events = app
            .post_turn_sse("c-tools", json!({"message": "What about my Paris trip?"}))
            .await
            .read_to_end()
            .await;
        let finished: Vec<_> = events
            .iter()
            .filter(|e| e.event == "tool.finished")
            .collect();
        assert_eq!(finished.len(), 1, "{chain}");
        assert_eq!(finished[0].json()["tool"], "local_search");
        assert_eq!(finished[0].json()["status"], "completed", "{chain}");
        assert_eq!(
            events.last().unwrap().json()["result"]["text"],
            text,
            "{chain}"
        );
        // The tool result went back in the provider's own shape.
        let second = &app.provider.requests()[1].body;
        let sent = second.to_string();
        assert!(
            sent.contains("No results for") || sent.contains("messages/"),
            "{chain}: {sent}"
        );
    }
}

#[tokio::test]
async fn priced_models_report_turn_and_session_costs() {
    let app = app_with(|s, _| {
        s.providers.chain = Some("openai:gpt-4o-mini".parse().unwrap());
        s.providers.pricing =
            serde_json::from_value(json!({"gpt-4o-mini": {"input": 0.15, "output": 0.6}})).unwrap();
    })
    .await;
    app.provider
        .enqueue([Reply::sse("openai/text.sse"), Reply::sse("openai/text.sse")]);
    let per_turn = (21.0 * 0.15 + 10.0 * 0.6) / 1_000_000.0;
    let first = app
        .post_turn_sse("c-cost", json!({"message": "Hi"}))
        .await
        .read_to_end()
        .await;
    let usage = first_event(&first, "usage");
    assert!((usage["cost_usd"].as_f64().unwrap() - per_turn).abs() < 1e-12);
    let result = &first.last().unwrap().json()["result"];
    assert!((result["cost_usd"].as_f64().unwrap() - per_turn).abs() < 1e-12);
    let second: serde_json::Value = app
        .post_turn("c-cost", json!({"message": "Again"}))
        .await
        .json()
        .await
        .unwrap();
    assert!(
        (second["session_cost_usd"].as_f64().unwrap() - 2.0 * per_turn).abs() < 1e-12,
        "{second}"
    );
    let (_, session) = app.get_json("/sessions/c-cost").await;
    assert!(
        (session["cost_usd"].as_f64().unwrap() - 2.0 * per_turn).abs() < 1e-12,
        "{session}"
    );
}

#[tokio::test]
async fn anthropic_thinking_blocks_travel_back_with_their_tool_calls() {
    let app = app_with(|s, _| {
        s.providers.chain = Some("anthropic:claude-sonnet-4-6".parse().unwrap());
        s.harness.think_level = "low".parse().unwrap();
    })
    .await;
    app.provider.enqueue([
        Reply::sse("anthropic/thinking_tool_use.sse"),
        Reply::sse("anthropic/thinking.sse"),
    ]);
    let events = app
        .post_turn_sse("c-think", json!({"message": "What about my Paris trip?"}))
        .await
        .read_to_end()
        .await;
    assert_eq!(events.last().unwrap().event, "turn.completed", "{events:?}");
    let second = &app.provider.requests()[1].body;
    assert_eq!(second["thinking"]["type"], "enabled");
    let assistant = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "assistant")
        .expect("the step's assistant message");
    let blocks = assistant["content"].as_array().unwrap();
    assert_eq!(blocks[0]["type"], "thinking");
    assert_eq!(
        blocks[0]["thinking"],
        "The user asks about an earlier trip. Search the history first."
    );
    assert_eq!(
        blocks[0]["signature"],
        "ErUBCkYIBRgCIkDx7qv2NmTzQ3Lr9Hb5PwK1yJd8Vc4Xs6Ra0Ze2GfUo"
    );
    assert_eq!(blocks[1]["type"], "tool_use");
    assert_eq!(blocks[1]["id"], "toolu_01Hj2Kl3Mn4Op5Qr6St7Uv8W");
}

/// Anthropic's thinking, with a `redacted_thinking` block before it, in a
/// two-step tool turn: both blocks go back byte for byte, the readable
/// one is shown as `reasoning.delta`, and its tokens are counted.
#[tokio::test]
async fn anthropic_thinking_is_shown_as_reasoning_and_redacted_blocks_go_back() {
    let app = app_with(|s, _| {
        s.providers.chain = Some("anthropic:claude-sonnet-4-6".parse().unwrap());
        s.harness.think_level = "low".parse().unwrap();
    })
    .await;
    app.provider.enqueue([
        Reply::sse("anthropic/redacted_thinking_tool_use.sse"),
        Reply::sse("anthropic/text.sse"),
    ]);
    let events = app
        .post_turn_sse(
            "c-redacted",
            json!({"message": "What about my Paris trip?"}),
        )
        .await
        .read_to_end()
        .await;
    let last = events.last().unwrap();
    assert_eq!(last.event, "turn.completed", "{events:?}");
    let reasoned: String = events
        .iter()
        .filter(|e| e.event == "reasoning.delta")
        .map(|e| {
            assert_eq!(e.json()["step"], 1);
            e.json()["text"].as_str().unwrap().to_owned()
        })
        .collect();
    let thought = "The user asks about an earlier trip. Search the history first.";
    assert_eq!(reasoned, thought);
    let completed = events
        .iter()
        .find(|e| e.event == "reasoning.completed")
        .expect("reasoning.completed")
        .json();
    // Anthropic counts no thinking tokens apart: a token per 4 bytes.
    let counted = thought.len().div_ceil(4) as u64;
    assert_eq!(completed["tokens"], counted);
    assert_eq!(last.json()["result"]["reasoning_tokens"], counted);
    let (_, usage) = app.get_json("/usage").await;
    assert_eq!(usage["today"]["reasoning_tokens"], counted, "{usage}");
    let second = &app.provider.requests()[1].body;
    let assistant = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "assistant")
        .expect("the step's assistant message");
    let blocks = assistant["content"].as_array().unwrap();
    let kinds: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["redacted_thinking", "thinking", "tool_use"]);
    let sent = crate::fake_provider::fixture("anthropic/redacted_thinking_tool_use.sse");
    let data = blocks[0]["data"].as_str().unwrap();
    assert!(
        data.starts_with("EmwKAhgB") && sent.contains(data),
        "byte for byte"
    );
    assert_eq!(blocks[1]["thinking"], thought);
}

#[tokio::test]
async fn a_model_that_refuses_reasoning_effort_is_asked_again_without_it() {
    let app = app_with(|s, _| {
        s.providers.chain = Some("openai:gpt-4o-mini".parse().unwrap());
        s.harness.think_level = "medium".parse().unwrap();
    })
    .await;
    app.provider.enqueue([
        Reply::body(
            400,
            "application/json",
            "openai/error_unsupported_reasoning_effort.json",
        ),
        Reply::sse("openai/text.sse"),
        Reply::sse("openai/text.sse"),
    ]);
    for session in ["c-effort-1", "c-effort-2"] {
        let events = app
            .post_turn_sse(session, json!({"message": "Hi"}))
            .await
            .read_to_end()
            .await;
        assert_eq!(events.last().unwrap().event, "turn.completed", "{events:?}");
    }
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0].body["reasoning_effort"], "medium");
    // Once refused, the model is not sent the parameter again.
    assert_eq!(requests[1].body.get("reasoning_effort"), None);
    assert_eq!(requests[2].body.get("reasoning_effort"), None);
}

/// Ollama models without thinking (llama3.x, gemma, qwen2.5) answer 400
/// "does not support thinking" to `think: true`: the request goes again
/// without it, and the model is not sent it again. (Before, every turn at
/// a think level above `off` failed, and the error was not one to fall
/// over on.)
#[tokio::test]
async fn an_ollama_model_without_thinking_is_asked_again_without_think() {
    let app = app_with(|s, p| {
        s.providers.chain = Some("ollama:llama3.2".parse().unwrap());
        s.providers.ollama_host = p.root.parse().unwrap();
        s.harness.think_level = "medium".parse().unwrap();
    })
    .await;
    app.provider.enqueue([
        Reply::body(400, "application/json", "ollama/think_unsupported.json"),
        Reply::ndjson("ollama/text.ndjson"),
        Reply::ndjson("ollama/text.ndjson"),
    ]);
    for session in ["c-think-1", "c-think-2"] {
        let events = app
            .post_turn_sse(session, json!({"message": "Hi"}))
            .await
            .read_to_end()
            .await;
        let end = events.last().unwrap();
        assert_eq!(end.event, "turn.completed", "{events:?}");
        assert_eq!(end.json()["result"]["text"], "Hello! How can I help?");
    }
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 3);
    assert!(
        requests.iter().all(|r| r.path == "/api/chat"),
        "{requests:?}"
    );
    assert_eq!(requests[0].body["think"], true);
    assert_eq!(requests[1].body.get("think"), None);
    assert_eq!(requests[2].body.get("think"), None);
}

#[tokio::test]
async fn a_cut_or_reset_answer_is_retracted_and_falls_over_to_the_next_provider() {
    // One try per provider: OpenAI's answer is cut (or reset), Anthropic's
    // is whole.
    for cut in [
        Reply::sse("openai/truncated.sse"),
        Reply::sse("openai/text.sse").abort_after(3),
    ] {
        let app = app_with(|_, _| {}).await;
        app.provider
            .enqueue([cut, Reply::sse("anthropic/text.sse")]);
        let events = app
            .post_turn_sse("c-cut", json!({"message": "Hi"}))
            .await
            .read_to_end()
            .await;
        let kinds = types(&events);
        let retracted = kinds
            .iter()
            .position(|t| *t == "message.retracted")
            .unwrap_or_else(|| panic!("a retraction: {events:?}"));
        assert!(kinds[..retracted].contains(&"message.delta"));
        assert_eq!(
            events[retracted].json()["reason"],
            "provider_stream_interrupted"
        );
        assert_eq!(events.last().unwrap().event, "turn.completed");
        let requests = app.provider.requests();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[1].path, "/v1/messages");
    }
}
