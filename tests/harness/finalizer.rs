//! Stage 5-6: the write gate and the finalizer's steps, each isolated.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use harness_base::{
    events::TurnEvent,
    providers::{
        Usage as ScriptedUsage,
        scripted::{ScriptedProvider, call, calls, text},
    },
    turn::WebMode,
};
use harness_core::{
    harness::{
        HarnessOptions,
        hooks::{
            AgentCallbacks, Exchange, HookError, JudgeRequest, JudgeScheduler, MemoryExtractor,
            MemoryTurn, ResearchLearner,
        },
    },
    tools::{Citation, ToolOutput},
};
use serde_json::json;

use crate::helpers::{Fixed, builder, options, request, run, scripted};

struct BrokenExtractor {
    panics: bool,
}

#[async_trait]
impl MemoryExtractor for BrokenExtractor {
    async fn extract_turn(
        &self,
        _: &MemoryTurn,
    ) -> Result<Option<harness_store::store::NewJob>, HookError> {
        assert!(!self.panics, "extractor exploded");
        Err(HookError::new("memory store is down"))
    }
}

#[derive(Default)]
struct Learner(Mutex<Vec<(String, String)>>);

#[async_trait]
impl ResearchLearner for Learner {
    async fn observe_turn(
        &self,
        exchange: Exchange<'_>,
    ) -> Result<Option<harness_store::store::ObservationRecord>, HookError> {
        let seen = (
            exchange.assistant_text.to_owned(),
            exchange.source_id.to_owned(),
        );
        self.0.lock().unwrap().push(seen);
        Ok(None)
    }
}

#[tokio::test]
async fn a_failing_memory_extractor_does_not_stop_the_turn_or_the_later_steps() {
    for panics in [false, true] {
        let provider = scripted([text("All good.")]);
        let learner = Arc::new(Learner::default());
        let harness = builder(&provider, vec![])
            .memory_extractor(Arc::new(BrokenExtractor { panics }))
            .research_learner(learner.clone())
            .build();
        let ran = run(&harness, request("hi")).await;
        let output = ran.output.expect("the result is still returned");
        assert_eq!(output.result.text, "All good.");
        assert_eq!(output.step_failures.len(), 1);
        assert_eq!(output.step_failures[0].step, "memory_extraction");
        // The learner ran after it, with the assistant message as its source.
        assert_eq!(
            *learner.0.lock().unwrap(),
            [(
                "All good.".to_owned(),
                format!("chat_message:{}", output.assistant_message_id)
            )]
        );
        let decision = output.decision.expect("a decision");
        let record: serde_json::Value = serde_json::from_str(&decision.record).unwrap();
        assert_eq!(record["finalizer_failures"][0]["step"], "memory_extraction");
        assert_eq!(
            output.messages.len(),
            2,
            "user and assistant messages to commit"
        );
    }
}

#[tokio::test]
async fn citations_are_appended_in_the_seed_format_and_classify_the_strategy() {
    let local = Fixed::ok(
        "local_search",
        ToolOutput {
            content: "found".into(),
            citations: vec![
                Citation::Local {
                    anchor: "notes/project.md".into(),
                },
                Citation::Local {
                    anchor: "docs/meeting-notes.md".into(),
                },
                Citation::Local {
                    anchor: "notes/project.md".into(),
                },
            ],
        },
    );
    let web = Fixed::ok(
        "web_search",
        ToolOutput {
            content: "found".into(),
            citations: vec![Citation::Web {
                title: "Title of page".into(),
                url: "https://example.com/page".into(),
            }],
        },
    );
    let provider = scripted([
        calls(vec![
            call("c1", "local_search", json!({})),
            call("c2", "web_search", json!({})),
        ]),
        text("Here are your open loops..."),
    ]);
    let harness = builder(&provider, vec![local, web]).build();
    let mut req = request("What are my open loops?");
    Arc::make_mut(&mut req.asked).show_citations = true;
    Arc::make_mut(&mut req.asked).web_mode = WebMode::On;
    let ran = run(&harness, req).await;
    let output = ran.output.unwrap();
    assert_eq!(
        output.result.text,
        "Here are your open loops...\n\nLocal citations:\n- notes/project.md\n- docs/meeting-notes.md\
         \n\nWeb citations:\n- Title of page: https://example.com/page"
    );
    assert_eq!(
        output.result.local_citations,
        ["notes/project.md", "docs/meeting-notes.md"]
    );
    assert_eq!(
        output.result.web_citations[0].url,
        "https://example.com/page"
    );
    assert_eq!(output.strategy, "web_augmented");
    assert_eq!(output.messages[1].content, output.result.text);
    assert!(ran.sink.types().contains(&"citations"));
}

#[tokio::test]
async fn without_show_citations_the_text_is_left_alone() {
    let local = Fixed::ok(
        "local_search",
        ToolOutput {
            content: "found".into(),
            citations: vec![Citation::Local {
                anchor: "notes/a.md".into(),
            }],
        },
    );
    let provider = scripted([
        calls(vec![call("c1", "local_search", json!({}))]),
        text("Answer."),
    ]);
    let harness = builder(&provider, vec![local]).build();
    let output = run(&harness, request("q")).await.output.unwrap();
    assert_eq!(output.result.text, "Answer.");
    assert_eq!(output.result.local_citations, ["notes/a.md"]);
    assert_eq!(output.strategy, "retrieval_augmented");
}

#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

#[async_trait]
impl AgentCallbacks for Recorder {
    async fn on_turn_start(&self, session_id: &str, turn_count: u64) {
        self.0
            .lock()
            .unwrap()
            .push(format!("start {session_id} {turn_count}"));
    }
    async fn on_usage(&self, input: u64, output: u64) {
        self.0
            .lock()
            .unwrap()
            .push(format!("usage {input} {output}"));
    }
    async fn on_turn_end(&self, session_id: &str) {
        self.0.lock().unwrap().push(format!("end {session_id}"));
    }
}

#[tokio::test]
async fn usage_is_reported_once_and_only_when_non_zero() {
    let recorder = Arc::new(Recorder::default());
    let provider = scripted([calls(vec![call("c1", "note", json!({}))]), text("done")]);
    let harness = builder(&provider, vec![Fixed::ok("note", ToolOutput::text("n"))])
        .callbacks(recorder.clone())
        .build();
    let ran = run(&harness, request("hi")).await;
    assert_eq!(
        *recorder.0.lock().unwrap(),
        ["start s-1 1", "usage 20 10", "end s-1"]
    );
    let totals: Vec<_> = ran
        .sink
        .events()
        .into_iter()
        .filter(|e| matches!(e, TurnEvent::Usage { step: None, .. }))
        .collect();
    assert_eq!(totals.len(), 1);

    let recorder = Arc::new(Recorder::default());
    let silent =
        Arc::new(ScriptedProvider::new([text("done")]).with_usage(ScriptedUsage::default()));
    let harness = harness_core::harness::AgentHarness::builder(silent)
        .callbacks(recorder.clone())
        .build();
    let ran = run(&harness, request("hi")).await;
    assert_eq!(*recorder.0.lock().unwrap(), ["start s-1 1", "end s-1"]);
    assert!(!ran.sink.types().contains(&"usage"));
}

#[derive(Default)]
struct Judges(Mutex<Vec<JudgeRequest>>);

#[async_trait]
impl JudgeScheduler for Judges {
    fn judges_for(&self, prompt_id: &str) -> Vec<String> {
        if prompt_id == "agent.profile.default" {
            vec!["faithfulness".into(), "relevance".into()]
        } else {
            Vec::new()
        }
    }
    async fn schedule(
        &self,
        request: JudgeRequest,
    ) -> Result<Vec<harness_store::store::NewJob>, HookError> {
        let job = |judge: &str| harness_store::store::NewJob {
            id: format!("job-{judge}"),
            kind: "judge".into(),
            session_id: request.session_id.as_str().to_owned(),
            turn_id: request.turn_id.clone(),
            payload: "{}".into(),
            at: chrono::Utc::now(),
        };
        let jobs = vec![job("faithfulness"), job("relevance")];
        self.0.lock().unwrap().push(request);
        Ok(jobs)
    }
}

#[tokio::test]
async fn judges_are_scheduled_only_for_prompts_that_have_them() {
    for (prompt_id, expected) in [
        (Some("agent.profile.default"), 1),
        (Some("other"), 0),
        (None, 0),
    ] {
        let judges = Arc::new(Judges::default());
        let provider = scripted([text("Answer.")]);
        let harness = builder(&provider, vec![])
            .options(HarnessOptions {
                prompt_id: prompt_id.map(str::to_owned),
                prompt_version: Some("1.0.0".into()),
                ..options()
            })
            .judges(judges.clone())
            .build();
        let output = run(&harness, request("q")).await.output.unwrap();
        let scheduled = judges.0.lock().unwrap();
        assert_eq!(scheduled.len(), expected, "{prompt_id:?}");
        if expected == 1 {
            assert_eq!(scheduled[0].response, "Answer.");
            assert!(scheduled[0].messages_text.ends_with("[user] q"));
            let record: serde_json::Value =
                serde_json::from_str(&output.decision.unwrap().record).unwrap();
            assert_eq!(record["judges_scheduled"], 2);
            // The jobs ride with the turn's end.
            assert_eq!(output.jobs.len(), 2);
        }
    }
}

#[tokio::test]
async fn decisions_can_be_switched_off() {
    let provider = scripted([text("Answer.")]);
    let harness = builder(&provider, vec![])
        .options(HarnessOptions {
            record_decisions: false,
            ..options()
        })
        .build();
    let ran = run(&harness, request("q")).await;
    assert!(ran.output.unwrap().decision.is_none());
    assert!(!ran.sink.types().contains(&"decision"));
}

#[tokio::test]
async fn the_write_gate_is_closed_when_the_finalizer_runs() {
    let provider = scripted([text("Answer.")]);
    let harness = builder(&provider, vec![]).build();
    let ran = run(&harness, request("q")).await;
    assert!(!ran.state.is_accepting_writes());
    assert_eq!(ran.state.final_text(), "Answer.");
}

#[tokio::test]
async fn redact_logs_masks_the_decision_record() {
    for (redact, expected) in [
        (false, "mail me at ann@example.com"),
        (true, "mail me at [redacted]"),
    ] {
        let provider = scripted([text("ok")]);
        let harness = builder(&provider, vec![])
            .options(HarnessOptions {
                redact_logs: redact,
                ..options()
            })
            .build();
        let output = run(&harness, request("mail me at ann@example.com"))
            .await
            .output
            .unwrap();
        let record: serde_json::Value =
            serde_json::from_str(&output.decision.unwrap().record).unwrap();
        assert_eq!(record["user_message"], expected);
    }
}
