//! A tool the client runs itself ([`crate::turn::ClientTool`]): a call of
//! it waits for the result the client posts. The harness waits for it
//! itself (`harness/waits.rs`: the wait's own deadline, a park when it
//! lasts); [`ClientCall::call`] is the same wait for a caller that runs
//! the tool as any other, within its spec's timeout.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use serde_json::Value;

use super::{Tool, ToolContext, ToolError, ToolErrorKind, ToolOutput, ToolSpec};
use crate::turn::ClientTool;

/// What became of a call of a tool the client runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientResult {
    /// The client posted it (`is_error`: its tool failed, `output` says why).
    Posted { output: String, is_error: bool },
    /// The wait's deadline came first.
    TimedOut,
    /// The turn was cancelled while it waited.
    Cancelled,
}

/// Waits for the results clients post for calls of their own tools.
#[async_trait]
pub trait ClientResults: Send + Sync {
    /// Waits for the result of `call_id` of `turn_id`, at most `within`, and
    /// no longer than `cancel` stays uncancelled.
    async fn wait(
        &self,
        turn_id: uuid::Uuid,
        call_id: &str,
        within: std::time::Duration,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> ClientResult;
}

/// A client's tool, for one call.
pub struct ClientCall {
    spec: ToolSpec,
    results: Arc<dyn ClientResults>,
}

impl ClientCall {
    /// The spec of the tool `declared` by its turn's client: made once a
    /// turn, so that its schema is compiled once for every call of it.
    pub fn spec_of(declared: &ClientTool) -> ToolSpec {
        // Waiting again for a result is harmless (it is kept by call id):
        // a call a process that died was waiting on is waited on again.
        ToolSpec::new(
            &declared.offered_name(),
            &declared.description,
            declared.parameters.clone(),
            declared.effect,
        )
        .with_source("client")
        .with_idempotent(true)
    }

    /// A call of the client's tool of `spec`, waiting at most `within`.
    pub fn new(spec: &ToolSpec, results: Arc<dyn ClientResults>, within: Duration) -> Self {
        Self {
            spec: spec.clone().with_timeout(within),
            results,
        }
    }
}

#[async_trait]
impl Tool for ClientCall {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: ToolContext, _arguments: Value) -> Result<ToolOutput, ToolError> {
        let within = self.spec.timeout();
        match self
            .results
            .wait(ctx.turn_id, &ctx.call_id, within, &ctx.cancel)
            .await
        {
            ClientResult::Posted {
                output,
                is_error: false,
            } => Ok(ToolOutput::text(output)),
            ClientResult::Posted {
                output,
                is_error: true,
            } => Err(ToolError::new(ToolErrorKind::Failed, output, true)),
            ClientResult::TimedOut => Err(ToolError::new(
                ToolErrorKind::Failed,
                "the client did not post a result before the turn's deadline",
                false,
            )),
            ClientResult::Cancelled => Err(ToolError::new(
                ToolErrorKind::Cancelled,
                "the turn was cancelled while it waited for the client",
                false,
            )),
        }
    }
}
