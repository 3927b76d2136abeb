//! Steering through the protocols that carry it: the AI SDK's
//! `body.multitask: "steer"`, AG-UI's `forwardedProps.multitask`, and a
//! Responses request that follows a response in progress with
//! `metadata.multitask: "steer"`. Each time the message joins the running
//! turn, the next provider request carries it once after the tool's
//! result, and the steering request's answer is the rest of that turn.

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    fake_provider::Reply,
    helpers::{TestApp, spawn_app},
    on_both_backends,
    support::Backend,
};

/// The JSON objects of an SSE body's `data:` lines.
fn data_lines(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str(data).ok())
        .collect()
}

/// The next turn asks for a tool, held until the gate opens, then answers.
fn held_tool_turn(app: &TestApp) -> CancellationToken {
    let gate = CancellationToken::new();
    app.provider.enqueue([
        Reply::sse("openai/tool_call_local_search.sse").hold_after(2, &gate),
        Reply::sse("openai/after_local_search.sse"),
    ]);
    gate
}

/// Posts `body` in a task: its status and text once it ends.
fn post_later(app: &TestApp, path: &str, body: Value) -> tokio::task::JoinHandle<(u16, String)> {
    let (client, url) = (reqwest::Client::new(), app.url(path));
    tokio::spawn(async move {
        let response = client.post(url).json(&body).send().await.unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    })
}

/// Waits until the session runs a turn; its id.
async fn running(app: &TestApp, session: &str) -> String {
    for _ in 0..500 {
        let (_, view) = app.get_json(&format!("/sessions/{session}")).await;
        if let Some(turn) = view["running_turn_id"].as_str() {
            return turn.to_owned();
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no turn of {session} runs");
}

/// The provider's last request carries `steered` once, after the tool's
/// result; the turn's log says it was applied at step 2.
async fn applied_once(app: &TestApp, session: &str, steered: &str) {
    let requests = app.provider.requests();
    let messages = requests.last().unwrap().body["messages"]
        .as_array()
        .unwrap()
        .clone();
    let tail: Vec<(&str, &str)> = messages[messages.len() - 2..]
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap(),
                m["content"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(tail, [("tool", tail[0].1), ("user", steered)]);
    let said = messages.iter().filter(|m| m["content"] == steered).count();
    assert_eq!(said, 1);
    let (_, log) = app
        .get_json(&format!("/sessions/{session}/events?limit=1000"))
        .await;
    let applied: Vec<&Value> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "steer.applied")
        .collect();
    assert_eq!(applied.len(), 1, "{log}");
    assert_eq!(applied[0]["step"], 2);
}

async fn each_protocol_steers_a_running_turn(backend: Backend) {
    let app = spawn_app(backend).await;
    let user = |id: &str, text: &str| json!({"id": id, "role": "user", "parts": [{"type": "text", "text": text}]});

    // The AI SDK: a second `sendMessage` while the first streams.
    let gate = held_tool_turn(&app);
    let first = post_later(
        &app,
        "/v1/ui/chat",
        json!({"id": "ui-steer", "messages": [user("u1", "Plan Paris")]}),
    );
    let turn = running(&app, "ui-steer").await;
    let steer = json!({"id": "ui-steer", "multitask": "steer",
                       "messages": [user("u1", "Plan Paris"), user("u2", "Also Rome")]});
    let steering = post_later(&app, "/v1/ui/chat", steer);
    let kept = wait_for_steer(&app, "ui-steer").await;
    assert_eq!(kept["turn_id"], json!(turn));
    gate.cancel();
    let (status, text) = steering.await.unwrap();
    assert_eq!(status, 200, "{text}");
    // The rest of the running turn, as a message of its own (the turn's
    // is the first request's): its answer, and its end.
    let chunks = data_lines(&text);
    assert_eq!(chunks[0], json!({"type": "start"}));
    let answered: String = chunks
        .iter()
        .filter(|c| c["type"] == "text-delta")
        .map(|c| c["delta"].as_str().unwrap())
        .collect();
    assert_eq!(answered, "You asked about a Paris trip before.");
    assert_eq!(chunks.last().unwrap()["type"], "finish");
    assert_eq!(first.await.unwrap().0, 200);
    applied_once(&app, "ui-steer", "Also Rome").await;

    // AG-UI: a second run on a thread whose run is live.
    let gate = held_tool_turn(&app);
    let say = |id: &str, text: &str| json!({"id": id, "role": "user", "content": text});
    let first = post_later(
        &app,
        "/v1/agui",
        json!({"threadId": "ag-steer", "runId": "r1", "messages": [say("u1", "Plan Paris")]}),
    );
    running(&app, "ag-steer").await;
    let steering = post_later(
        &app,
        "/v1/agui",
        json!({"threadId": "ag-steer", "runId": "r2", "forwardedProps": {"multitask": "steer"},
               "messages": [say("u1", "Plan Paris"), say("u2", "And Lisbon")]}),
    );
    wait_for_steer(&app, "ag-steer").await;
    gate.cancel();
    let (status, text) = steering.await.unwrap();
    assert_eq!(status, 200, "{text}");
    let events = data_lines(&text);
    assert_eq!(
        (&events[0]["type"], &events[0]["runId"]),
        (&json!("RUN_STARTED"), &json!("r2"))
    );
    assert_eq!(events.last().unwrap()["type"], "RUN_FINISHED");
    assert!(
        events.iter().any(|e| e["type"] == "TEXT_MESSAGE_CONTENT"),
        "{text}"
    );
    assert_eq!(first.await.unwrap().0, 200);
    applied_once(&app, "ag-steer", "And Lisbon").await;

    // Responses: a request that follows the response in progress.
    let gate = held_tool_turn(&app);
    let (status, started) = app
        .post_body(
            "/v1/responses",
            json!({"input": "Plan Paris", "background": true}),
        )
        .await;
    assert_eq!(
        (status, started["status"].as_str()),
        (200, Some("in_progress")),
        "{started}"
    );
    let steering = post_later(
        &app,
        "/v1/responses",
        json!({"input": "And Madrid", "previous_response_id": started["id"],
               "metadata": {"multitask": "steer"}}),
    );
    let session = started["conversation"]["id"].as_str().map(str::to_owned);
    let session = match session {
        Some(session) => session,
        None => session_of_response(&app, started["id"].as_str().unwrap()).await,
    };
    wait_for_steer(&app, &session).await;
    gate.cancel();
    let (status, text) = steering.await.unwrap();
    assert_eq!(status, 200, "{text}");
    let response: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(response["status"], "completed", "{response}");
    // A response of its own: the rest of the same turn.
    let id = response["id"].as_str().unwrap();
    assert!(
        id.starts_with(&format!("{}_", started["id"].as_str().unwrap())),
        "{id}"
    );
    assert!(
        text.contains("You asked about a Paris trip before."),
        "{text}"
    );
    applied_once(&app, &session, "And Madrid").await;
}

/// Waits until a steer of the session is in its log; the event.
async fn wait_for_steer(app: &TestApp, session: &str) -> Value {
    for _ in 0..500 {
        let (_, log) = app
            .get_json(&format!("/sessions/{session}/events?limit=1000"))
            .await;
        if let Some(accepted) = log["events"]
            .as_array()
            .and_then(|events| events.iter().find(|e| e["type"] == "steer.accepted"))
        {
            return accepted.clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no steer.accepted in {session}'s log");
}

/// The session of a response (the headers of `GET /v1/responses/{id}`).
async fn session_of_response(app: &TestApp, id: &str) -> String {
    let response = reqwest::Client::new()
        .get(app.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .unwrap();
    response.headers()["x-session-id"]
        .to_str()
        .unwrap()
        .to_owned()
}

on_both_backends!(each_protocol_steers_a_running_turn);
