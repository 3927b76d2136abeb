//! A two-step tool turn over SSE, end to end.

use serde_json::{Value, json};

use crate::{
    fake_provider::Reply,
    helpers::{first_event, spawn_app, types},
    on_both_backends,
    support::Backend,
};

async fn a_two_step_tool_turn_streams_every_stage(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([
        Reply::sse("openai/text.sse"),
        Reply::sse("openai/tool_call_local_search.sse"),
        Reply::sse("openai/after_local_search.sse"),
    ]);
    // A first turn leaves something to find.
    let first = app
        .post_turn("s-tools", json!({"message": "Plan a Paris trip for me"}))
        .await;
    assert_eq!(first.status(), 200);

    let mut stream = app
        .post_turn_sse(
            "s-tools",
            json!({"message": "What did I ask before?", "show_citations": true}),
        )
        .await;
    let events = stream.read_to_end().await;
    let mut expected = vec!["turn.started", "usage", "tool.started", "tool.finished"];
    expected.extend(["message.delta"; 8]);
    expected.extend(["usage", "citations", "usage", "decision", "turn.completed"]);
    assert_eq!(types(&events), expected);

    let started = events[2].json();
    assert_eq!(started["tool"], "local_search");
    assert_eq!(started["call_id"], "call_Q3mZx7LpV2nB8cR5tK1wJd4H");
    assert_eq!(started["arguments"], json!({"query": "Paris trip"}));
    assert_eq!(started["wave"], 1);
    let finished = events[3].json();
    assert_eq!(finished["status"], "completed");
    assert_eq!(events[12].json()["step"], 2);
    let citations = events[13].json();
    assert_eq!(citations["local"], json!(["messages/1"]));
    let total = events[14].json();
    assert_eq!(total["input_tokens"], 212 + 268);
    let decision = events[15].json();
    assert_eq!(decision["strategy"], "retrieval_augmented");
    assert_eq!(decision["record"]["tools_used"], json!(["local_search"]));
    let result = &events[16].json()["result"];
    assert_eq!(
        result["text"],
        "You asked about a Paris trip before.\n\nLocal citations:\n- messages/1"
    );

    // The tool ran against the store: the model saw the earlier message.
    let requests = app.provider.requests();
    let messages = requests[2].body["messages"].as_array().unwrap();
    let tool = messages.last().unwrap();
    assert_eq!(tool["role"], "tool");
    assert_eq!(tool["tool_call_id"], "call_Q3mZx7LpV2nB8cR5tK1wJd4H");
    assert!(
        tool["content"]
            .as_str()
            .unwrap()
            .contains("[messages/1] (user) Plan a Paris trip for me"),
        "{tool}"
    );
    // The decision is stored with the turn.
    let (_, log) = app.get_json("/sessions/s-tools/events").await;
    assert!(
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "decision")
    );
}

/// A tool step's records (`harness::durable`) are in the store while its
/// turn runs, the model's call before the tool's result, and gone once
/// the turn has ended.
async fn a_tool_step_is_recorded_while_its_turn_runs(backend: Backend) {
    let app = spawn_app(backend).await;
    let gate = tokio_util::sync::CancellationToken::new();
    app.provider.enqueue([
        Reply::sse("openai/tool_call_local_search.sse"),
        Reply::sse("openai/after_local_search.sse").hold_head(&gate),
    ]);
    let mut stream = app
        .post_turn_sse("s-steps", json!({"message": "What did I ask before?"}))
        .await;
    let mut turn_id = None;
    while let Some(event) = stream.next().await {
        let event = event.json();
        turn_id = event["turn_id"].as_str().map(str::to_owned);
        if event["type"] == "tool.finished" {
            break;
        }
    }
    let turn_id: uuid::Uuid = turn_id.unwrap().parse().unwrap();
    let store = app.db.open().await;
    // The step's end is committed with its events, before the next call;
    // its calls only read, so the model's answer has no record of its own.
    let mut records = Vec::new();
    for _ in 0..100 {
        records = store.step_records(turn_id).await.unwrap();
        if !records.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let records: Vec<harness_core::harness::durable::StepRecord> = records
        .iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect();
    assert_eq!(records.len(), 1);
    let rebuilt = harness_core::harness::durable::rebuild(&records)
        .unwrap()
        .unwrap();
    assert_eq!(rebuilt.step, 1);
    assert_eq!(
        rebuilt.phase,
        harness_core::harness::durable::StepPhase::Finished
    );
    assert_eq!(rebuilt.tool_results.len(), 1);
    assert_eq!(rebuilt.tool_results[0].tool, "local_search");
    assert_eq!(rebuilt.state.tool_calls, 1);
    let last = rebuilt.messages.last().unwrap();
    assert_eq!(
        last.tool_call_id.as_deref(),
        Some("call_Q3mZx7LpV2nB8cR5tK1wJd4H")
    );
    gate.cancel();
    let events = stream.read_to_end().await;
    assert_eq!(types(&events).last(), Some(&"turn.completed"));
    assert!(store.step_records(turn_id).await.unwrap().is_empty());
}

on_both_backends!(
    a_two_step_tool_turn_streams_every_stage,
    a_tool_step_is_recorded_while_its_turn_runs
);

#[tokio::test]
async fn decisions_and_artifacts_are_served() {
    let app = spawn_app(Backend::Sqlite).await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    app.post_turn("s-dec", json!({"message": "Hi"})).await;
    let (status, body) = app.get_json("/sessions/s-dec/decisions").await;
    assert_eq!(status, 200, "{body}");
    let decisions = body["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), 1);
    assert_eq!(decisions[0]["decision_key"], "support.chat.turn");
    assert_eq!(decisions[0]["record"]["strategy"], "direct_answer");
    let (status, body) = app.get_json("/sessions/nobody/decisions").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("session_not_found"))
    );
    let store = app.db.open().await;
    store
        .put_artifact(&harness_store::store::NewArtifact {
            id: "art_1".into(),
            session_id: "s-dec".into(),
            turn_id: "t".into(),
            call_id: "c1".into(),
            tool: "dump".into(),
            content: "z".repeat(13_000),
            created_at: chrono::Utc::now(),
        })
        .await
        .unwrap();
    let (status, body) = app.get_json("/sessions/s-dec/artifacts/art_1").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["content"].as_str().unwrap().len(), 13_000);
    assert_eq!(body["tool"], "dump");
    let (status, body) = app.get_json("/sessions/s-dec/artifacts/art_missing").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("artifact_not_found"))
    );
}

#[tokio::test]
async fn metrics_count_turns_and_persisted_events() {
    let app = spawn_app(Backend::Sqlite).await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    app.post_turn("s-metrics", json!({"message": "Hi"})).await;
    let response = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text; version=1.0.0")
    );
    let text = response.text().await.unwrap();
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing: {text}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("agent_harness_turns_started_total"), 1.0);
    assert_eq!(value("agent_harness_turns_running"), 0.0);
    assert_eq!(
        value("agent_harness_turns_finished_total{status=\"completed\"}"),
        1.0
    );
    // Everything after turn.started went through the writer: 9 deltas,
    // 2 usage, the decision and turn.completed.
    assert_eq!(value("agent_harness_events_persisted_total"), 13.0);
    assert_eq!(value("agent_harness_sse_streams_open"), 0.0);
    // Histograms: the turn's latency and time to first token, one
    // provider call's tokens.
    assert_eq!(
        value("agent_harness_turn_duration_seconds_count{status=\"completed\"}"),
        1.0
    );
    assert_eq!(
        value("agent_harness_turn_time_to_first_token_seconds_count"),
        1.0
    );
    assert!(value("gen_ai_client_token_usage_sum{type=\"input\"}") > 0.0);
}

#[tokio::test]
async fn a_provider_that_answers_json_instead_of_a_stream_still_completes_a_tool_turn() {
    let app = spawn_app(Backend::Sqlite).await;
    app.provider.enqueue([
        Reply::sse("openai/text.sse"),
        Reply::body(
            200,
            "application/json",
            "openai/completion_local_search.json",
        ),
        Reply::body(200, "application/json", "openai/completion_text.json"),
    ]);
    app.post_turn("s-json", json!({"message": "Plan a Paris trip for me"}))
        .await;
    let mut stream = app
        .post_turn_sse("s-json", json!({"message": "What did I ask before?"}))
        .await;
    let events = stream.read_to_end().await;
    assert_eq!(
        types(&events),
        [
            "turn.started",
            "usage",
            "tool.started",
            "tool.finished",
            "message.delta",
            "usage",
            "citations",
            "usage",
            "decision",
            "turn.completed"
        ]
    );
    assert_eq!(events[3].json()["status"], "completed");
    assert_eq!(
        events[4].json()["text"],
        "You asked about a Paris trip before."
    );
    assert_eq!(events[7].json()["input_tokens"], 212 + 268);
    let result = &events[9].json()["result"];
    assert_eq!(result["text"], "You asked about a Paris trip before.");
}

/// The first `data:` frame of an SSE body whose `type` is `kind`.
fn data_of_type(body: &str, kind: &str) -> Value {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|c| c["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {body}"))
}

/// `dump`: answers `text`, whatever it is asked.
struct Dump {
    spec: harness_core::tools::ToolSpec,
    text: String,
}

#[async_trait::async_trait]
impl harness_core::tools::Tool for Dump {
    fn spec(&self) -> &harness_core::tools::ToolSpec {
        &self.spec
    }

    async fn call(
        &self,
        _: harness_core::tools::ToolContext,
        _: serde_json::Value,
    ) -> Result<harness_core::tools::ToolOutput, harness_core::tools::ToolError> {
        Ok(harness_core::tools::ToolOutput::text(self.text.clone()))
    }
}

/// A chat UI shows what a tool returned: `tool.finished` carries the
/// output (its first 2,000 characters, and the artifact that keeps the
/// whole of a longer one), as do the AI SDK's `tool-output-available` and
/// AG-UI's `TOOL_CALL_RESULT`. (Before, they carried only a status.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_output_reaches_the_client_in_every_format() {
    let long = format!("BEGIN {} END", "x".repeat(3_000));
    for (text, whole) in [("18°C and sunny", true), (long.as_str(), false)] {
        let provider = crate::fake_provider::FakeProvider::start().await;
        let settings = crate::helpers::test_settings(&provider);
        let tool = std::sync::Arc::new(Dump {
            spec: harness_core::tools::ToolSpec::new(
                "dump",
                "Says what it has.",
                json!({"type": "object"}),
                harness_core::tools::EffectClass::ReadOnly,
            ),
            text: text.to_owned(),
        });
        let app = crate::helpers::spawn_app_with_tools(
            crate::support::TestDb::new(crate::support::Backend::Sqlite).await,
            provider,
            settings,
            vec![tool],
        )
        .await;
        let script = || {
            [
                Reply::openai_tool_call("call_d1", "dump", &json!({})),
                Reply::sse("openai/text.sse"),
            ]
        };
        // The native stream.
        app.provider.enqueue(script());
        let events = app
            .post_turn_sse("s-out", json!({"message": "Dump it."}))
            .await
            .read_to_end()
            .await;
        let finished = first_event(&events, "tool.finished");
        let output = finished["output"].as_str().unwrap();
        assert_eq!(output, text.chars().take(2_000).collect::<String>());
        if whole {
            assert!(finished.get("artifact_id").is_none(), "{finished}");
        } else {
            let id = finished["artifact_id"].as_str().unwrap();
            let (status, artifact) = app
                .get_json(&format!("/sessions/s-out/artifacts/{id}"))
                .await;
            assert_eq!(status, 200);
            assert_eq!(artifact["content"], text);
        }
        // The AI SDK's UI message stream.
        app.provider.enqueue(script());
        let body = app
            .post_text(
                "/v1/ui/chat",
                json!({"id": "s-out-ui", "messages": [
                    {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Dump it."}]}
                ]}),
            )
            .await;
        let chunk = data_of_type(&body, "tool-output-available");
        let shown = chunk["output"].as_str().unwrap();
        assert!(shown.starts_with(output), "{chunk}");
        assert_eq!(shown.contains("artifact"), !whole, "{chunk}");
        // AG-UI.
        app.provider.enqueue(script());
        let body = app
            .post_text(
                "/v1/agui",
                json!({"threadId": "s-out-agui", "runId": "r1", "messages": [
                    {"id": "m1", "role": "user", "content": "Dump it."}
                ]}),
            )
            .await;
        let result = data_of_type(&body, "TOOL_CALL_RESULT");
        let content = result["content"].as_str().unwrap();
        assert!(content.starts_with(output), "{result}");
        assert_eq!(content.contains("artifact"), !whole, "{result}");
        // The Responses API: the call's item as its stream ends it.
        app.provider.enqueue(script());
        let body = app
            .post_text(
                "/v1/responses",
                json!({"input": "Dump it.", "stream": true}),
            )
            .await;
        let done = data_of_type(&body, "response.output_item.done");
        let shown = done["item"]["output"].as_str().unwrap();
        assert!(shown.starts_with(output), "{done}");
        assert_eq!(shown.contains("artifact"), !whole, "{done}");
    }
}
