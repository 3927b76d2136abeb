//! Replicas: two or three `agent-harness` processes on one Postgres
//! database, as behind a gateway. A stream re-attached on another replica,
//! a cancel through any replica, 1,000 racing POSTs on one session, and a
//! replica killed with SIGKILL in the middle of a turn.

use std::time::{Duration, Instant};

use futures::future::join_all;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{ServiceProcess, SseEvent, SseStream},
    support::{Backend, TestDb, postgres_or_skip},
};

/// Seconds between heartbeats of the replicas (orphans are taken over
/// within two).
pub(super) const HEARTBEAT_S: u64 = 1;

/// One service process on the test's Postgres database.
pub(super) type Replica = ServiceProcess;

async fn start_replica(
    db: &TestDb,
    provider: &FakeProvider,
    instance: &str,
    settings: &[(&str, &str)],
) -> Replica {
    let heartbeat = HEARTBEAT_S.to_string();
    let mut env = vec![
        ("HARNESS_INSTANCE_ID", instance),
        ("HARNESS_HEARTBEAT_INTERVAL_S", heartbeat.as_str()),
    ];
    env.extend_from_slice(settings);
    ServiceProcess::start(&db.postgres_service_url(), provider, &env, None).await
}

pub(super) async fn replicas(count: usize) -> Option<(TestDb, FakeProvider, Vec<Replica>)> {
    replicas_with(count, &[]).await
}

/// `count` replicas with `settings` beside the defaults; `None` without
/// Postgres.
async fn replicas_with(
    count: usize,
    settings: &[(&str, &str)],
) -> Option<(TestDb, FakeProvider, Vec<Replica>)> {
    if !postgres_or_skip().await {
        return None;
    }
    let db = TestDb::new(Backend::Postgres).await;
    // Migrated once, before the replicas race to.
    db.open().await;
    let provider = FakeProvider::start().await;
    let mut started = Vec::new();
    for i in 0..count {
        let instance = format!("replica-{i}");
        started.push(start_replica(&db, &provider, &instance, settings).await);
    }
    Some((db, provider, started))
}

async fn post_turn_sse(client: &reqwest::Client, replica: &Replica, session: &str) -> SseStream {
    let response = client
        .post(replica.url(&format!("/sessions/{session}/turns")))
        .header("accept", "text/event-stream")
        .json(&json!({"message": "Hi"}))
        .send()
        .await
        .unwrap();
    SseStream::new(response).await
}

/// The provider's next answer stops after its third chunk until `gate` is
/// cancelled; the one after it is `then` (the step asked again by the
/// replica that takes the turn over).
fn held_then(provider: &FakeProvider, gate: &CancellationToken, then: &str) {
    provider.enqueue([
        Reply::sse("openai/text.sse").hold_after(3, gate),
        Reply::sse(then),
    ]);
}

/// A turn started on `replica`, read up to its first text.
async fn mid_answer(
    client: &reqwest::Client,
    replica: &Replica,
    session: &str,
) -> (SseStream, String) {
    let mut stream = post_turn_sse(client, replica, session).await;
    let turn = stream.turn_id();
    stream.read_until("message.delta").await;
    (stream, turn)
}

pub(super) async fn follow(
    client: &reqwest::Client,
    replica: &Replica,
    session: &str,
    turn: &str,
    after: Option<i64>,
) -> SseStream {
    let mut request = client.get(replica.url(&format!("/sessions/{session}/turns/{turn}/events")));
    if let Some(seq) = after {
        request = request.header("last-event-id", seq.to_string());
    }
    let stream = SseStream::new(request.send().await.unwrap()).await;
    assert_eq!(stream.status, 200);
    stream
}

fn seqs(events: &[SseEvent]) -> Vec<i64> {
    events.iter().map(SseEvent::seq).collect()
}

fn text(events: &[SseEvent]) -> String {
    events
        .iter()
        .filter(|e| e.event == "message.delta")
        .map(|e| e.json()["text"].as_str().unwrap().to_owned())
        .collect()
}

pub(super) async fn get_json(client: &reqwest::Client, url: String) -> (u16, Value) {
    let response = client.get(url).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reattached_on_another_replica_gets_every_event_once() {
    let Some((_db, provider, replicas)) = replicas(3).await else {
        return;
    };
    let client = reqwest::Client::new();
    let release = CancellationToken::new();
    provider.enqueue([Reply::sse("openai/text.sse").hold_after(3, &release)]);

    // Started on replica 0; the connection drops after the first delta.
    let mut first = post_turn_sse(&client, &replicas[0], "s-moves").await;
    let turn = first.turn_id();
    let before = first.read_until("message.delta").await;
    drop(first);
    let last = before.last().unwrap().seq();
    // Re-attached on replica 1 after what it saw; replica 2 follows from
    // the start. Both while the turn still runs on replica 0.
    let mut resumed = follow(&client, &replicas[1], "s-moves", &turn, Some(last)).await;
    let mut whole = follow(&client, &replicas[2], "s-moves", &turn, None).await;
    release.cancel();
    let after = resumed.read_to_end().await;
    let all = whole.read_to_end().await;

    let terminal = all.last().unwrap();
    assert_eq!(terminal.event, "turn.completed");
    let expected: Vec<i64> = (1..=terminal.seq()).collect();
    let mut joined = seqs(&before);
    joined.extend(seqs(&after));
    assert_eq!(joined, expected, "dropped + re-attached: each event once");
    assert_eq!(seqs(&all), expected, "followed elsewhere: each event once");
    assert_eq!(format!("{}{}", text(&before), text(&after)), text(&all));
    // The stored log is what the streams carried.
    let (status, log) = get_json(
        &client,
        replicas[1].url("/sessions/s-moves/events?limit=1000"),
    )
    .await;
    assert_eq!(status, 200);
    let stored: Vec<i64> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(stored, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_through_any_replica_stops_the_turn_within_a_second() {
    let Some((_db, provider, replicas)) = replicas(3).await else {
        return;
    };
    let client = reqwest::Client::new();
    let never = CancellationToken::new();
    for (session, through) in [("s-cancel-1", 1), ("s-cancel-2", 2)] {
        provider.enqueue([Reply::sse("openai/text.sse").hold_after(3, &never)]);
        let (mut stream, turn) = mid_answer(&client, &replicas[0], session).await;
        let asked = Instant::now();
        let response = client
            .post(replicas[through].url(&format!("/sessions/{session}/turns/{turn}/cancel")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202, "through replica {through}");
        let rest = stream.read_to_end().await;
        let stopped = asked.elapsed();
        assert_eq!(rest.last().unwrap().event, "turn.cancelled");
        assert!(stopped <= Duration::from_secs(1), "{stopped:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_turn_runs_per_session_across_replicas_under_a_thousand_racing_posts() {
    // The race, not the pool: 333 posts a replica queue for its ten
    // connections, and on a slow machine (a debug build on two busy
    // cores) the last wait longer than the default second for one, which
    // answers 503 as it should for a database that does not answer.
    let acquire = [("HARNESS_DATABASE_ACQUIRE_TIMEOUT_MS", "30000")];
    let Some((_db, provider, replicas)) = replicas_with(3, &acquire).await else {
        return;
    };
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let release = CancellationToken::new();
    // One answer is scripted: a second turn would find none and fail.
    provider.enqueue([Reply::sse("openai/text.sse").hold_after(3, &release)]);
    let posts = (0..1000).map(|i| {
        let client = client.clone();
        let url = replicas[i % replicas.len()].url("/sessions/s-race/turns");
        async move {
            let response = client
                .post(url)
                .header("accept", "text/event-stream")
                .json(&json!({"message": "Hi"}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            if status == 200 {
                (status, Some(SseStream::new(response).await), Value::Null)
            } else {
                (status, None, response.json().await.unwrap_or(Value::Null))
            }
        }
    });
    let answers = join_all(posts).await;
    let mut started = Vec::new();
    for (status, stream, problem) in answers {
        match status {
            200 => started.push(stream.unwrap()),
            409 => assert_eq!(problem["code"], "turn_already_running", "{problem}"),
            // Past the tenant's requests in flight on a replica: refused
            // before anything, as it should be.
            429 => assert_eq!(problem["code"], "too_many_streams", "{problem}"),
            other => panic!("{other}: {problem}"),
        }
    }
    if started.len() != 1 {
        // What happened, for the failure message: which turns began and
        // how they ended.
        let (_, log) = get_json(
            &client,
            replicas[0].url("/sessions/s-race/events?limit=1000"),
        )
        .await;
        panic!("{} turns began: {log}", started.len());
    }
    release.cancel();
    let events = started[0].read_to_end().await;
    assert_eq!(events.last().unwrap().event, "turn.completed");
    let (_, session) = get_json(&client, replicas[2].url("/sessions/s-race")).await;
    assert_eq!(session["turn_count"], 1, "{session}");
    assert_eq!(provider.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_turn_has_its_turn_finished_by_another_within_two_heartbeats() {
    let Some((_db, provider, mut replicas)) = replicas(2).await else {
        return;
    };
    let client = reqwest::Client::new();
    let never = CancellationToken::new();
    // The step asked again by the replica that takes the turn over.
    held_then(&provider, &never, "openai/text.sse");
    let (_stream, turn) = mid_answer(&client, &replicas[0], "s-killed").await;
    // A follower on the other replica, to see the end arrive.
    let mut follower = follow(&client, &replicas[1], "s-killed", &turn, None).await;

    replicas[0].kill();
    let killed = Instant::now();
    let events = follower.read_to_end().await;
    let ended = killed.elapsed();
    let seen: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    let resumed = seen
        .iter()
        .position(|t| *t == "turn.resumed")
        .unwrap_or_else(|| panic!("no turn.resumed in {seen:?}"));
    assert_eq!(seen[resumed + 1], "message.retracted", "{seen:?}");
    assert_eq!(events[resumed].json()["owner"], "replica-1");
    assert_eq!(seen.last(), Some(&"turn.completed"));
    // Every event once, in seq order.
    let seqs: Vec<i64> = events.iter().map(|e| e.seq()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert!(
        ended <= Duration::from_secs(2 * HEARTBEAT_S) + Duration::from_millis(500),
        "finished {ended:?} after the kill"
    );
    let (status, record) = get_json(
        &client,
        replicas[1].url(&format!("/sessions/s-killed/turns/{turn}")),
    )
    .await;
    assert_eq!(
        (status, record["status"].as_str()),
        (200, Some("completed"))
    );
    // The session is free: the next turn runs on the survivor.
    provider.enqueue([Reply::sse("openai/text.sse")]);
    let mut next = post_turn_sse(&client, &replicas[1], "s-killed").await;
    assert_eq!(next.status, 200);
    assert_eq!(
        next.read_to_end().await.last().unwrap().event,
        "turn.completed"
    );
}

/// SIGTERM (a deploy) of the replica running a turn: the turn is handed
/// over, announced, and another replica goes on with it at once, not after
/// a stale heartbeat; a follower there sees it through, every event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_shut_down_mid_turn_hands_it_over_at_once() {
    let Some((_db, provider, mut replicas)) = replicas(2).await else {
        return;
    };
    let client = reqwest::Client::new();
    let never = CancellationToken::new();
    held_then(&provider, &never, "openai/text.sse");
    let (_stream, turn) = mid_answer(&client, &replicas[0], "s-deploy").await;
    let mut follower = follow(&client, &replicas[1], "s-deploy", &turn, None).await;
    follower.read_until("message.delta").await;

    let asked = Instant::now();
    replicas[0].terminate().await;
    let rest = follower.read_until("turn.resumed").await;
    let handed_over = asked.elapsed();
    assert_eq!(rest.last().unwrap().json()["owner"], "replica-1");
    // Well under the 1.5 s a stale heartbeat takes.
    assert!(
        handed_over < Duration::from_millis(1_000),
        "taken over {handed_over:?} after SIGTERM"
    );
    let end = follower.read_to_end().await;
    assert_eq!(end.last().unwrap().event, "turn.completed");
    let metrics = replicas[1].get_text("/metrics").await;
    assert!(
        metrics.contains("agent_harness_turn_takeovers_total{reason=\"shutdown\"} 1"),
        "{metrics}"
    );
}

/// A JSON-mode caller whose connection was on a replica that died asks
/// again, with the same `Idempotency-Key`, on another replica: it gets the
/// turn's result once another replica has taken it over and finished it,
/// not a second turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_caller_asking_again_with_its_key_gets_the_turn_finished_elsewhere() {
    let Some((_db, provider, mut replicas)) = replicas(2).await else {
        return;
    };
    let client = reqwest::Client::new();
    let never = CancellationToken::new();
    held_then(&provider, &never, "openai/text.sse");
    let ask = |replica: &Replica| {
        client
            .post(replica.url("/sessions/s-json/turns"))
            .header("idempotency-key", "k-json")
            .json(&json!({"message": "Hi"}))
            .send()
    };
    let first = tokio::spawn(ask(&replicas[0]));
    for _ in 0..200 {
        if !provider.requests().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(provider.requests().len(), 1, "the turn runs on replica 0");
    replicas[0].kill();
    let lost = first.await.unwrap();
    assert!(
        lost.is_err() || lost.is_ok_and(|r| r.status() != 200),
        "the first connection died with its replica"
    );

    let again = ask(&replicas[1]).await.unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let body: Value = again.json().await.unwrap();
    assert!(
        !body["text"].as_str().unwrap_or_default().is_empty(),
        "{body}"
    );
    let (_, session) = get_json(&client, replicas[1].url("/sessions/s-json")).await;
    assert_eq!(session["turn_count"], 1, "one turn, not two: {session}");
    assert_eq!(
        provider.requests().len(),
        2,
        "its step, asked once per life"
    );
}

/// A replica frozen (SIGSTOP: a long pause, a partition) past the stale
/// window has its turn taken over; woken (SIGCONT), it goes on streaming
/// its model's answer but can write nothing more for the turn: the turn
/// ends once, by the replica that took it over, and the log holds every
/// event once, with no hole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_replica_that_wakes_writes_nothing_for_a_turn_taken_over() {
    let Some((_db, provider, replicas)) = replicas(2).await else {
        return;
    };
    let client = reqwest::Client::new();
    let words: Vec<String> = (0..60).map(|i| format!("w{i} ")).collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    provider.enqueue([
        // The frozen owner's answer: 6 s of text, still streaming when it
        // wakes.
        Reply::openai_deltas(&words).pace(Duration::from_millis(100)),
        Reply::sse("openai/text.sse"),
    ]);
    let mut stream = post_turn_sse(&client, &replicas[0], "s-frozen").await;
    let turn = stream.turn_id();
    // Far into its answer when it freezes (a late wake has much to write).
    for _ in 0..30 {
        stream.read_until("message.delta").await;
    }
    let mut follower = follow(&client, &replicas[1], "s-frozen", &turn, None).await;
    follower.read_until("message.delta").await;

    replicas[0].run(false);
    let rest = follower.read_to_end().await;
    replicas[0].run(true);
    assert_eq!(rest.last().unwrap().event, "turn.completed");
    assert!(rest.iter().any(|e| e.event == "turn.resumed"));
    // Time for the woken owner to try its writes, and fail them.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, log) = get_json(
        &client,
        replicas[1].url("/sessions/s-frozen/events?limit=1000"),
    )
    .await;
    let events = log["events"].as_array().unwrap();
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    let ends: Vec<&str> = events
        .iter()
        .filter_map(|e| e["type"].as_str())
        .filter(|t| t.starts_with("turn.") && !matches!(*t, "turn.started" | "turn.resumed"))
        .collect();
    assert_eq!(ends, ["turn.completed"], "one end, the new owner's");
    let (_, record) = get_json(
        &client,
        replicas[0].url(&format!("/sessions/s-frozen/turns/{turn}")),
    )
    .await;
    assert_eq!(record["status"], "completed", "{record}");
}

/// Every frame of a `data:`-line stream until it ends, as JSON (`[DONE]`
/// as a string).
async fn data_frames(stream: &mut SseStream) -> Vec<Value> {
    let mut frames = Vec::new();
    while let Some(frame) = stream.next().await {
        frames.push(serde_json::from_str(&frame.data).unwrap_or(Value::String(frame.data)));
    }
    frames
}

/// Reads a `data:`-line stream until a frame of `kind` (its `type`).
async fn data_until(stream: &mut SseStream, kind: &str) -> Vec<Value> {
    let mut frames = Vec::new();
    while let Some(frame) = stream.next().await {
        let frame: Value = serde_json::from_str(&frame.data).unwrap_or(Value::Null);
        let found = frame["type"] == kind;
        frames.push(frame);
        if found {
            return frames;
        }
    }
    panic!("no {kind} before the end: {frames:?}");
}

/// SIGTERM of the replica a wire-format client is connected to: the
/// replica hands the turn over and keeps the client's stream open,
/// following the turn in the shared log, until it ends. The AI SDK client
/// sees the turn resumed and its text once, whole (the step said again
/// alike is held back); the AG-UI client, whose step is said again
/// otherwise, sees its first message named void and the new text whole;
/// the Responses client, likewise, sees its first message item end
/// `incomplete` and the new text as a new one; the A2A client sees its
/// answer's artifact replaced; the MCP host gets the whole answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wire_format_stream_on_a_replica_shut_down_sees_the_turn_through() {
    let Some((_db, provider, mut replicas)) = replicas(6).await else {
        return;
    };
    let client = reqwest::Client::new();
    let never = CancellationToken::new();

    // The AI SDK's stream, said again alike.
    held_then(&provider, &never, "openai/text.sse");
    let response = client
        .post(replicas[0].url("/v1/ui/chat"))
        .json(&json!({"id": "s-ui", "messages": [{"role": "user", "parts": [{"type": "text", "text": "Hi"}]}]}))
        .send()
        .await
        .unwrap();
    let mut ui = SseStream::new(response).await;
    assert_eq!(ui.status, 200);
    let mut frames = data_until(&mut ui, "text-delta").await;
    replicas[0].terminate().await;
    frames.extend(data_frames(&mut ui).await);
    let kinds: Vec<&str> = frames.iter().filter_map(|f| f["type"].as_str()).collect();
    let text: String = frames
        .iter()
        .filter(|f| f["type"] == "text-delta")
        .map(|f| f["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Hello! How can I help you today?", "{frames:#?}");
    assert!(kinds.contains(&"data-turn-resumed"), "{kinds:?}");
    assert!(!kinds.contains(&"data-message-retracted"), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "text-start").count(), 1);
    assert_eq!(kinds.last(), Some(&"finish"), "{kinds:?}");
    assert_eq!(frames.last(), Some(&Value::String("[DONE]".into())));

    // AG-UI, said again otherwise: a replica that was not shut down takes
    // it over.
    held_then(&provider, &never, "openai/after_tool.sse");
    let response = client
        .post(replicas[1].url("/v1/agui"))
        .json(&json!({
            "threadId": "s-agui",
            "runId": "run-1",
            "messages": [{"id": "u1", "role": "user", "content": "Hi"}],
            "tools": [],
            "context": [],
            "state": {},
            "forwardedProps": {},
        }))
        .send()
        .await
        .unwrap();
    let mut agui = SseStream::new(response).await;
    assert_eq!(agui.status, 200);
    let mut frames = data_until(&mut agui, "TEXT_MESSAGE_CONTENT").await;
    replicas[1].terminate().await;
    frames.extend(data_frames(&mut agui).await);
    let said = |id: &Value| -> String {
        frames
            .iter()
            .filter(|f| f["type"] == "TEXT_MESSAGE_CONTENT" && &f["messageId"] == id)
            .map(|f| f["delta"].as_str().unwrap())
            .collect()
    };
    let starts: Vec<&Value> = frames
        .iter()
        .filter(|f| f["type"] == "TEXT_MESSAGE_START")
        .map(|f| &f["messageId"])
        .collect();
    assert_eq!(starts.len(), 2, "{frames:#?}");
    assert_eq!(said(starts[0]), "Hello!");
    assert_eq!(said(starts[1]), "It's 18°C in Paris.");
    let custom: Vec<&Value> = frames.iter().filter(|f| f["type"] == "CUSTOM").collect();
    assert_eq!(custom.len(), 2, "{frames:#?}");
    assert_eq!(custom[0]["name"], "turn.resumed");
    let owner = custom[0]["value"]["owner"].as_str().unwrap();
    assert!(
        owner.starts_with("replica-") && owner != "replica-1",
        "{owner}"
    );
    assert_eq!(custom[1]["name"], "message.retracted");
    assert_eq!(&custom[1]["value"]["messageId"], starts[0]);
    assert_eq!(custom[1]["value"]["reason"], "takeover");
    assert_eq!(frames.last().unwrap()["type"], "RUN_FINISHED");
    // The Responses API, said again otherwise: the first message item
    // ends `incomplete`, the new text is a message item of its own, and
    // the events stay numbered one by one.
    held_then(&provider, &never, "openai/after_tool.sse");
    let response = client
        .post(replicas[2].url("/v1/responses"))
        .json(&json!({"input": "Hi", "stream": true}))
        .send()
        .await
        .unwrap();
    let mut stream = SseStream::new(response).await;
    assert_eq!(stream.status, 200);
    let mut frames = data_until(&mut stream, "response.output_text.delta").await;
    replicas[2].terminate().await;
    frames.extend(data_frames(&mut stream).await);
    for (i, frame) in frames.iter().enumerate() {
        assert_eq!(frame["sequence_number"], i, "{frames:#?}");
    }
    let messages: Vec<&Value> = frames
        .iter()
        .filter(|f| f["type"] == "response.output_item.done" && f["item"]["type"] == "message")
        .map(|f| &f["item"])
        .collect();
    assert_eq!(messages.len(), 2, "{frames:#?}");
    assert_eq!(messages[0]["status"], "incomplete");
    assert_eq!(messages[0]["content"][0]["text"], "Hello!");
    assert_eq!(messages[1]["status"], "completed");
    assert_eq!(messages[1]["content"][0]["text"], "It's 18°C in Paris.");
    let last = frames.last().unwrap();
    assert_eq!(last["type"], "response.completed", "{frames:#?}");
    assert_eq!(last["response"]["output"].as_array().unwrap().len(), 2);

    // A2A, said again otherwise: the answer's artifact is replaced
    // (`append: false`) by the new text, and the task completes.
    held_then(&provider, &never, "openai/after_tool.sse");
    let response = client
        .post(replicas[3].url("/a2a"))
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": {
                "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "Hi"}]}
            }}),
        )
        .send()
        .await
        .unwrap();
    let mut stream = SseStream::new(response).await;
    let mut frames = Vec::new();
    while let Some(frame) = stream.next().await {
        let result = frame.json()["result"].clone();
        let chunk = result["artifactUpdate"]["artifact"]["parts"][0]["text"].clone();
        frames.push(result);
        if chunk.is_string() && frames.len() > 1 {
            break;
        }
    }
    replicas[3].terminate().await;
    while let Some(frame) = stream.next().await {
        frames.push(frame.json()["result"].clone());
    }
    // The answer as a client builds it: appended chunks, a replace starts over.
    let mut answer = String::new();
    for update in frames.iter().filter_map(|f| f.get("artifactUpdate")) {
        if update["append"] == false {
            answer.clear();
        }
        if let Some(text) = update["artifact"]["parts"][0]["text"].as_str() {
            answer.push_str(text);
        }
    }
    assert_eq!(answer, "It's 18°C in Paris.", "{frames:#?}");
    let end = &frames.last().unwrap()["statusUpdate"]["status"]["state"];
    assert_eq!(end, "TASK_STATE_COMPLETED", "{frames:#?}");

    // MCP's ask: its progress goes on from the new owner, and the result
    // is the turn's whole answer.
    held_then(&provider, &never, "openai/text.sse");
    let response = client
        .post(replicas[4].url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .json(
            &json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
                "name": "ask", "arguments": {"message": "Hi"}, "_meta": {"progressToken": 1}
            }}),
        )
        .send()
        .await
        .unwrap();
    let mut stream = SseStream::new(response).await;
    let first = stream.next().await.unwrap().json();
    assert_eq!(first["method"], "notifications/progress");
    replicas[4].terminate().await;
    let mut last = Value::Null;
    while let Some(frame) = stream.next().await {
        last = frame.json();
    }
    assert_eq!(last["id"], 7, "{last}");
    assert_eq!(last["result"]["isError"], false, "{last}");
    assert_eq!(
        last["result"]["content"][0]["text"],
        "Hello! How can I help you today?"
    );
}

/// A tenant's running turns are counted in the database: two replicas do
/// not give it twice its share. (Before, nothing limited them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_running_turns_are_counted_across_replicas() {
    let Some((_db, provider, replicas)) =
        replicas_with(2, &[("HARNESS_TENANT_MAX_RUNNING_TURNS", "2")]).await
    else {
        return;
    };
    let client = reqwest::Client::new();
    let gate = CancellationToken::new();
    provider.enqueue([
        Reply::openai_text("one").hold_head(&gate),
        Reply::openai_text("two").hold_head(&gate),
    ]);
    let mut held = Vec::new();
    for (session, replica) in [("s-share-1", 0), ("s-share-2", 1)] {
        let mut stream = post_turn_sse(&client, &replicas[replica], session).await;
        stream.read_until("turn.started").await;
        held.push(stream);
    }
    for replica in &replicas {
        let refused = client
            .post(replica.url("/sessions/s-share-3/turns"))
            .json(&json!({"message": "Hi"}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 429);
        let problem: Value = refused.json().await.unwrap();
        assert_eq!(problem["code"], "tenant_busy");
    }
    gate.cancel();
    for mut stream in held {
        assert_eq!(
            stream.read_to_end().await.last().unwrap().event,
            "turn.completed"
        );
    }
}

/// A webhook's message lives in the database with the event it says: the
/// replica that ran the turn is killed while its receiver is down, and
/// the other replica delivers it once the receiver is up, under the same
/// `webhook-id`. (Before, nothing sent webhooks.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_of_a_killed_replica_is_delivered_by_another() {
    let Some((_db, provider, mut replicas)) =
        replicas_with(2, &[("HARNESS_OUTBOUND_ALLOW_PRIVATE", "true")]).await
    else {
        return;
    };
    let (receiver, url) = crate::edge::webhooks::Receiver::start().await;
    receiver
        .failing
        .store(u32::MAX, std::sync::atomic::Ordering::SeqCst);
    let client = reqwest::Client::new();
    let made: Value = client
        .post(replicas[0].url("/webhooks"))
        .json(&json!({"url": url, "events": ["turn.completed"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let hook = made["id"].as_str().unwrap().to_owned();
    provider.enqueue([Reply::sse("openai/text.sse")]);
    let mut stream = post_turn_sse(&client, &replicas[0], "s-hook-kill").await;
    let turn = stream.turn_id();
    stream.read_to_end().await;
    // Tried, and refused, at least once; then the replica that ran the
    // turn dies.
    let (headers, _) = receiver.wait_for("turn.completed", Some(&turn)).await;
    let id = headers["webhook-id"].to_str().unwrap().to_owned();
    replicas[0].kill();
    receiver
        .failing
        .store(0, std::sync::atomic::Ordering::SeqCst);
    let mut delivered = Value::Null;
    // Its tries back off (1 s doubling): on a loaded machine the one after
    // the kill may come 30 s after the first.
    for _ in 0..1200 {
        let (_, listed) = get_json(
            &client,
            replicas[1].url(&format!("/webhooks/{hook}/deliveries")),
        )
        .await;
        delivered = listed["deliveries"][0].clone();
        if delivered["status"] == "delivered" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(delivered["status"], "delivered", "{delivered}");
    assert_eq!(delivered["id"], id.as_str());
    let ids: Vec<String> = receiver
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|(h, _)| h["webhook-id"].to_str().unwrap().to_owned())
        .collect();
    assert!(ids.iter().all(|seen| *seen == id), "{ids:?}");
    assert!(ids.len() >= 2, "{ids:?}");
}

/// A turn waiting for a person is parked by the replica that ran it (no
/// worker, no lease); that replica is killed; the decision, sent to
/// another replica, wakes the turn there, at once (not at its wait's end
/// a day later), and the write runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_turn_goes_on_where_its_decision_comes_after_its_replica_died() {
    let vault = crate::helpers::vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let vault_dir = vault.path().to_str().unwrap().to_owned();
    let settings = [
        ("HARNESS_APPROVAL_REQUIRED", "LOCAL_WRITE"),
        ("HARNESS_PARK_AFTER", "0s"),
        ("HARNESS_VAULT_DIR", vault_dir.as_str()),
    ];
    let Some((_db, provider, mut replicas)) = replicas_with(2, &settings).await else {
        return;
    };
    provider.enqueue([
        Reply::openai_tool_call(
            "call_w",
            "write_note",
            &json!({"path": "notes/a.md", "content": "decided elsewhere"}),
        ),
        Reply::openai_text("Written."),
    ]);
    let client = reqwest::Client::new();
    let response = client
        .post(replicas[0].url("/sessions/s-parked/turns"))
        .header("accept", "text/event-stream")
        .json(&json!({"message": "Change my note."}))
        .send()
        .await
        .unwrap();
    let mut stream = SseStream::new(response).await;
    let turn = stream.turn_id();
    stream.read_until("approval.requested").await;
    let record_url = |replica: &Replica| replica.url(&format!("/sessions/s-parked/turns/{turn}"));
    let mut parked = false;
    for _ in 0..250 {
        let (_, record) = get_json(&client, record_url(&replicas[1])).await;
        if record["parked_until"].is_string() {
            parked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(parked, "the turn never parked");
    replicas[0].kill();

    let decided = Instant::now();
    let answer = client
        .post(replicas[1].url(&format!("/sessions/s-parked/turns/{turn}/approvals/call_w")))
        .json(&json!({"approve": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let mut follower = follow(&client, &replicas[1], "s-parked", &turn, None).await;
    let rest = follower.read_to_end().await;
    assert!(
        decided.elapsed() < Duration::from_secs(5),
        "{:?}",
        decided.elapsed()
    );
    let resumed = rest.iter().find(|e| e.event == "turn.resumed").unwrap();
    assert_eq!(resumed.json()["owner"], "replica-1");
    assert_eq!(rest.last().unwrap().event, "turn.completed");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "decided elsewhere");
    let writes = rest
        .iter()
        .filter(|e| e.event == "tool.finished" && e.json()["tool"] == "write_note")
        .count();
    assert_eq!(writes, 1);
    let metrics = replicas[1].get_text("/metrics").await;
    assert!(
        metrics.contains("agent_harness_turns_unparked_total 1"),
        "{metrics}"
    );
}
