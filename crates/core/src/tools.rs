//! Tools: the [`Tool`] trait, its [`ToolSpec`], and the [`ToolRegistry`]
//! with its permission mode.
//!
//! A tool failure is a result the model sees (a stable kind, a retryable
//! flag, a message), never a turn failure. Tools get a cancellation token
//! and are expected to honour it; one that does not is given a short grace
//! and then dropped, and its late result is discarded by the late-write gate.

pub mod client;
pub mod http_tool;
pub mod mcp;
pub mod notes;
pub mod retrieval;
pub mod web;

use std::{collections::HashMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{providers::ToolDefinition, turn::WebMode};

/// The names of the service's own tools, which no declared tool may take.
pub const BUILTIN_TOOLS: &[&str] = &[
    "get_context_pack",
    "local_search",
    "read_note",
    "write_note",
    "append_note",
    "web_search",
    "fetch_url",
];

/// Default per-tool timeout (seeds: `TOOL_CALL_TIMEOUT_S = 45`).
pub const TOOL_CALL_TIMEOUT: Duration = Duration::from_secs(45);

pub use crate::turn::EffectClass;

/// The static description of a tool.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments.
    pub parameters: Value,
    pub effect: EffectClass,
    /// Per-call timeout; [`TOOL_CALL_TIMEOUT`] when `None`.
    pub timeout: Option<Duration>,
    /// Whether a timed-out call may be retried by the model (seeds default: true).
    pub retry_on_timeout: bool,
    /// Where the tool comes from: `builtin`, `mcp:{server}`, `http`.
    pub source: String,
    /// Whether running a call twice has the effect of running it once (the
    /// operator says so): a call that started in a process that died is
    /// run again (HTTP tools send the same `Idempotency-Key`), not ended
    /// `unknown`.
    pub idempotent: bool,
    /// `parameters` compiled, once, at the first call that is validated
    /// (shared by the spec's clones); the schema is not changed after.
    validator: Arc<std::sync::OnceLock<Result<jsonschema::Validator, String>>>,
}

impl ToolSpec {
    pub fn new(name: &str, description: &str, parameters: Value, effect: EffectClass) -> Self {
        Self {
            name: name.to_owned(),
            description: description.to_owned(),
            parameters,
            effect,
            timeout: None,
            retry_on_timeout: true,
            source: "builtin".to_owned(),
            idempotent: false,
            validator: Arc::default(),
        }
    }

    /// The arguments' schema compiled: once for the spec and its clones,
    /// not at every call.
    pub fn validator(&self) -> Result<&jsonschema::Validator, &str> {
        self.validator
            .get_or_init(|| jsonschema::validator_for(&self.parameters).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(String::as_str)
    }

    pub fn with_idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = idempotent;
        self
    }

    pub fn with_source(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    pub fn with_retry_on_timeout(mut self, retry: bool) -> Self {
        self.retry_on_timeout = retry;
        self
    }

    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(TOOL_CALL_TIMEOUT)
    }

    pub fn definition(&self) -> ToolDefinition {
        ToolDefinition {
            name: self.name.clone(),
            description: self.description.clone(),
            parameters: self.parameters.clone(),
        }
    }
}

/// What a tool call knows of its turn.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub session_id: crate::ids::SessionKey,
    pub turn_id: Uuid,
    /// 1-based number of the turn in its session.
    pub turn_number: u64,
    pub call_id: String,
    pub top_k: u32,
    pub web_mode: WebMode,
    /// Cancelled when the call timed out or the turn stopped.
    pub cancel: CancellationToken,
}

/// A source a tool output cites.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Citation {
    /// A local anchor (a vault path, a stored message).
    Local { anchor: String },
    /// A web page.
    Web { title: String, url: String },
    /// A rendered copy of web content.
    Rendered { path: String },
}

/// A successful tool result.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolOutput {
    /// What the model is shown.
    pub content: String,
    pub citations: Vec<Citation>,
}

impl ToolOutput {
    pub fn text(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            citations: Vec::new(),
        }
    }
}

/// A resource as the checkpoint taken before a write saved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// The resource's path (a note's, in the vault).
    pub path: String,
    /// Its bytes then; `None`: it did not exist.
    pub content: Option<Vec<u8>>,
}

/// What became of a call that started in a process that stopped before
/// the call ended, as the tool can tell from the resources now and as its
/// checkpoints saved them ([`Tool::settle`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// It took effect: what it would have answered.
    Landed(ToolOutput),
    /// It took no effect: it may run (again).
    NotLanded,
    /// Nothing tells: the model is told `outcome_unknown`.
    Unknown,
}

/// What kind of failure a tool call met (shown to the model, and in
/// `tool.finished`'s `error`, as its snake_case name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolErrorKind {
    /// The arguments make no sense to the tool.
    InvalidInput,
    /// What the call asked for does not exist.
    NotFound,
    /// The tool may not do this.
    PermissionDenied,
    /// Something the tool needs is down (a store, a service).
    Unavailable,
    /// The tool failed for a reason of its own.
    Failed,
    /// The tool panicked (the harness caught it).
    Panic,
    /// The turn stopped before the tool finished.
    Cancelled,
    /// The model named a tool that does not exist.
    UnknownTool,
    /// A fault of the harness itself.
    Internal,
}

impl ToolErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidInput => "invalid_input",
            Self::NotFound => "not_found",
            Self::PermissionDenied => "permission_denied",
            Self::Unavailable => "unavailable",
            Self::Failed => "failed",
            Self::Panic => "panic",
            Self::Cancelled => "cancelled",
            Self::UnknownTool => "unknown_tool",
            Self::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ToolErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tool failure, shown to the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ToolError {
    pub kind: ToolErrorKind,
    pub message: String,
    /// False: the tool is blocked for the rest of the turn.
    pub retryable: bool,
}

impl ToolError {
    pub fn new(kind: ToolErrorKind, message: impl Into<String>, retryable: bool) -> Self {
        Self {
            kind,
            message: message.into(),
            retryable,
        }
    }
}

/// A tool the model can call.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    fn spec(&self) -> &ToolSpec;

    /// The resources a call touches, derived from its arguments. Two
    /// read-only calls run in the same parallel wave only if their keys are
    /// disjoint. Default: none.
    fn resource_keys(&self, _arguments: &Value) -> Vec<String> {
        Vec::new()
    }

    /// Checks arguments the schema cannot judge (a path that leads out of
    /// the vault); an error is a validation denial, and the call never
    /// runs. Default: nothing to check.
    fn check(&self, _arguments: &Value) -> Result<(), String> {
        Ok(())
    }

    /// Runs the call. Honour `ctx.cancel`.
    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<ToolOutput, ToolError>;

    /// What became of a call with these `arguments` that started in a
    /// process that stopped before it ended, told from the checkpoints
    /// taken before it ran (`before`: none when the call never got past
    /// its checkpoint). Asked only of a tool that is neither read-only nor
    /// idempotent. Default: nothing tells.
    /// `session_id`: the call's session, as stored.
    async fn settle(&self, _session_id: &str, _arguments: &Value, _before: &[Saved]) -> Settled {
        Settled::Unknown
    }
}

/// Which tools may run (`HARNESS_TOOL_PERMISSION`). A tool outside the
/// mode is neither offered to the model nor run: a call of it is denied
/// with reason `permission`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionMode {
    /// Every registered tool runs without asking.
    #[default]
    #[serde(alias = "all")]
    Auto,
    /// Only `READ_ONLY` tools.
    ReadOnly,
    /// No tool at all.
    None,
}

impl std::str::FromStr for PermissionMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            // `all` is the name this mode had first.
            "auto" | "all" => Ok(Self::Auto),
            "read_only" => Ok(Self::ReadOnly),
            "none" => Ok(Self::None),
            other => Err(format!("expected auto, read_only or none, got {other:?}")),
        }
    }
}

impl PermissionMode {
    pub fn permits(self, effect: EffectClass) -> bool {
        match self {
            Self::Auto => true,
            Self::ReadOnly => effect == EffectClass::ReadOnly,
            Self::None => false,
        }
    }
}

/// The tools of a harness, in registration order.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: Vec<Registered>,
    index: HashMap<String, usize>,
    mode: PermissionMode,
}

/// A tool and what the model is shown of it, built once at registration:
/// turns share the definition instead of copying every schema.
#[derive(Clone)]
struct Registered {
    tool: Arc<dyn Tool>,
    definition: Arc<ToolDefinition>,
}

impl ToolRegistry {
    pub fn new(mode: PermissionMode) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    /// Adds a tool; a tool of the same name is replaced.
    pub fn register(mut self, tool: Arc<dyn Tool>) -> Self {
        let name = tool.spec().name.clone();
        let entry = Registered {
            definition: Arc::new(tool.spec().definition()),
            tool,
        };
        match self.index.get(&name) {
            Some(&i) => self.tools[i] = entry,
            None => {
                self.index.insert(name, self.tools.len());
                self.tools.push(entry);
            }
        }
        self
    }

    pub fn mode(&self) -> PermissionMode {
        self.mode
    }

    /// The definition of `name` offered to the model, shared.
    pub fn definition(&self, name: &str) -> Option<Arc<ToolDefinition>> {
        self.index
            .get(name)
            .map(|&i| self.tools[i].definition.clone())
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.index.get(name).map(|&i| &self.tools[i].tool)
    }

    /// Whether `name` is registered and the mode lets it run.
    pub fn permits(&self, name: &str) -> bool {
        self.get(name)
            .is_some_and(|t| self.mode.permits(t.spec().effect))
    }

    /// Every registered tool, in registration order, with whether the
    /// mode lets it run.
    pub fn all(&self) -> impl Iterator<Item = (&Arc<dyn Tool>, bool)> {
        self.tools
            .iter()
            .map(|r| (&r.tool, self.mode.permits(r.tool.spec().effect)))
    }

    /// The tools the model may be offered, in registration order.
    pub fn offered(&self) -> Vec<&Arc<dyn Tool>> {
        self.tools
            .iter()
            .map(|r| &r.tool)
            .filter(|t| self.mode.permits(t.spec().effect))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    struct Named(ToolSpec);

    #[async_trait]
    impl Tool for Named {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }

        async fn call(
            &self,
            _ctx: ToolContext,
            _arguments: Value,
        ) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::text("ok"))
        }
    }

    fn tool(name: &str, description: &str, effect: EffectClass) -> Arc<dyn Tool> {
        Arc::new(Named(ToolSpec::new(
            name,
            description,
            json!({"type": "object"}),
            effect,
        )))
    }

    #[test]
    fn a_tool_registered_again_replaces_its_definition_in_place() {
        let registry = ToolRegistry::new(PermissionMode::Auto)
            .register(tool("a", "first", EffectClass::ReadOnly))
            .register(tool("b", "other", EffectClass::ReadOnly))
            .register(tool("a", "second", EffectClass::ReadOnly));
        assert_eq!(registry.len(), 2);
        assert_eq!(registry.definition("a").unwrap().description, "second");
        assert_eq!(registry.get("a").unwrap().spec().description, "second");
        let offered: Vec<_> = registry
            .offered()
            .iter()
            .map(|t| t.spec().name.clone())
            .collect();
        assert_eq!(offered, ["a", "b"], "registration order is kept");
        assert!(registry.definition("missing").is_none());
    }

    #[test]
    fn turns_share_one_definition_per_tool() {
        let registry =
            ToolRegistry::new(PermissionMode::Auto).register(tool("a", "d", EffectClass::ReadOnly));
        let one = registry.definition("a").unwrap();
        let two = registry.definition("a").unwrap();
        assert!(Arc::ptr_eq(&one, &two));
    }
}
