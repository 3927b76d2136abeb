//! A2A 1.0's HTTP+JSON binding: the tasks of `/a2a` at the paths the
//! specification gives (`/message:send`, `/tasks/{id}`, …), answered as
//! bare objects, streamed as SSE of `StreamResponse`s, refused as
//! problem documents with the A2A error's `type`. The TCK runs it with
//! `scripts/a2a_tck_check.py`; here each route and error.

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    fake_provider::Reply,
    helpers::{SseStream, TestApp, spawn_app},
    on_both_backends,
    support::Backend,
};

fn send_request(text: &str, context: &str, immediately: bool) -> Value {
    json!({
        "message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": text}], "contextId": context},
        "configuration": {"returnImmediately": immediately},
    })
}

/// The status and body of `method path`, with `body` when given.
async fn call(app: &TestApp, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = app.client.request(method, app.url(path));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let problem = response.headers()["content-type"] == "application/problem+json";
    let body: Value = response.json().await.unwrap();
    assert_eq!(problem, status >= 400, "{status}: {body}");
    (status, body)
}

/// A task sent, read, listed and streamed over HTTP+JSON is the task of
/// the JSON-RPC binding: one task set behind both.
async fn a_task_is_sent_read_listed_and_streamed_over_rest(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let (status, sent) = call(
        &app,
        "POST",
        "/message:send",
        Some(send_request("Hi", "ctx-rest", false)),
    )
    .await;
    assert_eq!(status, 200, "{sent}");
    let task = &sent["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
    assert!(sent.get("jsonrpc").is_none(), "a bare object: {sent}");
    let id = task["id"].as_str().unwrap().to_owned();

    let (status, got) = call(&app, "GET", &format!("/tasks/{id}?historyLength=1"), None).await;
    assert_eq!(status, 200);
    assert_eq!(got["id"], id.as_str());
    assert_eq!(got["history"].as_array().unwrap().len(), 1);
    let by_rpc: Value = app
        .client
        .post(app.url("/a2a"))
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": id}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(by_rpc["result"]["id"], id.as_str(), "one task set");

    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let response = app
        .client
        .post(app.url("/message:stream"))
        .json(&send_request("Again", "ctx-rest", false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut stream = SseStream::new(response).await;
    let mut frames = Vec::new();
    while let Some(event) = stream.next().await {
        frames.push(event.json());
    }
    assert!(frames[0]["task"]["id"].is_string(), "{:?}", frames[0]);
    let last = frames.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    let second = frames[0]["task"]["id"].as_str().unwrap();

    let (status, listed) = call(&app, "GET", "/tasks?contextId=ctx-rest&pageSize=1", None).await;
    assert_eq!(status, 200);
    assert_eq!(listed["tasks"][0]["id"], second);
    assert_eq!(listed["totalSize"], 2);
    assert!(listed["tasks"][0].get("artifacts").is_none());
    let token = listed["nextPageToken"].as_str().unwrap();
    let (_, rest) = call(
        &app,
        "GET",
        &format!("/tasks?pageToken={token}&includeArtifacts=true"),
        None,
    )
    .await;
    assert_eq!(rest["tasks"][0]["id"], id.as_str());
    assert!(rest["tasks"][0]["artifacts"].is_array());

    // Keys are off: no extended card (issue 63).
    let (status, card) = call(&app, "GET", "/extendedAgentCard", None).await;
    assert_eq!(status, 400, "{card}");
    assert_eq!(card["code"], "extended_agent_card_not_configured", "{card}");
    assert!(card.get("skills").is_none(), "{card}");
}

/// A running task is cancelled with `:cancel` and followed with
/// `:subscribe`; once ended, each is refused with its A2A error.
async fn a_task_is_cancelled_and_subscribed_to_over_rest(backend: Backend) {
    let app = spawn_app(backend).await;
    let gate = CancellationToken::new();
    app.provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(3, &gate)]);
    let (_, sent) = call(
        &app,
        "POST",
        "/message:send",
        Some(send_request("Hi", "ctx-cancel", true)),
    )
    .await;
    assert_eq!(
        sent["task"]["status"]["state"], "TASK_STATE_WORKING",
        "{sent}"
    );
    let id = sent["task"]["id"].as_str().unwrap().to_owned();
    let response = app
        .client
        .post(app.url(&format!("/tasks/{id}:subscribe")))
        .send()
        .await
        .unwrap();
    let mut subscribed = SseStream::new(response).await;
    assert_eq!(
        subscribed.next().await.unwrap().json()["task"]["id"],
        id.as_str()
    );
    let (status, cancelled) = call(&app, "POST", &format!("/tasks/{id}:cancel"), None).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["status"]["state"], "TASK_STATE_CANCELED");
    let mut frames = Vec::new();
    while let Some(event) = subscribed.next().await {
        frames.push(event.json());
    }
    assert_eq!(
        frames.last().unwrap()["statusUpdate"]["status"]["state"],
        "TASK_STATE_CANCELED"
    );
    gate.cancel();

    let (status, again) = call(&app, "POST", &format!("/tasks/{id}:cancel"), None).await;
    assert_eq!(status, 409);
    assert_eq!(
        again["type"],
        "https://a2a-protocol.org/errors/task-not-cancelable"
    );
    assert_eq!(again["code"], "task_not_cancelable");
    let (status, late) = call(&app, "POST", &format!("/tasks/{id}:subscribe"), None).await;
    assert_eq!(status, 400);
    assert_eq!(
        late["type"],
        "https://a2a-protocol.org/errors/unsupported-operation"
    );
}

/// Every refusal is a problem document: the A2A error's status and
/// `type` (A2A 1.0 §5.4), and a stable `code`.
async fn every_rest_error_is_a_problem_with_its_type(backend: Backend) {
    let app = spawn_app(backend).await;
    let unknown = "0190a5c4-0000-7000-8000-000000000000";
    let data_part =
        json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"data": {"x": 1}}]}});
    for (method, path, body, status, code) in [
        (
            "GET",
            format!("/tasks/{unknown}"),
            None,
            404,
            "task_not_found",
        ),
        (
            "GET",
            "/tasks/not-a-task".into(),
            None,
            404,
            "task_not_found",
        ),
        (
            "POST",
            format!("/tasks/{unknown}:cancel"),
            None,
            404,
            "task_not_found",
        ),
        (
            "POST",
            format!("/tasks/{unknown}:pause"),
            None,
            404,
            "not_found",
        ),
        ("POST", format!("/tasks/{unknown}"), None, 404, "not_found"),
        (
            "GET",
            "/tasks?pageSize=0".into(),
            None,
            400,
            "invalid_params",
        ),
        (
            "GET",
            "/tasks?status=DONE".into(),
            None,
            400,
            "invalid_params",
        ),
        (
            "GET",
            "/tasks?pageSize=many".into(),
            None,
            400,
            "invalid_params",
        ),
        (
            "POST",
            "/message:send".into(),
            Some(json!({})),
            400,
            "invalid_params",
        ),
        (
            "POST",
            "/message:send".into(),
            Some(data_part),
            415,
            "content_type_not_supported",
        ),
        (
            "POST",
            format!("/tasks/{unknown}/pushNotificationConfigs"),
            Some(json!({"url": "https://example.com/hook"})),
            404,
            "task_not_found",
        ),
        (
            "GET",
            format!("/tasks/{unknown}/pushNotificationConfigs/c1"),
            None,
            404,
            "task_not_found",
        ),
    ] {
        let (got, problem) = call(&app, method, &path, body).await;
        assert_eq!(got, status, "{method} {path}: {problem}");
        assert_eq!(problem["code"], code, "{method} {path}: {problem}");
        assert_eq!(problem["status"], status);
    }
    let (_, missing) = call(&app, "GET", &format!("/tasks/{unknown}"), None).await;
    assert_eq!(
        missing["type"],
        "https://a2a-protocol.org/errors/task-not-found"
    );
    assert!(app.provider.requests().is_empty(), "no turn began");
}

on_both_backends!(
    a_task_is_sent_read_listed_and_streamed_over_rest,
    a_task_is_cancelled_and_subscribed_to_over_rest,
    every_rest_error_is_a_problem_with_its_type,
);
