//! The life of one turn in this process: its task runs the harness, its
//! sink numbers and queues its events, and its end is committed with its
//! terminal event (or, when that cannot be stored, a smaller `failed` end).

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use async_trait::async_trait;
use chrono::Utc;
use tokio::sync::Mutex;

use super::{
    LiveTurn, TurnRunner, writer,
    writer::{EventWriter, Flush},
};
use crate::{
    events::{StoredEvent, TurnEvent},
    harness::{
        EventSink, SinkError, TurnError, TurnInput, TurnOutput,
        budget::TurnBudget,
        durable::{self, PriorCalls, Resume, StepPhase, StepRecord},
        state::TurnRuntimeState,
    },
    providers::{ChatMessage, Role},
    store::{
        BeganTurn, Lease, MessageRecord, NewStep, StoreError, TurnFinish, TurnRecord, TurnStatus,
    },
    turn::TurnRequest,
};

/// The history messages a prompt takes (user, assistant and system).
fn chat_messages(messages: Vec<MessageRecord>) -> Vec<ChatMessage> {
    messages
        .into_iter()
        .filter_map(|m| {
            let role = m
                .role
                .parse::<Role>()
                .ok()
                .filter(|r| r.is_conversational())?;
            Some(ChatMessage::new(role, m.content))
        })
        .collect()
}

impl TurnRunner {
    /// The life of one turn, from its first event after `turn.started` to its commit.
    pub(super) async fn drive(
        self,
        live: Arc<LiveTurn>,
        spec: Arc<TurnRequest>,
        began: BeganTurn,
        memory_scope: String,
    ) {
        let started = tokio::time::Instant::now();
        let sink = self.sink(&live, began.first_seq + 1, started);
        let run = self.execute(&live, &spec, began, memory_scope, sink.clone());
        self.conclude(&live, &sink, started, run).await;
    }

    /// The life of a turn this process took over, from its `turn.resumed`
    /// at `next_seq` to its commit.
    pub(super) async fn drive_resumed(self, live: Arc<LiveTurn>, turn: TurnRecord, next_seq: i64) {
        let started = tokio::time::Instant::now();
        let sink = self.sink(&live, next_seq, started);
        let run = self.execute_resumed(&live, &turn, sink.clone());
        self.conclude(&live, &sink, started, run).await;
    }

    /// The sink of a turn whose next event takes `next_seq`.
    fn sink(
        &self,
        live: &Arc<LiveTurn>,
        next_seq: i64,
        began: tokio::time::Instant,
    ) -> Arc<TurnSink> {
        let inner = &self.inner;
        Arc::new(TurnSink {
            writer: inner.writer.clone(),
            live: live.clone(),
            metrics: inner.metrics.clone(),
            harness: inner.harness.clone(),
            began,
            answered: std::sync::atomic::AtomicBool::new(false),
            waiting: std::sync::Mutex::default(),
            next_seq: Mutex::new(Some(next_seq)),
            after_delta: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Runs `run` until it ends or the turn is stopped, and commits the end.
    async fn conclude(
        &self,
        live: &Arc<LiveTurn>,
        sink: &TurnSink,
        started: tokio::time::Instant,
        run: impl std::future::Future<Output = Result<TurnOutput, TurnFailure>>,
    ) {
        let inner = &self.inner;
        let outcome = tokio::select! {
            biased;
            () = live.cancel.cancelled() => Outcome::Cancelled,
            // The grace is over: a turn still mid-step is handed over as it
            // stands (its records say where), or interrupted.
            () = inner.interrupt.cancelled() => if inner.handover.is_cancelled() {
                Outcome::HandedOver
            } else {
                Outcome::Interrupted
            },
            // Some of its events are lost: stop now rather than at its
            // next event (a provider call may take a while).
            () = live.write_failed.cancelled() => Outcome::Failed(TurnFailure::LostEvents),
            result = run => match result {
                Ok(output) => Outcome::Completed(Box::new(output)),
                Err(TurnFailure::Turn(TurnError::HandedOver)) => Outcome::HandedOver,
                Err(failure) => Outcome::Failed(failure),
            },
        };
        tracing::debug!(elapsed_ms = started.elapsed().as_millis(), "turn ended");
        if matches!(outcome, Outcome::HandedOver) {
            self.hand_over(live, sink).await;
            live.closed.cancel();
            inner.live.remove(live.turn_id);
            inner.metrics.turn_handed_over();
            return;
        }
        let status = match self.finish(live, sink, outcome).await {
            Ok(Some(status)) => status,
            Ok(None) => {
                tracing::warn!("turn was ended elsewhere before it finished");
                TurnStatus::Interrupted
            }
            Err(e) => {
                tracing::error!(error = %e, "turn end could not be committed");
                TurnStatus::Failed
            }
        };
        tracing::Span::current().record("turn.status", status.as_str());
        live.closed.cancel();
        inner.live.remove(live.turn_id);
        inner.metrics.turn_finished(status, started.elapsed());
    }

    /// Gives the turn up for another process: nothing more is written for
    /// it here, what was queued is committed, and its lease is released
    /// (announced to the other replicas, which take it over at once). A
    /// release that cannot be written leaves the turn to the sweep, once
    /// its heartbeat is stale.
    async fn hand_over(&self, live: &Arc<LiveTurn>, sink: &TurnSink) {
        let inner = &self.inner;
        sink.close().await;
        if let Err(e) = inner.writer.flush(live).await {
            tracing::warn!(error = %e, "the turn's last events were not committed before its hand-over");
        }
        let lease = Lease {
            turn_id: live.turn_id,
            attempt: live.attempt,
        };
        match inner.store.release_turn(&lease).await {
            Ok(true) => tracing::info!("turn handed over"),
            Ok(false) => tracing::warn!("the turn was no longer this process's to hand over"),
            Err(e) => {
                tracing::warn!(error = %e, "the turn's release was not written; the sweep takes it over once its heartbeat is stale");
            }
        }
    }

    /// Reads what a turn taken over left (its records and its events), says
    /// `turn.resumed` (and retracts the text of a step it did not finish),
    /// and goes on with it.
    async fn execute_resumed(
        &self,
        live: &LiveTurn,
        turn: &TurnRecord,
        sink: Arc<TurnSink>,
    ) -> Result<TurnOutput, TurnFailure> {
        let inner = &self.inner;
        let store = &inner.store;
        let records = store
            .step_records(turn.id)
            .await
            .map_err(TurnFailure::History)?
            .iter()
            .map(|record| serde_json::from_str::<StepRecord>(record))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TurnFailure::Records(e.to_string()))?;
        let from = durable::rebuild(&records).map_err(|e| TurnFailure::Records(e.to_string()))?;
        let events = self.turn_events(turn).await?;
        let from_step = from.as_ref().map_or(0, |f| f.step);
        sink.emit(TurnEvent::TurnResumed {
            owner: inner.config.instance_id.clone(),
            attempt: live.attempt,
            from_step,
        })
        .await
        .map_err(|e| TurnFailure::Turn(e.into()))?;
        // A step past the records streamed text that is void now: it is
        // done again.
        if let Some(step) = unfinished_text(&events, from_step) {
            sink.emit(TurnEvent::MessageRetracted {
                step,
                reason: "takeover".to_owned(),
            })
            .await
            .map_err(|e| TurnFailure::Turn(e.into()))?;
        }
        let session = store
            .get_session(&turn.session_id)
            .await
            .map_err(TurnFailure::History)?;
        let history = match &turn.request.history {
            Some(history) => history.clone(),
            None => chat_messages(
                store
                    .recent_messages(&turn.session_id, inner.config.history_max_messages)
                    .await
                    .map_err(TurnFailure::History)?,
            ),
        };
        let key = crate::ids::SessionKey::from_stored(&turn.session_id);
        let request = TurnInput {
            session_id: turn.session_id.clone(),
            turn_id: turn.id,
            turn_number: session
                .as_ref()
                .map_or(1, |s| u64::try_from(s.turn_count).unwrap_or(1)),
            history,
            asked: Arc::new(turn.request.clone()),
            session_cost_before: session.and_then(|s| s.cost_usd),
            memory_scope: turn.request.memory_scope(&key),
            memories: None,
            handover: inner.handover.clone(),
        };
        // The deadline and the elapsed time count from the turn's start.
        let age = (Utc::now() - turn.created_at).to_std().unwrap_or_default();
        let now = tokio::time::Instant::now();
        let started = now.checked_sub(age).unwrap_or(now);
        let harness = &inner.harness;
        let limits = harness.options().budget_limits();
        let deadline = started + limits.timeout;
        let Some(from) = from else {
            // No step was recorded: nothing the turn did must be kept; it
            // starts over, within its own deadline.
            let state = Arc::new(TurnRuntimeState::new(
                &request.session_id,
                TurnBudget::resume(limits, deadline, [0, 0, 0]),
            ));
            return harness
                .run_turn_with_state(request, sink, state)
                .await
                .map_err(TurnFailure::Turn);
        };
        let typed: Vec<&TurnEvent> = events.iter().filter_map(|e| e.event()).collect();
        let prior = match from.phase {
            StepPhase::Answered => PriorCalls::of_step(typed, from.step),
            StepPhase::Finished => PriorCalls::default(),
        };
        let state = Arc::new(from.runtime_state(&request.session_id, limits, deadline));
        let resume = Resume {
            from,
            prior,
            started,
            state,
        };
        harness
            .resume_turn(request, sink, resume)
            .await
            .map_err(TurnFailure::Turn)
    }

    /// The events of a running turn so far, in seq order (at most
    /// [`TURN_EVENTS_READ_MAX`]).
    async fn turn_events(&self, turn: &TurnRecord) -> Result<Vec<StoredEvent>, TurnFailure> {
        const PAGE: u32 = 1000;
        let mut events: Vec<StoredEvent> = Vec::new();
        let mut after = turn.first_seq - 1;
        while events.len() < TURN_EVENTS_READ_MAX {
            let page = self
                .inner
                .store
                .list_events(&turn.session_id, Some(turn.id), after, PAGE)
                .await
                .map_err(TurnFailure::History)?;
            let full = page.len() == PAGE as usize;
            if let Some(last) = page.last() {
                after = last.seq;
            }
            events.extend(page);
            if !full {
                break;
            }
        }
        Ok(events)
    }

    /// Loads history and runs the harness.
    async fn execute(
        &self,
        live: &LiveTurn,
        spec: &Arc<TurnRequest>,
        began: BeganTurn,
        memory_scope: String,
        sink: Arc<TurnSink>,
    ) -> Result<TurnOutput, TurnFailure> {
        let BeganTurn {
            turn_number,
            session_cost_before,
            context,
            ..
        } = began;
        let history = match (&spec.history, context.history) {
            (Some(history), _) => history.clone(),
            // The first turn of a session has no history to read.
            (None, _) if turn_number <= 1 => Vec::new(),
            // Read with the begin.
            (None, Some(read)) => chat_messages(read),
            (None, None) => chat_messages(
                self.inner
                    .store
                    .recent_messages(&live.session_id, self.inner.config.history_max_messages)
                    .await
                    .map_err(TurnFailure::History)?,
            ),
        };
        let request = TurnInput {
            session_id: live.session_id.clone(),
            turn_id: live.turn_id,
            turn_number,
            history,
            asked: spec.clone(),
            session_cost_before,
            memory_scope,
            memories: context.memories,
            handover: self.inner.handover.clone(),
        };
        self.inner
            .harness
            .run_turn(request, sink)
            .await
            .map_err(TurnFailure::Turn)
    }

    /// Commits the turn's end with its terminal event; returns the status
    /// it ended with (`None`: someone else ended it first).
    ///
    /// A store failure is retried a few times. If the end still cannot be
    /// written (a value the database refuses, such as U+0000 in Postgres
    /// text, or a database that stays down), the turn ends `failed` with
    /// `event_log_unavailable` instead: no history, no decision, but its
    /// result (JSON, so any character survives) stays on the turn row. That
    /// smaller write is retried, about a second apart, until it lands or the
    /// service shuts down (for at most [`FALLBACK_ATTEMPTS`] tries): a
    /// database that was away (a partition, a restart) finds it within a
    /// second or so of its return, and the session is free. (Another
    /// replica that can reach the database meanwhile sweeps the turn once
    /// its heartbeat is stale; the end then finds it ended and stops.)
    async fn finish(
        &self,
        live: &Arc<LiveTurn>,
        sink: &TurnSink,
        outcome: Outcome,
    ) -> Result<Option<TurnStatus>, writer::FinishError> {
        // A call still waiting for a person when the turn ends otherwise
        // (cancelled, interrupted, failed) is resolved first: a client
        // never sees a request left open by a terminal event.
        sink.resolve_waiting(outcome.status()).await;
        let seq = sink.close().await;
        let finish = build_finish(live, outcome, seq)
            .map_err(|e| writer::FinishError::Store(StoreError::Corrupt(e.to_string())))?;
        // A turn some of whose events were lost must not end as if whole.
        let error = if live.write_failed.is_cancelled() {
            StoreError::Unavailable("earlier events of the turn could not be written".into())
        } else {
            match self.commit_finish(live, &finish, END_ATTEMPTS, true).await {
                Err(writer::FinishError::Store(e)) => e,
                other => {
                    // The turn's jobs are in the store now: wake the worker.
                    if matches!(other, Ok(true)) && !finish.jobs.is_empty() {
                        self.inner.config.jobs_queued.notify_one();
                    }
                    return other.map(|applied| applied.then_some(finish.status));
                }
            }
        };
        tracing::error!(
            error = %error,
            "the turn's end cannot be stored; ending it failed with event_log_unavailable"
        );
        let fallback = unstorable_end(&finish, &error, live.first_lost())
            .map_err(|e| writer::FinishError::Store(StoreError::Corrupt(e.to_string())))?;
        self.commit_finish(live, &fallback, FALLBACK_ATTEMPTS, false)
            .await
            .map(|applied| applied.then_some(TurnStatus::Failed))
    }

    /// Commits `finish`, trying up to `attempts` times with a growing pause
    /// (capped at [`END_RETRY_MAX`]); gives up early when the service is
    /// interrupted, or (`whole`) once some of the turn's events were lost.
    async fn commit_finish(
        &self,
        live: &Arc<LiveTurn>,
        finish: &TurnFinish,
        attempts: u32,
        whole: bool,
    ) -> Result<bool, writer::FinishError> {
        let mut delay = Duration::from_millis(100);
        let mut attempt = 1;
        loop {
            match self.inner.writer.finish(live, finish.clone(), whole).await {
                Err(writer::FinishError::Store(e))
                    if attempt < attempts
                        && e.is_transient()
                        && !self.inner.interrupt.is_cancelled()
                        && !(whole && live.write_failed.is_cancelled()) =>
                {
                    tracing::warn!(error = %e, attempt, "committing the turn end failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = self.inner.interrupt.cancelled() => {}
                    }
                    delay = (delay * 2).min(END_RETRY_MAX);
                    attempt += 1;
                }
                other => return other,
            }
        }
    }
}

/// Events of a turn read when it is taken over, at most (a turn's own are
/// far fewer: its steps, tool calls and text deltas).
const TURN_EVENTS_READ_MAX: usize = 100_000;

/// The step after `recorded` whose streamed text stands (not retracted
/// since), if it has any: the text of a step the records do not hold.
fn unfinished_text(events: &[StoredEvent], recorded: u32) -> Option<u32> {
    let mut open: Option<u32> = None;
    for event in events {
        match event.event() {
            Some(TurnEvent::MessageDelta { step, .. }) if *step > recorded => open = Some(*step),
            Some(TurnEvent::MessageRetracted { step, .. }) if open == Some(*step) => open = None,
            _ => {}
        }
    }
    open
}

/// Tries of a turn's whole end before the smaller `failed` end.
const END_ATTEMPTS: u32 = 3;

/// Longest pause between tries of a turn's end.
const END_RETRY_MAX: Duration = Duration::from_secs(1);

/// Tries of the `failed` end: with pauses of [`END_RETRY_MAX`], ten minutes
/// and more of a database that is away.
const FALLBACK_ATTEMPTS: u32 = 600;

/// The end of a turn whose own end could not be stored: `failed` with
/// `event_log_unavailable`, nothing but the turn row and its terminal
/// event, the result kept on the row.
///
/// `first_lost`: the first seq of the turn's events the log lost, if it
/// lost any; every later one was dropped too (a turn stops at its next
/// event), so the end names the range up to its own seq.
fn unstorable_end(
    finish: &TurnFinish,
    error: &StoreError,
    first_lost: Option<i64>,
) -> Result<TurnFinish, serde_json::Error> {
    let code = "event_log_unavailable".to_owned();
    let message = format!("the turn's end could not be stored: {error}");
    let terminal = &finish.terminal;
    let lost_seqs = first_lost
        .filter(|first| *first < terminal.seq)
        .map(|first| [first, terminal.seq - 1]);
    let event = TurnEvent::TurnFailed {
        code: code.clone(),
        message: message.clone(),
        lost_seqs,
    };
    Ok(TurnFinish {
        status: TurnStatus::Failed,
        error_code: Some(code),
        error_message: Some(message),
        messages: Vec::new(),
        decision: None,
        observation: None,
        jobs: Vec::new(),
        terminal: Arc::new(StoredEvent::new(
            &terminal.session_id,
            terminal.turn_id,
            terminal.seq,
            &event,
            Utc::now(),
        )?),
        ..finish.clone()
    })
}

/// Why a turn failed.
#[derive(Debug)]
enum TurnFailure {
    /// The harness failed: a provider, or the event log under it.
    Turn(TurnError),
    /// The session's stored history could not be read.
    History(StoreError),
    /// Some of the turn's events could not be written.
    LostEvents,
    /// A turn taken over whose records do not make a turn.
    Records(String),
}

impl TurnFailure {
    /// The stable code of `turn.failed`.
    fn code(&self) -> &'static str {
        match self {
            Self::Turn(e) => e.code(),
            Self::History(_) => "store_unavailable",
            Self::LostEvents => "event_log_unavailable",
            Self::Records(_) => "interrupted",
        }
    }

    fn message(&self) -> String {
        match self {
            Self::Turn(e) => e.to_string(),
            Self::History(e) => e.to_string(),
            Self::LostEvents => "events of the turn could not be written".to_owned(),
            Self::Records(e) => format!("the turn could not be taken over: {e}"),
        }
    }
}

/// How a turn ended.
enum Outcome {
    Completed(Box<TurnOutput>),
    Failed(TurnFailure),
    Cancelled,
    Interrupted,
    /// Given up for another process to go on with (shutdown).
    HandedOver,
}

impl Outcome {
    fn status(&self) -> TurnStatus {
        match self {
            Self::Completed(_) => TurnStatus::Completed,
            Self::Failed(_) => TurnStatus::Failed,
            Self::Cancelled => TurnStatus::Cancelled,
            Self::Interrupted | Self::HandedOver => TurnStatus::Interrupted,
        }
    }
}

fn build_finish(
    live: &LiveTurn,
    outcome: Outcome,
    seq: i64,
) -> Result<TurnFinish, serde_json::Error> {
    let status = outcome.status();
    let (mut result, mut error_code, mut error_message) = (None, None, None);
    let (mut messages, mut decision, mut cost_usd) = (Vec::new(), None, None);
    let (mut observation, mut jobs) = (None, Vec::new());
    let event = match outcome {
        Outcome::Completed(output) => {
            let output = *output;
            result = Some(serde_json::to_string(&output.result)?);
            cost_usd = output.result.cost_usd;
            messages = output.messages;
            decision = output.decision;
            observation = output.observation;
            jobs = output.jobs;
            TurnEvent::TurnCompleted {
                result: output.result,
            }
        }
        Outcome::Failed(failure) => {
            let (code, message) = (failure.code().to_owned(), failure.message());
            error_code = Some(code.clone());
            error_message = Some(message.clone());
            TurnEvent::TurnFailed {
                code,
                message,
                lost_seqs: None,
            }
        }
        Outcome::Cancelled => {
            error_code = Some("cancelled".into());
            TurnEvent::TurnCancelled {
                reason: "cancel_requested".into(),
            }
        }
        Outcome::Interrupted | Outcome::HandedOver => {
            error_code = Some("interrupted".into());
            error_message = Some("the service shut down".into());
            TurnEvent::TurnInterrupted {
                reason: "shutdown".into(),
            }
        }
    };
    Ok(TurnFinish {
        turn_id: live.turn_id,
        attempt: live.attempt,
        session_id: live.session_id.clone(),
        status,
        result,
        error_code,
        error_message,
        messages,
        decision,
        observation,
        jobs,
        cost_usd,
        terminal: Arc::new(StoredEvent::new(
            &live.session_id,
            live.turn_id,
            seq,
            &event,
            Utc::now(),
        )?),
    })
}

/// The sink of one turn: numbers events and queues them for the writer.
///
/// The terminal event takes the last seq and closes the sink in the same
/// step: whatever still holds the sink afterwards (a tool task finishing
/// late, on any terminal path: completed, failed, cancelled, interrupted)
/// writes nothing. A later write would take a seq of the session's next
/// turn and block it.
struct TurnSink {
    writer: EventWriter,
    live: Arc<LiveTurn>,
    /// Latency histograms and token counts, from the events as they pass.
    metrics: Arc<crate::metrics::Metrics>,
    /// Its tools: a metric's tool label is one of them (a model may call
    /// any name).
    harness: Arc<crate::harness::AgentHarness>,
    /// When the turn began (for the time to its first token).
    began: tokio::time::Instant,
    /// Whether the answer's first text has been seen.
    answered: std::sync::atomic::AtomicBool,
    /// Calls waiting for a person's decision (at most the turn's tool
    /// calls).
    waiting: std::sync::Mutex<Vec<String>>,
    /// The next seq; `None` once the terminal event took its seq. Held
    /// while an event is numbered and queued, so queue order is seq order.
    next_seq: Mutex<Option<i64>>,
    /// Whether the last event queued was a text delta (written under
    /// `next_seq`'s lock): the next one may then wait for company.
    after_delta: std::sync::atomic::AtomicBool,
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
                ..
            } => self.metrics.tokens(*input_tokens, *output_tokens),
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

    /// Resolves the calls still waiting for a person, as `cancelled`, with
    /// why the turn ended.
    async fn resolve_waiting(&self, status: TurnStatus) {
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
            };
            if let Err(e) = self.emit(event).await {
                tracing::debug!(error = %e, "a waiting call's resolution was not written");
            }
        }
    }

    /// The terminal event's seq; nothing is emitted after it.
    async fn close(&self) -> i64 {
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
        if self.live.write_failed.is_cancelled() {
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

    async fn step_done(&self, record: StepRecord) -> Result<(), SinkError> {
        // Under the seq's lock: queued after every event emitted before it.
        let next = self.next_seq.lock().await;
        if next.is_none() {
            return Err(SinkError("the turn has ended".into()));
        }
        if self.live.write_failed.is_cancelled() {
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
