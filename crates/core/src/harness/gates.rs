//! One tool call through the gates (a step's waves of calls are in
//! [`super::waves`]).
//!
//! | gate | on failure |
//! |---|---|
//! | 1. replay control | `ToolDenied(duplicate)` |
//! | 2. blocked tool / not permitted (mode, `web_mode`) | `ToolDenied(blocked)` / `ToolDenied(permission)` |
//! | 3. `on_pre_tool_use` | `ToolDenied(pre_hook)` |
//! | 4. argument validation with bounded repair, then the tool's own check | `ToolDenied(validation)` |
//! | (tool-call budget) | `ToolDenied(budget)` |
//! | 5. a write's checkpoint (`LOCAL_WRITE`, `DESTRUCTIVE`) | `ToolFailure(unavailable)` |
//! | 6. bounded executor | `ToolFailure` / `ToolTimeout` |
//! | 7. `on_post_tool_use` | ignored |
//! | 8. replay record | |
//!
//! [`exec_call`] never fails: every call ends in a [`ToolOutcome`], and
//! every call of a step gets exactly one tool message.

use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

mod approval;

use super::{
    AgentHarness, EventSink, TurnInput,
    durable::{PriorCall, PriorCalls},
    executor::{self, Executed},
    hooks::{CheckpointRequest, isolate},
    replay::ReplayControl,
    state::TurnRuntimeState,
    validation,
    waits::{self, Wait},
};
use crate::{
    events::{ToolStatus, TurnEvent},
    providers::ToolCall,
    tools::{EffectClass, Tool, ToolContext, ToolError, ToolErrorKind},
};
use approval::{Approval, approved, bound};

/// Why a call was not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyReason {
    Duplicate,
    Blocked,
    /// The permission mode (or the turn's `web_mode`) does not let it run.
    Permission,
    /// A person denied it, or no decision came before the deadline.
    Approval,
    PreHook,
    Validation,
    Budget,
}

impl DenyReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Duplicate => "duplicate",
            Self::Blocked => "blocked",
            Self::Permission => "permission",
            Self::Approval => "approval",
            Self::PreHook => "pre_hook",
            Self::Validation => "validation",
            Self::Budget => "budget",
        }
    }
}

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutcome {
    Executed(Executed),
    Denied {
        reason: DenyReason,
        message: String,
    },
    /// Not run here: the turn goes on from a step whose call a process
    /// that died ran (its end is in the log), or may have run (`Unknown`).
    /// `content` is what the model is told.
    Logged {
        status: ToolStatus,
        content: String,
        latency_ms: u64,
    },
    /// No end yet: it waits for an answer from outside (a person, a
    /// client) until `until`, and the turn is parked meanwhile.
    Parked {
        until: chrono::DateTime<chrono::Utc>,
    },
}

impl ToolOutcome {
    pub(super) fn failure(
        kind: ToolErrorKind,
        message: impl Into<String>,
        retryable: bool,
    ) -> Self {
        Self::Executed(Executed::Failed {
            error: ToolError::new(kind, message, retryable),
            latency_ms: 0,
        })
    }

    pub fn status(&self) -> ToolStatus {
        match self {
            Self::Executed(Executed::Completed { .. }) => ToolStatus::Completed,
            Self::Executed(Executed::Failed { .. }) => ToolStatus::Failed,
            Self::Executed(Executed::TimedOut { .. }) => ToolStatus::TimedOut,
            Self::Denied { .. } => ToolStatus::Denied,
            Self::Logged { status, .. } => *status,
            // Never reported: the turn stops before its end.
            Self::Parked { .. } => ToolStatus::Unknown,
        }
    }

    /// Whether the tool is blocked for the rest of the turn after this: a
    /// non-retryable failure, or a timeout of a tool that must not retry.
    pub fn blocks_tool(&self) -> bool {
        match self {
            Self::Executed(Executed::Failed { error, .. }) => !error.retryable,
            Self::Executed(Executed::TimedOut { retryable, .. }) => !retryable,
            _ => false,
        }
    }

    pub fn is_error(&self) -> bool {
        self.status() != ToolStatus::Completed
    }

    pub(super) fn latency_ms(&self) -> u64 {
        match self {
            Self::Executed(
                Executed::Completed { latency_ms, .. }
                | Executed::Failed { latency_ms, .. }
                | Executed::TimedOut { latency_ms, .. },
            )
            | Self::Logged { latency_ms, .. } => *latency_ms,
            Self::Denied { .. } | Self::Parked { .. } => 0,
        }
    }
}

/// What a call needs from its turn.
pub(super) struct CallEnv<'a> {
    pub harness: &'a AgentHarness,
    pub request: &'a TurnInput,
    pub state: &'a Arc<TurnRuntimeState>,
    pub replay: &'a ReplayControl,
    pub sink: &'a Arc<dyn EventSink>,
    pub turn_cancel: &'a CancellationToken,
    pub step: u32,
    /// What the log shows of the step's calls, when the turn goes on from
    /// a step a process that died began (empty otherwise).
    pub prior: &'a PriorCalls,
}

impl CallEnv<'_> {
    /// What a wait of one of its calls needs.
    fn waiter(&self) -> waits::Waiter<'_> {
        waits::Waiter {
            options: &self.harness.options,
            budget: &self.state.budget,
            cancel: self.turn_cancel,
        }
    }
}

/// Runs one call through the gates. Never fails.
pub(super) async fn exec_call(env: &CallEnv<'_>, call: &ToolCall) -> ToolOutcome {
    match admit(env, call).await {
        Ok(Admitted {
            tool,
            arguments,
            edited,
        }) => run(env, edited.as_ref().unwrap_or(call), tool, arguments).await,
        Err(refused) => *refused,
    }
}

/// A call every gate let through.
struct Admitted {
    tool: Arc<dyn Tool>,
    /// What it runs with.
    arguments: Value,
    /// The call as a person's approval edited it (its arguments the
    /// edit's), when one did.
    edited: Option<ToolCall>,
}

/// A gate's refusal: the outcome the model is told.
pub(super) type Refused = Box<ToolOutcome>;

pub(super) fn denied(reason: DenyReason, message: impl Into<String>) -> Refused {
    Box::new(ToolOutcome::Denied {
        reason,
        message: message.into(),
    })
}

/// The gates, in order: the tool and its arguments when every one lets
/// the call through. A call a person approved with other arguments goes
/// through the host's hook and the validation again with them, and runs
/// only if they are the arguments the approval was for.
async fn admit(env: &CallEnv<'_>, call: &ToolCall) -> Result<Admitted, Refused> {
    not_a_replay(env, call)?;
    let tool = permitted(env, call)?;
    pre_hook(env, call).await?;
    let arguments = valid_arguments(env, call, tool.as_ref())?;
    within_budget(env)?;
    let (arguments, edited) = match approved(env, call, tool.as_ref(), &arguments).await? {
        None => (arguments, None),
        Some(Approval {
            edited: None,
            sha256,
        }) => {
            bound(&arguments, sha256.as_deref())?;
            (arguments, None)
        }
        Some(Approval {
            edited: Some(text),
            sha256,
        }) => {
            let edited = ToolCall {
                arguments: crate::providers::Arguments::new(text),
                ..call.clone()
            };
            pre_hook(env, &edited).await?;
            let arguments = valid_arguments(env, &edited, tool.as_ref())?;
            bound(&arguments, sha256.as_deref())?;
            env.state.note_edited(&call.id, edited.arguments.raw());
            let _ = env
                .sink
                .emit(TurnEvent::ToolStarted {
                    step: env.step,
                    wave: 0,
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    arguments: arguments.clone(),
                    edited: true,
                })
                .await;
            (arguments, Some(edited))
        }
    };
    let call = edited.as_ref().unwrap_or(call);
    checkpointed(env, call, tool.as_ref(), &arguments).await?;
    Ok(Admitted {
        tool,
        arguments,
        edited,
    })
}

/// Gate 1, replay control: the same call twice in a turn runs once.
fn not_a_replay(env: &CallEnv<'_>, call: &ToolCall) -> Result<(), Refused> {
    match env.replay.should_skip(&call.name, &call.arguments) {
        Some(previous) => Err(denied(
            DenyReason::Duplicate,
            format!(
                "this exact call already ran in this turn (call {previous}); use its result above"
            ),
        )),
        None => Ok(()),
    }
}

/// Gate 2: a tool that exists, is not blocked for this turn, and is permitted.
fn permitted(env: &CallEnv<'_>, call: &ToolCall) -> Result<Arc<dyn Tool>, Refused> {
    let harness = env.harness;
    if let Some(tool) = client_tool(env, &call.name) {
        if !harness.tools.mode().permits(tool.spec().effect) {
            return Err(denied(
                DenyReason::Permission,
                format!(
                    "the tool {:?} is not permitted here (the service's permission mode)",
                    call.name
                ),
            ));
        }
        return Ok(tool);
    }
    let Some(tool) = harness.tools.get(&call.name).cloned() else {
        return Err(Box::new(ToolOutcome::failure(
            ToolErrorKind::UnknownTool,
            format!("there is no tool named {:?}", call.name),
            false,
        )));
    };
    if env.state.is_blocked(&call.name) {
        return Err(denied(
            DenyReason::Blocked,
            format!(
                "the tool {:?} is not available for the rest of this turn",
                call.name
            ),
        ));
    }
    if !harness.is_tool_allowed(&call.name, env.request) {
        return Err(denied(
            DenyReason::Permission,
            format!(
                "the tool {:?} is not permitted here (the service's permission mode, or web tools with web_mode off)",
                call.name
            ),
        ));
    }
    Ok(tool)
}

/// A tool the turn's client declared (`client__{name}`), for one call that
/// waits at most what is left of the turn.
fn client_tool(env: &CallEnv<'_>, name: &str) -> Option<Arc<dyn Tool>> {
    let results = env.harness.client_results.clone()?;
    let declared = env.request.asked.client_tool(name)?;
    let within = env.harness.options.wait_timeout;
    let spec = env
        .state
        .client_spec(name, || crate::tools::client::ClientCall::spec_of(declared));
    Some(Arc::new(crate::tools::client::ClientCall::new(
        &spec, results, within,
    )))
}

/// Gate 3: the host's pre-hook.
async fn pre_hook(env: &CallEnv<'_>, call: &ToolCall) -> Result<(), Refused> {
    let allowed = isolate(async { Ok(env.harness.callbacks.on_pre_tool_use(call).await) }).await;
    if allowed == Ok(true) {
        Ok(())
    } else {
        Err(denied(DenyReason::PreHook, "the host refused this call"))
    }
}

/// Gate 4: argument validation, with bounded repair, then the tool's own check
/// (a path out of the vault), which holds either way.
fn valid_arguments(env: &CallEnv<'_>, call: &ToolCall, tool: &dyn Tool) -> Result<Value, Refused> {
    let arguments = if env.harness.options.enable_tool_validation {
        validation::validate(env.state, &call.id, tool.spec(), &call.arguments)
            .map_err(|message| denied(DenyReason::Validation, message))?
    } else {
        call.arguments.or_empty_object()
    };
    tool.check(&arguments)
        .map_err(|message| denied(DenyReason::Validation, message))?;
    Ok(arguments)
}

/// Gate 4b: the turn's tool-call budget.
fn within_budget(env: &CallEnv<'_>) -> Result<(), Refused> {
    if env.state.budget.claim_tool_call() {
        Ok(())
    } else {
        Err(denied(
            DenyReason::Budget,
            "the tool-call budget of this turn is used up; answer with what you have",
        ))
    }
}

/// Gate 5: a write's checkpoint: what it will change is saved first, and a
/// write that cannot be undone does not run.
async fn checkpointed(
    env: &CallEnv<'_>,
    call: &ToolCall,
    tool: &dyn Tool,
    arguments: &Value,
) -> Result<(), Refused> {
    if !matches!(
        tool.spec().effect,
        EffectClass::LocalWrite | EffectClass::Destructive
    ) {
        return Ok(());
    }
    let Some(checkpoints) = env.harness.checkpoint_store() else {
        return Ok(());
    };
    let resource_keys = tool.resource_keys(arguments);
    if resource_keys.is_empty() {
        return Ok(());
    }
    let request = CheckpointRequest {
        session_id: env.request.session_id.clone(),
        turn_id: env.request.turn_id.to_string(),
        call_id: call.id.clone(),
        tool: call.name.clone(),
        resource_keys,
    };
    match isolate(checkpoints.snapshot(&request)).await {
        Ok(_) => Ok(()),
        Err(e) => Err(Box::new(ToolOutcome::failure(
            ToolErrorKind::Unavailable,
            format!("the write did not run: its checkpoint could not be saved ({e})"),
            true,
        ))),
    }
}

/// Steps 6-8: the bounded executor (or, for a client's tool, the wait for
/// its result), then the post-hook (best effort) and the replay record.
async fn run(
    env: &CallEnv<'_>,
    call: &ToolCall,
    tool: Arc<dyn Tool>,
    arguments: Value,
) -> ToolOutcome {
    let harness = env.harness;
    let executed = if let Some(name) = call.name.strip_prefix(crate::turn::CLIENT_TOOL_PREFIX)
        && tool.spec().source == "client"
    {
        match client_call(env, call, name, arguments).await {
            Wait::Ended(executed) => executed,
            Wait::Parked(until) => return ToolOutcome::Parked { until },
        }
    } else {
        let ctx = ToolContext {
            session_id: env.request.session_id.clone(),
            turn_id: env.request.turn_id,
            turn_number: env.request.turn_number,
            call_id: call.id.clone(),
            top_k: env.request.asked.top_k,
            web_mode: env.request.asked.web_mode,
            cancel: env.turn_cancel.child_token(),
        };
        executor::execute(
            &harness.tasks,
            tool,
            ctx,
            arguments,
            env.state.clone(),
            env.sink.clone(),
        )
        .await
    };
    let outcome = ToolOutcome::Executed(executed);
    // A tool that failed for good is blocked at once: a later call of it in
    // this very step (the next wave) is denied, not run again.
    if outcome.blocks_tool() {
        env.state.block_tool(&call.name);
    }
    let status = outcome.status();
    let _ = isolate(async {
        harness
            .callbacks
            .on_post_tool_use(call, status.as_str())
            .await;
        Ok(())
    })
    .await;
    if !outcome.is_error() {
        env.replay
            .record_completed(&call.name, &call.arguments, &call.id);
    }
    outcome
}

/// A call of the client's own tool (`name`, as the client knows it): the
/// client is told (once: not again when the turn goes on after a park or
/// a take-over), and the call waits for its result until the wait's
/// deadline.
async fn client_call(
    env: &CallEnv<'_>,
    call: &ToolCall,
    name: &str,
    arguments: Value,
) -> Wait<Executed> {
    let options = &env.harness.options;
    let Some(results) = env.harness.client_results.clone() else {
        return Wait::Ended(Executed::Failed {
            error: ToolError::new(
                ToolErrorKind::Internal,
                "this service takes no results of clients' tools",
                false,
            ),
            latency_ms: 0,
        });
    };
    let until = match env.prior.get(&call.id) {
        Some(PriorCall::Started {
            client: Some(asked),
            ..
        }) => waits::deadline_of(*asked, options),
        _ => {
            let until = waits::new_deadline(options);
            let _ = env
                .sink
                .emit(TurnEvent::ToolRequested {
                    step: env.step,
                    call_id: call.id.clone(),
                    tool: name.to_owned(),
                    arguments,
                    expires_at: Some(until),
                })
                .await;
            until
        }
    };
    let started = tokio::time::Instant::now();
    let waiter = env.waiter();
    let turn_id = env.request.turn_id;
    let result =
        match waits::client_result(waiter, results.as_ref(), turn_id, &call.id, until).await {
            Wait::Ended(result) => result,
            Wait::Parked(until) => return Wait::Parked(until),
        };
    let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    use crate::tools::client::ClientResult;
    Wait::Ended(match result {
        ClientResult::Posted {
            output,
            is_error: false,
        } => Executed::Completed {
            output: crate::tools::ToolOutput::text(output),
            latency_ms,
        },
        ClientResult::Posted {
            output,
            is_error: true,
        } => Executed::Failed {
            error: ToolError::new(ToolErrorKind::Failed, output, true),
            latency_ms,
        },
        // The client may still answer a later call of it.
        ClientResult::TimedOut => Executed::TimedOut {
            retryable: true,
            latency_ms,
        },
        ClientResult::Cancelled => Executed::Failed {
            error: ToolError::new(
                ToolErrorKind::Cancelled,
                "the turn was cancelled while it waited for the client",
                false,
            ),
            latency_ms,
        },
    })
}
