//! Service metrics, rendered in the Prometheus text format at `GET /metrics`.
//!
//! A handful of counters and gauges kept in atomics: cheaper than a metrics
//! registry on the per-event path, and all the gateway needs.

use std::{
    fmt::Write,
    sync::atomic::{AtomicI64, AtomicU64, Ordering},
};

use crate::store::TurnStatus;

/// The service's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    pub turns_started: AtomicU64,
    pub turns_running: AtomicI64,
    finished: [AtomicU64; 5],
    pub events_persisted: AtomicU64,
    pub event_batches: AtomicU64,
    pub event_batch_failures: AtomicU64,
    pub streams_open: AtomicI64,
}

const STATUSES: [TurnStatus; 5] = [
    TurnStatus::Running,
    TurnStatus::Completed,
    TurnStatus::Failed,
    TurnStatus::Cancelled,
    TurnStatus::Interrupted,
];

impl Metrics {
    pub fn turn_started(&self) {
        self.turns_started.fetch_add(1, Ordering::Relaxed);
        self.turns_running.fetch_add(1, Ordering::Relaxed);
    }

    pub fn turn_finished(&self, status: TurnStatus) {
        self.turns_running.fetch_sub(1, Ordering::Relaxed);
        if let Some(i) = STATUSES.iter().position(|s| *s == status) {
            self.finished[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        metric(
            "agent_harness_turns_started_total",
            "counter",
            "Turns begun.",
            load(&self.turns_started),
        );
        metric(
            "agent_harness_turns_running",
            "gauge",
            "Turns running in this process.",
            self.turns_running.load(Ordering::Relaxed).to_string(),
        );
        metric(
            "agent_harness_events_persisted_total",
            "counter",
            "Events committed to the event log.",
            load(&self.events_persisted),
        );
        metric(
            "agent_harness_event_batches_total",
            "counter",
            "Event log transactions (group commits).",
            load(&self.event_batches),
        );
        metric(
            "agent_harness_event_batch_failures_total",
            "counter",
            "Event log transactions that failed.",
            load(&self.event_batch_failures),
        );
        metric(
            "agent_harness_sse_streams_open",
            "gauge",
            "Open SSE streams.",
            self.streams_open.load(Ordering::Relaxed).to_string(),
        );
        let _ = writeln!(
            out,
            "# HELP agent_harness_turns_finished_total Turns ended, by status.\n# TYPE agent_harness_turns_finished_total counter"
        );
        for (status, count) in STATUSES.iter().zip(&self.finished).skip(1) {
            let _ = writeln!(
                out,
                "agent_harness_turns_finished_total{{status=\"{status}\"}} {}",
                count.load(Ordering::Relaxed)
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_in_the_text_format() {
        let metrics = Metrics::default();
        metrics.turn_started();
        metrics.turn_started();
        metrics.turn_finished(TurnStatus::Completed);
        let text = metrics.render();
        assert!(
            text.contains("agent_harness_turns_started_total 2\n"),
            "{text}"
        );
        assert!(text.contains("agent_harness_turns_running 1\n"), "{text}");
        assert!(
            text.contains("agent_harness_turns_finished_total{status=\"completed\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("agent_harness_turns_finished_total{status=\"failed\"} 0\n"),
            "{text}"
        );
    }
}
