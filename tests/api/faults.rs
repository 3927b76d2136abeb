//! The database goes away under a running service (a real Postgres behind
//! a TCP proxy the test cuts), and comes back.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{spawn_app_on, test_settings},
    support::{Backend, FaultProxy, TestDb},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_goes_down_fails_requests_fast_and_ends_streams_with_a_terminal_event() {
    if !crate::support::postgres_or_skip().await {
        return;
    }
    let proxy = FaultProxy::start(TestDb::postgres_addr()).await;
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.open_through(&proxy).await;
    let provider = FakeProvider::start().await;
    let settings = test_settings(&provider);
    let app = spawn_app_on(db, store, provider, settings, Vec::new()).await;

    // A turn is streaming when the database goes away.
    let gate = CancellationToken::new();
    app.provider.enqueue([
        Reply::sse("openai/text.sse").hold_after(3, &gate),
        Reply::sse("openai/text.sse"),
    ]);
    let mut stream = app.post_turn_sse("s-down", json!({"message": "Hi"})).await;
    let turn_id = stream.headers["x-turn-id"].to_str().unwrap().to_owned();
    stream.read_until("message.delta").await;
    proxy.cut();

    // Requests fail fast with 503 and Retry-After.
    let started = Instant::now();
    let response = app
        .client
        .post(app.url("/sessions/s-other/turns"))
        .json(&json!({"message": "Hi"}))
        .send()
        .await
        .unwrap();
    assert!(
        started.elapsed() <= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let problem: serde_json::Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "store_unavailable");
    let started = Instant::now();
    let (status, _) = app
        .get_json(&format!("/sessions/s-down/turns/{turn_id}"))
        .await;
    assert_eq!(status, 503);
    assert!(
        started.elapsed() <= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // The readiness probe answers within a second, and says not ready.
    let started = Instant::now();
    let (status, body) = app.get_json("/readyz").await;
    assert!(
        started.elapsed() <= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        (status, body["database"].as_str()),
        (503, Some("unreachable"))
    );

    // The turn goes on; its events cannot be written; its stream ends with
    // a terminal event (no id: it is not in the log), not a bare error.
    gate.cancel();
    let rest = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end())
        .await
        .expect("the stream ends within seconds");
    let last = rest.last().unwrap();
    assert_eq!(last.event, "turn.failed");
    assert_eq!(last.id, None);
    assert_eq!(last.json()["code"], "event_log_unavailable");
    assert!(rest.iter().all(|e| e.event != "error"), "{rest:?}");

    // The database is back: the turn's end lands and frees the session.
    proxy.restore();
    let turn = app.wait_turn_end("s-down", &turn_id).await;
    assert_eq!(turn["status"], "failed", "{turn}");
    assert_eq!(turn["error"]["code"], "event_log_unavailable", "{turn}");
    let next = app.post_turn("s-down", json!({"message": "again"})).await;
    assert_eq!(next.status(), 200);
    let (status, _) = app.get_json("/readyz").await;
    assert_eq!(status, 200);
}
