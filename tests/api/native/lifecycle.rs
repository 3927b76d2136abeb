//! Restarts, orphaned turns and graceful shutdown.

use std::{sync::Arc, time::Duration};

use chrono::Utc;
use harness_base::events::{StoredEvent, TurnEvent};
use harness_store::store::{NewTurn, TurnStatus};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{spawn_app_with, test_settings, types},
    on_both_backends,
    support::{Backend, TestDb},
};

fn left_running(session: &str, instance: &str, process: &str) -> NewTurn {
    NewTurn {
        id: Uuid::now_v7(),
        session_id: session.into(),
        tenant: harness_base::ids::DEFAULT_TENANT.into(),
        request: harness_base::turn::TurnRequest::new("hello?"),
        idempotency_key: None,
        owner_instance: instance.into(),
        owner_process: process.into(),
        created_at: Utc::now(),
        started_payload: serde_json::to_string(&TurnEvent::TurnStarted {
            message: "hello?".into(),
            provider: "openai".into(),
            model: "gpt-4o-mini".into(),
            warnings: Vec::new(),
        })
        .unwrap(),
        reads: Default::default(),
        max_running: None,
        held_back: false,
        traceparent: None,
    }
}

/// Writes a turn as a process that then died would have left it: running,
/// with a started event and one delta.
async fn crashed_turn(db: &TestDb, session: &str, instance: &str) -> Uuid {
    let store = db.open().await;
    let turn = left_running(session, instance, "a-process-that-died");
    store.begin_turn(&turn).await.unwrap();
    let delta = StoredEvent::new(
        session,
        turn.id,
        2,
        &TurnEvent::MessageDelta {
            step: 1,
            text: "Hel".into(),
        },
        Utc::now(),
    )
    .unwrap();
    store.write_batch(&[Arc::new(delta)], &[]).await.unwrap();
    turn.id
}

/// The events of a turn, by type.
async fn rest_of(app: &crate::helpers::TestApp, session: &str, turn_id: Uuid) -> Vec<String> {
    let events = app
        .turn_events(session, &turn_id.to_string(), None)
        .await
        .read_to_end()
        .await;
    types(&events).iter().map(|t| (*t).to_owned()).collect()
}

async fn a_restart_takes_over_turns_left_running_and_finishes_them(backend: Backend) {
    let db = TestDb::new(backend).await;
    let turn_id = crashed_turn(&db, "s-crash", "test-instance").await;

    let provider = FakeProvider::start().await;
    // The turn is taken over as the service starts: its answer is ready.
    provider.enqueue([Reply::sse("openai/text.sse")]);
    let settings = test_settings(&provider);
    let app = spawn_app_with(db, provider, settings).await;

    let turn = app.wait_turn_end("s-crash", &turn_id.to_string()).await;
    assert_eq!(turn["status"], "completed", "{turn}");
    let events = app
        .turn_events("s-crash", &turn_id.to_string(), None)
        .await
        .read_to_end()
        .await;
    let seen = types(&events);
    // Its first life, then this one: `turn.resumed`, the void text of the
    // step it did not finish retracted, and the turn done again.
    assert_eq!(
        seen[..4],
        [
            "turn.started",
            "message.delta",
            "turn.resumed",
            "message.retracted"
        ]
    );
    assert_eq!(seen.last(), Some(&"turn.completed"));
    let resumed = events[2].json();
    assert_eq!(resumed["owner"], "test-instance");
    assert_eq!(resumed["attempt"], 1);
    assert_eq!(resumed["from_step"], 0);
    assert_eq!(events[2].seq(), 3, "the seqs go on");
    assert_eq!(events[3].json()["step"], 1);
    assert_eq!(events[3].json()["reason"], "takeover");
    let seqs: Vec<i64> = events.iter().map(|e| e.seq()).collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    // The session takes new turns again, numbered after the old events.
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let mut stream = app
        .post_turn_sse("s-crash", json!({"message": "again"}))
        .await;
    let fresh = stream.read_to_end().await;
    assert_eq!(fresh[0].seq(), seqs.len() as i64 + 1);
}

/// A turn whose step records do not make a turn (here, one that is not a
/// record at all) cannot be taken over: it ends `failed` with
/// `takeover_failed`, and its session is free.
async fn a_turn_whose_records_are_unreadable_ends_takeover_failed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let turn_id = crashed_turn(&db, "s-bad-records", "test-instance").await;
    let store = db.open().await;
    let bad = harness_store::store::NewStep {
        turn_id,
        step: 1,
        phase: "answered",
        record: "not a record".into(),
        created_at: Utc::now(),
    };
    store
        .commit(harness_store::store::Batch {
            events: &[],
            steps: &[&bad],
            finishes: &[],
            leases: &[harness_store::store::Lease {
                turn_id,
                attempt: 0,
            }],
            fence: true,
        })
        .await
        .unwrap();
    let provider = FakeProvider::start().await;
    let settings = test_settings(&provider);
    let app = spawn_app_with(db, provider, settings).await;
    let turn = app
        .wait_turn_end("s-bad-records", &turn_id.to_string())
        .await;
    assert_eq!(turn["status"], "failed", "{turn}");
    assert_eq!(turn["error"]["code"], "takeover_failed", "{turn}");
    assert!(
        app.provider.requests().is_empty(),
        "nothing was asked again"
    );
}

async fn with_take_over_off_a_restart_interrupts_turns_left_running(backend: Backend) {
    let db = TestDb::new(backend).await;
    let turn_id = crashed_turn(&db, "s-crash", "test-instance").await;

    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.turn_max_attempts = 0;
    let app = spawn_app_with(db, provider, settings).await;

    let turn = app.wait_turn_end("s-crash", &turn_id.to_string()).await;
    assert_eq!(turn["status"], "interrupted");
    assert_eq!(turn["error"]["code"], "interrupted");
    let events = app
        .turn_events("s-crash", &turn_id.to_string(), None)
        .await
        .read_to_end()
        .await;
    assert_eq!(
        types(&events),
        ["turn.started", "message.delta", "turn.interrupted"]
    );
    assert_eq!(events[2].seq(), 3);
    assert_eq!(events[2].json()["reason"], "owner_lost");
}

async fn a_follower_sees_a_turn_taken_over_when_its_owner_stops_beating(backend: Backend) {
    let db = TestDb::new(backend).await;
    // Owned by another replica whose heartbeat was fresh when we started.
    let turn_id = crashed_turn(&db, "s-stale", "another-replica").await;
    let provider = FakeProvider::start().await;
    provider.enqueue([Reply::sse("openai/text.sse")]);
    let mut settings = test_settings(&provider);
    settings.server.heartbeat_interval_s = 1;
    settings.server.stale_turn_after_s = Some(3);
    let app = spawn_app_with(db, provider, settings).await;

    let mut follower = app.turn_events("s-stale", &turn_id.to_string(), None).await;
    let head = follower.read_until("message.delta").await;
    assert_eq!(types(&head), ["turn.started", "message.delta"]);
    // Still running: the other replica might be alive. Then its heartbeat
    // goes stale, the sweep takes the turn over, and the follower sees it
    // go on to its end.
    let (_, turn) = app
        .get_json(&format!("/sessions/s-stale/turns/{turn_id}"))
        .await;
    assert_eq!(turn["status"], "running");
    let rest = follower.read_to_end().await;
    let rest = types(&rest);
    assert_eq!(rest[..2], ["turn.resumed", "message.retracted"]);
    assert_eq!(rest.last(), Some(&"turn.completed"));
}

async fn an_orphan_of_a_replaced_instance_is_taken_over_within_two_heartbeats(backend: Backend) {
    let db = TestDb::new(backend).await;
    // A replica that died and was replaced by one with another name.
    let turn_id = crashed_turn(&db, "s-replaced", "replica-that-died").await;
    let beat_at = tokio::time::Instant::now();
    let provider = FakeProvider::start().await;
    provider.enqueue([Reply::sse("openai/text.sse")]);
    let mut settings = test_settings(&provider);
    settings.server.instance_id = "its-replacement".into();
    settings.server.heartbeat_interval_s = 1;
    let app = spawn_app_with(db, provider, settings).await;
    let turn = app.wait_turn_end("s-replaced", &turn_id.to_string()).await;
    let taken_over = beat_at.elapsed();
    assert_eq!(turn["status"], "completed");
    let events = rest_of(&app, "s-replaced", turn_id).await;
    assert!(events.contains(&"turn.resumed".to_owned()), "{events:?}");
    // Two heartbeat intervals after its owner's last beat, and a little
    // for the sweep, the answer and the polling of this test.
    assert!(
        taken_over <= std::time::Duration::from_millis(2_400),
        "{taken_over:?}"
    );
}

async fn a_cancel_sent_to_another_replica_stops_the_turn_within_a_second() {
    let db = TestDb::new(Backend::Postgres).await;
    let other_db = db.sharing();
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.instance_id = "replica-a".into();
    let owner = spawn_app_with(db, provider, settings).await;
    let never = CancellationToken::new();
    owner
        .provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(3, &never)]);
    let other_provider = FakeProvider::start().await;
    let mut settings = test_settings(&other_provider);
    settings.server.instance_id = "replica-b".into();
    let other = spawn_app_with(other_db, other_provider, settings).await;

    let mut stream = owner
        .post_turn_sse("s-remote", json!({"message": "Hi"}))
        .await;
    let turn_id = stream.turn_id();
    stream.read_until("message.delta").await;
    let asked = tokio::time::Instant::now();
    let (status, _) = other
        .post_json(&format!("/sessions/s-remote/turns/{turn_id}/cancel"))
        .await;
    assert_eq!(status, 202);
    let rest = stream.read_to_end().await;
    let stopped = asked.elapsed();
    assert_eq!(rest.last().unwrap().event, "turn.cancelled");
    assert!(stopped <= std::time::Duration::from_secs(1), "{stopped:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_sent_to_another_replica_stops_the_turn_within_a_second_on_postgres() {
    if crate::support::postgres_or_skip().await {
        a_cancel_sent_to_another_replica_stops_the_turn_within_a_second().await;
    }
}

on_both_backends!(an_orphan_of_a_replaced_instance_is_taken_over_within_two_heartbeats);

async fn with_take_over_off_shutdown_interrupts_turns_still_running_after_the_grace_period(
    backend: Backend,
) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.shutdown_grace_s = 1;
    settings.server.turn_max_attempts = 0;
    let db = TestDb::new(backend).await;
    let mut app = spawn_app_with(db, provider, settings).await;
    let never = CancellationToken::new();
    app.provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(3, &never)]);
    let mut stream = app.post_turn_sse("s-down", json!({"message": "Hi"})).await;
    let turn_id: Uuid = stream.turn_id().parse().unwrap();
    stream.read_until("message.delta").await;

    app.shutdown_token().cancel();
    let rest = stream.read_to_end().await;
    assert_eq!(rest.last().unwrap().event, "turn.interrupted");
    assert_eq!(rest.last().unwrap().json()["reason"], "shutdown");
    app.stop().await;

    let record = app
        .db
        .open()
        .await
        .get_turn(&"s-down".into(), turn_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, TurnStatus::Interrupted);
}

async fn with_take_over_off_shutdown_lets_a_turn_finish_within_the_grace_period(backend: Backend) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.turn_max_attempts = 0;
    let mut app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    let gate = CancellationToken::new();
    app.provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(3, &gate)]);
    let mut stream = app.post_turn_sse("s-grace", json!({"message": "Hi"})).await;
    let turn_id: Uuid = stream.turn_id().parse().unwrap();
    stream.read_until("message.delta").await;

    app.shutdown_token().cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.cancel();
    let rest = stream.read_to_end().await;
    assert_eq!(rest.last().unwrap().event, "turn.completed");
    app.stop().await;
    let store = app.db.open().await;
    let record = store
        .get_turn(&"s-grace".into(), turn_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, TurnStatus::Completed);
    assert_eq!(
        store
            .list_messages(&"s-grace".into(), 0, 10)
            .await
            .unwrap()
            .len(),
        2
    );
}

on_both_backends!(
    a_restart_takes_over_turns_left_running_and_finishes_them,
    a_turn_whose_records_are_unreadable_ends_takeover_failed,
    with_take_over_off_a_restart_interrupts_turns_left_running,
    a_follower_sees_a_turn_taken_over_when_its_owner_stops_beating,
    with_take_over_off_shutdown_interrupts_turns_still_running_after_the_grace_period,
    with_take_over_off_shutdown_lets_a_turn_finish_within_the_grace_period,
    a_turn_handed_over_at_shutdown_goes_on_when_the_service_starts_again,
);

/// SIGTERM with take-over on: a turn waiting for the model is not waited
/// for (nor interrupted): it is released at once, its stream ends without
/// a terminal event, and the service started again on the same database
/// goes on with it from its records; the client resumes with
/// `Last-Event-ID` and sees it through.
async fn a_turn_handed_over_at_shutdown_goes_on_when_the_service_starts_again(backend: Backend) {
    let provider = FakeProvider::start().await;
    let settings = test_settings(&provider);
    let mut app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    let never = CancellationToken::new();
    app.provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(3, &never)]);
    let mut stream = app.post_turn_sse("s-over", json!({"message": "Hi"})).await;
    let turn_id: Uuid = stream.turn_id().parse().unwrap();
    let head = stream.read_until("message.delta").await;

    let asked = tokio::time::Instant::now();
    app.shutdown_token().cancel();
    let mut rest = Vec::new();
    while let Some(event) = stream.next().await {
        rest.push(event);
    }
    assert!(
        rest.iter().all(|e| !e.event.starts_with("turn.")),
        "no end: the turn goes on elsewhere, {:?}",
        types(&rest)
    );
    let last_seen = head.iter().chain(&rest).map(|e| e.seq()).max().unwrap();
    app.stop().await;
    let stopped = asked.elapsed();
    // The 5 s grace was not waited out for a turn waiting on its model
    // (alone on Postgres, the process waits 3 s for another replica to
    // claim the turn before its streams end).
    assert!(stopped < Duration::from_millis(4500), "{stopped:?}");
    let record = app
        .db
        .open()
        .await
        .get_turn(&"s-over".into(), turn_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, TurnStatus::Running);

    // The service again, the same instance, the same database.
    let db = std::mem::replace(&mut app.db, TestDb::new(backend).await);
    drop(app);
    let provider = FakeProvider::start().await;
    provider.enqueue([Reply::sse("openai/text.sse")]);
    let settings = test_settings(&provider);
    let again = spawn_app_with(db, provider, settings).await;
    let events = again
        .turn_events("s-over", &turn_id.to_string(), Some(last_seen))
        .await
        .read_to_end()
        .await;
    let seen = types(&events);
    assert_eq!(seen[..2], ["turn.resumed", "message.retracted"], "{seen:?}");
    assert_eq!(seen.last(), Some(&"turn.completed"));
    assert_eq!(
        events[0].seq(),
        last_seen + 1,
        "nothing lost, nothing twice"
    );
    assert_eq!(
        again
            .metric("agent_harness_turn_takeovers_total{reason=\"shutdown\"}")
            .await,
        1.0
    );
}

/// `get_weather` (the tool the `openai/tool_call.sse` fixture calls) that
/// ignores cancellation and answers after `work`, past its 300 ms timeout.
struct LateWeather {
    spec: harness_core::tools::ToolSpec,
    work: Duration,
    finished: tokio_util::sync::CancellationToken,
}

#[async_trait::async_trait]
impl harness_core::tools::Tool for LateWeather {
    fn spec(&self) -> &harness_core::tools::ToolSpec {
        &self.spec
    }

    async fn call(
        &self,
        _: harness_core::tools::ToolContext,
        _: serde_json::Value,
    ) -> Result<harness_core::tools::ToolOutput, harness_core::tools::ToolError> {
        tokio::time::sleep(self.work).await;
        self.finished.cancel();
        Ok(harness_core::tools::ToolOutput::text("18°C"))
    }
}

async fn nothing_is_written_after_a_terminal_event(backend: Backend) {
    let provider = FakeProvider::start().await;
    let settings = test_settings(&provider);
    let finished = CancellationToken::new();
    let tool = Arc::new(LateWeather {
        spec: harness_core::tools::ToolSpec::new(
            "get_weather",
            "Weather of a place.",
            json!({"type": "object"}),
            harness_core::tools::EffectClass::ReadOnly,
        )
        .with_timeout(Duration::from_millis(300)),
        work: Duration::from_millis(1200),
        finished: finished.clone(),
    });
    let app = crate::helpers::spawn_app_with_tools(
        TestDb::new(backend).await,
        provider,
        settings,
        vec![tool],
    )
    .await;
    let never = CancellationToken::new();
    app.provider.enqueue([
        Reply::sse("openai/tool_call.sse"),
        Reply::sse("openai/text.sse").hold_after(1, &never),
        Reply::sse("openai/text.sse"),
    ]);
    let mut stream = app
        .post_turn_sse("s-late", json!({"message": "Weather in Paris?"}))
        .await;
    let turn_id = stream.next().await.unwrap().json()["turn_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The tool timed out and step 2 is under way: cancel the turn.
    let events = stream.read_until("tool.finished").await;
    assert_eq!(events.last().unwrap().json()["status"], "timed_out");
    let (status, body) = app
        .post_json(&format!("/sessions/s-late/turns/{turn_id}/cancel"))
        .await;
    assert_eq!((status, body["status"].as_str()), (200, Some("cancelled")));
    // The tool comes back after the turn's end.
    tokio::time::timeout(Duration::from_secs(10), finished.cancelled())
        .await
        .expect("the tool finishes");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, log) = app.get_json("/sessions/s-late/events").await;
    let logged: Vec<&str> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(logged.last(), Some(&"turn.cancelled"), "{logged:?}");
    assert!(!logged.contains(&"tool.late"), "{logged:?}");
    // The session's next turn starts and completes.
    let next = app
        .post_turn("s-late", json!({"message": "And now?"}))
        .await;
    assert_eq!(next.status(), 200);
}

on_both_backends!(nothing_is_written_after_a_terminal_event);
