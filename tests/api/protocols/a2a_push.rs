//! A2A push notifications: a task's configurations (made, read, listed,
//! deleted; URLs through the outbound guard), and the delivery of its
//! updates to a real HTTP receiver: in order, with the configured
//! credentials, tried again when the receiver fails, and carried on by
//! another replica from where the first stopped.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{extract::State, http::HeaderMap, http::StatusCode, routing::post};
use serde_json::{Value, json};

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, spawn_app, spawn_app_with, test_settings},
    on_both_backends,
    support::{Backend, TestDb},
};

/// What a receiver got, and how many requests it fails first.
#[derive(Default)]
struct Received {
    pushes: Vec<(HeaderMap, Value)>,
    fail_next: usize,
    refused: usize,
    /// Never answer (each request waits until its sender gives up).
    hang: bool,
    hanging: usize,
    most_hanging: usize,
}

/// One request that hangs, counted while it does.
struct Hanging(Arc<Mutex<Received>>);

impl Drop for Hanging {
    fn drop(&mut self) {
        self.0.lock().unwrap().hanging -= 1;
    }
}

/// A webhook on loopback that keeps what is POSTed to it.
struct Receiver {
    url: String,
    state: Arc<Mutex<Received>>,
}

impl Receiver {
    async fn start() -> Self {
        let state = Arc::new(Mutex::new(Received::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        async fn hook(
            State(state): State<Arc<Mutex<Received>>>,
            headers: HeaderMap,
            axum::Json(body): axum::Json<Value>,
        ) -> StatusCode {
            let hang = {
                let mut held = state.lock().unwrap();
                if held.hang {
                    held.hanging += 1;
                    held.most_hanging = held.most_hanging.max(held.hanging);
                }
                held.hang
            };
            if hang {
                let _counted = Hanging(state.clone());
                std::future::pending::<()>().await;
            }
            let mut state = state.lock().unwrap();
            if state.fail_next > 0 {
                state.fail_next -= 1;
                state.refused += 1;
                return StatusCode::SERVICE_UNAVAILABLE;
            }
            state.pushes.push((headers, body));
            StatusCode::OK
        }
        let router = axum::Router::new()
            .route("/hook", post(hook))
            .with_state(state.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Self { url, state }
    }

    fn fail_next(&self, count: usize) {
        self.state.lock().unwrap().fail_next = count;
    }

    fn hang(&self) {
        self.state.lock().unwrap().hang = true;
    }

    /// The most requests that hung at once, and how many hang now.
    fn hanging(&self) -> (usize, usize) {
        let state = self.state.lock().unwrap();
        (state.most_hanging, state.hanging)
    }

    fn refused(&self) -> usize {
        self.state.lock().unwrap().refused
    }

    /// The bodies received once one ends the task (within 20 s).
    async fn until_the_end(&self) -> Vec<(HeaderMap, Value)> {
        for _ in 0..400 {
            {
                let state = self.state.lock().unwrap();
                if state.pushes.iter().any(|(_, body)| ended(body)) {
                    return state.pushes.clone();
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "no push ended the task: {:?}",
            self.state.lock().unwrap().pushes
        );
    }
}

fn ended(body: &Value) -> bool {
    body["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
}

/// What each push says: its kind and, for a status, the state.
fn said(pushes: &[(HeaderMap, Value)]) -> Vec<String> {
    pushes
        .iter()
        .map(|(_, body)| {
            if let Some(task) = body.get("task") {
                format!("task {}", task["status"]["state"].as_str().unwrap())
            } else if let Some(update) = body.get("statusUpdate") {
                format!("status {}", update["status"]["state"].as_str().unwrap())
            } else if let Some(update) = body.get("artifactUpdate") {
                format!("artifact append={}", update["append"])
            } else {
                format!("other {body}")
            }
        })
        .collect()
}

/// The task a push names: the task itself, or an update's `taskId`.
fn task_of(body: &Value) -> &Value {
    body.get("task")
        .map(|t| &t["id"])
        .or_else(|| body.get("statusUpdate").map(|u| &u["taskId"]))
        .or_else(|| body.get("artifactUpdate").map(|u| &u["taskId"]))
        .unwrap()
}

async fn rpc(app: &TestApp, method: &str, params: Value) -> Value {
    app.client
        .post(app.url("/a2a"))
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn send_with_push(text: &str, config: Value) -> Value {
    json!({
        "message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": text}]},
        "configuration": {"taskPushNotificationConfig": config},
    })
}

async fn app_pushing_to_loopback(db: TestDb) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.outbound_allow_private = true;
    spawn_app_with(db, provider, settings).await
}

/// A task sent with a push configuration POSTs its updates to the URL,
/// in order, each with the configured token and credentials: the task
/// as it begins, its end, and before it the answer whole (no delta).
async fn a_tasks_updates_are_pushed_in_order_with_its_credentials(backend: Backend) {
    let receiver = Receiver::start().await;
    let app = app_pushing_to_loopback(TestDb::new(backend).await).await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let config = json!({
        "url": receiver.url,
        "token": "task-token-1",
        "authentication": {"scheme": "Bearer", "credentials": "s3cret"},
    });
    let sent = rpc(&app, "SendMessage", send_with_push("Hi", config)).await;
    let task = sent["result"]["task"]["id"].as_str().unwrap().to_owned();
    let pushes = receiver.until_the_end().await;
    assert_eq!(
        said(&pushes),
        [
            "task TASK_STATE_WORKING",
            "artifact append=false",
            "status TASK_STATE_COMPLETED"
        ],
        "{pushes:?}"
    );
    let answer = &pushes[1].1["artifactUpdate"]["artifact"]["parts"][0]["text"];
    let text = &sent["result"]["task"]["artifacts"][0]["parts"][0]["text"];
    assert_eq!(answer, text);
    for (headers, body) in &pushes {
        assert_eq!(headers["authorization"], "Bearer s3cret");
        assert_eq!(headers["x-a2a-notification-token"], "task-token-1");
        assert_eq!(task_of(body), task.as_str());
    }
    // The configuration is the task's: listed with the id it was given.
    let listed = rpc(
        &app,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": task}),
    )
    .await;
    assert_eq!(listed["result"]["configs"][0]["url"], receiver.url.as_str());
    assert_eq!(listed["result"]["configs"][0]["taskId"], task.as_str());
}

/// A receiver that fails is tried again, with backoff, and in the end
/// gets every update, in order: what failed is sent again before what
/// came after it.
async fn a_failing_receiver_is_tried_again_and_misses_nothing(backend: Backend) {
    let receiver = Receiver::start().await;
    receiver.fail_next(2);
    let app = app_pushing_to_loopback(TestDb::new(backend).await).await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    rpc(
        &app,
        "SendMessage",
        send_with_push("Hi", json!({"url": receiver.url})),
    )
    .await;
    let pushes = receiver.until_the_end().await;
    assert_eq!(receiver.refused(), 2);
    assert_eq!(
        said(&pushes),
        [
            "task TASK_STATE_WORKING",
            "artifact append=false",
            "status TASK_STATE_COMPLETED"
        ]
    );
}

/// Configurations are made, read, listed and deleted; a URL that is not
/// http(s), or whose address is internal (private ones are not allowed
/// here), a token a header cannot carry and an eleventh configuration
/// are refused.
async fn push_configs_are_made_read_listed_and_deleted(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let sent = rpc(
        &app,
        "SendMessage",
        json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "Hi"}]}}),
    )
    .await;
    let task = sent["result"]["task"]["id"].as_str().unwrap().to_owned();
    let made = rpc(
        &app,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task, "id": "c1", "url": "https://hooks.example.com/a2a",
               "authentication": {"scheme": "Basic", "credentials": "dTpw"}}),
    )
    .await;
    assert_eq!(made["result"]["id"], "c1", "{made}");
    assert_eq!(made["result"]["authentication"]["scheme"], "Basic");
    let unnamed = rpc(
        &app,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task, "url": "https://hooks.example.com/other"}),
    )
    .await;
    let made_id = unnamed["result"]["id"].as_str().unwrap().to_owned();
    assert!(!made_id.is_empty());
    let got = rpc(
        &app,
        "GetTaskPushNotificationConfig",
        json!({"taskId": task, "id": "c1"}),
    )
    .await;
    assert_eq!(got["result"]["url"], "https://hooks.example.com/a2a");
    let listed = rpc(
        &app,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": task}),
    )
    .await;
    assert_eq!(listed["result"]["configs"].as_array().unwrap().len(), 2);
    let deleted = rpc(
        &app,
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": task, "id": "c1"}),
    )
    .await;
    assert_eq!(deleted["result"], json!({}), "{deleted}");
    let gone = rpc(
        &app,
        "GetTaskPushNotificationConfig",
        json!({"taskId": task, "id": "c1"}),
    )
    .await;
    assert_eq!(gone["error"]["code"], -32001, "{gone}");

    for (config, why) in [
        (json!({"url": "ftp://hooks.example.com/a"}), "not http(s)"),
        (json!({"url": "http://127.0.0.1:9/hook"}), "loopback"),
        (json!({"url": "http://10.1.2.3/hook"}), "private"),
        (json!({"url": "http://[::1]/hook"}), "loopback v6"),
        (
            json!({"url": "https://u:p@hooks.example.com/"}),
            "credentials in the URL",
        ),
        (
            json!({"url": "https://hooks.example.com/", "token": "a\nb"}),
            "a token a header cannot carry",
        ),
        (
            json!({"url": "https://hooks.example.com/", "id": "a/b"}),
            "an id out of the alphabet",
        ),
        (
            json!({"url": "https://hooks.example.com/", "authentication": {"scheme": "Bearer x"}}),
            "a scheme with a space",
        ),
    ] {
        let mut params = config.clone();
        params["taskId"] = json!(task);
        let refused = rpc(&app, "CreateTaskPushNotificationConfig", params).await;
        assert_eq!(refused["error"]["code"], -32602, "{why}: {refused}");
    }
    for n in 0..9 {
        let more = rpc(
            &app,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": task, "id": format!("more-{n}"), "url": "https://hooks.example.com/"}),
        )
        .await;
        assert!(more["result"].is_object(), "{n}: {more}");
    }
    let eleventh = rpc(
        &app,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task, "id": "one-too-many", "url": "https://hooks.example.com/"}),
    )
    .await;
    assert_eq!(eleventh["error"]["code"], -32602, "{eleventh}");
    let unknown = rpc(
        &app,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": "0190a5c4-0000-7000-8000-000000000000", "url": "https://hooks.example.com/"}),
    )
    .await;
    assert_eq!(unknown["error"]["code"], -32001);
}

/// A replica that stops while its receiver fails leaves the delivery's
/// cursor in the database; another replica goes on from it and the
/// receiver gets every update.
async fn another_replica_delivers_what_a_stopped_one_left() {
    let db = TestDb::new(Backend::Postgres).await;
    let other_db = db.sharing();
    let receiver = Receiver::start().await;
    receiver.fail_next(usize::MAX);
    let mut first = app_pushing_to_loopback(db).await;
    first.provider.enqueue([Reply::sse("openai/text.sse")]);
    rpc(
        &first,
        "SendMessage",
        send_with_push("Hi", json!({"url": receiver.url})),
    )
    .await;
    for _ in 0..100 {
        if receiver.refused() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(receiver.refused() > 0, "the first replica tried");
    first.stop().await;
    receiver.fail_next(0);
    let _second = app_pushing_to_loopback(other_db).await;
    let pushes = receiver.until_the_end().await;
    assert_eq!(
        said(&pushes),
        [
            "task TASK_STATE_WORKING",
            "artifact append=false",
            "status TASK_STATE_COMPLETED"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_replica_delivers_what_a_stopped_one_left_on_postgres() {
    if crate::support::postgres_or_skip().await {
        return;
    }
    another_replica_delivers_what_a_stopped_one_left().await;
}

/// One tenant's receivers that never answer hold at most its share of a
/// replica's deliveries (4): another tenant's pushes go out meanwhile.
/// (Before, a round of 16 waited for its slowest, 8 at once.)
async fn a_tenants_stuck_receivers_do_not_hold_up_anothers_pushes(backend: Backend) {
    let stuck = Receiver::start().await;
    stuck.hang();
    let receiver = Receiver::start().await;
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.outbound_allow_private = true;
    settings.server.auth = harness_core::config::AuthMode::On;
    let mut app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    crate::edge::tenants::make_keys(
        &app,
        &[
            ("k-acme", "acme", "ah_acme"),
            ("k-globex", "globex", "ah_globex"),
        ],
    )
    .await;
    app.client = crate::edge::tenants::client_with_key("ah_acme");
    // Two running tasks of Acme's, ten configurations each: at their end,
    // twenty deliveries to a receiver that never answers.
    let gate = tokio_util::sync::CancellationToken::new();
    for _ in 0..2 {
        app.provider
            .enqueue([Reply::sse("openai/text.sse").hold_after(3, &gate)]);
        let mut params = send_with_push("Hi", json!({"url": stuck.url}));
        params["configuration"]["returnImmediately"] = json!(true);
        let sent = rpc(&app, "SendMessage", params).await;
        let task = sent["result"]["task"]["id"].as_str().unwrap().to_owned();
        for n in 0..9 {
            let config = json!({"taskId": task, "id": format!("more-{n}"), "url": stuck.url});
            let made = rpc(&app, "CreateTaskPushNotificationConfig", config).await;
            assert!(made["result"].is_object(), "{made}");
        }
    }
    gate.cancel();
    for _ in 0..100 {
        if stuck.hanging().1 >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(stuck.hanging().1 > 0, "acme's pushes are stuck");

    app.client = crate::edge::tenants::client_with_key("ah_globex");
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    rpc(
        &app,
        "SendMessage",
        send_with_push("Hi", json!({"url": receiver.url})),
    )
    .await;
    let pushes = receiver.until_the_end().await;
    assert_eq!(said(&pushes).last().unwrap(), "status TASK_STATE_COMPLETED");
    let (most, _) = stuck.hanging();
    assert!(most <= 4, "acme held {most} deliveries at once");
}

/// A streaming send whose configuration carries a push configuration
/// (the TCK's flow, issue 63): the stream's first event is the task, the
/// configuration is the task's, and the receiver gets that task's
/// updates, to its end, though the client stopped reading the stream.
async fn a_streamed_tasks_configuration_is_pushed_to(backend: Backend) {
    let receiver = Receiver::start().await;
    let app = app_pushing_to_loopback(TestDb::new(backend).await).await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let params = send_with_push("Hi", json!({"url": receiver.url, "token": "stream-1"}));
    let response = app
        .client
        .post(app.url("/a2a"))
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": params}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = crate::helpers::SseStream::new(response).await;
    let first = stream.next().await.expect("the task").json();
    let task = first["result"]["task"]["id"].as_str().unwrap().to_owned();
    drop(stream);
    let listed = rpc(
        &app,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": task}),
    )
    .await;
    assert_eq!(listed["result"]["configs"][0]["url"], receiver.url.as_str());
    let pushes = receiver.until_the_end().await;
    assert_eq!(said(&pushes).last().unwrap(), "status TASK_STATE_COMPLETED");
    for (headers, body) in &pushes {
        assert_eq!(headers["x-a2a-notification-token"], "stream-1");
        assert_eq!(task_of(body), task.as_str());
    }
}

on_both_backends!(
    a_streamed_tasks_configuration_is_pushed_to,
    a_tasks_updates_are_pushed_in_order_with_its_credentials,
    a_failing_receiver_is_tried_again_and_misses_nothing,
    push_configs_are_made_read_listed_and_deleted,
    a_tenants_stuck_receivers_do_not_hold_up_anothers_pushes,
);
