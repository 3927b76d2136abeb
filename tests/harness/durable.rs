//! A turn's step records rebuild the turn as it ran: after every step the
//! rebuilt state is the live state, and the rebuilt conversation is what
//! the model is asked next.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use harness_base::{
    events::{ToolStatus, TurnEvent},
    providers::{
        Role, Usage,
        scripted::{ScriptedProvider, call, calls, text},
    },
};
use harness_core::{
    harness::{
        AgentHarness, EventSink, HarnessOptions, SinkError, TurnInput,
        compaction::ContextWarningTracker,
        durable::{PriorCall, PriorCalls, Resume, StepPhase, StepRecord, rebuild},
        hooks::{ApprovalDecision, ApprovalGate, ApprovalRequest, CostTracker},
        replay::ReplayControl,
        state::{StateSnapshot, ToolResultRecord, TurnRuntimeState},
        thinking::ThinkLevel,
    },
    tools::{Citation, EffectClass, Saved, Settled, Tool, ToolOutput},
};
use serde_json::json;

use crate::helpers::{
    Fixed, Probe, RecordingSink, builder, long_history, options, request, scripted,
};

/// The turn as it was when one of its records was written.
struct Seen {
    record: StepRecord,
    state: StateSnapshot,
    tool_results: Vec<ToolResultRecord>,
    /// Provider calls made by then.
    requests: usize,
    /// Calls that had completed by then.
    completed: Vec<String>,
    /// Whether the harness waited for the record to be durable.
    waited: bool,
}

/// Watches a turn: its events, and beside each step record the live
/// state and how many provider calls were made.
struct Watching {
    sink: RecordingSink,
    provider: Arc<ScriptedProvider>,
    state: Arc<TurnRuntimeState>,
    seen: Mutex<Vec<Seen>>,
}

#[async_trait]
impl EventSink for Watching {
    async fn emit(&self, event: TurnEvent) -> Result<(), SinkError> {
        self.sink.emit(event).await
    }

    async fn step_done(&self, record: StepRecord, wait: bool) -> Result<(), SinkError> {
        let mut completed: Vec<String> = self
            .sink
            .events()
            .into_iter()
            .filter_map(|e| match e {
                TurnEvent::ToolFinished {
                    call_id,
                    status: ToolStatus::Completed,
                    ..
                } => Some(call_id),
                _ => None,
            })
            .collect();
        completed.sort();
        self.seen.lock().unwrap().push(Seen {
            // The replay gate is the harness's own: checked apart.
            state: self.state.snapshot(&ReplayControl::default()),
            tool_results: self.state.tool_results(),
            requests: self.provider.requests().len(),
            completed,
            waited: wait,
            record: record.clone(),
        });
        self.sink.step_done(record, wait).await
    }
}

/// Runs a turn and checks every prefix of its records against the turn as
/// it was when the last of them was written; returns the turn's records
/// and its answer.
async fn run_and_rebuild(
    harness: &AgentHarness,
    provider: &Arc<ScriptedProvider>,
    request: TurnInput,
) -> (Vec<StepRecord>, String, Vec<bool>) {
    let state = harness.new_state(&request.session_id);
    let watching = Arc::new(Watching {
        sink: RecordingSink::default(),
        provider: provider.clone(),
        state: state.clone(),
        seen: Mutex::default(),
    });
    let output = harness
        .run_turn_with_state(request, watching.clone(), state)
        .await
        .expect("the turn completes");
    let requests = provider.requests();
    let seen = std::mem::take(&mut *watching.seen.lock().unwrap());
    let records: Vec<StepRecord> = seen.iter().map(|s| s.record.clone()).collect();
    assert_eq!(records, watching.sink.records());
    for (k, seen) in seen.iter().enumerate() {
        // Through JSON, as the store keeps them.
        let kept: Vec<StepRecord> = records[..=k]
            .iter()
            .map(|r| serde_json::from_str(&serde_json::to_string(r).unwrap()).unwrap())
            .collect();
        let rebuilt = rebuild(&kept).unwrap().expect("records");
        let at = (rebuilt.step, rebuilt.phase);
        assert_eq!(at, (seen.record.step, seen.record.phase));
        let mut state = rebuilt.state.clone();
        let completed_calls = std::mem::take(&mut state.completed_calls);
        assert_eq!(state, seen.state, "state after {at:?}");
        let mut completed: Vec<String> = completed_calls.into_iter().map(|c| c.2).collect();
        completed.sort();
        assert_eq!(completed, seen.completed, "replay gate after {at:?}");
        assert_eq!(rebuilt.tool_results, seen.tool_results, "{at:?}");
        // The state made of the records gives them back.
        let limits = harness.options().budget_limits();
        let restored = rebuilt.runtime_state("s-1", limits, tokio::time::Instant::now());
        assert_eq!(
            restored.snapshot(&rebuilt.replay()),
            rebuilt.state,
            "{at:?}"
        );
        assert_eq!(restored.tool_results(), rebuilt.tool_results);
        match rebuilt.phase {
            StepPhase::Answered => {
                // The step's call, and the model's answer after it.
                let (answer, asked) = rebuilt.messages.split_last().unwrap();
                assert_eq!(asked, &requests[seen.requests - 1].messages[..], "{at:?}");
                assert_eq!(answer.role, Role::Assistant);
                assert!(!answer.tool_calls.is_empty());
            }
            StepPhase::Finished => {
                // What the next step asks.
                assert_eq!(rebuilt.messages, requests[seen.requests].messages, "{at:?}");
            }
        }
        assert_eq!(
            rebuilt.question_at,
            rebuilt
                .messages
                .iter()
                .rposition(|m| m.role == Role::User && m.content.contains("go"))
                .unwrap(),
            "the question is where the record says, {at:?}"
        );
        assert_eq!(rebuilt.prepared.prompt_len, requests[0].messages.len());
        // The prepared prompt, whatever the first record begins with.
        assert_eq!(rebuilt.prompt, requests[0].messages, "{at:?}");
    }
    assert!(!records.is_empty(), "a tool turn writes records");
    let waited = seen.iter().map(|s| s.waited).collect();
    (records, output.result.text, waited)
}

/// Approves every call at once.
struct Approve;

#[async_trait]
impl ApprovalGate for Approve {
    async fn decide(
        &self,
        _: &ApprovalRequest,
        _: std::time::Duration,
        _: &tokio_util::sync::CancellationToken,
    ) -> ApprovalDecision {
        ApprovalDecision::Approved {
            edited_arguments: None,
            arguments_sha256: None,
        }
    }
}

/// A cent per provider call.
struct CentPerCall;

impl CostTracker for CentPerCall {
    fn record(&self, _: &str, _: &str, _: &str, _: &Usage) -> Option<f64> {
        Some(0.01)
    }
}

#[tokio::test]
async fn every_step_of_a_tool_turn_rebuilds_from_its_records() {
    let provider = Arc::new(
        ScriptedProvider::new([
            // Step 1: a parallel read-only wave, a cited source, a tool
            // that fails for good (blocked).
            calls(vec![
                call("c1", "probe", json!({"key": "a", "ms": 1})),
                call("c2", "probe", json!({"key": "b", "ms": 1})),
                call("c3", "cite", json!({})),
                call("c4", "broken", json!({})),
            ]),
            text("The broken tool is out; the probes answered."),
            // Step 2: a repeat (the replay gate), arguments that fail
            // validation (a repair), a write that waits for approval.
            calls(vec![
                call("c5", "probe", json!({"key": "a", "ms": 1})),
                call("c6", "probe", json!({"ms": 1})),
                call("c7", "write", json!({"key": "w", "ms": 1})),
            ]),
            text("One call repeated, one was malformed."),
            text("done"),
        ])
        .with_usage(Usage {
            input_tokens: 10,
            output_tokens: 5,
            ..Usage::default()
        }),
    );
    let cited = ToolOutput {
        content: "a cited page".into(),
        citations: vec![Citation::Web {
            title: "A page".into(),
            url: "https://a.example/page".into(),
        }],
    };
    let tools: Vec<Arc<dyn Tool>> = vec![
        Probe::new("probe", EffectClass::ReadOnly),
        Probe::new("write", EffectClass::LocalWrite),
        Fixed::ok("cite", cited),
        Fixed::err("broken", false),
    ];
    let harness = builder(&provider, tools)
        .options(HarnessOptions {
            think_level: ThinkLevel::Low,
            approval_effects: vec![EffectClass::LocalWrite],
            ..options()
        })
        .approvals(Arc::new(Approve))
        .cost_tracker(Arc::new(CentPerCall))
        .build();
    let (records, answer, waited) = run_and_rebuild(&harness, &provider, request("go")).await;
    assert_eq!(answer, "done");
    // Only an answer whose calls include a write is recorded before they
    // run (and waits for that record to be durable); a step that only
    // reads leaves its `finished` record alone.
    assert_eq!(waited, [false, true, false]);
    let phases: Vec<(u32, StepPhase)> = records.iter().map(|r| (r.step, r.phase)).collect();
    use StepPhase::{Answered, Finished};
    assert_eq!(phases, [(1, Finished), (2, Answered), (2, Finished)]);
    // Each record carries what came since the one before it.
    assert_eq!(records[0].after, 0);
    for pair in records.windows(2) {
        let before: usize = pair[0].after + pair[0].messages.len();
        assert_eq!(pair[1].after, before, "{:?}", pair[1].phase);
    }
    let last = &records[2].state;
    assert_eq!((last.steps, last.tool_calls, last.reflections), (2, 5, 2));
    assert_eq!(last.blocked_tools, ["broken"]);
    assert_eq!(last.repair_counts.get("c6"), Some(&1));
    assert_eq!(last.citations.web.len(), 1);
    assert_eq!(last.usage.input_tokens, 40, "two steps and two reflections");
    assert!(last.cost_usd.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_compacted_conversation_is_recorded_whole_and_rebuilds() {
    let provider = scripted([
        calls(vec![call("c1", "probe", json!({"key": "a", "ms": 1}))]),
        text("They talked about lorem ipsum."),
        calls(vec![call("c2", "probe", json!({"key": "b", "ms": 1}))]),
        text("done"),
    ]);
    let harness = builder(&provider, vec![Probe::new("probe", EffectClass::ReadOnly)])
        .context_tracker(Some(ContextWarningTracker::new(1024)))
        .build();
    let mut asked = request("go");
    asked.history = long_history();
    let (records, answer, _) = run_and_rebuild(&harness, &provider, asked).await;
    assert_eq!(answer, "done");
    let compacted = records
        .iter()
        .find(|r| r.state.context_compacted)
        .expect("a compaction");
    assert_eq!(
        (compacted.step, compacted.phase, compacted.after),
        (1, StepPhase::Finished, 0),
        "recorded whole"
    );
    let after = records.last().unwrap();
    assert_eq!(after.step, 2);
    assert!(after.after > 0, "later records add to the rewritten one");
}

#[tokio::test]
async fn a_turn_that_answers_at_once_writes_no_record() {
    let provider = scripted([text("hello")]);
    let harness = builder(&provider, vec![]).build();
    let ran = crate::helpers::run(&harness, request("go")).await;
    assert_eq!(ran.text(), "hello");
    assert!(ran.sink.records().is_empty());
}

/// A turn going on from a step whose calls a dead process left: an ended
/// call is not run again (the model gets what the log holds), a read-only
/// or idempotent one that started is run again, a write that started ends
/// `unknown`, and no call's `tool.started` is said twice.
#[tokio::test]
async fn a_step_taken_over_runs_each_call_at_most_once() {
    let probe = Probe::new("probe", EffectClass::ReadOnly);
    let write = Probe::new("write", EffectClass::LocalWrite);
    let idem = Probe::idempotent("idem", EffectClass::LocalWrite);
    let tools: Vec<Arc<dyn Tool>> = vec![probe.clone(), write.clone(), idem.clone()];
    let ended = PriorCall::Ended {
        status: ToolStatus::Completed,
        reason: None,
        error: None,
        output: Some("logged result".into()),
        artifact_id: None,
        latency_ms: 3,
    };
    let started = PriorCall::Started {
        approval: None,
        client: None,
    };
    // What the log showed of its calls: c1-c3 started, c4 ended.
    let taken = take_over(
        tools,
        None,
        vec![
            call("c1", "probe", json!({"key": "a", "ms": 1})),
            call("c2", "write", json!({"key": "w", "ms": 1})),
            call("c3", "idem", json!({"key": "i", "ms": 1})),
            call("c4", "probe", json!({"key": "b", "ms": 1})),
        ],
        [
            ("c1", started.clone()),
            ("c2", started.clone()),
            ("c3", started),
            ("c4", ended),
        ],
    )
    .await;
    assert_eq!(probe.calls(), 1, "c1 again, not c4");
    assert_eq!(write.calls(), 0, "the write is not made blindly");
    assert_eq!(idem.calls(), 1, "the idempotent one is made again");
    assert_eq!(
        taken.finished,
        [
            ("c1".to_owned(), ToolStatus::Completed),
            ("c2".to_owned(), ToolStatus::Unknown),
            ("c3".to_owned(), ToolStatus::Completed),
        ],
        "c4's end is in the log already"
    );
    // The model is told each call's outcome, c4's as the log has it.
    assert_eq!(taken.told.len(), 4);
    assert_eq!(taken.told[1], harness_core::harness::waves::OUTCOME_UNKNOWN);
    assert_eq!(taken.told[3], "logged result");
    // Every call took its place in the budget, once.
    assert_eq!(taken.state.budget.tool_calls_used(), 4);
}

/// A started write whose tool can tell from its checkpoint what became of
/// it: landed (its answer, not run again), not landed (run, once), or
/// nothing tells (`unknown`). The tool is asked with what the checkpoint
/// store saved for that call.
#[tokio::test]
async fn a_started_write_is_settled_by_what_its_checkpoint_tells() {
    let write = Settling::new();
    let saved = Arc::new(SavedPerCall::default());
    let started = || PriorCall::Started {
        approval: None,
        client: None,
    };
    let taken = take_over(
        vec![write.clone()],
        Some(saved.clone()),
        vec![
            call("c1", "note", json!({"key": "landed"})),
            call("c2", "note", json!({"key": "not"})),
            call("c3", "note", json!({"key": "changed"})),
        ],
        [("c1", started()), ("c2", started()), ("c3", started())],
    )
    .await;
    assert_eq!(
        write.probe.calls(),
        1,
        "only the write that did not land runs"
    );
    assert_eq!(
        taken.finished,
        [
            ("c1".to_owned(), ToolStatus::Completed),
            ("c2".to_owned(), ToolStatus::Completed),
            ("c3".to_owned(), ToolStatus::Unknown),
        ]
    );
    assert!(
        taken.told[0].contains("it landed before"),
        "{}",
        taken.told[0]
    );
    assert!(taken.told[1].contains("probed not"), "{}", taken.told[1]);
    assert_eq!(taken.told[2], harness_core::harness::waves::OUTCOME_UNKNOWN);
    // Each was asked with its own call's checkpoint, and the one that ran
    // went through its checkpoint gate again.
    assert_eq!(
        *write.asked.lock().unwrap(),
        [
            ("landed".to_owned(), "saved c1".to_owned()),
            ("not".to_owned(), "saved c2".to_owned()),
            ("changed".to_owned(), "saved c3".to_owned()),
        ]
    );
    assert_eq!(*saved.snapshots.lock().unwrap(), ["c2"]);
    assert_eq!(taken.state.budget.tool_calls_used(), 3);
}

/// What a turn taken over after its first step was answered did.
struct TakenOver {
    /// The calls whose end it reported, with their status.
    finished: Vec<(String, ToolStatus)>,
    /// The tool messages the model was given next.
    told: Vec<String>,
    state: Arc<TurnRuntimeState>,
}

/// A turn whose model asks for `asked` in its first step: the process
/// dies once that answer is recorded, and a new owner goes on with the
/// log showing `prior` of the calls.
async fn take_over(
    tools: Vec<Arc<dyn Tool>>,
    checkpoints: Option<Arc<dyn harness_core::harness::hooks::CheckpointStore>>,
    asked: Vec<harness_base::providers::ToolCall>,
    prior: impl IntoIterator<Item = (&'static str, PriorCall)>,
) -> TakenOver {
    let first = Arc::new(ScriptedProvider::new([calls(asked)]));
    let with = |provider: &Arc<ScriptedProvider>| {
        let built = builder(provider, tools.clone());
        match &checkpoints {
            Some(store) => built.checkpoint_store(store.clone()),
            None => built,
        }
        .build()
    };
    // The first life: the model's answer is recorded, then the process
    // "dies" (the sink refuses everything after the answer's record).
    let dying = with(&first);
    let sink = Arc::new(DiesAfterAnswer::default());
    let state = dying.new_state("s-1");
    let turn = request("go");
    let lost = dying
        .run_turn_with_state(turn.clone(), sink.clone(), state)
        .await;
    assert!(lost.is_err(), "the first life ends with its process");
    let records = sink.records.lock().unwrap().clone();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].phase, StepPhase::Answered);

    let prior = PriorCalls(
        prior
            .into_iter()
            .map(|(id, p)| (id.to_owned(), p))
            .collect(),
    );
    let second = scripted([text("done")]);
    let harness = with(&second);
    let from = rebuild(&records).unwrap().unwrap();
    let limits = harness.options().budget_limits();
    let state =
        Arc::new(from.runtime_state("s-1", limits, tokio::time::Instant::now() + limits.timeout));
    let resume = Resume {
        from,
        prior,
        started: tokio::time::Instant::now(),
        state: state.clone(),
    };
    let sink = Arc::new(RecordingSink::default());
    let output = harness
        .resume_turn(turn, sink.clone(), resume)
        .await
        .unwrap();
    assert_eq!(output.result.text, "done");
    let events = sink.events();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, TurnEvent::ToolStarted { .. })),
        "every call's start is in the log already"
    );
    let finished = events
        .iter()
        .filter_map(|e| match e {
            TurnEvent::ToolFinished {
                call_id, status, ..
            } => Some((call_id.clone(), *status)),
            _ => None,
        })
        .collect();
    let asked_next = second.requests().pop().unwrap();
    TakenOver {
        finished,
        told: crate::helpers::tool_messages(&asked_next),
        state,
    }
}

/// A write tool that settles a started call by its `key`: `landed`,
/// `not` (landed), anything else unknown; it notes what it was asked with.
struct Settling {
    probe: Arc<Probe>,
    asked: Mutex<Vec<(String, String)>>,
}

impl Settling {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            probe: Probe::new("note", EffectClass::LocalWrite),
            asked: Mutex::default(),
        })
    }
}

#[async_trait]
impl Tool for Settling {
    fn spec(&self) -> &harness_core::tools::ToolSpec {
        self.probe.spec()
    }

    fn resource_keys(&self, arguments: &serde_json::Value) -> Vec<String> {
        self.probe.resource_keys(arguments)
    }

    async fn call(
        &self,
        ctx: harness_core::tools::ToolContext,
        arguments: serde_json::Value,
    ) -> Result<ToolOutput, harness_core::tools::ToolError> {
        self.probe.call(ctx, arguments).await
    }

    async fn settle(
        &self,
        _session: &str,
        arguments: &serde_json::Value,
        before: &[Saved],
    ) -> Settled {
        let key = arguments["key"].as_str().unwrap_or_default().to_owned();
        let saved = before
            .iter()
            .map(|s| String::from_utf8_lossy(s.content.as_deref().unwrap_or_default()).into_owned())
            .collect::<Vec<_>>()
            .join(",");
        self.asked.lock().unwrap().push((key.clone(), saved));
        match key.as_str() {
            "landed" => Settled::Landed(ToolOutput::text("it landed before")),
            "not" => Settled::NotLanded,
            _ => Settled::Unknown,
        }
    }
}

/// A checkpoint store that holds `saved {call id}` for every call, and
/// notes the calls whose write gate asked it for a snapshot.
#[derive(Default)]
struct SavedPerCall {
    snapshots: Mutex<Vec<String>>,
}

#[async_trait]
impl harness_core::harness::hooks::CheckpointStore for SavedPerCall {
    async fn snapshot(
        &self,
        request: &harness_core::harness::hooks::CheckpointRequest,
    ) -> Result<Vec<String>, harness_core::harness::hooks::HookError> {
        self.snapshots.lock().unwrap().push(request.call_id.clone());
        Ok(vec![format!("cp-{}", request.call_id)])
    }

    async fn saved(
        &self,
        _: &str,
        _: &str,
        call_id: &str,
    ) -> Result<Vec<Saved>, harness_core::harness::hooks::HookError> {
        Ok(vec![Saved {
            path: "n.md".into(),
            content: Some(format!("saved {call_id}").into_bytes()),
        }])
    }
}

/// A sink that takes the turn's records and events until the model's
/// answer is recorded, then refuses everything (its process died).
#[derive(Default)]
struct DiesAfterAnswer {
    records: Mutex<Vec<StepRecord>>,
}

#[async_trait]
impl EventSink for DiesAfterAnswer {
    async fn emit(&self, _: TurnEvent) -> Result<(), SinkError> {
        if self.records.lock().unwrap().is_empty() {
            Ok(())
        } else {
            Err(SinkError("the process died".into()))
        }
    }

    async fn step_done(&self, record: StepRecord, _: bool) -> Result<(), SinkError> {
        self.records.lock().unwrap().push(record);
        Ok(())
    }
}
