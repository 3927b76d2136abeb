//! Turns that outlive their process: service processes killed with
//! SIGKILL at random points of tool turns (while the model streams, during
//! a read-only wave, during a write, between steps), again and again. Every
//! turn ends `completed` with its whole answer, the write tool runs at most
//! once per call, and a client that re-attaches with `Last-Event-ID` gets
//! every event exactly once.
//!
//! `TAKEOVER_KILLS` sets the kills per backend (default 10; the note of
//! issue 25 gives the figures of a 200-kill run).

use crate::support::reply::JsonReply as _;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Json, Router,
    extract::{Query, State},
    routing::{get, post},
};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{ServiceProcess, SseEvent, SseStream},
    support::{Backend, TestDb, postgres_or_skip},
};

/// The answer every turn ends with, streamed a piece at a time.
const ANSWER: [&str; 12] = [
    "The ",
    "job ",
    "is ",
    "done: ",
    "looked ",
    "up, ",
    "recorded, ",
    "and ",
    "answered ",
    "in ",
    "full",
    ".",
];

/// What the tools of the test saw: executions of the write tool by key,
/// and its effects (an `Idempotency-Key` seen before has none).
#[derive(Default)]
struct Ledger {
    writes: Mutex<HashMap<String, u32>>,
    effects: Mutex<HashMap<String, u32>>,
    keys: Mutex<std::collections::HashSet<String>>,
    reads: Mutex<u32>,
}

#[derive(serde::Deserialize)]
struct Call {
    key: String,
    ms: Option<u64>,
}

async fn read(State(ledger): State<Arc<Ledger>>, Query(call): Query<Call>) -> Json<Value> {
    tokio::time::sleep(Duration::from_millis(call.ms.unwrap_or(0))).await;
    *ledger.reads.lock().unwrap() += 1;
    Json(json!({"key": call.key, "value": "found"}))
}

async fn write(
    State(ledger): State<Arc<Ledger>>,
    headers: axum::http::HeaderMap,
    Json(call): Json<Call>,
) -> Json<Value> {
    tokio::time::sleep(Duration::from_millis(call.ms.unwrap_or(0))).await;
    *ledger
        .writes
        .lock()
        .unwrap()
        .entry(call.key.clone())
        .or_default() += 1;
    // `{turn id}:{call id}`: the same for a call made again.
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    assert!(key.ends_with(&format!(":call_write_{}", call.key)), "{key}");
    if ledger.keys.lock().unwrap().insert(key) {
        *ledger
            .effects
            .lock()
            .unwrap()
            .entry(call.key.clone())
            .or_default() += 1;
    }
    Json(json!({"key": call.key, "recorded": true}))
}

/// The tools' server; the `HARNESS_HTTP_TOOLS` that declares them (the
/// write tool `idempotent` or not).
async fn tool_server(ledger: Arc<Ledger>, idempotent: bool) -> String {
    let app = Router::new()
        .route("/read", get(read))
        .route("/write", post(write))
        .with_state(ledger);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let parameters = json!({
        "type": "object",
        "properties": {"key": {"type": "string"}, "ms": {"type": "integer"}},
        "required": ["key"],
    });
    json!([
        {"name": "look_up", "description": "Look a key up.", "method": "GET",
         "url": format!("{base}/read"), "effect": "READ_ONLY", "parameters": parameters},
        {"name": "record", "description": "Record a key.", "method": "POST",
         "url": format!("{base}/write"), "effect": "LOCAL_WRITE", "parameters": parameters,
         "idempotent": idempotent},
    ])
    .to_string()
}

/// A model that answers by the conversation, as a real one does: look the
/// job up, then record it, then answer; asked again for a step (after a
/// take-over), it answers the same.
fn model(provider: &FakeProvider) {
    provider.respond_with(Arc::new(|body: &Value| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if !body["tools"].is_array() {
            // A reflection: no tools offered.
            return Reply::openai_text("Noted.");
        }
        let asked = messages
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default();
        let key = asked
            .split_whitespace()
            .find(|w| w.starts_with("job-"))
            .unwrap_or("job-?")
            .to_owned();
        match messages.iter().filter(|m| m["role"] == "tool").count() {
            0 => Reply::openai_tool_call(
                &format!("call_read_{key}"),
                "look_up",
                &json!({"key": key, "ms": 300}),
            ),
            1 => Reply::openai_tool_call(
                &format!("call_write_{key}"),
                "record",
                &json!({"key": key, "ms": 200}),
            ),
            _ => Reply::openai_deltas(&ANSWER).pace(Duration::from_millis(15)),
        }
    }));
}

async fn start(
    db_url: &str,
    provider: &FakeProvider,
    tools: &str,
    instance: &str,
) -> ServiceProcess {
    ServiceProcess::start(
        db_url,
        provider,
        &[
            ("HARNESS_INSTANCE_ID", instance),
            ("HARNESS_HEARTBEAT_INTERVAL_S", "1"),
            ("HARNESS_HTTP_TOOLS", tools),
            ("HARNESS_TURN_TIMEOUT_S", "120"),
            ("HARNESS_TURN_MAX_ATTEMPTS", "100"),
        ],
        None,
    )
    .await
}

/// A small deterministic generator for the kill times.
fn kill_after(round: u64) -> Duration {
    let mixed = round
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    Duration::from_millis((mixed >> 33) % 1_400)
}

fn kills() -> u64 {
    std::env::var("TAKEOVER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

/// What the rounds saw, for the figures.
#[derive(Debug, Default)]
struct Tally {
    rounds: u64,
    taken_over: u64,
    unknown_writes: u64,
    /// Milliseconds from a kill to the first event of the turn's next life
    /// (`turn.resumed`), as a re-attached client sees it.
    resumed_after_ms: Vec<u64>,
}

/// One round: a turn posted to `replicas[owner]`, its owner killed at a
/// random point and started again, the client re-attached to `reattach`
/// with `Last-Event-ID`; returns whether the kill caught the turn running.
async fn round(
    client: &reqwest::Client,
    replicas: &mut [ServiceProcess],
    owner: usize,
    reattach: usize,
    restart: impl AsyncFnOnce() -> ServiceProcess,
    number: u64,
    tally: &mut Tally,
) {
    let session = format!("s-kill-{number}");
    let response = client
        .post(replicas[owner].url(&format!("/sessions/{session}/turns")))
        .header("accept", "text/event-stream")
        .json(&json!({"message": format!("Please do job-{number} now.")}))
        .send()
        .await
        .unwrap();
    let mut stream = SseStream::new(response).await;
    assert_eq!(stream.status, 200);
    let turn = stream.turn_id();
    let mut seen: Vec<SseEvent> = Vec::new();
    let until = Instant::now() + kill_after(number);
    let mut ended = false;
    loop {
        tokio::select! {
            event = stream.next() => match event {
                Some(event) => {
                    ended = event.event.starts_with("turn.") && event.event != "turn.started"
                        && event.event != "turn.resumed";
                    seen.push(event);
                    if ended {
                        break;
                    }
                }
                None => break,
            },
            () = tokio::time::sleep_until(until) => break,
        }
    }
    drop(stream);
    replicas[owner].kill();
    let killed = Instant::now();
    replicas[owner] = restart().await;
    if !ended {
        let last = seen.last().and_then(|e| e.id.clone());
        let mut request =
            client.get(replicas[reattach].url(&format!("/sessions/{session}/turns/{turn}/events")));
        if let Some(last) = last {
            request = request.header("last-event-id", last);
        }
        let mut follow = SseStream::new(request.send().await.unwrap()).await;
        assert_eq!(follow.status, 200);
        let mut resumed = false;
        while let Some(event) = follow.next().await {
            if event.event == "turn.resumed" && !resumed {
                resumed = true;
                tally.taken_over += 1;
                tally
                    .resumed_after_ms
                    .push(u64::try_from(killed.elapsed().as_millis()).unwrap_or(u64::MAX));
            }
            let last = event.event.starts_with("turn.")
                && !matches!(event.event.as_str(), "turn.started" | "turn.resumed");
            seen.push(event);
            if last {
                break;
            }
        }
    }
    let types: Vec<&str> = seen.iter().map(|e| e.event.as_str()).collect();
    let terminal = seen.last().unwrap();
    assert_eq!(
        terminal.event, "turn.completed",
        "round {number}: {types:?}"
    );
    let text = terminal.json()["result"]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(text, ANSWER.concat(), "round {number}: the whole answer");
    // Every event once, in order, none missing.
    let seqs: Vec<i64> = seen
        .iter()
        .map(|e| e.id.as_deref().unwrap().parse().unwrap())
        .collect();
    let expected: Vec<i64> = (1..=seqs.len() as i64).collect();
    assert_eq!(seqs, expected, "round {number}: {types:?}");
    tally.unknown_writes += seen
        .iter()
        .filter(|e| e.event == "tool.finished" && e.json()["status"] == "unknown")
        .count() as u64;
    tally.rounds += 1;
}

#[expect(
    clippy::print_stdout,
    reason = "the run's figures, read with --nocapture for the take-over note"
)]
fn check(ledger: &Ledger, tally: &Tally, label: &str) {
    // The kill times fall over the whole turn: a good part of the turns
    // were caught running (else this proves nothing).
    assert!(
        tally.taken_over * 4 >= tally.rounds,
        "only {} of {} turns were caught running",
        tally.taken_over,
        tally.rounds
    );
    // The write's effects: once at most (each key once, whatever ran).
    let writes = ledger.effects.lock().unwrap();
    let twice: Vec<_> = writes.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "writes took effect more than once: {twice:?}"
    );
    let mut after = tally.resumed_after_ms.clone();
    after.sort_unstable();
    let at = |q: f64| {
        after
            .get(((after.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0)
    };
    println!(
        "{label}: {} rounds, {} taken over (kill to turn.resumed p50 {} ms, p99 {} ms), \
         {} writes run once each, {} writes ended unknown",
        tally.rounds,
        tally.taken_over,
        at(0.5),
        at(0.99),
        writes.len(),
        tally.unknown_writes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_finish_every_turn_whatever_kill_9_interrupts() {
    if !postgres_or_skip().await {
        return;
    }
    let db = TestDb::new(Backend::Postgres).await;
    db.open().await;
    let url = db.postgres_service_url();
    let ledger = Arc::new(Ledger::default());
    let tools = tool_server(ledger.clone(), false).await;
    let provider = FakeProvider::start().await;
    model(&provider);
    let mut replicas = Vec::new();
    for i in 0..3 {
        replicas.push(start(&url, &provider, &tools, &format!("replica-{i}")).await);
    }
    let client = reqwest::Client::new();
    let mut tally = Tally::default();
    for number in 0..kills() {
        let owner = (number % 3) as usize;
        let instance = format!("replica-{owner}");
        let (url, provider, tools) = (&url, &provider, &tools);
        round(
            &client,
            &mut replicas,
            owner,
            (owner + 1) % 3,
            async || start(url, provider, tools, &instance).await,
            number,
            &mut tally,
        )
        .await;
    }
    check(&ledger, &tally, "postgres, three replicas");
    // Not declared idempotent, a write is not even sent twice.
    let writes = ledger.writes.lock().unwrap();
    assert!(writes.values().all(|n| *n <= 1), "{writes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sqlite_process_restarted_finishes_every_turn_whatever_kill_9_interrupts() {
    let db = TestDb::new(Backend::Sqlite).await;
    db.open().await;
    let url = db.sqlite_url();
    let ledger = Arc::new(Ledger::default());
    let tools = tool_server(ledger.clone(), true).await;
    let provider = FakeProvider::start().await;
    model(&provider);
    let mut process = vec![start(&url, &provider, &tools, "single").await];
    let client = reqwest::Client::new();
    let mut tally = Tally::default();
    for number in 0..kills() {
        let (url, provider, tools) = (&url, &provider, &tools);
        round(
            &client,
            &mut process,
            0,
            0,
            async || start(url, provider, tools, "single").await,
            number,
            &mut tally,
        )
        .await;
    }
    check(
        &ledger,
        &tally,
        "sqlite, one process restarted, the write idempotent",
    );
    // Declared idempotent, a write that started in a dead process is made
    // again with its key: none ends unknown, each has its effect once.
    assert_eq!(tally.unknown_writes, 0);
    let effects = ledger.effects.lock().unwrap();
    assert_eq!(effects.len() as u64, tally.rounds);
    assert!(effects.values().all(|n| *n == 1), "{effects:?}");
}

/// A turn whose tool kills its process each time it runs (read-only, so
/// each new owner runs it again): taken over `HARNESS_TURN_MAX_ATTEMPTS`
/// (3) times, then ended `interrupted` by the next start, which lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_kills_its_process_every_time_ends_interrupted_after_its_take_overs() {
    let db = TestDb::new(Backend::Sqlite).await;
    db.open().await;
    let url = db.sqlite_url();
    let victim: Arc<Mutex<Option<u32>>> = Arc::default();
    let calls: Arc<Mutex<u32>> = Arc::default();
    let app = {
        let (victim, calls) = (victim.clone(), calls.clone());
        Router::new().route(
            "/crash",
            get(move || {
                let (victim, calls) = (victim.clone(), calls.clone());
                async move {
                    *calls.lock().unwrap() += 1;
                    // The calling process may still be starting: its pid is
                    // known once it is ready.
                    for _ in 0..1000 {
                        let pid = *victim.lock().unwrap();
                        if let Some(pid) = pid {
                            let _ = std::process::Command::new("kill")
                                .args(["-KILL", &pid.to_string()])
                                .status();
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    "crashed"
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let tools = json!([{"name": "crash", "description": "Crash.", "method": "GET",
        "url": format!("{base}/crash"), "effect": "READ_ONLY",
        "parameters": {"type": "object", "properties": {}}}])
    .to_string();
    let provider = FakeProvider::start().await;
    provider.respond_with(Arc::new(|body: &Value| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if body["tools"].is_array() && !messages.iter().any(|m| m["role"] == "tool") {
            Reply::openai_tool_call("call_crash", "crash", &json!({}))
        } else {
            Reply::openai_text("never reached")
        }
    }));
    let env = [
        ("HARNESS_INSTANCE_ID", "fragile"),
        ("HARNESS_HTTP_TOOLS", tools.as_str()),
    ];
    let mut process = ServiceProcess::start(&url, &provider, &env, None).await;
    *victim.lock().unwrap() = Some(process.pid());
    let client = reqwest::Client::new();
    let response = client
        .post(process.url("/sessions/s-fragile/turns"))
        .header("accept", "text/event-stream")
        .json(&json!({"message": "go"}))
        .send()
        .await
        .unwrap();
    let turn = response.headers()["x-turn-id"].to_str().unwrap().to_owned();
    drop(response);
    let mut starts = 1;
    let status = loop {
        // Wait for the tool to kill it, then start it again.
        let waited = Instant::now();
        while !process.exited() {
            assert!(
                waited.elapsed() < Duration::from_secs(20),
                "the process was not killed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The next process's pid is known once it is ready (a start that
        // takes the turn over may call the tool before: the tool waits).
        *victim.lock().unwrap() = None;
        process = ServiceProcess::start(&url, &provider, &env, None).await;
        starts += 1;
        *victim.lock().unwrap() = Some(process.pid());
        // The process may be gone again already (the tool killed it).
        let record: Value = match client
            .get(process.url(&format!("/sessions/s-fragile/turns/{turn}")))
            .send()
            .await
        {
            Ok(response) => response.json().await.unwrap_or_default(),
            Err(_) => Value::Null,
        };
        if (!record.is_null() && record["status"] != "running") || starts > 8 {
            break record["status"].clone();
        }
    };
    assert_eq!(status, "interrupted");
    let log: Value = client
        .get(process.url("/sessions/s-fragile/events"))
        .json_reply()
        .await;
    let types: Vec<&str> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert_eq!(
        types.iter().filter(|t| **t == "turn.resumed").count(),
        3,
        "{types:?}"
    );
    assert_eq!(types.last(), Some(&"turn.interrupted"));
    assert_eq!(
        *calls.lock().unwrap(),
        4,
        "the first life and three take-overs"
    );
}

/// One client's turn: posted to the first live replica that takes it, read
/// to its end, re-attached (with `Last-Event-ID`) wherever it can when its
/// stream ends early (its replica shut down); returns its events and how
/// long it took.
async fn turn_through_a_rolling_restart(
    client: &reqwest::Client,
    bases: &Mutex<Vec<String>>,
    number: u64,
) -> (Vec<SseEvent>, Duration) {
    let began = Instant::now();
    let session = format!("s-rolling-{number}");
    let mut pick = number as usize;
    let (mut stream, turn) = loop {
        let base = {
            let bases = bases.lock().unwrap();
            bases[pick % bases.len()].clone()
        };
        pick += 1;
        let posted = client
            .post(format!("{base}/sessions/{session}/turns"))
            .header("accept", "text/event-stream")
            .json(&json!({"message": format!("Please do job-r{number} now.")}))
            .send()
            .await;
        match posted {
            Ok(response) if response.status() == 200 => {
                let turn = response.headers()["x-turn-id"].to_str().unwrap().to_owned();
                break (SseStream::new(response).await, turn);
            }
            // Refused (shutting down) or gone: another replica.
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "no replica took the turn"
        );
    };
    let mut seen: Vec<SseEvent> = Vec::new();
    loop {
        while let Some(event) = stream.next().await {
            let last = event.event.starts_with("turn.")
                && !matches!(event.event.as_str(), "turn.started" | "turn.resumed");
            seen.push(event);
            if last {
                return (seen, began.elapsed());
            }
        }
        // The stream ended early: re-attach where it can be.
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "turn {turn} never ended"
        );
        let base = {
            let bases = bases.lock().unwrap();
            bases[pick % bases.len()].clone()
        };
        pick += 1;
        let mut request = client.get(format!("{base}/sessions/{session}/turns/{turn}/events"));
        if let Some(last) = seen.last().and_then(|e| e.id.clone()) {
            request = request.header("last-event-id", last);
        }
        match request.send().await {
            Ok(response) if response.status() == 200 => stream = SseStream::new(response).await,
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A rolling restart (each replica in turn stopped with SIGTERM and
/// started again) under a steady load of tool turns: every turn completes
/// whole, every write runs at most once, every client sees every event
/// once; the added latency of the handed-over turns is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_completes_every_turn() {
    if !postgres_or_skip().await {
        return;
    }
    const CLIENTS: u64 = 4;
    let db = TestDb::new(Backend::Postgres).await;
    db.open().await;
    let url = db.postgres_service_url();
    let ledger = Arc::new(Ledger::default());
    let tools = tool_server(ledger.clone(), false).await;
    let provider = FakeProvider::start().await;
    model(&provider);
    let mut replicas = Vec::new();
    for i in 0..3 {
        replicas.push(start(&url, &provider, &tools, &format!("rolling-{i}")).await);
    }
    let bases = Arc::new(Mutex::new(
        replicas.iter().map(|r| r.url("")).collect::<Vec<_>>(),
    ));
    let stop = tokio_util::sync::CancellationToken::new();
    let client = reqwest::Client::new();
    let mut load = Vec::new();
    for worker in 0..CLIENTS {
        let (client, bases, stop) = (client.clone(), bases.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut turns = Vec::new();
            for n in 0.. {
                if stop.is_cancelled() {
                    break;
                }
                let number = worker * 1000 + n;
                turns.push(turn_through_a_rolling_restart(&client, &bases, number).await);
            }
            turns
        }));
    }
    for (i, replica) in replicas.iter_mut().enumerate() {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        replica.terminate().await;
        *replica = start(&url, &provider, &tools, &format!("rolling-{i}")).await;
        bases.lock().unwrap()[i] = replica.url("");
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.cancel();
    let mut handed_over = Vec::new();
    let mut plain = Vec::new();
    for worker in load {
        for (events, took) in worker.await.unwrap() {
            let types: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
            let terminal = events.last().unwrap();
            assert_eq!(terminal.event, "turn.completed", "{types:?}");
            assert_eq!(
                terminal.json()["result"]["text"].as_str(),
                Some(ANSWER.concat().as_str())
            );
            let seqs: Vec<i64> = events
                .iter()
                .map(|e| e.id.as_deref().unwrap().parse().unwrap())
                .collect();
            assert_eq!(
                seqs,
                (1..=seqs.len() as i64).collect::<Vec<_>>(),
                "{types:?}"
            );
            if types.contains(&"turn.resumed") {
                handed_over.push(took);
            } else {
                plain.push(took);
            }
        }
    }
    let writes = ledger.writes.lock().unwrap();
    assert!(
        writes.values().all(|n| *n <= 1),
        "a write ran twice: {writes:?}"
    );
    assert!(!handed_over.is_empty(), "no turn was caught by a restart");
    plain.sort();
    handed_over.sort();
    let median = plain[plain.len() / 2];
    let p99 = handed_over[((handed_over.len() - 1) as f64 * 0.99) as usize];
    println!(
        "rolling restart: {} turns completed ({} handed over), plain turn p50 {} ms, \
         handed-over turn p99 {} ms (added {} ms), {} writes run once each",
        plain.len() + handed_over.len(),
        handed_over.len(),
        median.as_millis(),
        p99.as_millis(),
        p99.saturating_sub(median).as_millis(),
        writes.len()
    );
}

/// A write that waits for a person outlives its process: the process is
/// killed with SIGKILL while the call waits, the service starts again on
/// the same SQLite file, the person's decision goes to the new process,
/// and the turn ends with the write done once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_person_outlives_its_process() {
    let db = TestDb::new(Backend::Sqlite).await;
    db.open().await;
    let url = db.sqlite_url();
    let vault = crate::helpers::vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let provider = FakeProvider::start().await;
    provider.respond_with(Arc::new(|body: &Value| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if body["tools"].is_array() && !messages.iter().any(|m| m["role"] == "tool") {
            Reply::openai_tool_call(
                "call_wait",
                "write_note",
                &json!({"path": "notes/a.md", "content": "decided later"}),
            )
        } else {
            Reply::openai_text("Written.")
        }
    }));
    let vault_dir = vault.path().to_str().unwrap().to_owned();
    let env = [
        ("HARNESS_INSTANCE_ID", "waiting"),
        ("HARNESS_APPROVAL_REQUIRED", "LOCAL_WRITE"),
        ("HARNESS_VAULT_DIR", vault_dir.as_str()),
    ];
    let mut process = ServiceProcess::start(&url, &provider, &env, None).await;
    let client = reqwest::Client::new();
    let response = client
        .post(process.url("/sessions/s-waits/turns"))
        .header("accept", "text/event-stream")
        .json(&json!({"message": "Change my note."}))
        .send()
        .await
        .unwrap();
    let mut stream = SseStream::new(response).await;
    let turn = stream.turn_id();
    stream.read_until("approval.requested").await;
    process.kill();
    process = ServiceProcess::start(&url, &provider, &env, None).await;
    let decided = client
        .post(process.url(&format!(
            "/sessions/s-waits/turns/{turn}/approvals/call_wait"
        )))
        .json(&json!({"approve": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(decided.status(), 200);
    let mut record = Value::Null;
    for _ in 0..200 {
        record = client
            .get(process.url(&format!("/sessions/s-waits/turns/{turn}")))
            .json_reply()
            .await;
        if record["status"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "decided later");
    let log: Value = client
        .get(process.url("/sessions/s-waits/events?limit=1000"))
        .json_reply()
        .await;
    let events = log["events"].as_array().unwrap();
    let resolved: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "approval.resolved")
        .collect();
    assert_eq!(resolved.len(), 1, "{events:?}");
    assert_eq!(resolved[0]["outcome"], "approved");
    let writes = events
        .iter()
        .filter(|e| e["type"] == "tool.finished" && e["tool"] == "write_note")
        .count();
    assert_eq!(writes, 1, "the write ran once");
}

/// A parked wait outlives a restart: the turn waits for a person in the
/// database (`HARNESS_PARK_AFTER=0s`), the service is stopped (SIGTERM)
/// and started again on the same SQLite file, and the decision, posted to
/// the new process, wakes the turn there at once; the write runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_wait_outlives_a_restart() {
    let db = TestDb::new(Backend::Sqlite).await;
    db.open().await;
    let url = db.sqlite_url();
    let vault = crate::helpers::vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let provider = FakeProvider::start().await;
    provider.enqueue([
        Reply::openai_tool_call(
            "call_park",
            "write_note",
            &json!({"path": "notes/a.md", "content": "decided after a restart"}),
        ),
        Reply::openai_text("Written."),
    ]);
    let vault_dir = vault.path().to_str().unwrap().to_owned();
    let env = [
        ("HARNESS_INSTANCE_ID", "parking"),
        ("HARNESS_APPROVAL_REQUIRED", "LOCAL_WRITE"),
        ("HARNESS_PARK_AFTER", "0s"),
        ("HARNESS_VAULT_DIR", vault_dir.as_str()),
    ];
    let mut process = ServiceProcess::start(&url, &provider, &env, None).await;
    let client = reqwest::Client::new();
    let response = client
        .post(process.url("/sessions/s-parks/turns"))
        .header("accept", "text/event-stream")
        .json(&json!({"message": "Change my note."}))
        .send()
        .await
        .unwrap();
    let mut stream = SseStream::new(response).await;
    let turn = stream.turn_id();
    stream.read_until("approval.requested").await;
    let record_url = format!("/sessions/s-parks/turns/{turn}");
    let mut record = Value::Null;
    for _ in 0..250 {
        record = client.get(process.url(&record_url)).json_reply().await;
        if record["parked_until"].is_string() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(record["parked_until"].is_string(), "{record}");
    process.terminate().await;
    process = ServiceProcess::start(&url, &provider, &env, None).await;
    // Still parked: the new process took nothing over at its start.
    let record: Value = client.get(process.url(&record_url)).json_reply().await;
    assert_eq!(record["status"], "running", "{record}");
    assert!(record["parked_until"].is_string(), "{record}");
    let decided = client
        .post(process.url(&format!(
            "/sessions/s-parks/turns/{turn}/approvals/call_park"
        )))
        .json(&json!({"approve": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(decided.status(), 200);
    let mut record = Value::Null;
    for _ in 0..100 {
        record = client.get(process.url(&record_url)).json_reply().await;
        if record["status"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(
        std::fs::read_to_string(&note).unwrap(),
        "decided after a restart"
    );
    let log: Value = client
        .get(process.url("/sessions/s-parks/events?limit=1000"))
        .json_reply()
        .await;
    let events = log["events"].as_array().unwrap();
    let count = |kind: &str| events.iter().filter(|e| e["type"] == kind).count();
    assert_eq!(count("approval.requested"), 1, "{events:?}");
    assert_eq!(count("tool.finished"), 1, "the write ran once");
}
