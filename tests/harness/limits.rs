//! Error paths and limits: late tools, the deadline, max_steps, provider
//! errors, oversized outputs.

use std::{
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use async_trait::async_trait;
use harness_base::{
    events::TurnEvent,
    providers::{
        ProviderError, ProviderFailure,
        scripted::{Scripted, call, calls, text},
    },
};
use harness_core::{
    harness::{
        HarnessOptions, MAX_STEPS_TEXT, TIMEOUT_TEXT, TurnError,
        hooks::{ArtifactStore, HookError, LongOutput},
        state::TraceStatus,
    },
    tools::{EffectClass, Tool, ToolOutput},
};
use serde_json::json;

use crate::helpers::{
    Fixed, Probe, Stubborn, builder, options, request, run, scripted, tool_messages,
};

fn mentions_secret(events: &[TurnEvent]) -> bool {
    events.iter().any(|e| {
        serde_json::to_string(e)
            .unwrap()
            .contains("LATE-SECRET-RESULT")
    })
}

#[tokio::test(start_paused = true)]
async fn a_tool_past_its_timeout_finishes_late_and_writes_nothing() {
    let stubborn = Stubborn::new(Duration::from_secs(3));
    let provider = scripted([calls(vec![call("c1", "stubborn", json!({}))]), text("done")]);
    let harness = builder(&provider, vec![stubborn.clone() as Arc<dyn Tool>]).build();
    let ran = run(&harness, request("go")).await;
    assert_eq!(ran.text(), "done");
    assert_eq!(
        ran.sink.finished(),
        [("stubborn".into(), "timed_out".into(), None)]
    );
    // It timed out and was not retryable: blocked.
    assert_eq!(ran.state.blocked_tools(), ["stubborn"]);
    assert_eq!(
        stubborn.finished.load(Ordering::SeqCst),
        0,
        "still working when the turn ended"
    );
    let events_at_end = ran.sink.events();

    // Let the tool finish after the turn ended.
    harness.wait_for_tool_tasks().await;
    assert_eq!(stubborn.finished.load(Ordering::SeqCst), 1);
    assert_eq!(
        ran.state.trace_entry("c1").unwrap().status,
        TraceStatus::TimedOutLate
    );
    assert_eq!(ran.sink.events(), events_at_end, "no event after the turn");
    assert!(!mentions_secret(&ran.sink.events()));
    let results = ran.state.tool_results();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].status.as_str(), "timed_out");
    assert!(
        results
            .iter()
            .all(|r| !r.content.contains("LATE-SECRET-RESULT"))
    );
    assert!(!tool_messages(&provider.requests()[1])[0].contains("LATE-SECRET-RESULT"));
}

#[tokio::test(start_paused = true)]
async fn a_late_finish_during_the_turn_is_noted_without_its_result() {
    let stubborn = Stubborn::new(Duration::from_secs(3));
    let provider = scripted([
        calls(vec![call("c1", "stubborn", json!({}))]),
        // The next generation takes long enough for the tool to come back.
        Scripted::After(Duration::from_secs(5), Box::new(text("done"))),
    ]);
    let harness = builder(&provider, vec![stubborn.clone() as Arc<dyn Tool>]).build();
    let ran = run(&harness, request("go")).await;
    assert_eq!(ran.text(), "done");
    let late: Vec<_> = ran
        .sink
        .events()
        .into_iter()
        .filter(|e| matches!(e, TurnEvent::ToolLate { .. }))
        .collect();
    assert_eq!(late.len(), 1);
    assert!(
        matches!(&late[0], TurnEvent::ToolLate { call_id, tool, .. } if call_id == "c1" && tool == "stubborn")
    );
    assert!(!mentions_secret(&ran.sink.events()));
    assert_eq!(ran.state.tool_results().len(), 1);
    assert_eq!(
        ran.state.trace_entry("c1").unwrap().status,
        TraceStatus::TimedOutLate
    );
}

#[tokio::test(start_paused = true)]
async fn the_deadline_mid_loop_ends_the_turn_with_the_timeout_text() {
    let probe = Probe::new("probe", EffectClass::ReadOnly);
    let step = |i: usize| {
        calls(vec![call(
            &format!("c{i}"),
            "probe",
            json!({"key": format!("k{i}"), "ms": 4000}),
        )])
    };
    let provider = scripted([step(1), step(2), step(3), step(4)]);
    let harness = builder(&provider, vec![probe as Arc<dyn Tool>])
        .options(HarnessOptions {
            timeout: Duration::from_secs(10),
            ..options()
        })
        .build();
    let ran = run(&harness, request("go")).await;
    assert_eq!(ran.text(), TIMEOUT_TEXT);
    assert!(ran.state.timed_out());
    // The third call was clamped to the 2 s left and timed out.
    let statuses: Vec<String> = ran.sink.finished().into_iter().map(|f| f.1).collect();
    assert_eq!(statuses, ["completed", "completed", "timed_out"]);
    assert_eq!(provider.requests().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_during_generation_ends_the_turn_with_the_timeout_text() {
    let provider = scripted([Scripted::Stall]);
    let harness = builder(&provider, vec![])
        .options(HarnessOptions {
            timeout: Duration::from_secs(5),
            ..options()
        })
        .build();
    let ran = run(&harness, request("go")).await;
    assert_eq!(ran.text(), TIMEOUT_TEXT);
    assert!(ran.state.timed_out());
}

#[tokio::test(start_paused = true)]
async fn exhausting_max_steps_ends_with_the_fallback_text() {
    let probe = Probe::new("probe", EffectClass::ReadOnly);
    let provider = scripted((0..10).map(|i| {
        calls(vec![call(
            &format!("c{i}"),
            "probe",
            json!({"key": format!("k{i}"), "ms": 1}),
        )])
    }));
    let harness = builder(&provider, vec![probe as Arc<dyn Tool>]).build();
    let ran = run(&harness, request("go")).await;
    assert_eq!(ran.text(), MAX_STEPS_TEXT);
    assert_eq!(provider.requests().len(), 6, "max_steps defaults to 6");
    assert_eq!(ran.state.budget.steps_used(), 6);
    assert!(!ran.state.timed_out());
}

#[tokio::test]
async fn a_provider_error_fails_the_turn_with_its_code() {
    let failure = ProviderFailure {
        status: 401,
        message: "bad key".into(),
        body: String::new(),
    };
    let provider = scripted([Scripted::Fail(ProviderError::Auth(failure))]);
    let harness = builder(&provider, vec![]).build();
    let ran = run(&harness, request("go")).await;
    match ran.output {
        Err(e @ TurnError::Provider(_)) => assert_eq!(e.code(), "provider_auth_failed"),
        other => panic!("expected a provider error, got {other:?}"),
    }
}

#[derive(Default)]
struct Artifacts(Mutex<Vec<(String, usize)>>);

#[async_trait]
impl ArtifactStore for Artifacts {
    async fn put(&self, output: LongOutput<'_>) -> Result<String, HookError> {
        self.0
            .lock()
            .unwrap()
            .push((output.call_id.to_owned(), output.content.len()));
        Ok("art-1".into())
    }
}

/// An output over 2,000 characters is kept as an artifact (a client is
/// shown its first 2,000 and the artifact); over 12,000, the model gets
/// its first 2,000 and the artifact's id; up to 12,000 it gets it whole.
#[tokio::test]
async fn long_outputs_are_kept_as_artifacts_and_the_longest_reach_the_model_cut() {
    let big = Fixed::ok("dump", ToolOutput::text("x".repeat(13_000)));
    let small = Fixed::ok("note", ToolOutput::text("y".repeat(12_000)));
    let provider = scripted([
        calls(vec![
            call("c1", "dump", json!({})),
            call("c2", "note", json!({})),
        ]),
        text("done"),
    ]);
    let artifacts = Arc::new(Artifacts::default());
    let harness = builder(&provider, vec![big, small])
        .artifacts(artifacts.clone())
        .build();
    run(&harness, request("go")).await;
    assert_eq!(
        *artifacts.0.lock().unwrap(),
        [("c1".to_owned(), 13_000), ("c2".to_owned(), 12_000)]
    );
    let told = tool_messages(&provider.requests()[1]);
    assert!(
        told[0].starts_with("[output of 13000 characters stored as artifact art-1;"),
        "{}",
        &told[0][..80]
    );
    assert_eq!(told[0].matches('x').count(), 2_000);
    assert_eq!(told[1], "y".repeat(12_000), "12,000 characters stay inline");
}

/// The write gate closes however the turn ends. A turn that fails (its
/// provider refuses the next step) while a tool still works: the tool
/// finishes later and writes nothing, no event, no result.
#[tokio::test(start_paused = true)]
async fn after_a_failed_turn_a_late_tool_writes_nothing() {
    let stubborn = Stubborn::new(Duration::from_secs(3));
    let failure = ProviderFailure {
        status: 401,
        message: "bad key".into(),
        body: String::new(),
    };
    let provider = scripted([
        calls(vec![call("c1", "stubborn", json!({}))]),
        Scripted::Fail(ProviderError::Auth(failure)),
    ]);
    let harness = builder(&provider, vec![stubborn.clone() as Arc<dyn Tool>]).build();
    let ran = run(&harness, request("go")).await;
    assert!(ran.output.is_err(), "the turn failed");
    let events_at_end = ran.sink.events();
    let results_at_end = ran.state.tool_results().len();
    harness.wait_for_tool_tasks().await;
    assert_eq!(stubborn.finished.load(Ordering::SeqCst), 1);
    assert_eq!(ran.sink.events(), events_at_end, "no event after the turn");
    assert_eq!(ran.state.tool_results().len(), results_at_end);
    assert!(!mentions_secret(&ran.sink.events()));
    assert!(
        ran.state
            .tool_results()
            .iter()
            .all(|r| !r.content.contains("LATE-SECRET-RESULT"))
    );
}

/// A turn cancelled (its future dropped, as the runner does) while a tool
/// works: the tool finishes later and writes nothing.
#[tokio::test(start_paused = true)]
async fn after_a_cancelled_turn_a_late_tool_writes_nothing() {
    let stubborn = Stubborn::new(Duration::from_millis(800));
    let provider = scripted([calls(vec![call("c1", "stubborn", json!({}))]), text("done")]);
    let harness = builder(&provider, vec![stubborn.clone() as Arc<dyn Tool>]).build();
    let request = request("go");
    let sink = Arc::new(crate::helpers::RecordingSink::default());
    let state = harness.new_state(&request.session_id);
    // Cancelled while the tool works (it needs 0.8 s).
    let turn = harness.run_turn_with_state(request, sink.clone(), state.clone());
    assert!(
        tokio::time::timeout(Duration::from_millis(300), turn)
            .await
            .is_err()
    );
    let events_at_end = sink.events();
    harness.wait_for_tool_tasks().await;
    assert_eq!(stubborn.finished.load(Ordering::SeqCst), 1);
    assert_eq!(sink.events(), events_at_end, "no event after the cancel");
    assert!(state.tool_results().is_empty(), "no result recorded");
    assert!(!mentions_secret(&sink.events()));
}

/// The fields of each closed `gen_ai.execute_tool` span, in the order the
/// spans closed.
#[derive(Clone, Default)]
struct ToolSpans(Arc<Mutex<Vec<std::collections::BTreeMap<String, String>>>>);

type Fields = std::collections::BTreeMap<String, String>;

struct FieldVisitor<'a>(&'a mut Fields);

impl tracing::field::Visit for FieldVisitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").replace('"', ""),
        );
    }
}

impl<S> tracing_subscriber::Layer<S> for ToolSpans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attributes: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if attributes.metadata().name() != "gen_ai.execute_tool" {
            return;
        }
        let mut fields = Fields::new();
        attributes.record(&mut FieldVisitor(&mut fields));
        ctx.span(id).unwrap().extensions_mut().insert(fields);
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let span = ctx.span(id).unwrap();
        if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
            values.record(&mut FieldVisitor(fields));
        }
    }

    fn on_close(&self, id: tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(fields) = ctx.span(&id).unwrap().extensions_mut().remove::<Fields>() {
            self.0.lock().unwrap().push(fields);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn each_tool_call_has_a_span_that_says_how_it_failed() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let spans = ToolSpans::default();
    let _default = crate::capture::capture(tracing_subscriber::registry().with(spans.clone()));
    let provider = scripted([
        calls(vec![
            call("c1", "fixed", json!({})),
            call("c2", "broken", json!({})),
            call("c3", "stubborn", json!({})),
        ]),
        text("done"),
    ]);
    let tools = vec![
        Fixed::ok("fixed", ToolOutput::text("fine")) as Arc<dyn Tool>,
        Fixed::err("broken", false),
        Stubborn::new(Duration::from_secs(3)),
    ];
    let harness = builder(&provider, tools).build();
    let ran = run(&harness, request("go")).await;
    assert_eq!(ran.text(), "done");
    harness.wait_for_tool_tasks().await;

    // (call, span name, error.type, otel.status_code)
    let mut seen: Vec<[String; 4]> = spans
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|f| {
            [
                "gen_ai.tool.call.id",
                "otel.name",
                "error.type",
                "otel.status_code",
            ]
            .map(|key| f.get(key).cloned().unwrap_or_default())
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ["c1", "execute_tool fixed", "", ""],
            ["c2", "execute_tool broken", "failed", "ERROR"],
            ["c3", "execute_tool stubborn", "timeout", "ERROR"],
        ]
        .map(|fields| fields.map(str::to_owned))
    );
}
