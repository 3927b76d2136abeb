//! Service metrics at `GET /metrics`, kept and rendered by
//! `prometheus-client` (the Prometheus project's Rust client) in the
//! OpenMetrics text format: counters and gauges of turns, events and
//! streams, and histograms of turn latency, time to first token, tokens
//! per provider call and tool latency.
//!
//! Labels are bounded: turn statuses, token types, and tool names (the
//! registry's) with their outcomes.

use std::time::Duration;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

use crate::store::TurnStatus;

/// The content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    /// A provider error's stable code (`provider_timeout`, …).
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    /// A background job's kind.
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    /// `input` or `output` (`gen_ai.token.type`).
    r#type: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
    /// The `tool.finished` status: completed, failed, timed_out, denied…
    outcome: String,
}

/// Seconds, 5 ms to about 80 s: turns and tool calls.
fn seconds_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// Tokens, 16 to about 1 M.
fn token_buckets() -> Histogram {
    Histogram::new(exponential_buckets(16.0, 4.0, 9))
}

/// The service's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    turns_started: Counter,
    turns_running: Gauge,
    turns_finished: Family<StatusLabels, Counter>,
    takeovers: Family<ReasonLabels, Counter>,
    parks: Counter,
    unparks: Counter,
    retention_erased: Counter,
    events_persisted: Counter,
    event_batches: Counter,
    event_batch_failures: Counter,
    streams_open: Gauge,
    turn_duration: Family<StatusLabels, Histogram, fn() -> Histogram>,
    time_to_first_token: Histogram,
    tokens: Family<TokenLabels, Histogram, fn() -> Histogram>,
    tool_duration: Family<ToolLabels, Histogram, fn() -> Histogram>,
    provider_errors: Family<CodeLabels, Counter>,
    jobs_pending: Gauge,
    job_oldest_age: Gauge<f64, std::sync::atomic::AtomicU64>,
    jobs_shed: Family<KindLabels, Counter>,
}

const STATUSES: [TurnStatus; 4] = [
    TurnStatus::Completed,
    TurnStatus::Failed,
    TurnStatus::Cancelled,
    TurnStatus::Interrupted,
];

impl Default for Metrics {
    #[expect(
        clippy::too_many_lines,
        reason = "registers every metric, a statement each"
    )]
    fn default() -> Self {
        let mut registry = Registry::default();
        let metrics = Self {
            turns_started: Counter::default(),
            turns_running: Gauge::default(),
            turns_finished: Family::default(),
            takeovers: Family::default(),
            parks: Counter::default(),
            unparks: Counter::default(),
            retention_erased: Counter::default(),
            events_persisted: Counter::default(),
            event_batches: Counter::default(),
            event_batch_failures: Counter::default(),
            streams_open: Gauge::default(),
            turn_duration: Family::new_with_constructor(seconds_buckets),
            time_to_first_token: seconds_buckets(),
            tokens: Family::new_with_constructor(token_buckets),
            tool_duration: Family::new_with_constructor(seconds_buckets),
            provider_errors: Family::default(),
            jobs_pending: Gauge::default(),
            job_oldest_age: Gauge::default(),
            jobs_shed: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "agent_harness_turns_started",
            "Turns begun",
            metrics.turns_started.clone(),
        );
        registry.register(
            "agent_harness_turns_running",
            "Turns running in this process",
            metrics.turns_running.clone(),
        );
        // Every status is shown from the start, at 0.
        for status in STATUSES {
            let _ = metrics.turns_finished.get_or_create(&StatusLabels {
                status: status.as_str(),
            });
        }
        registry.register(
            "agent_harness_turns_finished",
            "Turns ended, by status",
            metrics.turns_finished.clone(),
        );
        for reason in ["crash", "shutdown"] {
            let _ = metrics.takeovers.get_or_create(&ReasonLabels { reason });
        }
        registry.register(
            "agent_harness_turn_takeovers",
            "Turns this process took over from another, by why their owner let go: it died (crash) or handed them over (shutdown)",
            metrics.takeovers.clone(),
        );
        registry.register(
            "agent_harness_turns_parked",
            "Turns this process parked in the database to wait for an answer (a person's decision, a client's result)",
            metrics.parks.clone(),
        );
        registry.register(
            "agent_harness_turns_unparked",
            "Parked turns this process went on with (answered, or their wait ended)",
            metrics.unparks.clone(),
        );
        registry.register(
            "agent_harness_retention_erased",
            "Sessions the retention sweep erased (inactive past their tenant's retention)",
            metrics.retention_erased.clone(),
        );
        registry.register(
            "agent_harness_events_persisted",
            "Events committed to the event log",
            metrics.events_persisted.clone(),
        );
        registry.register(
            "agent_harness_event_batches",
            "Event log transactions (group commits)",
            metrics.event_batches.clone(),
        );
        registry.register(
            "agent_harness_event_batch_failures",
            "Event log transactions that failed",
            metrics.event_batch_failures.clone(),
        );
        registry.register(
            "agent_harness_sse_streams_open",
            "Open SSE streams",
            metrics.streams_open.clone(),
        );
        registry.register_with_unit(
            "agent_harness_turn_duration",
            "Turns, from begin to end, by status",
            Unit::Seconds,
            metrics.turn_duration.clone(),
        );
        registry.register_with_unit(
            "agent_harness_turn_time_to_first_token",
            "Turns, from begin to the first text of the answer",
            Unit::Seconds,
            metrics.time_to_first_token.clone(),
        );
        registry.register(
            "gen_ai_client_token_usage",
            "Tokens per provider call, by type (input, output)",
            metrics.tokens.clone(),
        );
        // Shown from the start, at 0: the one a hung provider makes.
        let _ = metrics.provider_errors.get_or_create(&CodeLabels {
            code: "provider_timeout".to_owned(),
        });
        registry.register(
            "agent_harness_provider_errors",
            "Provider calls that failed, by code (a call the turn's deadline \
             cut off is a provider_timeout)",
            metrics.provider_errors.clone(),
        );
        registry.register(
            "agent_harness_jobs_pending",
            "Background jobs waiting to run, of every replica",
            metrics.jobs_pending.clone(),
        );
        registry.register_with_unit(
            "agent_harness_job_oldest_age",
            "Age of the oldest background job waiting to run",
            Unit::Seconds,
            metrics.job_oldest_age.clone(),
        );
        let _ = metrics.jobs_shed.get_or_create(&KindLabels {
            kind: "memory_extraction",
        });
        registry.register(
            "agent_harness_jobs_shed",
            "Background jobs given up because the backlog was over its bound, by kind",
            metrics.jobs_shed.clone(),
        );
        registry.register_with_unit(
            "agent_harness_tool_duration",
            "Tool calls, by tool and outcome",
            Unit::Seconds,
            metrics.tool_duration.clone(),
        );
        Self {
            registry,
            ..metrics
        }
    }
}

impl Metrics {
    pub fn turn_started(&self) {
        self.turns_started.inc();
        self.turns_running.inc();
    }

    pub fn turn_finished(&self, status: TurnStatus, elapsed: Duration) {
        self.turns_running.dec();
        let labels = StatusLabels {
            status: status.as_str(),
        };
        self.turns_finished.get_or_create(&labels).inc();
        self.turn_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// A turn this process took over; `released`: its owner handed it over
    /// (else it died).
    pub fn turn_taken_over(&self, released: bool) {
        let reason = if released { "shutdown" } else { "crash" };
        self.takeovers.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// A session the retention sweep erased.
    pub fn retention_erased(&self) {
        self.retention_erased.inc();
    }

    /// A turn this process parked: it runs here no more.
    pub fn turn_parked(&self) {
        self.parks.inc();
        self.turns_running.dec();
    }

    /// A parked turn this process goes on with (counted as started).
    pub fn turn_unparked(&self) {
        self.unparks.inc();
    }

    /// A turn this process gave up for another to go on with.
    pub fn turn_handed_over(&self) {
        self.turns_running.dec();
    }

    pub fn first_token(&self, elapsed: Duration) {
        self.time_to_first_token.observe(elapsed.as_secs_f64());
    }

    /// One provider call's tokens.
    pub fn tokens(&self, input: u64, output: u64) {
        for (kind, count) in [("input", input), ("output", output)] {
            self.tokens
                .get_or_create(&TokenLabels { r#type: kind })
                .observe(count as f64);
        }
    }

    pub fn tool_finished(&self, tool: &str, outcome: &str, latency: Duration) {
        self.tool_duration
            .get_or_create(&ToolLabels {
                tool: tool.to_owned(),
                outcome: outcome.to_owned(),
            })
            .observe(latency.as_secs_f64());
    }

    /// The background jobs waiting, and the age of the oldest.
    pub fn job_backlog(&self, pending: u64, oldest_age_seconds: f64) {
        self.jobs_pending
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
        self.job_oldest_age.set(oldest_age_seconds);
    }

    /// Jobs of `kind` given up over the backlog bound.
    pub fn jobs_shed(&self, kind: &'static str, count: u64) {
        self.jobs_shed
            .get_or_create(&KindLabels { kind })
            .inc_by(count);
    }

    /// A provider call failed with `code`.
    pub fn provider_error(&self, code: &str) {
        self.provider_errors
            .get_or_create(&CodeLabels {
                code: code.to_owned(),
            })
            .inc();
    }

    pub fn batch_committed(&self, events: u64) {
        self.events_persisted.inc_by(events);
        self.event_batches.inc();
    }

    pub fn batch_failed(&self) {
        self.event_batch_failures.inc();
    }

    pub fn stream_opened(&self) {
        self.streams_open.inc();
    }

    pub fn stream_closed(&self) {
        self.streams_open.dec();
    }

    /// Turns running in this process, as the gauge says.
    pub fn running(&self) -> i64 {
        self.turns_running.get()
    }

    /// The OpenMetrics text exposition ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            out = format!("# the metrics could not be rendered: {e}\n# EOF\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value<'a>(text: &'a str, name: &str) -> &'a str {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing: {text}"))
    }

    #[test]
    fn counters_gauges_and_histograms_render_as_openmetrics() {
        let metrics = Metrics::default();
        metrics.turn_started();
        metrics.turn_started();
        metrics.turn_finished(TurnStatus::Completed, Duration::from_millis(30));
        metrics.first_token(Duration::from_millis(12));
        metrics.tokens(120, 40);
        metrics.tool_finished("read_note", "completed", Duration::from_millis(7));
        metrics.batch_committed(5);
        let text = metrics.render();
        assert_eq!(value(&text, "agent_harness_turns_started_total"), "2");
        assert_eq!(value(&text, "agent_harness_turns_running"), "1");
        assert_eq!(
            value(
                &text,
                "agent_harness_turns_finished_total{status=\"completed\"}"
            ),
            "1"
        );
        assert_eq!(
            value(
                &text,
                "agent_harness_turns_finished_total{status=\"failed\"}"
            ),
            "0"
        );
        assert_eq!(value(&text, "agent_harness_events_persisted_total"), "5");
        assert!(
            text.contains("# TYPE agent_harness_turn_duration_seconds histogram"),
            "{text}"
        );
        assert_eq!(
            value(
                &text,
                "agent_harness_turn_duration_seconds_count{status=\"completed\"}"
            ),
            "1"
        );
        // 30 ms is above the 20 ms bucket and within the 40 ms one.
        assert_eq!(
            value(
                &text,
                "agent_harness_turn_duration_seconds_bucket{le=\"0.02\",status=\"completed\"}"
            ),
            "0"
        );
        assert_eq!(
            value(
                &text,
                "agent_harness_turn_duration_seconds_bucket{le=\"0.04\",status=\"completed\"}"
            ),
            "1"
        );
        assert_eq!(
            value(&text, "gen_ai_client_token_usage_sum{type=\"input\"}"),
            "120.0"
        );
        assert_eq!(
            value(
                &text,
                "agent_harness_tool_duration_seconds_count{tool=\"read_note\",outcome=\"completed\"}"
            ),
            "1"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
