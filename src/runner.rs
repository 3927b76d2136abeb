//! The turn runner: starts each turn in its own tracked task with its own
//! cancellation token, detached from the HTTP connection that asked for it;
//! numbers its events, sends them through the event log writer to live
//! subscribers, and commits its end.
//!
//! Only `POST .../cancel`, shutdown (after the grace period) or the turn's
//! budget stop a turn; a client that goes away merely stops listening.

mod heartbeat;
pub mod live;
mod subscribe;
mod writer;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use chrono::{SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument;
use uuid::Uuid;

use crate::{
    events::{StoredEvent, TurnEvent},
    harness::{AgentHarness, EventSink, SinkError, TurnOutput, TurnRequest, WebMode},
    ids::SessionId,
    metrics::Metrics,
    providers::{ChatMessage, Role},
    store::{
        BeganTurn, BeginTurnError, NewTurn, OrphanScope, Store, StoreError, TurnFinish, TurnRecord,
        TurnStatus,
    },
};
use live::{LiveTurn, LiveTurns};
use writer::EventWriter;

/// A validated turn request, as stored with the turn (and compared on an
/// idempotent replay).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnSpec {
    pub message: String,
    pub top_k: u32,
    pub web_mode: WebMode,
    pub show_citations: bool,
    pub runtime_provider: Option<String>,
    pub runtime_model: Option<String>,
    pub skill_context: Option<String>,
    /// The history to use instead of the session's stored one.
    pub history: Option<Vec<ChatMessage>>,
}

/// Settings of the runner.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    pub instance_id: String,
    pub history_max_messages: u32,
    pub heartbeat_interval: Duration,
    pub stale_turn_after: Duration,
    /// How often a subscriber to a turn run elsewhere re-reads the log.
    pub poll_interval: Duration,
    pub event_queue_capacity: usize,
    pub event_batch_max: usize,
}

/// A turn that [`TurnRunner::start`] began, or found by its idempotency key.
pub struct StartedTurn {
    pub turn_id: Uuid,
    /// True when the idempotency key named an existing turn.
    pub replayed: bool,
    /// Seq of the turn's `turn.started` event.
    pub first_seq: i64,
    /// For a new turn: a subscription taken before it could emit anything.
    pub live: Option<LiveStart>,
}

/// The start of a new turn's event stream, without a log read.
pub struct LiveStart {
    pub(crate) live: Arc<LiveTurn>,
    pub(crate) receiver: tokio::sync::broadcast::Receiver<Arc<StoredEvent>>,
    pub(crate) started: Arc<StoredEvent>,
}

/// Why a turn did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the session already has a running turn {0}")]
    AlreadyRunning(Uuid),
    #[error("the idempotency key was used for a different request (turn {0})")]
    IdempotencyMismatch(Uuid),
    #[error("the service is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a cancel did.
#[derive(Debug)]
pub enum CancelOutcome {
    /// The turn ended; here is its record (normally `cancelled`, or
    /// whatever it reached first).
    Ended(TurnRecord),
    /// The turn runs in another process; its owner will stop it.
    Requested,
}

/// Why a cancel was refused.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("turn not found")]
    NotFound,
    #[error("turn is not running (status {0})")]
    NotRunning(TurnStatus),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Runs turns; cheap to clone.
#[derive(Clone)]
pub struct TurnRunner {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    harness: Arc<AgentHarness>,
    writer: EventWriter,
    live: LiveTurns,
    config: RunnerConfig,
    process_id: String,
    /// Turn tasks.
    turns: TaskTracker,
    /// Writer and heartbeat.
    background: TaskTracker,
    /// Set when shutdown begins: no new turns.
    draining: CancellationToken,
    /// Set when the grace period is over: running turns end `interrupted`.
    interrupt: CancellationToken,
    /// Stops the heartbeat and then the writer.
    stop_background: CancellationToken,
    /// Ends every open event stream.
    close_streams: CancellationToken,
}

impl TurnRunner {
    /// Builds the runner and starts its writer and heartbeat.
    pub fn start_runner(
        store: Arc<dyn Store>,
        harness: Arc<AgentHarness>,
        config: RunnerConfig,
    ) -> Self {
        let background = TaskTracker::new();
        let stop_background = CancellationToken::new();
        let writer_stop = CancellationToken::new();
        let metrics = Arc::new(Metrics::default());
        let writer = EventWriter::spawn(
            store.clone(),
            metrics.clone(),
            config.event_queue_capacity,
            config.event_batch_max,
            &background,
            writer_stop.clone(),
        );
        let runner = Self {
            inner: Arc::new(Inner {
                store,
                metrics,
                harness,
                writer,
                live: LiveTurns::default(),
                config,
                process_id: Uuid::now_v7().to_string(),
                turns: TaskTracker::new(),
                background,
                draining: CancellationToken::new(),
                interrupt: CancellationToken::new(),
                stop_background,
                close_streams: CancellationToken::new(),
            }),
        };
        let heartbeat_runner = runner.clone();
        let stop = runner.inner.stop_background.clone();
        runner.inner.background.spawn(async move {
            heartbeat::run(heartbeat_runner, stop).await;
            // The writer outlives the heartbeat so that late finishes commit.
            writer_stop.cancel();
        });
        runner.inner.background.spawn(heartbeat::listen_for_cancels(
            runner.clone(),
            runner.inner.stop_background.clone(),
        ));
        runner
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    pub fn harness(&self) -> &Arc<AgentHarness> {
        &self.inner.harness
    }

    /// Turns running in this process.
    pub fn running_turns(&self) -> usize {
        self.inner.live.len()
    }

    pub fn is_draining(&self) -> bool {
        self.inner.draining.is_cancelled()
    }

    /// Marks turns left running by a dead process as interrupted. Run at
    /// start, before serving; the heartbeat repeats it for stale turns.
    pub async fn recover_orphans(&self) -> Result<usize, StoreError> {
        let mut total = 0;
        // Bounded: each call interrupts up to a page of orphans.
        for _ in 0..1000 {
            let done = self.sweep_orphans().await?;
            total += done;
            if done == 0 {
                break;
            }
        }
        Ok(total)
    }

    async fn sweep_orphans(&self) -> Result<usize, StoreError> {
        let now = Utc::now();
        let stale = chrono::Duration::from_std(self.inner.config.stale_turn_after)
            .unwrap_or(chrono::Duration::MAX);
        let scope = OrphanScope {
            instance: self.inner.config.instance_id.clone(),
            process: self.inner.process_id.clone(),
            stale_before: now.checked_sub_signed(stale).unwrap_or(now),
            alive: self.inner.live.ids().into_iter().collect(),
        };
        let events = self
            .inner
            .store
            .interrupt_orphans(&scope, "owner_lost", now)
            .await?;
        for event in &events {
            tracing::warn!(turn.id = %event.turn_id, session.id = %event.session_id, "interrupted an orphaned turn");
        }
        Ok(events.len())
    }

    /// Begins a turn and starts it in the background.
    pub async fn start(
        &self,
        session_id: &SessionId,
        spec: TurnSpec,
        idempotency_key: Option<String>,
    ) -> Result<StartedTurn, StartError> {
        if self.is_draining() {
            return Err(StartError::ShuttingDown);
        }
        let inner = &self.inner;
        let turn_id = Uuid::now_v7();
        let now = Utc::now().trunc_subsecs(6);
        let (provider, model) = inner.harness.resolve_provider_model(
            spec.runtime_provider.as_deref(),
            spec.runtime_model.as_deref(),
        );
        let started = TurnEvent::TurnStarted {
            message: spec.message.clone(),
            provider,
            model,
        };
        let encode = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
        let new_turn = NewTurn {
            id: turn_id,
            session_id: session_id.as_str().to_owned(),
            request: serde_json::to_string(&spec).map_err(encode)?,
            idempotency_key,
            owner_instance: inner.config.instance_id.clone(),
            owner_process: inner.process_id.clone(),
            created_at: now,
            started_payload: serde_json::to_string(&started).map_err(encode)?,
        };
        let began = match inner.store.begin_turn(&new_turn).await {
            Ok(began) => began,
            Err(BeginTurnError::AlreadyRunning(running)) => {
                return Err(StartError::AlreadyRunning(running));
            }
            Err(BeginTurnError::IdempotencyKeyExists(existing)) => {
                return if existing.request == new_turn.request {
                    Ok(StartedTurn {
                        turn_id: existing.id,
                        replayed: true,
                        first_seq: existing.first_seq,
                        live: None,
                    })
                } else {
                    Err(StartError::IdempotencyMismatch(existing.id))
                };
            }
            Err(BeginTurnError::Store(e)) => return Err(e.into()),
        };
        inner.metrics.turn_started();
        let live = inner.live.insert(session_id.as_str(), turn_id);
        // Subscribed before the task can publish anything: the caller's
        // stream starts from the known `turn.started` without a log read.
        let receiver = live.subscribe();
        let started_event = Arc::new(
            StoredEvent::new(session_id.as_str(), turn_id, began.first_seq, &started, now)
                .map_err(encode)?,
        );
        let runner = self.clone();
        let span = tracing::info_span!(
            "turn",
            otel.name = "invoke_agent",
            gen_ai.operation.name = "invoke_agent",
            turn.id = %turn_id,
            session.id = %session_id,
            turn.status = tracing::field::Empty,
        );
        inner
            .turns
            .spawn(runner.drive(live.clone(), spec, began).instrument(span));
        Ok(StartedTurn {
            turn_id,
            replayed: false,
            first_seq: began.first_seq,
            live: Some(LiveStart {
                live,
                receiver,
                started: started_event,
            }),
        })
    }

    /// The life of one turn, from its first event after `turn.started` to its commit.
    async fn drive(self, live: Arc<LiveTurn>, spec: TurnSpec, began: BeganTurn) {
        let inner = &self.inner;
        let started = tokio::time::Instant::now();
        let sink = Arc::new(TurnSink {
            writer: inner.writer.clone(),
            live: live.clone(),
            next_seq: Mutex::new(Some(began.first_seq + 1)),
        });
        let outcome = tokio::select! {
            biased;
            () = live.cancel.cancelled() => Outcome::Cancelled,
            () = inner.interrupt.cancelled() => Outcome::Interrupted,
            // Some of its events are lost: stop now rather than at its
            // next event (a provider call may take a while).
            () = live.write_failed.cancelled() => Outcome::Failed {
                code: "event_log_unavailable".into(),
                message: "events of the turn could not be written".into(),
            },
            result = self.execute(&live, &spec, began, sink.clone()) => match result {
                Ok(output) => Outcome::Completed(Box::new(output)),
                Err((code, message)) => Outcome::Failed { code, message },
            },
        };
        tracing::debug!(elapsed_ms = started.elapsed().as_millis(), "turn ended");
        let status = match self.finish(&live, &sink, outcome).await {
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
        inner.metrics.turn_finished(status);
    }

    /// Loads history and runs the harness.
    async fn execute(
        &self,
        live: &LiveTurn,
        spec: &TurnSpec,
        began: BeganTurn,
        sink: Arc<TurnSink>,
    ) -> Result<TurnOutput, (String, String)> {
        let unavailable = |e: StoreError| ("store_unavailable".to_owned(), e.to_string());
        let history = match &spec.history {
            Some(history) => history.clone(),
            // The first turn of a session has no history to read.
            None if began.turn_number <= 1 => Vec::new(),
            None => self
                .inner
                .store
                .recent_messages(&live.session_id, self.inner.config.history_max_messages)
                .await
                .map_err(unavailable)?
                .into_iter()
                .filter_map(|m| {
                    let role = match m.role.as_str() {
                        "user" => Role::User,
                        "assistant" => Role::Assistant,
                        "system" => Role::System,
                        _ => return None,
                    };
                    Some(ChatMessage::new(role, m.content))
                })
                .collect(),
        };
        let request = TurnRequest {
            session_id: live.session_id.clone(),
            turn_id: live.turn_id,
            turn_number: began.turn_number,
            history,
            user_message: spec.message.clone(),
            top_k: spec.top_k,
            web_mode: spec.web_mode,
            show_citations: spec.show_citations,
            runtime_provider: spec.runtime_provider.clone(),
            runtime_model: spec.runtime_model.clone(),
            skill_context: spec.skill_context.clone(),
            session_cost_before: began.session_cost_before,
        };
        self.inner
            .harness
            .run_turn(request, sink)
            .await
            .map_err(|e| (e.code().to_owned(), e.to_string()))
    }

    /// Commits the turn's end with its terminal event; returns the status
    /// it ended with (`None`: someone else ended it first).
    ///
    /// A store failure is retried a few times. If the end still cannot be
    /// written (a value the database refuses, such as U+0000 in Postgres
    /// text, or a database that stays down), the turn ends `failed` with
    /// `event_log_unavailable` instead: no history, no decision, but its
    /// result (JSON, so any character survives) stays on the turn row. That
    /// smaller write is retried until it lands, the service shuts down, or
    /// the turn would be stale anyway (other replicas then sweep it).
    async fn finish(
        &self,
        live: &Arc<LiveTurn>,
        sink: &TurnSink,
        outcome: Outcome,
    ) -> Result<Option<TurnStatus>, writer::FinishError> {
        let seq = sink.close().await;
        let finish = build_finish(live, outcome, seq)
            .map_err(|e| writer::FinishError::Store(StoreError::Corrupt(e.to_string())))?;
        // A turn some of whose events were lost must not end as if whole.
        let error = if live.write_failed.is_cancelled() {
            StoreError::Unavailable("earlier events of the turn could not be written".into())
        } else {
            match self.commit_finish(live, &finish, END_ATTEMPTS, true).await {
                Err(writer::FinishError::Store(e)) => e,
                other => return other.map(|applied| applied.then_some(finish.status)),
            }
        };
        tracing::error!(
            error = %error,
            "the turn's end cannot be stored; ending it failed with event_log_unavailable"
        );
        let fallback = unstorable_end(&finish, &error)
            .map_err(|e| writer::FinishError::Store(StoreError::Corrupt(e.to_string())))?;
        let attempts = fallback_attempts(self.inner.config.stale_turn_after);
        self.commit_finish(live, &fallback, attempts, false)
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

    /// Stops a running turn.
    pub async fn cancel(
        &self,
        session_id: &SessionId,
        turn_id: Uuid,
    ) -> Result<CancelOutcome, CancelError> {
        let store = &self.inner.store;
        let record = store
            .get_turn(session_id.as_str(), turn_id)
            .await?
            .ok_or(CancelError::NotFound)?;
        if record.status != TurnStatus::Running {
            return Err(CancelError::NotRunning(record.status));
        }
        if let Some(live) = self.inner.live.get(turn_id) {
            live.cancel.cancel();
            // The turn commits its end promptly once cancelled; wait for it
            // so the answer can carry the final status.
            let _ = tokio::time::timeout(Duration::from_secs(5), live.closed.cancelled()).await;
        } else if !store.request_cancel(turn_id).await? {
            let record = store.get_turn(session_id.as_str(), turn_id).await?;
            return Err(CancelError::NotRunning(
                record.map_or(TurnStatus::Interrupted, |r| r.status),
            ));
        } else {
            return Ok(CancelOutcome::Requested);
        }
        let record = store
            .get_turn(session_id.as_str(), turn_id)
            .await?
            .ok_or(CancelError::NotFound)?;
        Ok(CancelOutcome::Ended(record))
    }

    /// Waits until the turn is no longer running and returns its record;
    /// `None` if the service shuts down first.
    pub async fn wait_for_end(
        &self,
        session_id: &SessionId,
        turn_id: Uuid,
    ) -> Result<Option<TurnRecord>, StoreError> {
        if let Some(live) = self.inner.live.get(turn_id) {
            tokio::select! {
                () = live.closed.cancelled() => {}
                () = self.inner.close_streams.cancelled() => {}
            }
        }
        loop {
            let record = self
                .inner
                .store
                .get_turn(session_id.as_str(), turn_id)
                .await?;
            match record {
                Some(r) if r.status == TurnStatus::Running => {}
                other => return Ok(other),
            }
            if self.inner.close_streams.is_cancelled() {
                return Ok(None);
            }
            tokio::select! {
                () = tokio::time::sleep(self.inner.config.poll_interval) => {}
                () = self.inner.close_streams.cancelled() => {}
            }
        }
    }

    /// Shuts down: no new turns; running turns get `grace` to finish, then
    /// end `interrupted`; the event log is flushed; open streams end.
    pub async fn shutdown(&self, grace: Duration) {
        let inner = &self.inner;
        inner.draining.cancel();
        inner.turns.close();
        if tokio::time::timeout(grace, inner.turns.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                running = inner.live.len(),
                "grace period over; interrupting running turns"
            );
            inner.interrupt.cancel();
            if tokio::time::timeout(Duration::from_secs(10), inner.turns.wait())
                .await
                .is_err()
            {
                tracing::error!("turns did not end after being interrupted");
            }
        }
        // Tool tasks of ended turns are bounded by their late grace.
        if tokio::time::timeout(Duration::from_secs(10), inner.harness.wait_for_tool_tasks())
            .await
            .is_err()
        {
            tracing::warn!("tool tasks still running at shutdown");
        }
        inner.stop_background.cancel();
        inner.background.close();
        if tokio::time::timeout(Duration::from_secs(10), inner.background.wait())
            .await
            .is_err()
        {
            tracing::error!("event writer did not drain in time");
        }
        inner.close_streams.cancel();
    }

    /// A token cancelled when open streams must end.
    pub fn streams_closed(&self) -> CancellationToken {
        self.inner.close_streams.clone()
    }
}

/// Tries of a turn's whole end before the smaller `failed` end.
const END_ATTEMPTS: u32 = 3;

/// Longest pause between tries of a turn's end.
const END_RETRY_MAX: Duration = Duration::from_secs(2);

/// Tries of the `failed` end: enough to span `stale_after` (after which
/// other replicas sweep the turn), at least a few.
fn fallback_attempts(stale_after: Duration) -> u32 {
    let secs = u32::try_from(stale_after.as_secs()).unwrap_or(u32::MAX);
    secs.div_ceil(2).clamp(4, 1_000)
}

/// The end of a turn whose own end could not be stored: `failed` with
/// `event_log_unavailable`, nothing but the turn row and its terminal
/// event, the result kept on the row.
fn unstorable_end(
    finish: &TurnFinish,
    error: &StoreError,
) -> Result<TurnFinish, serde_json::Error> {
    let code = "event_log_unavailable".to_owned();
    let message = format!("the turn's end could not be stored: {error}");
    let terminal = &finish.terminal;
    let event = TurnEvent::TurnFailed {
        code: code.clone(),
        message: message.clone(),
    };
    Ok(TurnFinish {
        status: TurnStatus::Failed,
        error_code: Some(code),
        error_message: Some(message),
        messages: Vec::new(),
        decision: None,
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

/// How a turn ended.
enum Outcome {
    Completed(Box<TurnOutput>),
    Failed { code: String, message: String },
    Cancelled,
    Interrupted,
}

impl Outcome {
    fn status(&self) -> TurnStatus {
        match self {
            Self::Completed(_) => TurnStatus::Completed,
            Self::Failed { .. } => TurnStatus::Failed,
            Self::Cancelled => TurnStatus::Cancelled,
            Self::Interrupted => TurnStatus::Interrupted,
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
    let event = match outcome {
        Outcome::Completed(output) => {
            let output = *output;
            result = Some(serde_json::to_string(&output.result)?);
            cost_usd = output.result.cost_usd;
            messages = output.messages;
            decision = output.decision;
            TurnEvent::TurnCompleted {
                result: output.result,
            }
        }
        Outcome::Failed { code, message } => {
            error_code = Some(code.clone());
            error_message = Some(message.clone());
            TurnEvent::TurnFailed { code, message }
        }
        Outcome::Cancelled => {
            error_code = Some("cancelled".into());
            TurnEvent::TurnCancelled {
                reason: "cancel_requested".into(),
            }
        }
        Outcome::Interrupted => {
            error_code = Some("interrupted".into());
            error_message = Some("the service shut down".into());
            TurnEvent::TurnInterrupted {
                reason: "shutdown".into(),
            }
        }
    };
    Ok(TurnFinish {
        turn_id: live.turn_id,
        session_id: live.session_id.clone(),
        status,
        result,
        error_code,
        error_message,
        messages,
        decision,
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
    /// The next seq; `None` once the terminal event took its seq. Held
    /// while an event is numbered and queued, so queue order is seq order.
    next_seq: Mutex<Option<i64>>,
}

impl TurnSink {
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
        let stored = StoredEvent::new(
            &self.live.session_id,
            self.live.turn_id,
            seq,
            &event,
            Utc::now(),
        )
        .map_err(|e| SinkError(e.to_string()))?;
        self.writer
            .append(&self.live, Arc::new(stored))
            .await
            .map_err(|e| SinkError(e.to_string()))?;
        *next = Some(seq + 1);
        Ok(())
    }
}
