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

on_both_backends!(an_agui_run_streams_the_turn_as_agui_events);
