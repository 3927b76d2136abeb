//! The optional collaborators of the harness (seeds: `004`), and the
//! callbacks a host can register.
//!
//! They are the vocabulary between the harness and what plugs into it
//! (memory, judges, the store's checkpoints and approvals), so they sit
//! below both: `memory` implements them without importing the harness.
//! The harness re-exports them as `harness::hooks`.
//!
//! Every method may fail; the harness isolates each call so that one
//! collaborator cannot take the turn down (a panic is caught too).

use std::{fmt, panic::AssertUnwindSafe};

use async_trait::async_trait;
use futures::FutureExt;

use serde::{Deserialize, Serialize};

use crate::{
    events::ToolStatus,
    providers::{ToolCall, Usage},
    store::{MemoryQuery, MemoryRecord, NewJob, ObservationRecord},
};

/// What the reflection engine, the finalizer and the hooks learn of a
/// tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResultRecord {
    pub call_id: String,
    pub tool: String,
    pub status: ToolStatus,
    /// What the model was shown (possibly an artifact reference).
    pub content: String,
}

/// A collaborator's failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HookError(pub String);

impl HookError {
    pub fn new(message: impl fmt::Display) -> Self {
        Self(message.to_string())
    }
}

/// Episodic memory for the prompt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryContext {
    /// Formatted memory text (a system message when not empty).
    pub text: String,
    /// Preference and habit items, merged into the context pack.
    pub preferences: Vec<String>,
}

#[async_trait]
pub trait MemoryRetriever: Send + Sync {
    /// The memories of `scope` (the turn's memory scope) relevant to `query`.
    async fn retrieve_for_context(
        &self,
        scope: &str,
        query: &str,
    ) -> Result<MemoryContext, HookError>;

    /// The store read this retriever makes for `query`, when it is one a
    /// store may answer with the turn's begin (`None`: it reads itself).
    fn store_query(&self, _scope: &str, _query: &str) -> Option<MemoryQuery> {
        None
    }

    /// As [`Self::retrieve_for_context`], with its [`Self::store_query`]
    /// already answered (`read`: the matches and the preferences).
    async fn retrieve_with(
        &self,
        scope: &str,
        query: &str,
        read: (Vec<MemoryRecord>, Vec<MemoryRecord>),
    ) -> Result<MemoryContext, HookError> {
        let _ = read;
        self.retrieve_for_context(scope, query).await
    }
}

/// A completed turn, for memory extraction.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryTurn {
    /// Whose memories: `user:{id}` or `session:{id}`.
    pub scope: String,
    pub session_id: crate::ids::SessionKey,
    pub turn_id: String,
    pub user_message: String,
    pub assistant_message: String,
    pub tool_results: Vec<ToolResultRecord>,
    /// The provider and model that answered the turn.
    pub provider: String,
    pub model: String,
}

#[async_trait]
pub trait MemoryExtractor: Send + Sync {
    /// Takes note of the turn. A slow extraction should queue its work
    /// (the turn's completion waits for this call): the job returned is
    /// written with the turn's end, in the transaction that stores the
    /// answer, and runs only once that has landed.
    async fn extract_turn(&self, turn: &MemoryTurn) -> Result<Option<NewJob>, HookError>;
}

/// A turn's question and answer, for the research learner.
#[derive(Debug, Clone, Copy)]
pub struct Exchange<'a> {
    pub session_id: &'a str,
    pub user_text: &'a str,
    pub assistant_text: &'a str,
    /// The stored answer (`chat_message:{id}`).
    pub source_id: &'a str,
}

#[async_trait]
pub trait ResearchLearner: Send + Sync {
    /// Looks at the turn. What it returns is written with the turn's end,
    /// in the transaction that stores the answer it names (so no
    /// observation names an answer that was not stored), and is not
    /// written at all if the turn's end is not stored.
    async fn observe_turn(
        &self,
        exchange: Exchange<'_>,
    ) -> Result<Option<ObservationRecord>, HookError>;
}

/// What a judge evaluates.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JudgeRequest {
    pub prompt_id: String,
    pub prompt_version: String,
    pub session_id: crate::ids::SessionKey,
    pub turn_id: String,
    pub user_message: String,
    pub response: String,
    /// Facts of the context pack the answer could rely on.
    pub facts: Vec<String>,
    /// The prompt as `[role] content` blocks.
    pub messages_text: String,
    /// The provider and model that answered the turn.
    pub provider: String,
    pub model: String,
}

/// Queues LLM judges (faithfulness, relevance, ...) for a prompt's answers.
#[async_trait]
pub trait JudgeScheduler: Send + Sync {
    /// Judges registered for a prompt id (none: nothing is scheduled).
    fn judges_for(&self, prompt_id: &str) -> Vec<String>;
    /// The judges' jobs: written with the turn's end, in the transaction
    /// that stores the answer they judge, and run once that has landed.
    async fn schedule(&self, request: JudgeRequest) -> Result<Vec<NewJob>, HookError>;
}

/// A write about to run, whose resources are to be saved first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRequest {
    pub session_id: crate::ids::SessionKey,
    pub turn_id: String,
    pub call_id: String,
    pub tool: String,
    /// What the write will change: the call's resource keys.
    pub resource_keys: Vec<String>,
}

/// Snapshots of vault files before confirmed writes, for undo. A write
/// whose snapshot fails does not run.
#[async_trait]
pub trait CheckpointStore: Send + Sync {
    /// Saves the resources; returns the checkpoints' ids. A call that
    /// already has its checkpoints (it runs again after a take-over) keeps
    /// them: they hold what was there before its first run.
    async fn snapshot(&self, request: &CheckpointRequest) -> Result<Vec<String>, HookError>;

    /// What the checkpoints of one call saved, oldest first (none: the
    /// call never got past its checkpoint).
    async fn saved(
        &self,
        session_id: &str,
        turn_id: &str,
        call_id: &str,
    ) -> Result<Vec<crate::tools::Saved>, HookError>;
}

/// A tool call waiting for a person's approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRequest {
    pub session_id: crate::ids::SessionKey,
    pub turn_id: String,
    pub call_id: String,
    pub tool: String,
}

/// What became of an approval request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalDecision {
    /// Approved: with the arguments to run instead, when the person
    /// edited them (JSON, checked against the tool's schema), and the
    /// SHA-256 of the arguments the approval is for (none: a decision
    /// made before approvals were bound, for the arguments as asked).
    Approved {
        edited_arguments: Option<String>,
        arguments_sha256: Option<String>,
    },
    Denied {
        reason: String,
    },
    /// The turn's deadline came first.
    TimedOut,
    /// The turn was cancelled while it waited.
    Cancelled,
}

/// Asks a person before calls of some effect classes run.
#[async_trait]
pub trait ApprovalGate: Send + Sync {
    /// Waits for the decision on `request`, at most `within`, and no longer
    /// than `cancel` stays uncancelled.
    async fn decide(
        &self,
        request: &ApprovalRequest,
        within: std::time::Duration,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> ApprovalDecision;
}

pub use crate::tools::client::{ClientResult, ClientResults};

/// A message steered into a running turn, claimed for one of its steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steered {
    pub id: uuid::Uuid,
    pub message: String,
}

/// Where a running turn finds the messages steered into it.
#[async_trait]
pub trait Steering: Send + Sync {
    /// Claims for `step` of `turn_id` the messages steered into it and not
    /// in its conversation before that step, oldest first, at most
    /// `limit`. A step going again after a take-over claims again what
    /// its first try claimed (its record never landed), so a message is
    /// in the conversation once.
    async fn claim(
        &self,
        turn_id: uuid::Uuid,
        step: u32,
        limit: u32,
    ) -> Result<Vec<Steered>, HookError>;
}

/// Accumulates token cost per session.
pub trait CostTracker: Send + Sync {
    /// Records a provider call; returns its cost in USD when the model is priced.
    fn record(&self, session_id: &str, provider: &str, model: &str, usage: &Usage) -> Option<f64>;
}

/// Host callbacks. Every method has a no-op default.
#[async_trait]
pub trait AgentCallbacks: Send + Sync {
    async fn on_turn_start(&self, _session_id: &str, _turn_count: u64) {}
    async fn on_stream_chunk(&self, _text: &str) {}
    /// Return false to deny the call (`ToolDenied(reason = "pre_hook")`).
    async fn on_pre_tool_use(&self, _call: &ToolCall) -> bool {
        true
    }
    async fn on_post_tool_use(&self, _call: &ToolCall, _status: &str) {}
    async fn on_usage(&self, _input_tokens: u64, _output_tokens: u64) {}
    /// A provider call failed (its stable code, e.g. `provider_timeout`),
    /// or the turn's deadline passed before it answered (`provider_timeout`).
    async fn on_provider_error(&self, _code: &str) {}
    async fn on_turn_end(&self, _session_id: &str) {}
}

/// Callbacks that do nothing.
#[derive(Debug, Default)]
pub struct NoCallbacks;

impl AgentCallbacks for NoCallbacks {}

/// Runs `future`, turning a panic into an error: a collaborator must not
/// take the turn down.
pub async fn isolate<T>(
    future: impl Future<Output = Result<T, HookError>>,
) -> Result<T, HookError> {
    match AssertUnwindSafe(future).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".to_owned());
            Err(HookError(format!("panicked: {message}")))
        }
    }
}

/// A tool's output too large for the prompt, and the call that gave it.
#[derive(Debug, Clone, Copy)]
pub struct LongOutput<'a> {
    pub session_id: &'a str,
    pub turn_id: uuid::Uuid,
    pub call_id: &'a str,
    pub tool: &'a str,
    pub content: &'a str,
}

/// Where tool outputs too large for the prompt are kept.
#[async_trait]
pub trait ArtifactStore: Send + Sync {
    /// Keeps `output`; returns the artifact id.
    async fn put(&self, output: LongOutput<'_>) -> Result<String, HookError>;
}

/// A pricing table is a cost tracker: it prices each call by its model.
impl CostTracker for crate::providers::catalogue::ModelCatalogue {
    fn record(
        &self,
        _session_id: &str,
        _provider: &str,
        model: &str,
        usage: &Usage,
    ) -> Option<f64> {
        self.cost(model, usage)
    }
}
