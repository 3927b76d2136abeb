//! `POST /v1/agui`: an AG-UI run of a turn. The `@ag-ui/core` schemas check
//! every event in `.ci/run` (`scripts/clients/check.mjs`); here the sequence.

use serde_json::{Value, json};

use crate::{fake_provider::Reply, helpers::spawn_app, on_both_backends, support::Backend};

async fn an_agui_run_streams_the_turn_as_agui_events(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([
        Reply::sse("openai/tool_call_local_search.sse"),
        Reply::sse("openai/after_local_search.sse"),
    ]);
    let response = app
        .client
        .post(app.url("/v1/agui"))
        .json(&json!({
            "threadId": "thread-1",
            "runId": "run-1",
            "state": {},
            "tools": [],
            "context": [],
            "forwardedProps": {},
            "messages": [{"id": "u1", "role": "user", "content": "What did I ask before?"}]
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = response.text().await.unwrap();
    let events: Vec<Value> = body
        .split("\n\n")
        .filter_map(|f| f.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types[..7],
        [
            "RUN_STARTED",
            "STEP_STARTED",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT",
            "STEP_FINISHED"
        ]
    );
    assert_eq!(types[7..9], ["STEP_STARTED", "TEXT_MESSAGE_START"]);
    assert_eq!(
        types[types.len() - 3..],
        ["TEXT_MESSAGE_END", "STEP_FINISHED", "RUN_FINISHED"]
    );
    assert_eq!(
        (events[0]["threadId"].as_str(), events[0]["runId"].as_str()),
        (Some("thread-1"), Some("run-1"))
    );
    assert_eq!(events[2]["toolCallName"], "local_search");
    assert_eq!(events[3]["delta"], r#"{"query":"Paris trip"}"#);
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "TEXT_MESSAGE_CONTENT")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "You asked about a Paris trip before.");
    assert_eq!(
        events.last().unwrap()["result"]["text"],
        "You asked about a Paris trip before."
    );
}

/// A frontend tool: a call of it is `TOOL_CALL_*` and the run finishes;
/// the next run's messages end with the tool message, and that run is the
/// same turn after the call.
async fn a_frontend_tool_ends_the_run_and_the_next_run_answers_it(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([
        Reply::openai_tool_call("call_a1", "client__get_location", &json!({})),
        Reply::openai_text("You are in Paris."),
    ]);
    let run = |run_id: &str, messages: Value| {
        app.client.post(app.url("/v1/agui")).json(&json!({
            "threadId": "thread-tool",
            "runId": run_id,
            "tools": [{"name": "get_location", "description": "Where the user is",
                       "parameters": {"type": "object", "properties": {}}}],
            "messages": messages,
        }))
    };
    let events = |body: String| -> Vec<Value> {
        body.split("\n\n")
            .filter_map(|f| f.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    };
    let user = json!({"id": "u1", "role": "user", "content": "Where am I?"});
    // A tool that cannot be declared is refused before any turn.
    let refused = app
        .client
        .post(app.url("/v1/agui"))
        .json(
            &json!({"threadId": "thread-tool", "tools": [{"name": "no spaces"}],
            "messages": [user]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(
        (&problem["code"], &problem["field"]),
        (&json!("invalid_field"), &json!("tools"))
    );
    assert!(app.provider.requests().is_empty(), "no turn began");
    let first = events(
        run("run-1", json!([user]))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    let types: Vec<&str> = first.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types[types.len() - 4..],
        [
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "RUN_FINISHED"
        ],
        "{types:?}"
    );
    assert!(!types.contains(&"TOOL_CALL_RESULT"), "{types:?}");
    // A completed run that leaves the client's call to answer names it,
    // and says what its provider call used.
    let finished = first.last().unwrap();
    assert_eq!(
        finished["outcome"],
        json!({"type": "success", "pendingToolCallIds": ["call_a1"]}),
        "{finished}"
    );
    let usage = &finished["usage"][0];
    let (input, output) = (
        usage["inputTokens"].as_u64().unwrap(),
        usage["outputTokens"].as_u64().unwrap(),
    );
    assert!(input > 0 && output > 0, "{finished}");
    assert_eq!(usage["totalTokens"], input + output);
    let start = &first[types.len() - 4];
    assert_eq!(
        (&start["toolCallId"], &start["toolCallName"]),
        (&json!("call_a1"), &json!("get_location"))
    );
    let tool_message = |call: &str| {
        json!([user,
            {"id": "a1", "role": "assistant", "toolCalls": [{"id": call, "type": "function",
                "function": {"name": "get_location", "arguments": "{}"}}]},
            {"id": "t1", "role": "tool", "toolCallId": call, "content": "Paris"}])
    };
    let stray = run("run-x", tool_message("call_other"))
        .send()
        .await
        .unwrap();
    assert_eq!(stray.status(), 404);
    let problem: Value = stray.json().await.unwrap();
    assert_eq!(problem["code"], "call_not_found");

    let second = events(
        run("run-2", tool_message("call_a1"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(second[0]["type"], "RUN_STARTED");
    assert_eq!(second[0]["runId"], "run-2");
    let text: String = second
        .iter()
        .filter(|e| e["type"] == "TEXT_MESSAGE_CONTENT")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "You are in Paris.");
    assert!(
        !second
            .iter()
            .any(|e| e["type"].as_str().unwrap().starts_with("TOOL_CALL"))
    );
    let finished = second.last().unwrap();
    assert_eq!(finished["type"], "RUN_FINISHED");
    assert!(finished["outcome"].is_null(), "{finished}");
    // The second run counts its own call only (the fake's text answer:
    // 120 in, 40 out), not the first run's.
    assert_eq!(
        (
            &finished["usage"][0]["inputTokens"],
            &finished["usage"][0]["outputTokens"]
        ),
        (&json!(120), &json!(40)),
        "{finished}"
    );
    let sent = app.provider.requests()[1].body["messages"].to_string();
    assert!(sent.contains("Paris"), "{sent}");
}

/// A run stopped before it completed (cancelled, or interrupted by a
/// newer message) ends with `RUN_FINISHED` and AG-UI 1.0's cancelled
/// outcome, not `RUN_ERROR`: it did not fail.
#[tokio::test]
async fn a_cancelled_run_finishes_with_the_cancelled_outcome() {
    let app = spawn_app(Backend::Sqlite).await;
    let never = tokio_util::sync::CancellationToken::new();
    app.provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(3, &never)]);
    let mut response = app
        .client
        .post(app.url("/v1/agui"))
        .json(&json!({"threadId": "thread-stop", "runId": "run-stop",
            "messages": [{"id": "u1", "role": "user", "content": "Hi"}]}))
        .send()
        .await
        .unwrap();
    let mut body = String::new();
    while !body.contains("TEXT_MESSAGE_CONTENT") {
        let chunk = response.chunk().await.unwrap().expect("the run's events");
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    let (_, session) = app.get_json("/sessions/thread-stop").await;
    let turn_id = session["running_turn_id"].as_str().unwrap().to_owned();
    let (status, _) = app
        .post_json(&format!("/sessions/thread-stop/turns/{turn_id}/cancel"))
        .await;
    assert!(status == 200 || status == 202, "{status}");
    while let Some(chunk) = response.chunk().await.unwrap() {
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    let events: Vec<Value> = body
        .split("\n\n")
        .filter_map(|f| f.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert!(!types.contains(&"RUN_ERROR"), "{types:?}");
    assert_eq!(
        types[types.len() - 3..],
        ["TEXT_MESSAGE_END", "STEP_FINISHED", "RUN_FINISHED"],
        "{types:?}"
    );
    let finished = events.last().unwrap();
    assert_eq!(
        finished["outcome"],
        json!({"type": "cancelled"}),
        "{finished}"
    );
    assert_eq!(finished["runId"], "run-stop");
}

on_both_backends!(
    an_agui_run_streams_the_turn_as_agui_events,
    a_frontend_tool_ends_the_run_and_the_next_run_answers_it,
);
