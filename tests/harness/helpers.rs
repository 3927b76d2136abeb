//! Test tools, a recording sink and shortcuts.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use harness_base::{
    events::TurnEvent,
    providers::ChatMessage,
    providers::scripted::{Scripted, ScriptedProvider},
    turn::TurnRequest,
};
use harness_core::{
    harness::{
        AgentHarness, AgentHarnessBuilder, EventSink, HarnessOptions, SinkError, TurnError,
        TurnInput, TurnOutput, durable::StepRecord, state::TurnRuntimeState,
    },
    tools::{
        EffectClass, PermissionMode, Tool, ToolContext, ToolError, ToolErrorKind, ToolOutput,
        ToolRegistry, ToolSpec,
    },
};
use serde_json::{Value, json};
use uuid::Uuid;

/// Records every event and every step record.
#[derive(Default)]
pub struct RecordingSink {
    events: Mutex<Vec<TurnEvent>>,
    records: Mutex<Vec<StepRecord>>,
}

impl RecordingSink {
    pub fn records(&self) -> Vec<StepRecord> {
        self.records.lock().unwrap().clone()
    }

    pub fn events(&self) -> Vec<TurnEvent> {
        self.events.lock().unwrap().clone()
    }

    pub fn types(&self) -> Vec<&'static str> {
        self.events().iter().map(TurnEvent::event_type).collect()
    }

    /// `(tool, status, reason)` of every `tool.finished`.
    pub fn finished(&self) -> Vec<(String, String, Option<String>)> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                TurnEvent::ToolFinished {
                    tool,
                    status,
                    reason,
                    ..
                } => Some((tool, status.as_str().to_owned(), reason)),
                _ => None,
            })
            .collect()
    }
}

#[async_trait]
impl EventSink for RecordingSink {
    async fn emit(&self, event: TurnEvent) -> Result<(), SinkError> {
        self.events.lock().unwrap().push(event);
        Ok(())
    }

    async fn step_done(&self, record: StepRecord, _: bool) -> Result<(), SinkError> {
        self.records.lock().unwrap().push(record);
        Ok(())
    }
}

/// A tool that sleeps `ms` (default 100, honouring cancellation), keyed by
/// `key`, counting how many of its calls run at once.
pub struct Probe {
    spec: ToolSpec,
    in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    pub calls: AtomicUsize,
}

impl Probe {
    pub fn new(name: &str, effect: EffectClass) -> Arc<Self> {
        Arc::new(Self {
            spec: ToolSpec::new(
                name,
                "Probe a resource by key.",
                json!({
                    "type": "object",
                    "properties": {"key": {"type": "string"}, "ms": {"type": "integer", "minimum": 0}},
                    "required": ["key"],
                    "additionalProperties": false
                }),
                effect,
            ),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            calls: AtomicUsize::new(0),
        })
    }

    /// A probe whose calls the operator declared idempotent.
    pub fn idempotent(name: &str, effect: EffectClass) -> Arc<Self> {
        let probe = Self::new(name, effect);
        let mut probe = Arc::into_inner(probe).unwrap();
        probe.spec = probe.spec.with_idempotent(true);
        Arc::new(probe)
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn max(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Tool for Probe {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn resource_keys(&self, arguments: &Value) -> Vec<String> {
        arguments["key"]
            .as_str()
            .map(|k| vec![k.to_owned()])
            .unwrap_or_default()
    }

    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let ms = arguments["ms"].as_u64().unwrap_or(100);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(ms)) => {}
            () = ctx.cancel.cancelled() => {}
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(ToolOutput::text(format!(
            "probed {}",
            arguments["key"].as_str().unwrap_or("?")
        )))
    }
}

/// A tool with a fixed answer (or error, or panic).
pub struct Fixed {
    spec: ToolSpec,
    answer: Result<ToolOutput, ToolError>,
    panics: bool,
}

impl Fixed {
    pub fn ok(name: &str, output: ToolOutput) -> Arc<Self> {
        Arc::new(Self {
            spec: ToolSpec::new(
                name,
                "A tool.",
                json!({"type": "object"}),
                EffectClass::ReadOnly,
            ),
            answer: Ok(output),
            panics: false,
        })
    }

    pub fn err(name: &str, retryable: bool) -> Arc<Self> {
        Self::err_with(name, "the tool broke", retryable)
    }

    pub fn err_with(name: &str, message: &str, retryable: bool) -> Arc<Self> {
        Arc::new(Self {
            spec: ToolSpec::new(
                name,
                "A tool.",
                json!({"type": "object"}),
                EffectClass::ReadOnly,
            ),
            answer: Err(ToolError::new(ToolErrorKind::Failed, message, retryable)),
            panics: false,
        })
    }

    pub fn panicking(name: &str) -> Arc<Self> {
        Arc::new(Self {
            spec: ToolSpec::new(
                name,
                "A tool.",
                json!({"type": "object"}),
                EffectClass::ReadOnly,
            ),
            answer: Ok(ToolOutput::default()),
            panics: true,
        })
    }
}

#[async_trait]
impl Tool for Fixed {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _: ToolContext, _: Value) -> Result<ToolOutput, ToolError> {
        assert!(!self.panics, "this tool always panics");
        self.answer.clone()
    }
}

/// A tool that ignores cancellation and finishes after `work`, past its
/// own 1 s timeout.
pub struct Stubborn {
    spec: ToolSpec,
    work: Duration,
    pub finished: AtomicUsize,
}

impl Stubborn {
    pub fn new(work: Duration) -> Arc<Self> {
        Arc::new(Self {
            spec: ToolSpec::new(
                "stubborn",
                "Slow.",
                json!({"type": "object"}),
                EffectClass::ReadOnly,
            )
            .with_timeout(Duration::from_secs(1))
            .with_retry_on_timeout(false),
            work,
            finished: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl Tool for Stubborn {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _: ToolContext, _: Value) -> Result<ToolOutput, ToolError> {
        tokio::time::sleep(self.work).await;
        self.finished.fetch_add(1, Ordering::SeqCst);
        Ok(ToolOutput::text("LATE-SECRET-RESULT"))
    }
}

pub fn registry(tools: Vec<Arc<dyn Tool>>) -> ToolRegistry {
    tools.into_iter().fold(
        ToolRegistry::new(PermissionMode::Auto),
        ToolRegistry::register,
    )
}

pub fn builder(provider: &Arc<ScriptedProvider>, tools: Vec<Arc<dyn Tool>>) -> AgentHarnessBuilder {
    AgentHarness::builder(provider.clone()).tools(registry(tools))
}

pub fn scripted(script: impl IntoIterator<Item = Scripted>) -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::new(script))
}

pub fn request(message: &str) -> TurnInput {
    TurnInput {
        session_id: "s-1".into(),
        turn_id: Uuid::now_v7(),
        turn_number: 1,
        history: Vec::new(),
        asked: Arc::new(TurnRequest::new(message)),
        attachments: Vec::new(),
        earlier: Vec::new(),
        session_cost_before: None,
        memory_scope: "session:s-1".into(),
        memories: None,
        handover: Default::default(),
        reasoning: None,
        steered: None,
    }
}

pub struct Ran {
    pub output: Result<TurnOutput, TurnError>,
    pub sink: Arc<RecordingSink>,
    pub state: Arc<TurnRuntimeState>,
}

impl Ran {
    pub fn text(&self) -> &str {
        &self
            .output
            .as_ref()
            .expect("the turn completes")
            .result
            .text
    }
}

pub async fn run(harness: &AgentHarness, request: TurnInput) -> Ran {
    let sink = Arc::new(RecordingSink::default());
    let state = harness.new_state(&request.session_id);
    let output = harness
        .run_turn_with_state(request, sink.clone(), state.clone())
        .await;
    Ran {
        output,
        sink,
        state,
    }
}

pub fn options() -> HarnessOptions {
    HarnessOptions::default()
}

/// Contents of the tool messages of a provider request, a tool's own
/// output taken out of its untrusted fence.
pub fn tool_messages(request: &harness_base::providers::ChatRequest) -> Vec<String> {
    request
        .messages
        .iter()
        .filter(|m| m.role == harness_base::providers::Role::Tool)
        .map(|m| unfence(&m.content))
        .collect()
}

/// A fenced tool result's content (checking the fence), or `content` as
/// it is when it has no fence.
pub fn unfence(content: &str) -> String {
    let Some(rest) = content.strip_prefix(harness_core::harness::waves::TOOL_RESULT_INTRO) else {
        return content.to_owned();
    };
    let rest = rest
        .strip_prefix("\n<<<UNTRUSTED_CONTEXT ")
        .expect("an opening fence");
    let (tag, body) = rest.split_once(">>>\n").expect("a tagged fence");
    assert_eq!(tag.len(), 16, "{content}");
    body.strip_suffix(&format!("\n<<<END_UNTRUSTED_CONTEXT {tag}>>>"))
        .expect("the matching closing fence")
        .to_owned()
}

/// Six long messages of an earlier conversation: enough for the critical
/// context level of a 1,024-token window.
pub fn long_history() -> Vec<ChatMessage> {
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
