//! How a turn stops, as its user sees it: the answer, the deadline, the
//! step limit or the answer's token limit, named in the result.

use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, spawn_app_with, test_settings},
    support::{Backend, TestDb},
};

/// `agent_harness_provider_errors_total{code="provider_timeout"}`.
async fn provider_timeouts(app: &TestApp) -> u64 {
    app.metric("agent_harness_provider_errors_total{code=\"provider_timeout\"}")
        .await as u64
}

/// A provider that never answers, in each way one can (no headers;
/// headers, then silence; keep-alive comments only), meets the turn's
/// deadline (1 s) before the provider idle timeout (60 s): the turn keeps
/// the seeds' behaviour (completed, the timeout text is its answer) and
/// says why it stopped, in the result, `turn.completed` and the decision
/// record; and each call counts as a provider timeout in the metrics.
/// (Before, nothing told it from an answer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_never_answers_stops_the_turn_at_its_deadline_and_says_so() {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.harness.turn_timeout_s = 1;
    let app = spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await;
    let never = CancellationToken::new();
    let hangs = [
        ("no-headers", Reply::openai_text("late").hold_head(&never)),
        (
            "silence",
            Reply::openai_deltas(&["late"]).hold_after(0, &never),
        ),
        (
            "comments",
            Reply::comments_only(100).pace(Duration::from_millis(100)),
        ),
    ];
    let before = provider_timeouts(&app).await;
    for (i, (name, reply)) in hangs.into_iter().enumerate() {
        app.provider.enqueue([reply]);
        let session = format!("s-hung-{name}");
        let mut stream = app.post_turn_sse(&session, json!({"message": "Hi"})).await;
        let events = stream.read_to_end().await;
        let end = events.last().unwrap();
        assert_eq!(end.event, "turn.completed", "{name}: {events:?}");
        let result = &end.json()["result"];
        assert_eq!(result["stop_reason"], "deadline", "{name}: {result}");
        assert_eq!(
            result["text"],
            harness_core::harness::TIMEOUT_TEXT,
            "{name}"
        );
        let (_, decisions) = app
            .get_json(&format!("/sessions/{session}/decisions"))
            .await;
        let record = &decisions["decisions"][0]["record"];
        assert_eq!(record["stop_reason"], "deadline", "{name}: {record}");
        assert_eq!(record["timed_out"], true, "{name}");
        assert_eq!(
            provider_timeouts(&app).await,
            before + i as u64 + 1,
            "{name}"
        );
    }
    never.cancel();
}

/// A stream of keep-alive comments and nothing else is idle: with the
/// provider idle timeout (1 s) shorter than the turn's deadline (30 s),
/// the call fails as a provider timeout within about a second instead of
/// running out the turn's time. (Before, every comment held the idle
/// timer off.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_comments_alone_is_idle() {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.harness.turn_timeout_s = 30;
    settings.providers.idle_timeout_s = 1;
    let app = spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await;
    app.provider
        .enqueue([Reply::comments_only(200).pace(Duration::from_millis(100))]);
    let started = tokio::time::Instant::now();
    let response = app.post_turn("s-comments", json!({"message": "Hi"})).await;
    let elapsed = started.elapsed();
    assert_eq!(response.status(), 502, "{elapsed:?}");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "provider_timeout", "{problem}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert_eq!(provider_timeouts(&app).await, 1);
}

/// The model's answer that stopped at its output-token limit
/// (`finish_reason: length`) ends the turn with `stop_reason: budget`; a
/// whole answer with `answer`; a turn whose every step asks for tools with
/// `max_steps`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_stop_reason_is_named() {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.harness.max_steps = 1;
    let app = spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await;
    let cut = crate::fake_provider::fixture("openai/text.sse")
        .replace("\"finish_reason\":\"stop\"", "\"finish_reason\":\"length\"");
    assert!(
        cut.contains("\"length\""),
        "the fixture names its finish reason"
    );
    app.provider.enqueue([
        Reply::sse("openai/text.sse"),
        Reply::raw_sse(&cut),
        Reply::openai_tool_call("call_1", "local_search", &json!({"query": "x"})),
    ]);
    for (session, reason) in [
        ("s-answer", "answer"),
        ("s-cut", "budget"),
        ("s-steps", "max_steps"),
    ] {
        let response = app.post_turn(session, json!({"message": "Hi"})).await;
        assert_eq!(response.status(), 200, "{session}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["stop_reason"], reason, "{session}: {body}");
    }
}
