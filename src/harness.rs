//! The agent turn: [`AgentHarness::run_turn`] drives the bounded loop of
//! provider calls and reports everything as [`TurnEvent`]s to an
//! [`EventSink`]. It owns no I/O of its own besides the provider; where the
//! events go (event log, live subscribers) is the runner's business.

pub mod budget;
mod prepare;
pub mod state;
mod turn_loop;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::{
    events::TurnEvent,
    providers::{ChatMessage, LlmProvider, ProviderError},
};

pub use prepare::runtime_metadata;

/// Text of a turn whose deadline passed before an answer.
pub const TIMEOUT_TEXT: &str =
    "I ran out of time for this turn before finishing. Please try again or narrow the request.";

/// Text of a turn that used all its steps without a final answer.
pub const MAX_STEPS_TEXT: &str = "I reached the step limit for this turn before finishing. \
     Please try again or narrow the request.";

/// Settings of the harness, fixed when it is built.
#[derive(Debug, Clone)]
pub struct HarnessConfig {
    /// Maximum LLM generation steps per turn (seeds: 6).
    pub max_steps: u32,
    /// Absolute wall-clock deadline of a turn (seeds: 60 s).
    pub timeout: Duration,
    /// The base system prompt.
    pub system_prompt: String,
}

impl Default for HarnessConfig {
    fn default() -> Self {
        Self {
            max_steps: 6,
            timeout: Duration::from_secs(60),
            system_prompt: crate::config::DEFAULT_SYSTEM_PROMPT.to_owned(),
        }
    }
}

/// `web_mode` of a turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WebMode {
    #[default]
    Off,
    On,
}

/// Everything one turn needs from its caller.
#[derive(Debug, Clone)]
pub struct TurnRequest {
    pub session_id: String,
    pub turn_id: Uuid,
    pub history: Vec<ChatMessage>,
    pub user_message: String,
    pub top_k: u32,
    pub web_mode: WebMode,
    pub show_citations: bool,
    /// Provider name for the runtime metadata; the harness's own when `None`.
    pub runtime_provider: Option<String>,
    /// Model to call; the provider's default when `None`.
    pub runtime_model: Option<String>,
    pub skill_context: Option<String>,
}

/// The public result of a turn (the seeds' `TurnResult`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TurnResult {
    /// The final assistant response (with citations when requested).
    pub text: String,
    /// Vault anchors cited this turn.
    pub local_citations: Vec<String>,
    /// Web sources cited this turn.
    pub web_citations: Vec<std::collections::BTreeMap<String, String>>,
    /// Paths of rendered web content.
    pub rendered_content_paths: Vec<String>,
    /// The context pack used, if any.
    #[schema(value_type = Option<Object>)]
    pub context_pack_json: Option<serde_json::Value>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_creation_tokens: u64,
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
}

/// Why a turn failed. Deadline and step exhaustion are not failures: the
/// turn completes with [`TIMEOUT_TEXT`] or [`MAX_STEPS_TEXT`].
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error(transparent)]
    Sink(#[from] SinkError),
}

impl TurnError {
    /// Stable code for `turn.failed` and problem responses.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Provider(e) => e.code(),
            Self::Sink(_) => "event_log_unavailable",
        }
    }
}

/// Runs agent turns. Built once, shared as `Arc<AgentHarness>`, never
/// mutated: all per-turn state lives in the turn's own future.
pub struct AgentHarness {
    provider: Arc<dyn LlmProvider>,
    config: HarnessConfig,
}

impl AgentHarness {
    pub fn new(provider: Arc<dyn LlmProvider>, config: HarnessConfig) -> Self {
        Self { provider, config }
    }

    pub fn config(&self) -> &HarnessConfig {
        &self.config
    }

    /// Name of the provider and the model a turn with these overrides uses.
    pub fn resolve_provider_model(
        &self,
        runtime_provider: Option<&str>,
        runtime_model: Option<&str>,
    ) -> (String, String) {
        prepare::resolve_provider_model(self.provider.as_ref(), runtime_provider, runtime_model)
    }

    /// Runs one turn to its result.
    ///
    /// # Cancel safety
    /// Dropping the future stops the turn at its next await (the provider
    /// request is dropped with it). It writes nothing but events through
    /// `sink`, so a dropped turn leaves only the events already emitted.
    pub async fn run_turn(
        &self,
        request: TurnRequest,
        sink: &dyn EventSink,
    ) -> Result<TurnResult, TurnError> {
        turn_loop::run(self, request, sink).await
    }
}
