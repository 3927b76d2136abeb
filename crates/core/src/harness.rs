//! The agent turn: [`AgentHarness::run_turn`] is the seeds' `run_turn`,
//! stage 0 to 6, reporting everything as [`TurnEvent`]s to an
//! [`EventSink`]. It does no I/O of its own besides the provider, the
//! tools and the collaborators; where events and the turn's commit go is
//! the runner's business.
//!
//! | seed | here |
//! |---|---|
//! | `AgentHarness` | [`AgentHarness`], built by [`AgentHarnessBuilder`], immutable |
//! | `run_turn` stages 0-6 | `turn_loop.rs` (stages, the tool offer) |
//! | `_execute_turn_loop_v2` (4a-4i) | `step.rs`: one step (gate, provider call, waves, reflection, compaction) |
//! | `TurnBudget` | [`budget::TurnBudget`] |
//! | `TurnRuntimeState` | [`state::TurnRuntimeState`] |
//! | `TurnPreparer` | [`prepare::TurnPreparer`] |
//! | `ToolScheduler` | [`scheduler::schedule`] |
//! | `_exec_call_v2` (7 gates) | [`gates`]; a step's waves and tool messages: [`waves`] |
//! | `BoundedToolExecutor` | [`executor::execute`] |
//! | `ReplayControl`, `ToolArgValidator` | [`replay`], [`validation`] |
//! | `ThinkingManager`, `ReflectionEngine` | [`thinking`] |
//! | `ContextWarningTracker`, `ContextCompactor` | [`compaction`] |
//! | `SemanticToolSelector` | [`selector`] |
//! | `TurnFinalizer` | [`finalizer`] |

pub mod budget;
pub mod call_ids;
pub mod compaction;
pub mod durable;
pub mod executor;
pub mod finalizer;
pub mod gates;
mod generate;
pub use crate::hooks;
pub mod prepare;
pub mod replay;
pub mod scheduler;
pub mod selector;
pub mod state;
mod steering;
mod step;
pub mod thinking;
mod turn_loop;
pub mod validation;
mod waits;
pub mod waves;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::{
    events::TurnEvent,
    providers::{ChatMessage, LlmProvider, ProviderError},
    store::{MemoryQuery, MemoryRecord, NewDecision, NewJob, NewMessage, ObservationRecord},
    tools::ToolRegistry,
    turn::{TurnRequest, TurnResult, WebMode},
};
use budget::{BudgetLimits, TurnBudget};
use compaction::ContextWarningTracker;
use hooks::{
    AgentCallbacks, ApprovalGate, ArtifactStore, CheckpointStore, CostTracker, JudgeScheduler,
    MemoryExtractor, MemoryRetriever, NoCallbacks, ResearchLearner,
};
use state::TurnRuntimeState;
use thinking::{ThinkLevel, ThinkingManager};

pub use finalizer::StepFailure;

/// The system prompt used when none is configured.
pub const DEFAULT_SYSTEM_PROMPT: &str =
    "You are a helpful assistant. Answer accurately and concisely.";

/// Text of a turn whose deadline passed before an answer.
pub const TIMEOUT_TEXT: &str =
    "I ran out of time for this turn before finishing. Please try again or narrow the request.";

/// Text of a turn that used all its steps without a final answer.
pub const MAX_STEPS_TEXT: &str = "I reached the step limit for this turn before finishing. \
     Please try again or narrow the request.";

/// The harness's constructor options, with the seeds' defaults.
#[derive(Debug, Clone)]
pub struct HarnessOptions {
    /// Maximum LLM steps per turn (6).
    pub max_steps: u32,
    /// Absolute deadline of a turn (60 s).
    pub timeout: Duration,
    /// Tool calls per turn (6).
    pub max_tool_calls: u32,
    /// Reflections per turn (4).
    pub max_reflections: u32,
    /// OFF.
    pub think_level: ThinkLevel,
    /// The operator's ceiling on a request's think level (HIGH).
    pub max_think_level: ThinkLevel,
    /// The operator's ceiling on a call's output tokens (none).
    pub max_output_tokens: Option<u32>,
    /// 0: never; N: reflect on every N-th turn of a session.
    pub reflect_every: u32,
    /// Stream provider output (true: the service always streams).
    pub stream: bool,
    /// Whether the model's reasoning leaves the service
    /// (`HARNESS_REASONING`).
    pub reasoning: Reasoning,
    /// The base system prompt.
    pub system_prompt: String,
    pub prompt_id: Option<String>,
    pub prompt_version: Option<String>,
    pub prompt_tags: Vec<String>,
    pub prompt_engine: String,
    pub prompt_render_hash: Option<String>,
    pub prompt_variables: Vec<String>,
    /// Keep message text out of decision records and telemetry.
    pub redact_logs: bool,
    /// Record prompt and answer text on provider-call spans
    /// (`gen_ai.input.messages`, `gen_ai.output.messages`); off by default.
    pub capture_content: bool,
    /// Global switch for parallel waves (true).
    pub parallel_enabled: bool,
    pub run_context_metadata: serde_json::Map<String, serde_json::Value>,
    /// Validate tool arguments with bounded repair (true).
    pub enable_tool_validation: bool,
    /// Trim the offered tools to the most relevant (false).
    pub enable_semantic_selection: bool,
    /// Tools offered when selection is on (25).
    pub max_tools_per_turn: usize,
    /// Summarise older messages at the critical context level (true).
    pub auto_compact: bool,
    /// Store a decision record per turn (the seeds' `decision_store`).
    pub record_decisions: bool,
    /// Calls of these effect classes wait for a person's approval (with an
    /// approval gate; none by default).
    pub approval_effects: Vec<crate::tools::EffectClass>,
    /// How long a call waits for a person's decision or a client's result
    /// before it ends `timed_out` (apart from the turn's compute
    /// deadline, which stands still meanwhile).
    pub wait_timeout: Duration,
    /// How long a wait keeps the turn running here before the turn is
    /// parked ([`TurnError::Parked`]) to go on when the answer comes
    /// (`None`: never parked; it waits here until `wait_timeout`).
    pub park_after: Option<Duration>,
}

impl Default for HarnessOptions {
    fn default() -> Self {
        Self {
            max_steps: 6,
            timeout: Duration::from_secs(60),
            max_tool_calls: 6,
            max_reflections: 4,
            think_level: ThinkLevel::Off,
            max_think_level: ThinkLevel::High,
            max_output_tokens: None,
            reflect_every: 0,
            stream: true,
            reasoning: Reasoning::Show,
            system_prompt: DEFAULT_SYSTEM_PROMPT.to_owned(),
            prompt_id: None,
            prompt_version: None,
            prompt_tags: Vec::new(),
            prompt_engine: "minimal".to_owned(),
            prompt_render_hash: None,
            prompt_variables: Vec::new(),
            redact_logs: false,
            capture_content: false,
            parallel_enabled: true,
            run_context_metadata: serde_json::Map::new(),
            enable_tool_validation: true,
            enable_semantic_selection: false,
            max_tools_per_turn: 25,
            auto_compact: true,
            record_decisions: true,
            approval_effects: Vec::new(),
            wait_timeout: Duration::from_secs(24 * 60 * 60),
            park_after: None,
        }
    }
}

impl HarnessOptions {
    pub fn budget_limits(&self) -> BudgetLimits {
        BudgetLimits {
            max_steps: self.max_steps,
            max_tool_calls: self.max_tool_calls,
            max_reflections: self.max_reflections,
            timeout: self.timeout,
        }
    }
}

/// Everything one turn needs from its caller.
#[derive(Debug, Clone)]
pub struct TurnInput {
    pub session_id: crate::ids::SessionKey,
    pub turn_id: Uuid,
    /// 1-based number of this turn in its session.
    pub turn_number: u64,
    pub history: Vec<ChatMessage>,
    /// What the turn is asked, as the edge validated it.
    pub asked: Arc<TurnRequest>,
    /// Its message's images and files with their bytes (its request
    /// names their files): what each call sends.
    pub attachments: Vec<crate::providers::Attachment>,
    /// The images and PDFs of its history's messages, with their bytes
    /// (the history's messages carry them too; a record of them does not).
    pub earlier: Vec<crate::providers::Attachment>,
    /// Cost of the session's earlier turns, for the session total.
    pub session_cost_before: Option<f64>,
    /// Whether its reasoning reaches clients, as its tenant chose (none:
    /// as the harness's options say).
    pub reasoning: Option<Reasoning>,
    /// Whose memories the turn reads and adds to: `user:{id}` when the
    /// request names a user, else `session:{id}`.
    pub memory_scope: String,
    /// The answer to [`AgentHarness::memory_query`], when the store gave
    /// it with the turn's begin (the matches and the preferences).
    pub memories: Option<(Vec<MemoryRecord>, Vec<MemoryRecord>)>,
    /// Cancelled when the process hands its turns over (shutdown): the
    /// turn stops at its next step boundary, or at once while it waits for
    /// the model (that step is done again by the next owner), with
    /// [`TurnError::HandedOver`].
    pub handover: tokio_util::sync::CancellationToken,
    /// Whether a message may have been steered into the turn (set by its
    /// process as it hears of one): a step looks for them only then, so
    /// a turn never steered reads nothing. `None`: at every step.
    pub steered: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// Whether the model's reasoning is shown to clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Reasoning {
    /// As `reasoning.delta` events (and each protocol's own shape).
    #[default]
    Show,
    /// Nothing of it leaves the service (its tokens still count).
    Hidden,
}

/// A turn's result plus what the runner commits with `turn.completed`.
#[derive(Debug, Clone)]
pub struct TurnOutput {
    pub result: TurnResult,
    pub assistant_message_id: Uuid,
    /// The user message and the answer, for the history.
    pub messages: Vec<NewMessage>,
    pub decision: Option<NewDecision>,
    /// The research learner's observation, written with the turn's end.
    pub observation: Option<ObservationRecord>,
    /// Work queued for after the turn (memory extraction), written with
    /// the turn's end.
    pub jobs: Vec<NewJob>,
    pub strategy: String,
    pub step_failures: Vec<StepFailure>,
}

/// Why an event could not be delivered; the turn cannot go on without its log.
#[derive(Debug, Clone, thiserror::Error)]
#[error("event log unavailable: {0}")]
pub struct SinkError(pub String);

/// Where a turn's events go.
#[async_trait]
pub trait EventSink: Send + Sync {
    /// Records `event`. Events are delivered in the order of the calls.
    async fn emit(&self, event: TurnEvent) -> Result<(), SinkError>;

    /// Records what a step leaves for the rest of the turn, after the
    /// events emitted before it (see [`durable`]); with `wait`, returns
    /// only once the record is durable (what the step does next must not
    /// happen without it).
    async fn step_done(&self, record: durable::StepRecord, wait: bool) -> Result<(), SinkError>;
}

/// Why a turn failed. Deadline and step exhaustion are not failures: the
/// turn completes with [`TIMEOUT_TEXT`] or [`MAX_STEPS_TEXT`].
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// The process is handing the turn over: it stopped at a step
    /// boundary, its records say where it stands.
    #[error("the turn was handed over to another process")]
    HandedOver,
    /// Calls of the turn wait for answers from outside (a person, a
    /// client) longer than it keeps running: it stopped where its records
    /// say, to go on when an answer comes or the wait ends.
    #[error("the turn waits for an answer")]
    Parked(Parked),
}

/// Where a parked turn waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parked {
    /// When the first of its waits ends unanswered.
    pub until: chrono::DateTime<chrono::Utc>,
    /// The calls that wait.
    pub calls: Vec<String>,
}

impl TurnError {
    /// Stable code for `turn.failed` and problem responses.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Provider(e) => e.code(),
            Self::Sink(_) => "event_log_unavailable",
            Self::HandedOver => "handed_over",
            Self::Parked(_) => "parked",
        }
    }
}

/// Runs agent turns. Built once, shared as `Arc<AgentHarness>`, never
/// mutated: all per-turn state lives in the turn's [`TurnRuntimeState`].
pub struct AgentHarness {
    provider: Arc<dyn LlmProvider>,
    tools: ToolRegistry,
    options: HarnessOptions,
    thinking: ThinkingManager,
    callbacks: Arc<dyn AgentCallbacks>,
    memory_retriever: Option<Arc<dyn MemoryRetriever>>,
    memory_extractor: Option<Arc<dyn MemoryExtractor>>,
    research_learner: Option<Arc<dyn ResearchLearner>>,
    judges: Option<Arc<dyn JudgeScheduler>>,
    checkpoint_store: Option<Arc<dyn CheckpointStore>>,
    approvals: Option<Arc<dyn ApprovalGate>>,
    /// Where calls of the clients' own tools get their results (none: a
    /// turn's client tools are not offered).
    client_results: Option<Arc<dyn crate::hooks::ClientResults>>,
    /// Where a turn finds messages steered into it (none: never steered).
    steering: Option<Arc<dyn crate::hooks::Steering>>,
    cost_tracker: Option<Arc<dyn CostTracker>>,
    context_tracker: Option<ContextWarningTracker>,
    /// Embeddings of the tools, for semantic selection (none: by words).
    tool_embeddings: Option<Arc<selector::ToolEmbeddings>>,
    /// What is known of each model (its longest answer: the turn's calls
    /// ask for no more).
    models: Option<Arc<crate::providers::catalogue::ModelCatalogue>>,
    artifacts: Option<Arc<dyn ArtifactStore>>,
    /// Tool tasks (each bounded by its timeout and the late grace).
    tasks: TaskTracker,
}

/// Builds an [`AgentHarness`].
pub struct AgentHarnessBuilder {
    harness: AgentHarness,
}

impl AgentHarnessBuilder {
    pub fn tools(mut self, tools: ToolRegistry) -> Self {
        self.harness.tools = tools;
        self
    }

    pub fn options(mut self, options: HarnessOptions) -> Self {
        self.harness.thinking = ThinkingManager {
            level: options.think_level,
            reflect_every: options.reflect_every,
        };
        self.harness.options = options;
        self
    }

    pub fn callbacks(mut self, callbacks: Arc<dyn AgentCallbacks>) -> Self {
        self.harness.callbacks = callbacks;
        self
    }

    pub fn memory_retriever(mut self, retriever: Arc<dyn MemoryRetriever>) -> Self {
        self.harness.memory_retriever = Some(retriever);
        self
    }

    pub fn memory_extractor(mut self, extractor: Arc<dyn MemoryExtractor>) -> Self {
        self.harness.memory_extractor = Some(extractor);
        self
    }

    pub fn research_learner(mut self, learner: Arc<dyn ResearchLearner>) -> Self {
        self.harness.research_learner = Some(learner);
        self
    }

    pub fn judges(mut self, judges: Arc<dyn JudgeScheduler>) -> Self {
        self.harness.judges = Some(judges);
        self
    }

    /// Calls of the options' `approval_effects` wait for this gate.
    pub fn approvals(mut self, gate: Arc<dyn ApprovalGate>) -> Self {
        self.harness.approvals = Some(gate);
        self
    }

    /// Calls of a turn's client tools wait for their results here.
    pub fn client_results(mut self, results: Arc<dyn crate::hooks::ClientResults>) -> Self {
        self.harness.client_results = Some(results);
        self
    }

    pub fn steering(mut self, steering: Arc<dyn crate::hooks::Steering>) -> Self {
        self.harness.steering = Some(steering);
        self
    }

    pub fn checkpoint_store(mut self, store: Arc<dyn CheckpointStore>) -> Self {
        self.harness.checkpoint_store = Some(store);
        self
    }

    pub fn cost_tracker(mut self, tracker: Arc<dyn CostTracker>) -> Self {
        self.harness.cost_tracker = Some(tracker);
        self
    }

    /// Watches the context window; `None` turns compaction off.
    /// Semantic tool selection by embeddings (see [`selector`]).
    pub fn tool_embedder(
        mut self,
        embedder: Arc<dyn crate::providers::embeddings::Embedder>,
    ) -> Self {
        self.harness.tool_embeddings = Some(Arc::new(selector::ToolEmbeddings::new(embedder)));
        self
    }

    /// The model catalogue: each call's answer limit.
    pub fn models(mut self, models: Arc<crate::providers::catalogue::ModelCatalogue>) -> Self {
        self.harness.models = Some(models);
        self
    }

    pub fn context_tracker(mut self, tracker: Option<ContextWarningTracker>) -> Self {
        self.harness.context_tracker = tracker;
        self
    }

    pub fn artifacts(mut self, artifacts: Arc<dyn ArtifactStore>) -> Self {
        self.harness.artifacts = Some(artifacts);
        self
    }

    pub fn build(self) -> AgentHarness {
        self.harness
    }
}

impl AgentHarness {
    /// A builder with the seeds' defaults, no tools and no collaborators.
    pub fn builder(provider: Arc<dyn LlmProvider>) -> AgentHarnessBuilder {
        AgentHarnessBuilder {
            harness: Self {
                provider,
                tools: ToolRegistry::default(),
                options: HarnessOptions::default(),
                thinking: ThinkingManager::default(),
                callbacks: Arc::new(NoCallbacks),
                memory_retriever: None,
                memory_extractor: None,
                research_learner: None,
                judges: None,
                checkpoint_store: None,
                approvals: None,
                client_results: None,
                steering: None,
                cost_tracker: None,
                context_tracker: Some(ContextWarningTracker::new(128_000)),
                models: None,
                tool_embeddings: None,
                artifacts: None,
                tasks: TaskTracker::new(),
            },
        }
    }

    pub fn options(&self) -> &HarnessOptions {
        &self.options
    }

    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// The store read stage 1's memory retrieval makes for a turn of
    /// `scope` asking `message`, for the store to answer with the turn's
    /// begin; `None`: no retrieval, or one that reads for itself.
    pub fn memory_query(&self, scope: &str, message: &str) -> Option<MemoryQuery> {
        self.memory_retriever.as_ref()?.store_query(scope, message)
    }

    /// The model a turn asking `asked` runs on, and what it reads besides
    /// text (the catalogue's `inputs`).
    pub fn reads(
        &self,
        asked: &crate::turn::TurnRequest,
    ) -> (String, crate::providers::catalogue::Inputs) {
        let (_, model) = prepare::resolve_provider_model(
            self.provider.as_ref(),
            asked.runtime_provider.as_deref(),
            asked.runtime_model.as_deref(),
        );
        let inputs = self
            .models
            .as_ref()
            .map(|models| models.inputs(&model))
            .unwrap_or_default();
        (model, inputs)
    }

    pub fn provider(&self) -> &Arc<dyn LlmProvider> {
        &self.provider
    }

    pub fn checkpoint_store(&self) -> Option<&Arc<dyn CheckpointStore>> {
        self.checkpoint_store.as_ref()
    }

    /// Name of the provider and the model a turn with these overrides uses.
    pub fn resolve_provider_model(
        &self,
        runtime_provider: Option<&str>,
        runtime_model: Option<&str>,
    ) -> (String, String) {
        prepare::resolve_provider_model(self.provider.as_ref(), runtime_provider, runtime_model)
    }

    /// Whether `name` may run in this turn: registered, permitted by the
    /// registry's mode, and the web tools only with `web_mode: on`.
    pub fn is_tool_allowed(&self, name: &str, request: &TurnInput) -> bool {
        self.tools.permits(name)
            && (!crate::tools::web::WEB_TOOLS.contains(&name)
                || request.asked.web_mode == WebMode::On)
    }

    /// A fresh state with this harness's budget, its deadline starting now.
    pub fn new_state(&self, session_id: &str) -> Arc<TurnRuntimeState> {
        Arc::new(TurnRuntimeState::new(
            session_id,
            TurnBudget::create(self.options.budget_limits()),
        ))
    }

    /// Waits for tool tasks still running (each is bounded).
    pub async fn wait_for_tool_tasks(&self) {
        self.tasks.close();
        self.tasks.wait().await;
        self.tasks.reopen();
    }

    /// Runs one turn to its result.
    ///
    /// # Cancel safety
    /// Dropping the future stops the turn at its next await; its tool tasks
    /// are cancelled and then dropped after [`executor::LATE_GRACE`]. Only
    /// events already emitted remain; nothing else is written.
    pub async fn run_turn(
        &self,
        request: TurnInput,
        sink: Arc<dyn EventSink>,
    ) -> Result<TurnOutput, TurnError> {
        let state = self.new_state(&request.session_id);
        self.run_turn_with_state(request, sink, state).await
    }

    /// Goes on with a turn that another process began, from where its
    /// records left it (see [`durable`]): stages 0 to 3 are not run again.
    pub async fn resume_turn(
        &self,
        request: TurnInput,
        sink: Arc<dyn EventSink>,
        resume: durable::Resume,
    ) -> Result<TurnOutput, TurnError> {
        turn_loop::resume(self, request, sink, resume).await
    }

    /// [`AgentHarness::run_turn`] with a state the caller keeps (to inspect
    /// it afterwards).
    pub async fn run_turn_with_state(
        &self,
        request: TurnInput,
        sink: Arc<dyn EventSink>,
        state: Arc<TurnRuntimeState>,
    ) -> Result<TurnOutput, TurnError> {
        turn_loop::run(self, request, sink, state).await
    }
}
