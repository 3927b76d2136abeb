//! The sink of one turn: numbers its events and queues them, with its
//! step records, for the event writer.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use async_trait::async_trait;
use chrono::Utc;
use tokio::sync::Mutex;

use super::{
    LiveTurn,
    writer::{EventWriter, Flush},
};
use crate::{
    events::{StoredEvent, TurnEvent},
    harness::{EventSink, SinkError, durable::StepRecord},
    store::{NewStep, TurnStatus},
};

/// The sink of one turn: numbers events and queues them for the writer.
///
/// The terminal event takes the last seq and closes the sink in the same
/// step: whatever still holds the sink afterwards (a tool task finishing
/// late, on any terminal path: completed, failed, cancelled, interrupted)
/// writes nothing. A later write would take a seq of the session's next
/// turn and block it.
pub(super) struct TurnSink {
    pub(super) writer: EventWriter,
    pub(super) live: Arc<LiveTurn>,
    /// Latency histograms and token counts, from the events as they pass.
    pub(super) metrics: Arc<crate::metrics::Metrics>,
    /// Its tools: a metric's tool label is one of them (a model may call
    /// any name).
    pub(super) harness: Arc<crate::harness::AgentHarness>,
    /// When the turn began (for the time to its first token).
    pub(super) began: tokio::time::Instant,
    /// Whether the answer's first text has been seen.
    pub(super) answered: std::sync::atomic::AtomicBool,
    /// Calls waiting for a person's decision (at most the turn's tool
    /// calls).
    pub(super) waiting: std::sync::Mutex<Vec<String>>,
    /// What this attempt's provider calls used, for its tenant's usage.
    pub(super) used: std::sync::Mutex<crate::store::UsageTotals>,
    /// The next seq; `None` once the terminal event took its seq. Held
    /// while an event is numbered and queued, so queue order is seq order.
    pub(super) next_seq: Mutex<Option<i64>>,
    /// Whether the last event queued was a text delta (written under
    /// `next_seq`'s lock): the next one may then wait for company.
    pub(super) after_delta: std::sync::atomic::AtomicBool,
}

impl TurnSink {
    /// What the metrics (and the list of calls waiting for a person)
    /// take from an event of the turn.
    fn observe(&self, event: &TurnEvent) {
        match event {
            TurnEvent::ApprovalRequested { call_id, .. } => {
                if let Ok(mut waiting) = self.waiting.lock() {
                    waiting.push(call_id.clone());
                }
            }
            TurnEvent::ApprovalResolved { call_id, .. } => {
                if let Ok(mut waiting) = self.waiting.lock() {
                    waiting.retain(|c| c != call_id);
                }
            }
            TurnEvent::MessageDelta { .. } if !self.answered.swap(true, Ordering::Relaxed) => {
                self.metrics.first_token(self.began.elapsed());
            }
            // A step's usage is one provider call's.
            TurnEvent::Usage {
                step: Some(_),
                input_tokens,
                output_tokens,
                reasoning_tokens,
                cost_usd,
                ..
            } => {
                self.metrics.tokens(*input_tokens, *output_tokens);
                if let Ok(mut used) = self.used.lock() {
                    used.input_tokens = used.input_tokens.saturating_add(*input_tokens);
                    used.output_tokens = used.output_tokens.saturating_add(*output_tokens);
                    used.reasoning_tokens = used.reasoning_tokens.saturating_add(*reasoning_tokens);
                    used.cost_usd = match (used.cost_usd, cost_usd) {
                        (Some(a), Some(b)) => Some(a + b),
                        (a, b) => a.or(*b),
                    };
                }
            }
            TurnEvent::ToolFinished {
                tool,
                status,
                latency_ms,
                ..
            } => {
                let tool = match self.harness.tools().get(tool) {
                    Some(_) => tool.as_str(),
                    None => "unknown",
                };
                self.metrics.tool_finished(
                    tool,
                    status.as_str(),
                    Duration::from_millis(*latency_ms),
                );
            }
            _ => {}
        }
    }

    /// Takes the calls a turn's log shows waiting for a person (a turn
    /// going on after a park or a take-over).
    pub(super) fn waiting_in(&self, events: &[crate::events::StoredEvent]) {
        for event in events.iter().filter_map(|e| e.event()) {
            if matches!(
                event,
                TurnEvent::ApprovalRequested { .. } | TurnEvent::ApprovalResolved { .. }
            ) {
                self.observe(event);
            }
        }
    }

    /// Resolves the calls still waiting for a person, as `cancelled`, with
    /// why the turn ended.
    pub(super) async fn resolve_waiting(&self, status: TurnStatus) {
        let waiting = self
            .waiting
            .lock()
            .map(|mut waiting| std::mem::take(&mut *waiting))
            .unwrap_or_default();
        for call_id in waiting {
            let event = TurnEvent::ApprovalResolved {
                call_id,
                outcome: "cancelled".to_owned(),
                reason: Some(format!("the turn ended {}", status.as_str())),
                edited_arguments: None,
            };
            if let Err(e) = self.emit(event).await {
                tracing::debug!(error = %e, "a waiting call's resolution was not written");
            }
        }
    }

    /// The terminal event's seq; nothing is emitted after it.
    pub(super) async fn close(&self) -> i64 {
        let mut next = self.next_seq.lock().await;
        // Called once per turn, by the turn's own task; a second call
        // would get a seq past the first terminal (never written).
        let seq = next.unwrap_or(i64::MAX);
        *next = None;
        seq
    }
}

/// How soon `event` must be committed, given whether the event before it
/// was a text delta: the first text after anything else (a step's first
/// token) goes out at once; text right after text may wait for the rest.
fn flush_after(after_delta: bool, event: &TurnEvent) -> Flush {
    match event {
        TurnEvent::MessageDelta { .. } if after_delta => Flush::MayWait,
        _ => Flush::Now,
    }
}

#[async_trait]
impl EventSink for TurnSink {
    async fn emit(&self, event: TurnEvent) -> Result<(), SinkError> {
        let mut next = self.next_seq.lock().await;
        let Some(seq) = *next else {
            tracing::debug!(
                event = event.event_type(),
                "event after the turn ended; dropped"
            );
            return Err(SinkError("the turn has ended".into()));
        };
        if self.live.lost_events() {
            return Err(SinkError(
                "earlier events of the turn could not be written".into(),
            ));
        }
        self.observe(&event);
        let delta = matches!(event, TurnEvent::MessageDelta { .. });
        let flush = flush_after(self.after_delta.swap(delta, Ordering::Relaxed), &event);
        let stored = StoredEvent::from_event(
            &self.live.session_id,
            self.live.turn_id,
            seq,
            event,
            Utc::now(),
        )
        .map_err(|e| SinkError(e.to_string()))?;
        self.writer
            .append(&self.live, Arc::new(stored), flush)
            .await
            .map_err(|e| SinkError(e.to_string()))?;
        *next = Some(seq + 1);
        Ok(())
    }

    async fn step_done(&self, record: StepRecord, wait: bool) -> Result<(), SinkError> {
        // Under the seq's lock: queued after every event emitted before it.
        let next = self.next_seq.lock().await;
        if next.is_none() {
            return Err(SinkError("the turn has ended".into()));
        }
        if self.live.lost_events() {
            return Err(SinkError(
                "earlier events of the turn could not be written".into(),
            ));
        }
        let step = NewStep {
            turn_id: self.live.turn_id,
            step: record.step,
            phase: record.phase.as_str(),
            record: serde_json::to_string(&record).map_err(|e| SinkError(e.to_string()))?,
            created_at: Utc::now(),
        };
        let committed = self
            .writer
            .step(&self.live, step)
            .await
            .map_err(|e| SinkError(e.to_string()))?;
        drop(next);
        if !wait {
            return Ok(());
        }
        // Waited for outside the seq's lock: the turn's other tasks (a
        // late tool's event) may queue meanwhile.
        match committed.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(SinkError(e.to_string())),
            Err(_) => Err(SinkError("the event writer has stopped".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_text_right_after_text_may_wait() {
        let text = TurnEvent::MessageDelta {
            step: 1,
            text: "t".into(),
        };
        let other = TurnEvent::MessageRetracted {
            step: 1,
            reason: "retry".into(),
        };
        assert_eq!(flush_after(false, &text), Flush::Now, "a step's first text");
        assert_eq!(flush_after(true, &text), Flush::MayWait);
        assert_eq!(flush_after(true, &other), Flush::Now);
        assert_eq!(flush_after(false, &other), Flush::Now);
    }
}
