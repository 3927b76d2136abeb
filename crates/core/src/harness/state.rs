//! `TurnRuntimeState`: the one mutable container of a turn.
//!
//! Created at the start of a turn, passed explicitly to whoever writes turn
//! data, dropped at its end: the harness itself holds no per-turn state, so
//! turns cannot contaminate each other. Every method takes `&self` and is
//! safe to call from the tasks of a parallel wave; locks are never held
//! across an await.
//!
//! The tool trace is the late-write gate: a tool that finishes after its
//! timeout finds its entry `timed_out`, gets `false` from
//! [`TurnRuntimeState::complete_trace`], and must write nothing.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{
        Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use serde::{Deserialize, Serialize};

use super::{budget::TurnBudget, replay::ReplayControl};
use crate::providers::Usage;
pub use crate::{hooks::ToolResultRecord, turn::WebCitation};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here leaves its data consistent.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where a tool call is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceStatus {
    Running,
    Completed,
    TimedOut,
    TimedOutLate,
}

/// One tool call in the trace. Not persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolTraceEntry {
    pub tool_name: String,
    pub status: TraceStatus,
    pub trace_id: String,
    pub latency_ms: u64,
    pub retryable: bool,
}

/// Citations collected during a turn, in the order they were found, without
/// duplicates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CitationAccumulator {
    pub local: Vec<String>,
    pub web: Vec<WebCitation>,
    pub rendered_paths: Vec<String>,
}

impl CitationAccumulator {
    pub fn add_local(&mut self, anchor: &str) {
        if !anchor.is_empty() && !self.local.iter().any(|a| a == anchor) {
            self.local.push(anchor.to_owned());
        }
    }

    pub fn add_web(&mut self, citation: WebCitation) {
        if !citation.url.is_empty() && !self.web.iter().any(|w| w.url == citation.url) {
            self.web.push(citation);
        }
    }

    pub fn add_rendered(&mut self, path: &str) {
        if !path.is_empty() && !self.rendered_paths.iter().any(|p| p == path) {
            self.rendered_paths.push(path.to_owned());
        }
    }
}

/// The mutable state of one turn.
#[derive(Debug)]
pub struct TurnRuntimeState {
    pub session_id: crate::ids::SessionKey,
    pub budget: TurnBudget,
    tokens: Mutex<Usage>,
    cost_usd: Mutex<Option<f64>>,
    citations: Mutex<CitationAccumulator>,
    tool_trace: Mutex<HashMap<String, ToolTraceEntry>>,
    tool_results: Mutex<Vec<ToolResultRecord>>,
    blocked_tool_names: Mutex<HashSet<String>>,
    validation_repair_counts: Mutex<HashMap<String, u32>>,
    /// The specs of the client's tools this turn called, by name: one
    /// each, its schema compiled once (at most one per declared tool).
    client_specs: Mutex<HashMap<String, crate::tools::ToolSpec>>,
    final_text: Mutex<String>,
    timed_out: AtomicBool,
    prompt_render_hash: Mutex<String>,
    context_was_compacted: AtomicBool,
    writes_open: AtomicBool,
    /// Every call id this turn handed out (see [`super::call_ids`]): a
    /// compaction may take the messages that held them, never these. At
    /// most the turn's tool calls.
    call_ids: Mutex<HashSet<String>>,
    /// The arguments people's approvals gave calls of the step that runs
    /// (JSON, by call id), for the model's history: at most the step's
    /// calls.
    edited: Mutex<HashMap<String, String>>,
    /// The messages steered into the turn, in the order its steps took
    /// them (the turn's history keeps them after its question): at most
    /// a bounded number a step.
    steered: Mutex<Vec<String>>,
}

impl TurnRuntimeState {
    /// The spec of the client's tool `name` this turn, made by `make` the
    /// first time a call asks for it; every later call shares it (and its
    /// compiled schema).
    pub fn client_spec(
        &self,
        name: &str,
        make: impl FnOnce() -> crate::tools::ToolSpec,
    ) -> crate::tools::ToolSpec {
        lock(&self.client_specs)
            .entry(name.to_owned())
            .or_insert_with(make)
            .clone()
    }

    pub fn new(session_id: impl Into<crate::ids::SessionKey>, budget: TurnBudget) -> Self {
        Self {
            session_id: session_id.into(),
            budget,
            tokens: Mutex::default(),
            cost_usd: Mutex::default(),
            citations: Mutex::default(),
            tool_trace: Mutex::default(),
            tool_results: Mutex::default(),
            blocked_tool_names: Mutex::default(),
            validation_repair_counts: Mutex::default(),
            client_specs: Mutex::default(),
            final_text: Mutex::default(),
            timed_out: AtomicBool::new(false),
            prompt_render_hash: Mutex::default(),
            context_was_compacted: AtomicBool::new(false),
            writes_open: AtomicBool::new(true),
            call_ids: Mutex::default(),
            edited: Mutex::default(),
            steered: Mutex::default(),
        }
    }

    /// A message steered into the turn is in its conversation.
    pub fn note_steered(&self, message: String) {
        lock(&self.steered).push(message);
    }

    /// The messages steered into the turn, in order.
    pub fn steered(&self) -> Vec<String> {
        lock(&self.steered).clone()
    }

    /// A person's approval runs the call `call_id` with `arguments`.
    pub fn note_edited(&self, call_id: &str, arguments: &str) {
        lock(&self.edited).insert(call_id.to_owned(), arguments.to_owned());
    }

    /// The edits of the step's calls, taken.
    pub fn take_edited(&self) -> HashMap<String, String> {
        std::mem::take(&mut *lock(&self.edited))
    }

    /// Gives each of `calls` (the model's at `step`) an id that neither
    /// `messages` nor any earlier call of this turn holds, and keeps them.
    pub fn hand_out_call_ids(
        &self,
        calls: &mut [crate::providers::ToolCall],
        messages: &[crate::providers::ChatMessage],
        step: u32,
    ) {
        let mut given = lock(&self.call_ids);
        super::call_ids::make_unique(calls, messages, &given, step);
        given.extend(calls.iter().map(|c| c.id.clone()));
    }

    /// Keeps `ids` as handed out (a turn taken over: its log names them).
    pub fn handed_out_call_ids(&self, ids: impl IntoIterator<Item = String>) {
        lock(&self.call_ids).extend(ids);
    }

    /// A turn's state as its records left it (see [`super::durable`]):
    /// counters, usage, citations, blocks, repairs and tool results; its
    /// budget's counters are `budget`'s own.
    pub fn restore(
        session_id: impl Into<crate::ids::SessionKey>,
        budget: TurnBudget,
        snapshot: &StateSnapshot,
        tool_results: Vec<ToolResultRecord>,
    ) -> Self {
        let state = Self::new(session_id, budget);
        *lock(&state.tokens) = snapshot.usage;
        *lock(&state.cost_usd) = snapshot.cost_usd;
        *lock(&state.citations) = snapshot.citations.clone();
        *lock(&state.tool_results) = tool_results;
        *lock(&state.blocked_tool_names) = snapshot.blocked_tools.iter().cloned().collect();
        *lock(&state.validation_repair_counts) = snapshot
            .repair_counts
            .iter()
            .map(|(call, count)| (call.clone(), *count))
            .collect();
        if snapshot.context_compacted {
            state.set_context_compacted();
        }
        lock(&state.steered).clone_from(&snapshot.steered);
        state
    }

    /// The durable part of the state now (tool results aside: records
    /// carry them as they are added), with the replay gate's calls.
    pub fn snapshot(&self, replay: &ReplayControl) -> StateSnapshot {
        StateSnapshot {
            steps: self.budget.steps_used(),
            tool_calls: self.budget.tool_calls_used(),
            reflections: self.budget.reflections_used(),
            usage: self.tokens(),
            cost_usd: self.cost_usd(),
            citations: self.citations(),
            blocked_tools: self.blocked_tools(),
            repair_counts: lock(&self.validation_repair_counts)
                .iter()
                .map(|(call, count)| (call.clone(), *count))
                .collect(),
            completed_calls: replay.completed(),
            context_compacted: self.context_was_compacted(),
            steered: self.steered(),
        }
    }

    // Token accounting.

    pub fn add_tokens(&self, usage: &Usage) {
        lock(&self.tokens).add(usage);
    }

    pub fn tokens(&self) -> Usage {
        *lock(&self.tokens)
    }

    /// Adds the cost of a provider call (`None`: the model is not priced).
    pub fn add_cost(&self, cost: Option<f64>) {
        if let Some(cost) = cost {
            let mut total = lock(&self.cost_usd);
            *total = Some(total.unwrap_or(0.0) + cost);
        }
    }

    /// The turn's cost so far, if any call was priced.
    pub fn cost_usd(&self) -> Option<f64> {
        *lock(&self.cost_usd)
    }

    // Citations.

    pub fn with_citations<R>(&self, f: impl FnOnce(&mut CitationAccumulator) -> R) -> R {
        f(&mut lock(&self.citations))
    }

    pub fn citations(&self) -> CitationAccumulator {
        lock(&self.citations).clone()
    }

    // The tool trace: the late-write gate.

    /// Before a tool starts: its entry is `running`.
    pub fn set_trace_running(&self, trace_id: &str, tool_name: &str) {
        lock(&self.tool_trace).insert(
            trace_id.to_owned(),
            ToolTraceEntry {
                tool_name: tool_name.to_owned(),
                status: TraceStatus::Running,
                trace_id: trace_id.to_owned(),
                latency_ms: 0,
                retryable: true,
            },
        );
    }

    /// The harness gave up waiting for the tool.
    pub fn mark_trace_timed_out(&self, trace_id: &str) {
        if let Some(entry) = lock(&self.tool_trace).get_mut(trace_id)
            && entry.status == TraceStatus::Running
        {
            entry.status = TraceStatus::TimedOut;
        }
    }

    /// The tool finished. `true`: it was still awaited (now `completed`);
    /// `false`: it had timed out (now `timed_out_late`) and its result must
    /// be dropped without any side effect.
    pub fn complete_trace(&self, trace_id: &str, latency_ms: u64, retryable: bool) -> bool {
        let mut trace = lock(&self.tool_trace);
        let Some(entry) = trace.get_mut(trace_id) else {
            return false;
        };
        entry.latency_ms = latency_ms;
        entry.retryable = retryable;
        match entry.status {
            TraceStatus::Running => {
                entry.status = TraceStatus::Completed;
                true
            }
            TraceStatus::TimedOut => {
                entry.status = TraceStatus::TimedOutLate;
                false
            }
            TraceStatus::Completed | TraceStatus::TimedOutLate => false,
        }
    }

    pub fn trace_entry(&self, trace_id: &str) -> Option<ToolTraceEntry> {
        lock(&self.tool_trace).get(trace_id).cloned()
    }

    // Tool results, blocking and repair counts.

    /// Appends a tool result; ignored once writes are closed.
    pub fn push_tool_result(&self, record: ToolResultRecord) -> bool {
        if !self.is_accepting_writes() {
            return false;
        }
        lock(&self.tool_results).push(record);
        true
    }

    pub fn tool_results(&self) -> Vec<ToolResultRecord> {
        lock(&self.tool_results).clone()
    }

    pub fn block_tool(&self, name: &str) {
        lock(&self.blocked_tool_names).insert(name.to_owned());
    }

    pub fn is_blocked(&self, name: &str) -> bool {
        lock(&self.blocked_tool_names).contains(name)
    }

    pub fn blocked_tools(&self) -> Vec<String> {
        let mut names: Vec<String> = lock(&self.blocked_tool_names).iter().cloned().collect();
        names.sort();
        names
    }

    /// Counts one repair attempt for `call_id`; returns the new count.
    pub fn count_repair(&self, call_id: &str) -> u32 {
        let mut counts = lock(&self.validation_repair_counts);
        let count = counts.entry(call_id.to_owned()).or_insert(0);
        *count += 1;
        *count
    }

    pub fn repair_count(&self, call_id: &str) -> u32 {
        lock(&self.validation_repair_counts)
            .get(call_id)
            .copied()
            .unwrap_or(0)
    }

    // Outcome.

    pub fn set_final_text(&self, text: impl Into<String>) {
        *lock(&self.final_text) = text.into();
    }

    pub fn final_text(&self) -> String {
        lock(&self.final_text).clone()
    }

    pub fn set_timed_out(&self) {
        self.timed_out.store(true, Ordering::Release);
    }

    pub fn timed_out(&self) -> bool {
        self.timed_out.load(Ordering::Acquire)
    }

    pub fn set_prompt_render_hash(&self, hash: impl Into<String>) {
        *lock(&self.prompt_render_hash) = hash.into();
    }

    pub fn prompt_render_hash(&self) -> String {
        lock(&self.prompt_render_hash).clone()
    }

    pub fn set_context_compacted(&self) {
        self.context_was_compacted.store(true, Ordering::Release);
    }

    pub fn context_was_compacted(&self) -> bool {
        self.context_was_compacted.load(Ordering::Acquire)
    }

    // The write gate.

    /// Seals the turn: nothing may be written for it afterwards.
    pub fn close_writes(&self) {
        self.writes_open.store(false, Ordering::Release);
    }

    pub fn is_accepting_writes(&self) -> bool {
        self.writes_open.load(Ordering::Acquire)
    }
}

/// A turn's counters and collections after a step (all but the
/// conversation and the tool results, which records carry as additions).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StateSnapshot {
    pub steps: u32,
    pub tool_calls: u32,
    pub reflections: u32,
    pub usage: Usage,
    pub cost_usd: Option<f64>,
    pub citations: CitationAccumulator,
    pub blocked_tools: Vec<String>,
    pub repair_counts: BTreeMap<String, u32>,
    /// The calls that completed, for the replay gate: `(tool, canonical
    /// arguments, call id)`, sorted.
    pub completed_calls: Vec<(String, String, String)>,
    pub context_compacted: bool,
    /// The messages steered into the turn so far (absent: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steered: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{events::ToolStatus, harness::budget::BudgetLimits};

    fn state() -> TurnRuntimeState {
        TurnRuntimeState::new("s", TurnBudget::create(BudgetLimits::default()))
    }

    /// Every call of a client's tool in a turn shares one spec and one
    /// compiled schema (before, each call made its spec, and compiled the
    /// schema, again).
    #[test]
    fn a_client_tools_schema_is_compiled_once_a_turn() {
        use crate::tools::client::ClientCall;
        let state = state();
        let declared = crate::turn::ClientTool::checked(
            "pick_date".into(),
            "Asks the user for a date.".into(),
            Some(serde_json::json!({"type": "object", "properties": {"day": {"type": "string"}}})),
            None,
        )
        .unwrap();
        let made = std::sync::atomic::AtomicU32::new(0);
        let make = || {
            made.fetch_add(1, Ordering::Relaxed);
            ClientCall::spec_of(&declared)
        };
        let first = state.client_spec("client__pick_date", make);
        let compiled: *const jsonschema::Validator = first.validator().unwrap();
        let again = state.client_spec("client__pick_date", || ClientCall::spec_of(&declared));
        assert!(std::ptr::eq(compiled, again.validator().unwrap()));
        assert_eq!(made.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_tool_that_finishes_in_time_completes() {
        let state = state();
        state.set_trace_running("t1", "local_search");
        assert!(state.complete_trace("t1", 12, true));
        let entry = state.trace_entry("t1").unwrap();
        assert_eq!(
            (entry.status, entry.latency_ms),
            (TraceStatus::Completed, 12)
        );
        assert!(
            !state.complete_trace("t1", 13, true),
            "a trace completes once"
        );
    }

    #[test]
    fn a_tool_that_finishes_after_its_timeout_is_late_and_refused() {
        let state = state();
        state.set_trace_running("t1", "slow");
        state.mark_trace_timed_out("t1");
        assert!(!state.complete_trace("t1", 50_000, false));
        assert_eq!(
            state.trace_entry("t1").unwrap().status,
            TraceStatus::TimedOutLate
        );
        assert!(!state.complete_trace("unknown", 1, true));
    }

    #[test]
    fn closed_writes_refuse_tool_results() {
        let state = state();
        let record = ToolResultRecord {
            call_id: "c".into(),
            tool: "t".into(),
            status: ToolStatus::Completed,
            content: "x".into(),
        };
        assert!(state.push_tool_result(record.clone()));
        state.close_writes();
        assert!(!state.is_accepting_writes());
        assert!(!state.push_tool_result(record));
        assert_eq!(state.tool_results().len(), 1);
    }

    #[test]
    fn tokens_and_citations_accumulate_without_duplicates() {
        let state = state();
        state.add_tokens(&Usage {
            input_tokens: 10,
            output_tokens: 2,
            cache_read_tokens: 1,
            cache_creation_tokens: 0,
            reasoning_tokens: 0,
        });
        state.add_tokens(&Usage {
            input_tokens: 5,
            output_tokens: 3,
            ..Usage::default()
        });
        assert_eq!(state.tokens().input_tokens, 15);
        assert_eq!(state.tokens().output_tokens, 5);
        state.with_citations(|c| {
            c.add_local("notes/a.md");
            c.add_local("notes/b.md");
            c.add_local("notes/a.md");
            c.add_web(WebCitation {
                title: "A".into(),
                url: "https://a.example".into(),
            });
            c.add_web(WebCitation {
                title: "A again".into(),
                url: "https://a.example".into(),
            });
        });
        let citations = state.citations();
        assert_eq!(citations.local, ["notes/a.md", "notes/b.md"]);
        assert_eq!(citations.web.len(), 1);
    }

    #[test]
    fn repair_counts_are_per_call() {
        let state = state();
        assert_eq!(state.count_repair("a"), 1);
        assert_eq!(state.count_repair("a"), 2);
        assert_eq!(state.count_repair("b"), 1);
        assert_eq!(state.repair_count("a"), 2);
    }
}
