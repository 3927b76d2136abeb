//! Steering across replicas (Postgres): a message steered into a turn
//! through another replica than the one running it is applied once at the
//! turn's next step, also when that replica is killed mid-step and another
//! goes on with the turn; a message the turn did not take becomes the
//! session's next turn; and one a process that died left is found by the
//! heartbeat's sweep.

use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::replicas::{HEARTBEAT_S, Replica, follow, get_json, replicas};
use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{SseStream, spawn_app_with, test_settings},
    on_both_backends,
    support::{Backend, TestDb},
};

async fn start_sse(
    client: &reqwest::Client,
    replica: &Replica,
    session: &str,
    message: &str,
) -> SseStream {
    let response = client
        .post(replica.url(&format!("/sessions/{session}/turns")))
        .header("accept", "text/event-stream")
        .json(&json!({ "message": message }))
        .send()
        .await
        .unwrap();
    SseStream::new(response).await
}

async fn steer(
    client: &reqwest::Client,
    replica: &Replica,
    session: &str,
    turn: &str,
    message: &str,
) -> Value {
    let response = client
        .post(replica.url(&format!("/sessions/{session}/turns/{turn}/steer")))
        .json(&json!({ "message": message }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    response.json().await.unwrap()
}

/// The turn that answers `steer` of `turn`, once the session's log (at
/// `url`) says `steer.deferred` (within a few heartbeats).
async fn deferred_in(client: &reqwest::Client, url: &str, steer: &Value, turn: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4 * HEARTBEAT_S + 2);
    loop {
        let (_, page) = get_json(client, url.to_owned()).await;
        let deferred = page["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == "steer.deferred")
            .cloned();
        if let Some(deferred) = deferred {
            assert_eq!(&deferred["steer_id"], steer);
            assert_eq!(deferred["steered_turn_id"], json!(turn));
            return deferred["turn_id"].as_str().unwrap().to_owned();
        }
        assert!(tokio::time::Instant::now() < deadline, "no steer.deferred");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How often `text` is among the user messages of a provider request.
fn user_said(body: &Value, text: &str) -> usize {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user" && m["content"] == text)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_is_applied_once_across_a_replica_killed_mid_step() {
    let Some((_db, provider, mut replicas)) = replicas(2).await else {
        return;
    };
    let client = reqwest::Client::new();
    let (first, never) = (CancellationToken::new(), CancellationToken::new());
    provider.enqueue([
        Reply::sse("openai/tool_call_local_search.sse").hold_after(2, &first),
        // Step 2 on the replica that is killed: held until the kill.
        Reply::openai_deltas(&["Paris ", "and"]).hold_after(2, &never),
        // Step 2 again, on the replica that takes the turn over.
        Reply::openai_text("Paris and Rome."),
    ]);
    let mut stream = start_sse(&client, &replicas[0], "s-steer-kill", "Plan Paris").await;
    let turn = stream.turn_id();
    stream.read_until("turn.started").await;
    // Through the other replica: kept in the store, read by the owner.
    let steered = steer(&client, &replicas[1], "s-steer-kill", &turn, "Also Rome").await;
    first.cancel();
    stream.read_until("message.delta").await;
    assert_eq!(provider.requests().len(), 2);
    replicas[0].kill();

    let mut follower = follow(&client, &replicas[1], "s-steer-kill", &turn, None).await;
    let events = follower.read_to_end().await;
    assert_eq!(events.last().unwrap().event, "turn.completed");
    let resumed = events.iter().find(|e| e.event == "turn.resumed").unwrap();
    assert_eq!(resumed.json()["owner"], "replica-1");
    // Claimed for step 2 by each attempt at it: the same steer, the same step.
    let applied: Vec<Value> = events
        .iter()
        .filter(|e| e.event == "steer.applied")
        .map(|e| e.json())
        .collect();
    assert_eq!(applied.len(), 2, "{applied:?}");
    for event in &applied {
        assert_eq!(
            (&event["steer_id"], &event["step"]),
            (&steered["steer_id"], &json!(2))
        );
    }
    // Each request of step 2 carries the message once, after the tool's result.
    let requests = provider.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(user_said(&requests[0].body, "Also Rome"), 0);
    for request in &requests[1..] {
        assert_eq!(user_said(&request.body, "Also Rome"), 1);
        let messages = request.body["messages"].as_array().unwrap();
        assert_eq!(messages[messages.len() - 2]["role"], "tool");
    }
    // Kept once in the history; no next turn was made of it.
    let (_, page) = get_json(&client, replicas[1].url("/sessions/s-steer-kill/messages")).await;
    let said: Vec<&str> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(said, ["Plan Paris", "Also Rome", "Paris and Rome."]);
    tokio::time::sleep(Duration::from_secs(2 * HEARTBEAT_S)).await;
    let (_, session) = get_json(&client, replicas[1].url("/sessions/s-steer-kill")).await;
    assert_eq!(session["turn_count"], 1, "{session}");
}

/// Killed right after the steer's 202, before any step took it: the
/// replica that takes the turn over applies it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_answered_just_before_its_replica_is_killed_is_applied_once() {
    let Some((_db, provider, mut replicas)) = replicas(2).await else {
        return;
    };
    let client = reqwest::Client::new();
    let never = CancellationToken::new();
    provider.enqueue([
        Reply::sse("openai/tool_call_local_search.sse").hold_after(2, &never),
        // Step 1 again, then step 2, on the replica that takes it over.
        Reply::sse("openai/tool_call_local_search.sse"),
        Reply::openai_text("Paris and Rome."),
    ]);
    let mut stream = start_sse(&client, &replicas[0], "s-steer-202", "Plan Paris").await;
    let turn = stream.turn_id();
    stream.read_until("turn.started").await;
    let steered = steer(&client, &replicas[0], "s-steer-202", &turn, "Also Rome").await;
    // Its first provider call is made (and held): the survivor's is the
    // second of the script.
    for _ in 0..500 {
        if !provider.requests().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(provider.requests().len(), 1);
    replicas[0].kill();

    let mut follower = follow(&client, &replicas[1], "s-steer-202", &turn, None).await;
    let events = follower.read_to_end().await;
    assert_eq!(events.last().unwrap().event, "turn.completed");
    let applied: Vec<Value> = events
        .iter()
        .filter(|e| e.event == "steer.applied")
        .map(|e| e.json())
        .collect();
    assert_eq!(applied.len(), 1, "{applied:?}");
    assert_eq!(
        (&applied[0]["steer_id"], &applied[0]["step"]),
        (&steered["steer_id"], &json!(2))
    );
    let requests = provider.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(user_said(&requests[1].body, "Also Rome"), 0);
    assert_eq!(user_said(&requests[2].body, "Also Rome"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_through_another_replica_is_in_the_turns_log_and_becomes_its_next_turn() {
    // The replica that runs the turn hears of the steer from the store:
    // it says so in its log before the other replica answers, and makes
    // the message the next turn at the turn's end.
    let Some((_db, provider, replicas)) = replicas(2).await else {
        return;
    };
    let client = reqwest::Client::new();
    let gate = CancellationToken::new();
    provider.enqueue([
        Reply::openai_deltas(&["About ", "Paris."]).hold_after(2, &gate),
        Reply::openai_text("About Rome."),
    ]);
    let mut stream = start_sse(&client, &replicas[0], "s-steer-swept", "Paris?").await;
    let turn = stream.turn_id();
    stream.read_until("message.delta").await;
    let steered = steer(&client, &replicas[1], "s-steer-swept", &turn, "And Rome?").await;
    // In the turn's log by the answer, though another replica runs it.
    let (_, log) = get_json(
        &client,
        replicas[1].url("/sessions/s-steer-swept/events?limit=1000"),
    )
    .await;
    let accepted: Vec<&Value> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "steer.accepted")
        .collect();
    assert_eq!(accepted.len(), 1, "{log}");
    assert_eq!(accepted[0]["steer_id"], steered["steer_id"]);
    assert_eq!(accepted[0]["turn_id"], json!(turn));
    gate.cancel();
    assert_eq!(
        stream.read_to_end().await.last().unwrap().event,
        "turn.completed"
    );

    let url = replicas[1].url("/sessions/s-steer-swept/events?limit=1000");
    let next = deferred_in(&client, &url, &steered["steer_id"], &turn).await;
    let mut follower = follow(&client, &replicas[1], "s-steer-swept", &next, None).await;
    assert_eq!(
        follower.read_to_end().await.last().unwrap().event,
        "turn.completed"
    );
    // One next turn, whichever replica swept first.
    tokio::time::sleep(Duration::from_secs(2 * HEARTBEAT_S)).await;
    let (_, session) = get_json(&client, replicas[0].url("/sessions/s-steer-swept")).await;
    assert_eq!(session["turn_count"], 2, "{session}");
    let requests = provider.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(user_said(&requests[1].body, "And Rome?"), 1);
}

/// What a process that died between a steer and its turn's end (or that
/// could not start the next turn) leaves: a steer no step took, of a turn
/// that ended. The heartbeat's sweep makes it the session's next turn.
async fn a_steer_left_by_a_process_that_died_is_answered_by_the_sweep(backend: Backend) {
    let provider = FakeProvider::start().await;
    provider.enqueue([Reply::openai_text("First."), Reply::openai_text("Second.")]);
    let mut settings = test_settings(&provider);
    settings.server.heartbeat_interval_s = 1;
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    let response = app.post_turn("s-left", json!({"message": "one"})).await;
    assert_eq!(response.status(), 200);
    let turn = response.json::<Value>().await.unwrap()["turn_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let steer = uuid::Uuid::now_v7();
    let insert = format!(
        "INSERT INTO steers (id, session_id, turn_id, message, created_at) \
         VALUES ('{steer}', 's-left', '{turn}', 'and two', '2026-12-07T00:00:00Z')"
    );
    match backend {
        Backend::Sqlite => app.db.execute_sqlite(&insert).await,
        Backend::Postgres => app.db.execute_postgres(&insert).await,
    }
    let url = app.url("/sessions/s-left/events?limit=1000");
    let next = deferred_in(&app.client, &url, &json!(steer.to_string()), &turn).await;
    let ended = app.wait_turn_end("s-left", &next).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(user_said(&requests[1].body, "and two"), 1);
    // Once: later sweeps find nothing left.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, session) = app.get_json("/sessions/s-left").await;
    assert_eq!(session["turn_count"], 2, "{session}");
}

on_both_backends!(a_steer_left_by_a_process_that_died_is_answered_by_the_sweep);
