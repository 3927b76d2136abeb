//! Stage 4h-4i: reflection and context compaction.

use std::sync::Arc;

use agent_harness::{
    events::TurnEvent,
    harness::{HarnessOptions, compaction::ContextWarningTracker, thinking::ThinkLevel},
    providers::{
        ChatMessage, ProviderError, ProviderFailure, Role,
        scripted::{Scripted, call, calls, text},
    },
    tools::{EffectClass, Tool},
};
use serde_json::json;

use crate::helpers::{Fixed, Probe, builder, options, request, run, scripted};

fn reflections(events: &[TurnEvent]) -> Vec<(bool, Option<String>)> {
    events
        .iter()
        .filter_map(|e| match e {
            TurnEvent::Reflection { stub, reason, .. } => Some((*stub, reason.clone())),
            _ => None,
        })
        .collect()
}

fn thinking(level: ThinkLevel) -> HarnessOptions {
    HarnessOptions {
        think_level: level,
        ..options()
    }
}

#[tokio::test]
async fn a_tool_error_triggers_a_reflection_that_the_model_then_sees() {
    let provider = scripted([
        calls(vec![call("c1", "flaky", json!({}))]),
        text("The tool failed; try another way."),
        text("done"),
    ]);
    let harness = builder(&provider, vec![Fixed::err("flaky", true)])
        .options(thinking(ThinkLevel::Low))
        .build();
    let ran = run(&harness, request("go")).await;
    assert_eq!(ran.text(), "done");
    assert_eq!(reflections(&ran.sink.events()), [(false, None)]);
    let last = provider.requests().pop().unwrap();
    assert!(
        last.messages.iter().any(|m| m.role == Role::System
            && m.content == "Reflection: The tool failed; try another way.")
    );
    assert_eq!(ran.state.budget.reflections_used(), 1);
}

#[tokio::test]
async fn a_failed_reflection_is_a_stub_and_the_loop_goes_on() {
    let failure = ProviderFailure {
        status: 500,
        message: "boom".into(),
        body: String::new(),
    };
    let provider = scripted([
        calls(vec![call("c1", "flaky", json!({}))]),
        Scripted::Fail(ProviderError::Server(failure)),
        text("done"),
    ]);
    let harness = builder(&provider, vec![Fixed::err("flaky", true)])
        .options(thinking(ThinkLevel::High))
        .build();
    let ran = run(&harness, request("go")).await;
    assert_eq!(ran.text(), "done");
    assert_eq!(
        reflections(&ran.sink.events()),
        [(true, Some("error".into()))]
    );
}

#[tokio::test]
async fn reflections_stop_at_their_budget() {
    let provider = scripted([
        calls(vec![call("c1", "flaky", json!({"n": 1}))]),
        text("reflected once"),
        calls(vec![call("c2", "flaky", json!({"n": 2}))]),
        text("done"),
    ]);
    let harness = builder(&provider, vec![Fixed::err("flaky", true)])
        .options(HarnessOptions {
            max_reflections: 1,
            ..thinking(ThinkLevel::Medium)
        })
        .build();
    let ran = run(&harness, request("go")).await;
    assert_eq!(ran.text(), "done");
    assert_eq!(
        reflections(&ran.sink.events()),
        [(false, None), (true, Some("budget".into()))]
    );
}

#[tokio::test(start_paused = true)]
async fn reflect_every_n_turns_reflects_on_those_turns_only() {
    for (turn_number, expected) in [(1, 0), (2, 1)] {
        let probe = Probe::new("probe", EffectClass::ReadOnly);
        let mut script = vec![calls(vec![call(
            "c1",
            "probe",
            json!({"key": "a", "ms": 1}),
        )])];
        if expected == 1 {
            script.push(text("periodic reflection"));
        }
        script.push(text("done"));
        let provider = scripted(script);
        let harness = builder(&provider, vec![probe as Arc<dyn Tool>])
            .options(HarnessOptions {
                reflect_every: 2,
                ..thinking(ThinkLevel::Low)
            })
            .build();
        let mut req = request("go");
        req.turn_number = turn_number;
        let ran = run(&harness, req).await;
        assert_eq!(ran.text(), "done");
        assert_eq!(
            reflections(&ran.sink.events()).len(),
            expected,
            "turn {turn_number}"
        );
    }
}

#[tokio::test]
async fn think_level_off_never_reflects() {
    let provider = scripted([calls(vec![call("c1", "flaky", json!({}))]), text("done")]);
    let harness = builder(&provider, vec![Fixed::err("flaky", true)]).build();
    let ran = run(&harness, request("go")).await;
    assert_eq!(ran.text(), "done");
    assert!(reflections(&ran.sink.events()).is_empty());
}

fn long_history() -> Vec<ChatMessage> {
    (0..6)
        .map(|i| {
            let content = format!("message {i} {}", "lorem ipsum ".repeat(70));
            if i % 2 == 0 {
                ChatMessage::user(content)
            } else {
                ChatMessage::assistant(content, vec![])
            }
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_critical_context_level_compacts_older_messages() {
    let probe = Probe::new("probe", EffectClass::ReadOnly);
    let provider = scripted([
        calls(vec![call("c1", "probe", json!({"key": "a", "ms": 1}))]),
        text("They talked about lorem ipsum."),
        text("done"),
    ]);
    let harness = builder(&provider, vec![probe as Arc<dyn Tool>])
        .context_tracker(Some(ContextWarningTracker::new(1024)))
        .build();
    let mut req = request("go");
    req.history = long_history();
    let ran = run(&harness, req).await;
    assert_eq!(ran.text(), "done");
    assert!(ran.state.context_was_compacted());
    let compacted: Vec<_> = ran
        .sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            TurnEvent::ContextCompacted {
                removed_messages,
                tokens_before,
                tokens_after,
                ..
            } => Some((removed_messages, tokens_before, tokens_after)),
            _ => None,
        })
        .collect();
    assert_eq!(compacted.len(), 1);
    let (removed, before, after) = compacted[0];
    assert!(removed >= 2 && after < before, "{compacted:?}");
    let requests = provider.requests();
    let last = requests.last().unwrap();
    assert!(last.messages.iter().any(|m| m
        .content
        .starts_with("Summary of the earlier conversation (compacted to fit the context window):\nThey talked about lorem ipsum.")));
    assert!(last.messages.len() < requests[0].messages.len());
    // The tool call and its result stayed together.
    let n = last.messages.len();
    assert_eq!(last.messages[n - 1].role, Role::Tool);
    assert_eq!(last.messages[n - 2].role, Role::Assistant);
}

#[tokio::test(start_paused = true)]
async fn auto_compact_off_leaves_the_context_alone() {
    let probe = Probe::new("probe", EffectClass::ReadOnly);
    let provider = scripted([
        calls(vec![call("c1", "probe", json!({"key": "a", "ms": 1}))]),
        text("done"),
    ]);
    let harness = builder(&provider, vec![probe as Arc<dyn Tool>])
        .options(HarnessOptions {
            auto_compact: false,
            ..options()
        })
        .context_tracker(Some(ContextWarningTracker::new(1024)))
        .build();
    let mut req = request("go");
    req.history = long_history();
    let ran = run(&harness, req).await;
    assert_eq!(ran.text(), "done");
    assert!(!ran.state.context_was_compacted());
}
