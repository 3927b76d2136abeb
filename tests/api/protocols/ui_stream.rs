//! `POST /v1/ui/chat`: a `useChat` request answered as the AI SDK's UI
//! message stream (v1). The real `ai` package reads it in `.ci/run`
//! (`scripts/ui_stream_check.mjs`); here the chunks are checked one by one.

use serde_json::{Value, json};

use crate::{
    fake_provider::Reply,
    helpers::{TestApp, spawn_app},
    on_both_backends,
    support::Backend,
};

/// The user's message of the client-side tool tests.
fn where_am_i() -> Value {
    json!({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Where am I?"}]})
}

/// The streamed body of a useChat request of chat `id` with `messages`,
/// offering the client's `get_location` tool.
async fn location_chat(app: &TestApp, id: &str, messages: Value) -> String {
    let request = app.client.post(app.url("/v1/ui/chat")).json(&json!({
        "id": id,
        "messages": messages,
        "clientTools": [{"name": "get_location", "description": "Where the user is"}],
    }));
    request.send().await.unwrap().text().await.unwrap()
}

fn chunks(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|frame| frame.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

async fn a_use_chat_request_streams_ui_message_chunks(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([
        Reply::sse("openai/tool_call_local_search.sse"),
        Reply::sse("openai/after_local_search.sse"),
    ]);
    let response = app
        .client
        .post(app.url("/v1/ui/chat"))
        .json(&json!({
            "id": "chat-1",
            "trigger": "submit-message",
            "messages": [
                {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Plan a Paris trip"}]},
                {"id": "m2", "role": "assistant", "parts": [{"type": "text", "text": "Sure."}]},
                {"id": "m3", "role": "user", "parts": [{"type": "text", "text": "What did I ask before?"}]}
            ]
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-vercel-ai-ui-message-stream"], "v1");
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let body = response.text().await.unwrap();
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    let chunks = chunks(&body);
    let types: Vec<&str> = chunks.iter().map(|c| c["type"].as_str().unwrap()).collect();
    assert_eq!(
        types[..4],
        [
            "start",
            "start-step",
            "tool-input-available",
            "tool-output-available"
        ]
    );
    assert_eq!(
        types[types.len() - 3..],
        ["text-end", "finish-step", "finish"]
    );
    assert_eq!(chunks[2]["toolName"], "local_search");
    assert_eq!(chunks[2]["input"], json!({"query": "Paris trip"}));
    assert_eq!(chunks[3]["toolCallId"], chunks[2]["toolCallId"]);
    // The service runs it: the client's onToolCall must not.
    assert_eq!(
        (
            &chunks[2]["providerExecuted"],
            &chunks[3]["providerExecuted"]
        ),
        (&json!(true), &json!(true))
    );
    let text: String = chunks
        .iter()
        .filter(|c| c["type"] == "text-delta")
        .map(|c| c["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "You asked about a Paris trip before.");
    // The history came from the request: the model saw the earlier turns.
    let sent = app.provider.requests()[0].body["messages"].to_string();
    assert!(
        sent.contains("Plan a Paris trip") && sent.contains("Sure."),
        "{sent}"
    );
    // And a chat is a session.
    let (_, session) = app.get_json("/sessions/chat-1").await;
    assert_eq!(session["turn_count"], 1);

    let response = app
        .client
        .post(app.url("/v1/ui/chat"))
        .json(&json!({"id": "chat-1", "messages": [{"role": "assistant", "parts": []}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
}

/// `useChat`'s resume (`GET /v1/ui/chat/{id}/stream`): the chat's running
/// turn from its start, the same chunks as the stream that began it; 204
/// when no turn of the chat runs, or the chat was never made.
async fn use_chat_resumes_the_running_turn_from_its_start(backend: Backend) {
    let app = spawn_app(backend).await;
    let resume = || app.client.get(app.url("/v1/ui/chat/chat-r/stream")).send();
    assert_eq!(resume().await.unwrap().status(), 204, "no such chat");
    let gate = tokio_util::sync::CancellationToken::new();
    app.provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(3, &gate)]);
    let first = app
        .client
        .post(app.url("/v1/ui/chat"))
        .json(&json!({"id": "chat-r", "messages": [
            {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Hi"}]}
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let resumed = resume().await.unwrap();
    assert_eq!(resumed.status(), 200);
    assert_eq!(resumed.headers()["x-vercel-ai-ui-message-stream"], "v1");
    assert_eq!(resumed.headers()["x-turn-id"], first.headers()["x-turn-id"]);
    gate.cancel();
    let (first, resumed) = (first.text().await.unwrap(), resumed.text().await.unwrap());
    assert_eq!(chunks(&resumed), chunks(&first));
    let text: String = chunks(&resumed)
        .iter()
        .filter(|c| c["type"] == "text-delta")
        .map(|c| c["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Hello! How can I help you today?");
    assert!(resumed.ends_with("data: [DONE]\n\n"));
    assert_eq!(resume().await.unwrap().status(), 204, "the turn is over");
}

/// A client-side tool: its call is `tool-input-available` (not
/// `providerExecuted`, so `onToolCall` runs it) and the stream finishes;
/// the next request's last message holds the result in that part, and its
/// stream is the same turn after the call.
async fn a_client_side_tool_is_answered_in_the_next_request(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([
        Reply::openai_tool_call("call_u1", "client__get_location", &json!({"precise": true})),
        Reply::openai_text("You are in Lyon."),
    ]);
    let user = where_am_i();
    let chat = |messages| location_chat(&app, "chat-tool", messages);
    let twice = json!({"name": "get_location", "description": "Where the user is"});
    let refused = app
        .client
        .post(app.url("/v1/ui/chat"))
        .json(&json!({"id": "chat-tool", "messages": [user], "clientTools": [twice, twice]}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(
        (&problem["code"], &problem["field"]),
        (&json!("invalid_field"), &json!("clientTools"))
    );
    assert!(app.provider.requests().is_empty(), "no turn began");
    let body = chat(json!([user])).await;
    let first = chunks(&body);
    let call = first
        .iter()
        .find(|c| c["type"] == "tool-input-available")
        .unwrap();
    assert_eq!(
        (&call["toolCallId"], &call["toolName"], &call["input"]),
        (
            &json!("call_u1"),
            &json!("get_location"),
            &json!({"precise": true})
        )
    );
    assert!(call.get("providerExecuted").is_none(), "{call}");
    assert_eq!(first.last().unwrap()["type"], "finish");
    assert!(body.ends_with("data: [DONE]\n\n"));

    let answered = json!([user, {"id": "a1", "role": "assistant", "parts": [
        {"type": "step-start"},
        {"type": "tool-get_location", "toolCallId": "call_u1", "state": "output-available",
         "input": {"precise": true}, "output": {"city": "Lyon"}}]}]);
    let body = chat(answered).await;
    let rest = chunks(&body);
    let text: String = rest
        .iter()
        .filter(|c| c["type"] == "text-delta")
        .map(|c| c["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "You are in Lyon.");
    assert!(!rest.iter().any(|c| c["type"] == "tool-output-available"));
    let sent = app.provider.requests()[1].body["messages"].to_string();
    assert!(sent.contains(r#"{\"city\":\"Lyon\"}"#), "{sent}");
}

/// `useChat`'s resume of a turn that went on after a client-side tool
/// starts after the call the client answered: the next call is asked,
/// the answered one is not asked again.
async fn use_chat_resumes_after_the_client_call_it_answered(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([
        Reply::openai_tool_call("call_r1", "client__get_location", &json!({})),
        Reply::openai_tool_call("call_r2", "client__get_location", &json!({"precise": true})),
    ]);
    let user = where_am_i();
    let chat = |messages| location_chat(&app, "chat-resume-tool", messages);
    let calls = |body: &str| -> Vec<String> {
        chunks(body)
            .iter()
            .filter(|c| c["type"] == "tool-input-available")
            .map(|c| c["toolCallId"].as_str().unwrap().to_owned())
            .collect()
    };
    let first = chat(json!([user])).await;
    assert_eq!(calls(&first), ["call_r1"]);
    let resume = || app.get_text("/v1/ui/chat/chat-resume-tool/stream");
    assert_eq!(calls(&resume().await), ["call_r1"], "nothing answered yet");
    let answered = json!([user, {"id": "a1", "role": "assistant", "parts": [
        {"type": "tool-get_location", "toolCallId": "call_r1", "state": "output-available",
         "input": {}, "output": "Lyon"}]}]);
    let second = chat(answered).await;
    assert_eq!(calls(&second), ["call_r2"]);
    assert_eq!(
        calls(&resume().await),
        ["call_r2"],
        "after the answered call"
    );
}

on_both_backends!(
    a_use_chat_request_streams_ui_message_chunks,
    use_chat_resumes_the_running_turn_from_its_start,
    a_client_side_tool_is_answered_in_the_next_request,
    use_chat_resumes_after_the_client_call_it_answered,
);
