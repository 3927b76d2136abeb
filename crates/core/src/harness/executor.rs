//! `BoundedToolExecutor`: runs one tool call in its own tracked task with a
//! timeout from its spec (clamped to the turn's deadline) and a child
//! cancellation token.
//!
//! On timeout the harness stops waiting, marks the trace `timed_out` and
//! cancels the token. A tool that honours the token stops; one that does
//! not gets [`LATE_GRACE`] more and is then dropped. Either way, when it
//! finishes it meets the late-write gate: `complete_trace` says `false`, its
//! result is discarded, and at most a `tool.late` marker (no result) is
//! recorded while the turn still accepts writes.

use std::{panic::AssertUnwindSafe, sync::Arc, time::Duration};

use futures::FutureExt;
use serde_json::Value;
use tokio::{sync::oneshot, time::Instant};
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use super::{EventSink, state::TurnRuntimeState};
use crate::{
    events::TurnEvent,
    tools::{Tool, ToolContext, ToolError, ToolErrorKind, ToolOutput},
};

/// How long a cancelled tool may still run before it is dropped.
pub const LATE_GRACE: Duration = Duration::from_secs(5);

/// What the executor reports.
#[derive(Debug, Clone, PartialEq)]
pub enum Executed {
    Completed { output: ToolOutput, latency_ms: u64 },
    Failed { error: ToolError, latency_ms: u64 },
    TimedOut { retryable: bool, latency_ms: u64 },
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs `tool` for one call, in a span of its own (`execute_tool`, the
/// GenAI conventions' name). Never panics; a panicking tool is a failure.
#[expect(
    clippy::too_many_lines,
    reason = "a call's life in one place: its timeout, its cancellation, its outcome"
)]
#[tracing::instrument(
    name = "gen_ai.execute_tool",
    skip_all,
    fields(
        otel.name = format!("execute_tool {}", tool.spec().name),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %tool.spec().name,
        gen_ai.tool.call.id = %ctx.call_id,
        error.type = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
)]
pub async fn execute(
    tracker: &TaskTracker,
    tool: Arc<dyn Tool>,
    ctx: ToolContext,
    arguments: Value,
    state: Arc<TurnRuntimeState>,
    sink: Arc<dyn EventSink>,
) -> Executed {
    let spec = tool.spec();
    let name = spec.name.clone();
    let timeout = state.budget.clamp(spec.timeout());
    let retry_on_timeout = spec.retry_on_timeout;
    let trace_id = ctx.call_id.clone();
    let cancel = ctx.cancel.clone();
    state.set_trace_running(&trace_id, &name);
    let started = Instant::now();
    let (sender, mut receiver) = oneshot::channel();

    let task_state = state.clone();
    let task_cancel = cancel.clone();
    let task_trace = trace_id.clone();
    let task_name = name.clone();
    tracker.spawn(
        async move {
            let run = AssertUnwindSafe(tool.call(ctx, arguments)).catch_unwind();
            let grace = async {
                task_cancel.cancelled().await;
                tokio::time::sleep(LATE_GRACE).await;
            };
            let result = tokio::select! {
                biased;
                result = run => Some(result.unwrap_or_else(|_| {
                    Err(ToolError::new(ToolErrorKind::Panic, "the tool panicked", false))
                })),
                () = grace => None,
            };
            let latency_ms = millis(started.elapsed());
            let retryable = !matches!(&result, Some(Err(e)) if !e.retryable);
            if task_state.complete_trace(&task_trace, latency_ms, retryable) {
                // The harness is waiting: hand the result over.
                let _ = sender.send(result);
            } else if result.is_some() && task_state.is_accepting_writes() {
                // Late: the result is dropped; only the fact is recorded.
                let _ = sink
                    .emit(TurnEvent::ToolLate {
                        call_id: task_trace,
                        tool: task_name,
                        latency_ms,
                    })
                    .await;
            }
        }
        .in_current_span(),
    );

    let received = match tokio::time::timeout(timeout, &mut receiver).await {
        Ok(received) => Some(received.ok().flatten()),
        Err(_) => {
            state.mark_trace_timed_out(&trace_id);
            // The tool may have completed just as the timeout fired.
            receiver.try_recv().ok()
        }
    };
    let latency_ms = millis(started.elapsed());
    let executed = match received {
        None => {
            cancel.cancel();
            Executed::TimedOut {
                retryable: retry_on_timeout,
                latency_ms: millis(timeout),
            }
        }
        Some(Some(Ok(output))) => Executed::Completed { output, latency_ms },
        Some(Some(Err(error))) => Executed::Failed { error, latency_ms },
        Some(None) => Executed::Failed {
            error: ToolError::new(
                ToolErrorKind::Cancelled,
                "the turn stopped before the tool finished",
                false,
            ),
            latency_ms,
        },
    };
    let error = match &executed {
        Executed::Completed { .. } => None,
        Executed::Failed { error, .. } => Some(error.kind.as_str()),
        Executed::TimedOut { .. } => Some("timeout"),
    };
    if let Some(error) = error {
        let span = tracing::Span::current();
        span.record("error.type", error);
        span.record("otel.status_code", "ERROR");
    }
    executed
}
