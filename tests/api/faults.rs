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

/// The service on a Postgres it reaches through a proxy the test cuts.
async fn proxied_app() -> (FaultProxy, crate::helpers::TestApp) {
    let proxy = FaultProxy::start(TestDb::postgres_addr()).await;
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.open_through(&proxy).await;
    let provider = FakeProvider::start().await;
    let settings = test_settings(&provider);
    let app = spawn_app_on(db, store, provider, settings, Vec::new()).await;
    (proxy, app)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_goes_down_fails_requests_fast_and_ends_streams_with_a_terminal_event() {
    if !crate::support::postgres_or_skip().await {
        return;
    }
    let (proxy, app) = proxied_app().await;

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

/// The writer's commit of a turn's end reaches Postgres, and the answer
/// is lost (the connection is cut right after COMMIT is sent). A finish is
/// written once its own turn's events are, so the batch also holds another
/// turn's deltas (here: turn A streams steadily while turn B ends). The
/// retry finds the batch stored and goes on: both turns complete with
/// every event once (A used to hit `events_pkey` on the retry and end
/// `failed` with `event_log_unavailable`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_commit_answer_was_lost_is_retried_without_a_duplicate() {
    if !crate::support::postgres_or_skip().await {
        return;
    }
    let (proxy, app) = proxied_app().await;
    // A: 300 deltas, a millisecond apart. B: its whole answer at once.
    let words: Vec<String> = (0..300).map(|i| format!("w{i} ")).collect();
    let pieces: Vec<&str> = words.iter().map(String::as_str).collect();
    let whole = crate::fake_provider::fixture("openai/text.sse");
    app.provider.enqueue([Reply::openai_deltas(&pieces)]);
    let mut a = app
        .post_turn_sse("s-streaming", json!({"message": "Hi"}))
        .await;
    let a_turn = a.headers["x-turn-id"].to_str().unwrap().to_owned();
    let mut a_live = a.read_until("message.delta").await;
    app.provider
        .enqueue([Reply::text(200, "text/event-stream", &whole)]);
    proxy.cut_after_next_commit();
    let mut b = app
        .post_turn_sse("s-ending", json!({"message": "Hi"}))
        .await;
    let b_turn = b.headers["x-turn-id"].to_str().unwrap().to_owned();
    let b_live = b.read_to_end().await;
    a_live.extend(a.read_to_end().await);
    assert!(proxy.commit_was_cut(), "a commit was cut");
    for (session, turn, live) in [
        ("s-streaming", &a_turn, &a_live),
        ("s-ending", &b_turn, &b_live),
    ] {
        let last = live.last().unwrap().json();
        assert_eq!(last["type"], "turn.completed", "{session}: {last}");
        let ended = app.wait_turn_end(session, turn).await;
        assert_eq!(ended["status"], "completed", "{session}: {ended}");
        // The log holds every event once, gap-free; the stream showed it.
        let (_, log) = app
            .get_json(&format!("/sessions/{session}/events?limit=1000"))
            .await;
        let seqs: Vec<i64> = log["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["seq"].as_i64().unwrap())
            .collect();
        let expected: Vec<i64> = (1..=seqs.len() as i64).collect();
        assert_eq!(seqs, expected, "{session}");
        let live_seqs: Vec<i64> = live.iter().map(|e| e.seq()).collect();
        assert_eq!(seqs, live_seqs, "{session}");
        // The history has the answer once.
        let (_, history) = app.get_json(&format!("/sessions/{session}/messages")).await;
        assert_eq!(
            history["messages"].as_array().unwrap().len(),
            2,
            "{history}"
        );
    }
    assert_eq!(
        crate::helpers::streamed_text(&a_live),
        words.concat(),
        "every delta of A once"
    );
    // The cut batch failed once and was tried again.
    let metrics = app.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "agent_harness_event_batch_failures_total 1"),
        "{metrics}"
    );
}
