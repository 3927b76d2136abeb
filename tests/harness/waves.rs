//! Stage 4e-4f: waves. A max-in-flight probe proves parallelism and its
//! absence; paused time proves a parallel wave takes one call's time.

use harness_base::{
    events::TurnEvent,
    providers::scripted::{call, calls, text},
};
use harness_core::{
    harness::HarnessOptions,
    tools::{EffectClass, Tool},
};
use serde_json::json;
use tokio::time::Instant;

use crate::helpers::{Fixed, Probe, builder, options, request, run, scripted, unfence};

fn probe_call(id: &str, key: &str) -> harness_base::providers::ToolCall {
    call(id, "probe", json!({"key": key, "ms": 100}))
}

fn waves_of(events: &[TurnEvent]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            TurnEvent::ToolStarted { wave, .. } => Some(*wave),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn disjoint_reads_run_in_one_parallel_wave() {
    let probe = Probe::new("probe", EffectClass::ReadOnly);
    let provider = scripted([
        calls(vec![
            probe_call("c1", "a"),
            probe_call("c2", "b"),
            probe_call("c3", "c"),
        ]),
        text("done"),
    ]);
    let harness = builder(&provider, vec![probe.clone() as std::sync::Arc<dyn Tool>]).build();
    let started = Instant::now();
    let ran = run(&harness, request("go")).await;
    assert_eq!(ran.text(), "done");
    assert_eq!(probe.max(), 3, "all three ran at once");
    assert!(
        started.elapsed() < std::time::Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(waves_of(&ran.sink.events()), [1, 1, 1]);
}

#[tokio::test(start_paused = true)]
async fn overlapping_keys_split_the_wave() {
    let probe = Probe::new("probe", EffectClass::ReadOnly);
    let provider = scripted([
        calls(vec![
            probe_call("c1", "a"),
            probe_call("c2", "b"),
            probe_call("c3", "a"),
        ]),
        text("done"),
    ]);
    let harness = builder(&provider, vec![probe.clone() as std::sync::Arc<dyn Tool>]).build();
    let ran = run(&harness, request("go")).await;
    assert_eq!(probe.max(), 2);
    assert_eq!(waves_of(&ran.sink.events()), [1, 1, 2]);
}

#[tokio::test(start_paused = true)]
async fn writes_network_and_destructive_calls_run_one_per_wave() {
    for effect in [
        EffectClass::LocalWrite,
        EffectClass::Network,
        EffectClass::Destructive,
    ] {
        let probe = Probe::new("probe", effect);
        let provider = scripted([
            calls(vec![
                probe_call("c1", "a"),
                probe_call("c2", "b"),
                probe_call("c3", "c"),
            ]),
            text("done"),
        ]);
        let harness = builder(&provider, vec![probe.clone() as std::sync::Arc<dyn Tool>]).build();
        let ran = run(&harness, request("go")).await;
        assert_eq!(probe.max(), 1, "{effect:?}");
        assert_eq!(waves_of(&ran.sink.events()), [1, 2, 3], "{effect:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn parallel_disabled_runs_reads_one_at_a_time() {
    let probe = Probe::new("probe", EffectClass::ReadOnly);
    let provider = scripted([
        calls(vec![probe_call("c1", "a"), probe_call("c2", "b")]),
        text("done"),
    ]);
    let harness = builder(&provider, vec![probe.clone() as std::sync::Arc<dyn Tool>])
        .options(HarnessOptions {
            parallel_enabled: false,
            ..options()
        })
        .build();
    let started = Instant::now();
    run(&harness, request("go")).await;
    assert_eq!(probe.max(), 1);
    assert!(started.elapsed() >= std::time::Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn results_come_back_in_call_order_with_one_tool_message_each() {
    let probe = Probe::new("probe", EffectClass::ReadOnly);
    let provider = scripted([
        calls(vec![
            call("slow", "probe", json!({"key": "a", "ms": 300})),
            call("boom", "explodes", json!({})),
            call("fast", "probe", json!({"key": "b", "ms": 10})),
        ]),
        text("done"),
    ]);
    let harness = builder(
        &provider,
        vec![
            probe as std::sync::Arc<dyn Tool>,
            Fixed::panicking("explodes"),
        ],
    )
    .build();
    let ran = run(&harness, request("go")).await;
    assert_eq!(ran.text(), "done");
    let second = &provider.requests()[1];
    let answers: Vec<(String, String)> = second
        .messages
        .iter()
        .filter(|m| m.role == harness_base::providers::Role::Tool)
        .map(|m| (m.tool_call_id.clone().unwrap(), unfence(&m.content)))
        .collect();
    assert_eq!(answers.len(), 3, "exactly one tool message per call");
    assert_eq!(answers[0], ("slow".into(), "probed a".into()));
    assert_eq!(answers[1].0, "boom");
    assert!(
        answers[1].1.starts_with("Error (panic)"),
        "{}",
        answers[1].1
    );
    assert_eq!(answers[2], ("fast".into(), "probed b".into()));
    let finished: Vec<String> = ran
        .sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            TurnEvent::ToolFinished { call_id, .. } => Some(call_id),
            _ => None,
        })
        .collect();
    assert_eq!(finished, ["slow", "boom", "fast"]);
}
