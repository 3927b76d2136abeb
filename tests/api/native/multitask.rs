//! Double-texting: a turn asked for while one runs is refused (the
//! default), queued behind it, or ends it first.

use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    fake_provider::Reply,
    helpers::{TestApp, spawn_app},
    on_both_backends,
    support::Backend,
};

async fn post(app: &TestApp, session: &str, body: Value) -> (u16, Value) {
    let response = app.post_turn(session, body).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn a_turn_can_wait_for_the_running_one_or_end_it(backend: Backend) {
    let app = std::sync::Arc::new(spawn_app(backend).await);
    let gate = CancellationToken::new();
    app.provider.enqueue([
        Reply::sse("openai/text.sse").hold_after(2, &gate),
        Reply::sse("openai/text.sse"),
    ]);
    let mut first = app
        .post_turn_sse("s-multi", json!({"message": "first"}))
        .await;
    let first_id = first.turn_id();
    first.read_until("turn.started").await;

    // The default refuses; an unknown mode is a bad request.
    let (status, problem) = post(&app, "s-multi", json!({"message": "no"})).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("turn_already_running"))
    );
    let (status, _) = post(
        &app,
        "s-multi",
        json!({"message": "x", "multitask": "maybe"}),
    )
    .await;
    assert_eq!(status, 422);

    // `enqueue` waits for the running turn, then runs.
    let queued = {
        let app = app.clone();
        tokio::spawn(async move {
            post(
                &app,
                "s-multi",
                json!({"message": "second", "multitask": "enqueue"}),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!queued.is_finished(), "it waits while the first turn runs");
    gate.cancel();
    first.read_to_end().await;
    let (status, second) = queued.await.unwrap();
    assert_eq!(
        (status, second["status"].as_str()),
        (200, Some("completed")),
        "{second}"
    );
    let (_, turn) = app
        .get_json(&format!("/sessions/s-multi/turns/{first_id}"))
        .await;
    assert_eq!(turn["status"], "completed", "the first turn ran to its end");

    // `interrupt` cancels the running turn, then runs.
    let hold = CancellationToken::new();
    app.provider.enqueue([
        Reply::sse("openai/text.sse").hold_after(2, &hold),
        Reply::sse("openai/text.sse"),
    ]);
    let mut third = app
        .post_turn_sse("s-multi", json!({"message": "third"}))
        .await;
    let third_id = third.turn_id();
    // Its provider answer has begun (the held reply is taken).
    third.read_until("message.delta").await;
    let (status, fourth) = post(
        &app,
        "s-multi",
        json!({"message": "fourth", "multitask": "interrupt"}),
    )
    .await;
    assert_eq!(
        (status, fourth["status"].as_str()),
        (200, Some("completed")),
        "{fourth}"
    );
    let events = third.read_to_end().await;
    assert_eq!(events.last().unwrap().event, "turn.cancelled");
    let (_, turn) = app
        .get_json(&format!("/sessions/s-multi/turns/{third_id}"))
        .await;
    assert_eq!(turn["status"], "cancelled");
    hold.cancel();
    let (_, session) = app.get_json("/sessions/s-multi").await;
    assert_eq!(session["turn_count"], 4);
}

on_both_backends!(a_turn_can_wait_for_the_running_one_or_end_it);

/// Queued turns run in the order they were posted: five requests with
/// `enqueue` wait behind a running turn, each posted once the one before
/// it waits, and the turns run second, third, ... sixth. (Before, every
/// waiting request tried again when the running turn ended and the race
/// decided: turn 3 ran before turn 2 in 3 of 6 trials.)
async fn queued_turns_run_in_the_order_they_were_posted(backend: Backend) {
    let app = std::sync::Arc::new(spawn_app(backend).await);
    let gate = CancellationToken::new();
    app.provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(2, &gate)]);
    let mut first = app
        .post_turn_sse("s-queue", json!({"message": "turn 1"}))
        .await;
    first.read_until("turn.started").await;
    let mut waiting = Vec::new();
    for n in 2..=6 {
        app.provider.enqueue([Reply::sse("openai/text.sse")]);
        let app = app.clone();
        waiting.push(tokio::spawn(async move {
            post(
                &app,
                "s-queue",
                json!({"message": format!("turn {n}"), "multitask": "enqueue"}),
            )
            .await
        }));
        // Taken its place before the next is posted.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    gate.cancel();
    first.read_to_end().await;
    for task in waiting {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, 200, "{body}");
    }
    let ran: Vec<String> = app
        .provider
        .requests()
        .iter()
        .map(|r| {
            let messages = r.body["messages"].as_array().unwrap();
            messages.last().unwrap()["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let posted: Vec<String> = (1..=6).map(|n| format!("turn {n}")).collect();
    assert_eq!(ran, posted);
}

/// Issue 63: a request queued behind a running turn whose session is
/// then erased gives up (404 `session_not_found`, at its next touch of its
/// ticket), and the erased session does not begin again. (Before, the
/// request waited for its deadline and then began the turn, making the
/// session again.)
async fn a_queued_request_of_an_erased_session_gives_up(backend: Backend) {
    let app = std::sync::Arc::new(spawn_app(backend).await);
    let gate = CancellationToken::new();
    app.provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(2, &gate)]);
    let mut first = app
        .post_turn_sse("s-erase-q", json!({"message": "turn 1"}))
        .await;
    first.read_until("turn.started").await;
    let queued = {
        let app = app.clone();
        tokio::spawn(async move {
            post(
                &app,
                "s-erase-q",
                json!({"message": "turn 2", "multitask": "enqueue"}),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let erased = app
        .client
        .delete(app.url("/sessions/s-erase-q"))
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), 204);
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .expect("the queued request gives up before its deadline")
        .unwrap();
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("session_not_found")),
        "{body}"
    );
    let (status, _) = app.get_json("/sessions/s-erase-q").await;
    assert_eq!(status, 404);
    assert_eq!(app.provider.requests().len(), 1, "turn 2 never began");
    gate.cancel();
}

on_both_backends!(
    queued_turns_run_in_the_order_they_were_posted,
    a_queued_request_of_an_erased_session_gives_up,
);
