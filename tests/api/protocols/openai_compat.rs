//! `POST /v1/chat/completions` speaks the OpenAI format: its chunks have
//! the shape of the recorded OpenAI stream (`openai/text.sse`), its JSON
//! answer that of a `chat.completion`.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::{
    fake_provider::{Reply, fixture},
    helpers::spawn_app,
    on_both_backends,
    support::Backend,
};

/// The keys of an object.
fn keys(value: &Value) -> BTreeSet<String> {
    value
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// The `data:` payloads of an SSE body.
fn data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|frame| frame.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

async fn chat_completions_stream_in_the_openai_format(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let response = app
        .client
        .post(app.url("/v1/chat/completions"))
        .header("x-session-id", "s-compat")
        .json(&json!({
            "model": "agent-harness",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Say hello."}]}
            ],
            "stream": true,
            "stream_options": {"include_usage": true},
            "temperature": 0.2
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(response.headers()["x-session-id"], "s-compat");
    let body = response.text().await.unwrap();
    let payloads = data(&body);
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    // The recorded stream's chunks, less OpenAI's own extras.
    let recorded: Value =
        serde_json::from_str(data(&fixture("openai/text.sse"))[0].as_str()).unwrap();
    let mut expected = keys(&recorded);
    expected.remove("obfuscation");
    expected.remove("service_tier");
    for chunk in &chunks {
        assert_eq!(keys(chunk), expected, "{chunk}");
        assert_eq!(chunk["object"], "chat.completion.chunk");
    }
    assert_eq!(
        keys(&chunks[0]["choices"][0]),
        keys(&recorded["choices"][0])
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hello! How can I help you today?");
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let usage = &chunks[chunks.len() - 1]["usage"];
    assert_eq!(
        (
            usage["prompt_tokens"].as_u64(),
            usage["completion_tokens"].as_u64()
        ),
        (Some(21), Some(10))
    );
    // The message reached the model; the turn is the session's.
    let sent = app.provider.requests()[0].body["messages"].to_string();
    assert!(sent.contains("Say hello."), "{sent}");
    let (_, session) = app.get_json("/sessions/s-compat").await;
    assert_eq!(session["turn_count"], 1);
}

async fn chat_completions_answer_json_when_not_streaming(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let response = app
        .client
        .post(app.url("/v1/chat/completions"))
        .json(&json!({"model": "gpt-4o-mini", "user": "s-compat-json", "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-session-id"], "s-compat-json");
    let completion: Value = response.json().await.unwrap();
    assert_eq!(completion["object"], "chat.completion");
    assert_eq!(
        completion["choices"][0]["message"]["content"],
        "Hello! How can I help you today?"
    );
    assert_eq!(completion["choices"][0]["finish_reason"], "stop");
    assert_eq!(completion["usage"]["total_tokens"], 31);
    assert_eq!(app.provider.requests()[0].body["model"], "gpt-4o-mini");
    // What the format cannot carry is refused clearly.
    for (body, says) in [
        (json!({"messages": []}), "must not be empty"),
        (
            json!({"messages": [{"role": "assistant", "content": "x"}]}),
            "the user's",
        ),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}, {"role": "user", "content": "y"}]}),
            "unknown role",
        ),
    ] {
        let response = app
            .client
            .post(app.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 422, "{body}");
        let problem: Value = response.json().await.unwrap();
        assert!(
            problem["detail"].as_str().unwrap().contains(says),
            "{problem}"
        );
    }
}

on_both_backends!(
    chat_completions_stream_in_the_openai_format,
    chat_completions_answer_json_when_not_streaming,
);
