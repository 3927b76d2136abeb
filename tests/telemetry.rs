//! Traces as a collector receives them: the binary exports OTLP/HTTP JSON
//! to a receiver in this test. An incoming `traceparent` is continued; the
//! resource is OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; provider
//! calls are CLIENT spans with typed GenAI attributes; each tool call has a
//! span of its own.

#![allow(
    clippy::disallowed_methods,
    reason = "a test's (the bench's) own servers and clients live as long as it does"
)]
#![allow(
    clippy::too_many_lines,
    reason = "a test (a scenario) is one story told whole; the lint holds in the service code"
)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly; the lint holds in the service code"
)]

use std::{
    process::Command,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, body::Bytes, routing::post};
use serde_json::Value;

#[path = "support/listening.rs"]
mod listening;

#[path = "support/reply.rs"]
mod reply;

#[path = "support/fake_provider.rs"]
mod fake_provider;

use fake_provider::{FakeProvider, Reply};
use reply::JsonReply as _;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN_ID: &str = "00f067aa0ba902b7";

/// Every span of every export, with its resource's attributes.
fn spans(exports: &[Value]) -> Vec<(Value, Value)> {
    let mut all = Vec::new();
    for export in exports {
        for resource_spans in export["resourceSpans"].as_array().into_iter().flatten() {
            let resource = resource_spans["resource"]["attributes"].clone();
            for scope in resource_spans["scopeSpans"]
                .as_array()
                .into_iter()
                .flatten()
            {
                for span in scope["spans"].as_array().into_iter().flatten() {
                    all.push((resource.clone(), span.clone()));
                }
            }
        }
    }
    all
}

/// An OTLP/HTTP JSON collector on loopback: its address, and every export
/// it received.
/// The service (its SQLite file and vault in `dir`, any port) exporting
/// OTLP/HTTP JSON to the collector at `collector`.
fn traced_service(dir: &std::path::Path, collector: std::net::SocketAddr) -> Command {
    let mut command = listening::service_in(dir);
    command
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{collector}"))
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json");
    command
}

async fn collector() -> (std::net::SocketAddr, Arc<Mutex<Vec<Value>>>) {
    let received: Arc<Mutex<Vec<Value>>> = Arc::default();
    let sink = received.clone();
    let collector = Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let sink = sink.clone();
            async move {
                let export: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                sink.lock().unwrap().push(export);
                "{}"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, collector).await });
    (addr, received)
}

/// Waits (10 s at most) until the service at `base` is ready.
async fn wait_ready(client: &reqwest::Client, base: &str) {
    for _ in 0..200 {
        if client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the service at {base} did not become ready");
}

/// The value of attribute `key` (an OTLP `AnyValue` object).
fn attribute<'a>(attributes: &'a Value, key: &str) -> Option<&'a Value> {
    attributes
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_is_traced_in_the_callers_trace_with_typed_genai_spans() {
    // The collector.
    let (collector_addr, received) = collector().await;

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("service.log");
    let (stdout, stderr) = listening::log_file(&log);
    let mut child = traced_service(dir.path(), collector_addr)
        .env("HARNESS_PROVIDERS", "demo:echo")
        .env("OTEL_SERVICE_NAME", "harness-under-test")
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=test,service.name=overridden",
        )
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    let base = listening::listening_at(&log).await;
    let client = reqwest::Client::new();
    wait_ready(&client, &base).await;
    // A turn that searches the notes (the demo provider calls a tool).
    let response = client
        .post(format!("{base}/sessions/s-traced/turns"))
        .header("traceparent", format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01"))
        .json(&serde_json::json!({"message": "search my notes"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap();
    // SIGTERM: the service stops and flushes its spans.
    let stopped = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;

    let exports = received.lock().unwrap().clone();
    let spans = spans(&exports);
    assert!(!spans.is_empty(), "no spans were exported");
    let (resource, _) = &spans[0];
    assert_eq!(
        attribute(resource, "service.name"),
        Some(&serde_json::json!({"stringValue": "harness-under-test"}))
    );
    assert_eq!(
        attribute(resource, "deployment.environment"),
        Some(&serde_json::json!({"stringValue": "test"}))
    );
    let named = |prefix: &str| {
        spans
            .iter()
            .map(|(_, s)| s)
            .find(|s| s["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
            .unwrap_or_else(|| panic!("no span {prefix}: {spans:#?}"))
            .clone()
    };
    // The request continues the caller's trace.
    let request = spans
        .iter()
        .map(|(_, s)| s)
        .find(|s| {
            attribute(&s["attributes"], "url.path")
                == Some(&serde_json::json!({"stringValue": "/sessions/s-traced/turns"}))
        })
        .unwrap_or_else(|| panic!("no span of the turn's request: {spans:#?}"))
        .clone();
    assert_eq!(request["traceId"], TRACE_ID, "{request}");
    assert_eq!(request["parentSpanId"], PARENT_SPAN_ID, "{request}");
    assert_eq!(request["kind"], 2, "SERVER: {request}");
    // The provider call: CLIENT, in the same trace, tokens as integers,
    // finish reasons as an array of strings.
    let chat = named("chat ");
    assert_eq!(chat["traceId"], TRACE_ID, "{chat}");
    assert_eq!(chat["kind"], 3, "CLIENT: {chat}");
    let attributes = &chat["attributes"];
    assert_eq!(
        attribute(attributes, "gen_ai.operation.name"),
        Some(&serde_json::json!({"stringValue": "chat"}))
    );
    assert!(
        attribute(attributes, "gen_ai.usage.input_tokens")
            .is_some_and(|v| v.get("intValue").is_some()),
        "{chat}"
    );
    assert!(
        attribute(attributes, "gen_ai.response.finish_reasons")
            .and_then(|v| v["arrayValue"]["values"].as_array())
            .is_some_and(|values| values.iter().all(|v| v.get("stringValue").is_some())),
        "{chat}"
    );
    // The tool call has its own span.
    let tool = named("execute_tool local_search");
    assert_eq!(tool["traceId"], TRACE_ID, "{tool}");
    assert_eq!(
        attribute(&tool["attributes"], "gen_ai.tool.name"),
        Some(&serde_json::json!({"stringValue": "local_search"}))
    );
}

/// The fake provider: its first answer is a 500 whose message quotes
/// personal data (as an upstream error may quote the request), then the
/// recorded text answer.
async fn failing_once_provider() -> FakeProvider {
    let provider = FakeProvider::start().await;
    provider.enqueue([
        Reply::text(
            500,
            "application/json",
            r#"{"error":{"message":"upstream failed on a message from bob@example.com (card 4111 1111 1111 1111, phone +1 (555) 123-4567)","type":"server_error"}}"#,
        ),
        Reply::sse("openai/text.sse"),
    ]);
    provider
}

/// What the service wrote for observation in one turn with personal data
/// in its message and in a provider's error: its log lines (JSON), its
/// exported spans, its decision record and research observation; and the
/// history the next turn reads.
struct Observed {
    logs: String,
    spans: String,
    decision: Value,
    observation: Value,
    history: Value,
}

async fn observe_one_turn(redact: bool) -> Observed {
    let (collector_addr, received) = collector().await;
    let provider = failing_once_provider().await;
    let provider_url = provider.base_url.clone();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("service.log");
    let (stdout, stderr) = listening::log_file(&log);
    let mut child = traced_service(dir.path(), collector_addr)
        .env("HARNESS_PROVIDERS", "openai:gpt-4o-mini")
        .env("OPENAI_BASE_URL", &provider_url)
        .env("OPENAI_API_KEY", "sk-test")
        .env("HARNESS_PROVIDER_MAX_ATTEMPTS", "2")
        .env("HARNESS_PROVIDER_RETRY_BASE_MS", "10")
        .env("HARNESS_LOG", "debug")
        .env("HARNESS_REDACT_LOGS", redact.to_string())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    let base = listening::listening_at(&log).await;
    let client = reqwest::Client::new();
    wait_ready(&client, &base).await;
    let response = client
        .post(format!("{base}/sessions/s-private/turns"))
        .json(&serde_json::json!({
            "message": "I am bob@example.com, card 4111 1111 1111 1111; call +1 (555) 123-4567"
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap();
    let get = |path: &str| {
        let request = client.get(format!("{base}{path}"));
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let decision = get("/sessions/s-private/decisions").await["decisions"][0]["record"].clone();
    let observation = get("/sessions/s-private/observations").await["observations"][0].clone();
    let history = get("/sessions/s-private/messages").await;
    let stopped = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    let logs = std::fs::read_to_string(&log).unwrap();
    let spans = serde_json::to_string(&*received.lock().unwrap()).unwrap();
    Observed {
        logs,
        spans,
        decision,
        observation,
        history,
    }
}

/// With `HARNESS_REDACT_LOGS`, nothing written for observation shows the
/// e-mail address, the card number or the phone number: not a log line,
/// not a span (a log line inside a span is one of its events), not the
/// decision record nor the research observation; the history the next
/// turn reads keeps them. The same turn without it shows them in every one
/// of those places, so each place is one the masking has to reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redaction_nothing_written_for_observation_shows_personal_data() {
    let secrets = ["bob@example.com", "4111 1111 1111 1111", "123-4567"];
    let plain = observe_one_turn(false).await;
    let masked = observe_one_turn(true).await;
    for (observed, shows) in [(&plain, true), (&masked, false)] {
        let places = [
            ("logs", observed.logs.clone()),
            ("spans", observed.spans.clone()),
            ("decision record", observed.decision.to_string()),
            ("research observation", observed.observation.to_string()),
        ];
        for (place, text) in &places {
            assert!(!text.is_empty() && text != "null", "no {place}");
            for secret in secrets {
                assert_eq!(
                    text.contains(secret),
                    shows,
                    "{place} (redaction {}): {secret} in {text}",
                    if shows { "off" } else { "on" }
                );
            }
        }
        assert!(
            observed.history.to_string().contains("bob@example.com"),
            "the history keeps the message as it was sent"
        );
    }
    assert!(masked.logs.contains("[redacted]"), "{}", masked.logs);
}

/// A turn handed over at shutdown and taken over when the service starts
/// again: the span of its second life is a trace of its own, linked to the
/// span that began the turn in the caller's trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_taken_over_links_its_span_to_where_it_began() {
    let (collector_addr, received) = collector().await;
    // The first answer never comes; the life that takes the turn over
    // gets the recorded text.
    let provider = FakeProvider::start().await;
    let never = tokio_util::sync::CancellationToken::new();
    provider.enqueue([
        Reply::sse("openai/text.sse").hold_head(&never),
        Reply::sse("openai/text.sse"),
    ]);
    let provider_url = provider.base_url.clone();
    let dir = tempfile::tempdir().unwrap();
    // Each life listens where it chooses and logs to a file of its own.
    let start = |life: &str| {
        let log = dir.path().join(format!("{life}.log"));
        let (stdout, stderr) = listening::log_file(&log);
        let child = traced_service(dir.path(), collector_addr)
            .env("HARNESS_PROVIDERS", "openai:gpt-4o-mini")
            .env("OPENAI_BASE_URL", &provider_url)
            .env("OPENAI_API_KEY", "sk-test")
            .env("HARNESS_INSTANCE_ID", "replica-1")
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap();
        async move { (child, listening::listening_at(&log).await) }
    };
    let stop = |child: std::process::Child| async move {
        let stopped = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(stopped.success());
        let mut child = child;
        tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap()
            .unwrap();
    };
    let client = reqwest::Client::new();

    // The first life: the turn waits for the model when the service stops.
    let (first, base) = start("first").await;
    wait_ready(&client, &base).await;
    let response = client
        .post(format!("{base}/sessions/s-linked/turns"))
        .header("traceparent", format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01"))
        .header("accept", "text/event-stream")
        .json(&serde_json::json!({"message": "hello?"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let turn_id = response.headers()["x-turn-id"].to_str().unwrap().to_owned();
    let asked = tokio::time::Instant::now() + Duration::from_secs(10);
    while provider.requests().is_empty() {
        assert!(
            tokio::time::Instant::now() < asked,
            "the provider was never asked"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop(first).await;
    drop(response);

    // The second life: taken over as the service starts, and finished.
    let (second, base) = start("second").await;
    wait_ready(&client, &base).await;
    let mut status = Value::Null;
    for _ in 0..200 {
        let turn: Value = client
            .get(format!("{base}/sessions/s-linked/turns/{turn_id}"))
            .json_reply()
            .await;
        status = turn["status"].clone();
        if status != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, "completed");
    stop(second).await;

    let spans = spans(&received.lock().unwrap());
    let turn_spans: Vec<&Value> = spans
        .iter()
        .map(|(_, s)| s)
        .filter(|s| {
            s["name"] == "invoke_agent"
                && attribute(&s["attributes"], "turn.id")
                    == Some(&serde_json::json!({"stringValue": turn_id}))
        })
        .collect();
    assert_eq!(turn_spans.len(), 2, "one span per life: {turn_spans:#?}");
    let (began, resumed) = (turn_spans[0], turn_spans[1]);
    assert_eq!(began["traceId"], TRACE_ID, "{began}");
    assert!(
        began["links"].as_array().is_none_or(Vec::is_empty),
        "{began}"
    );
    assert_ne!(
        resumed["traceId"], TRACE_ID,
        "a trace of its own: {resumed}"
    );
    assert_eq!(
        attribute(&resumed["attributes"], "turn.attempt"),
        Some(&serde_json::json!({"intValue": "1"})),
        "{resumed}"
    );
    let links = resumed["links"].as_array().unwrap();
    assert_eq!(links.len(), 1, "{resumed}");
    assert_eq!(links[0]["traceId"], TRACE_ID, "{resumed}");
    assert_eq!(links[0]["spanId"], began["spanId"], "{resumed}");
}
