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
    let turn_id = stream.turn_id();
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
    let a_turn = a.turn_id();
    let mut a_live = a.read_until("message.delta").await;
    app.provider
        .enqueue([Reply::text(200, "text/event-stream", &whole)]);
    proxy.cut_after_next_commit();
    let mut b = app
        .post_turn_sse("s-ending", json!({"message": "Hi"}))
        .await;
    let b_turn = b.turn_id();
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
    assert_eq!(
        app.metric("agent_harness_event_batch_failures_total").await,
        1.0
    );
}

/// A network partition: the database is black-holed (nothing answers,
/// nothing is closed) while four turns stream (the event writer is in the
/// middle of a transaction), for `outage` (`limits`: the store's and the
/// service's). A turn answers with `answer`, and `gate` (if any) is
/// released once the database is gone. Within one heartbeat
/// interval of its return, every turn of the outage has ended, either
/// completed with every event in the log or `failed` with
/// `event_log_unavailable` naming the seqs the log lost, and its session
/// takes a new turn. Returns how the turns ended.
async fn partition_while_streaming(
    limits: harness_store::store::PoolLimits,
    outage: Duration,
    answer: impl Fn() -> Reply,
    gate: Option<CancellationToken>,
) -> Vec<harness_store::store::TurnRecord> {
    use harness_store::store::TurnStatus;
    const TURNS: usize = 4;
    let proxy = FaultProxy::start(TestDb::postgres_addr()).await;
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.open_through_with(&proxy, limits).await;
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.database.acquire_timeout_ms = limits.acquire_timeout.as_millis() as u64;
    settings.database.call_timeout_ms = limits.call_timeout.as_millis() as u64;
    let heartbeat = Duration::from_secs(settings.server.heartbeat_interval_s);
    let app = spawn_app_on(db, store, provider, settings, Vec::new()).await;
    let mut turns = Vec::new();
    for i in 0..TURNS {
        app.provider.enqueue([answer()]);
        let session = format!("s-partition-{i}");
        let mut stream = app.post_turn_sse(&session, json!({"message": "Hi"})).await;
        let turn = stream.turn_id();
        stream.read_until("message.delta").await;
        turns.push((session, turn, stream));
    }

    proxy.black_hole();
    if let Some(gate) = gate {
        gate.cancel();
    }
    tokio::time::sleep(outage).await;
    proxy.restore();
    let restored = Instant::now();

    // Read past the proxy: what the log holds.
    let store = app.db.open().await;
    let mut ended = Vec::new();
    for (session, turn, _) in &turns {
        let turn_id = turn.parse().unwrap();
        let record = loop {
            let record = store
                .get_turn(&session.as_str().into(), turn_id)
                .await
                .unwrap()
                .unwrap();
            if record.status != TurnStatus::Running {
                break record;
            }
            assert!(
                restored.elapsed() <= heartbeat,
                "{session}: still running {:?} after the database came back",
                restored.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        ended.push(record);
    }
    for record in &ended {
        let mut events = Vec::new();
        loop {
            let after = events.last().map_or(
                record.first_seq - 1,
                |e: &harness_base::events::StoredEvent| e.seq,
            );
            let page = store
                .list_events(&record.session_id, Some(record.id), after, 1000)
                .await
                .unwrap();
            if page.is_empty() {
                break;
            }
            events.extend(page);
        }
        let terminal: serde_json::Value =
            serde_json::from_str(&events.last().unwrap().payload).unwrap();
        let mut held: Vec<i64> = events.iter().map(|e| e.seq).collect();
        match record.status {
            TurnStatus::Completed => assert_eq!(terminal["type"], "turn.completed"),
            TurnStatus::Failed => {
                assert_eq!(terminal["type"], "turn.failed", "{terminal}");
                assert_eq!(terminal["code"], "event_log_unavailable", "{terminal}");
                if let Some(lost) = terminal["lost_seqs"].as_array() {
                    let (from, to) = (lost[0].as_i64().unwrap(), lost[1].as_i64().unwrap());
                    assert!(held.iter().all(|seq| *seq < from || *seq > to), "{held:?}");
                    held.extend(from..=to);
                    held.sort_unstable();
                }
            }
            other => panic!("{}: ended {other:?}: {terminal}", record.session_id),
        }
        let whole: Vec<i64> = (record.first_seq..=events.last().unwrap().seq).collect();
        assert_eq!(held, whole, "{}: a hole in the log", record.session_id);
    }
    // Every session is free: a new turn starts at once.
    for (session, _, _) in &turns {
        app.provider.enqueue([Reply::openai_text("back")]);
        let response = app.post_turn(session, json!({"message": "again"})).await;
        assert_eq!(response.status(), 200, "{session}");
    }
    ended
}

/// [`partition_while_streaming`] with the default bounds, for twice as
/// long as a call may wait: the event writer's tries of its batch outlast
/// the outage, and every turn
/// completes whole. (Before calls were bounded, the writer waited on its
/// silent connection for as long as TCP does, and every turn and session
/// waited with it: still running a heartbeat after the return.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_leaves_no_turn_running_a_heartbeat_after_the_database_is_back() {
    if !crate::support::postgres_or_skip().await {
        return;
    }
    // Each answer streams for seconds, a delta a millisecond.
    let words: Vec<String> = (0..3000).map(|i| format!("w{i} ")).collect();
    let pieces: Vec<&str> = words.iter().map(String::as_str).collect();
    let limits = crate::support::test_limits();
    let ended = partition_while_streaming(
        limits,
        limits.call_timeout * 2,
        || Reply::openai_deltas(&pieces),
        None,
    )
    .await;
    assert!(
        ended
            .iter()
            .all(|t| t.status == harness_store::store::TurnStatus::Completed)
    );
}

/// [`partition_while_streaming`] with bounds short beside the outage (a
/// call waits 1 s, the outage lasts 16): each turn's answer ends in the
/// outage, the writer gives up on its last events, and the turn's end is
/// tried until the database is back. Each turn ends `failed` with
/// `event_log_unavailable` and the range it lost (not `interrupted` by the
/// orphan sweep after its end gave up: it used to try only for about as
/// long as a turn takes to go stale, 7.5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_longer_than_the_writer_waits_fails_its_turns_once_the_database_is_back() {
    if !crate::support::postgres_or_skip().await {
        return;
    }
    let limits = harness_store::store::PoolLimits {
        acquire_timeout: Duration::from_millis(100),
        call_timeout: Duration::from_millis(1000),
        ..crate::support::test_limits()
    };
    let gate = CancellationToken::new();
    let ended = partition_while_streaming(
        limits,
        Duration::from_secs(24),
        || Reply::openai_deltas(&["one ", "two ", "three"]).hold_after(2, &gate),
        Some(gate.clone()),
    )
    .await;
    for turn in &ended {
        assert_eq!(turn.status, harness_store::store::TurnStatus::Failed);
        assert_eq!(turn.error_code.as_deref(), Some("event_log_unavailable"));
    }
}
