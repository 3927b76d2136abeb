//! Traces as a collector receives them: the binary exports OTLP/HTTP JSON
//! to a receiver in this test. An incoming `traceparent` is continued; the
//! resource is OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; provider
//! calls are CLIENT spans with typed GenAI attributes; each tool call has a
//! span of its own.

use std::{
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, body::Bytes, routing::post};
use serde_json::Value;

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
    let collector_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, collector).await });

    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent-harness"))
        .env_clear()
        .env("HARNESS_PROVIDERS", "demo:echo")
        .env("HARNESS_LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "DATABASE_URL",
            format!("sqlite://{}/h.db", dir.path().display()),
        )
        .env("HARNESS_VAULT_DIR", dir.path().join("vault"))
        .env("HARNESS_LOG_FORMAT", "json")
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{collector_addr}"),
        )
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .env("OTEL_SERVICE_NAME", "harness-under-test")
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=test,service.name=overridden",
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    for _ in 0..200 {
        if client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
