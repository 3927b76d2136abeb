//! The life of one turn in this process: its task runs the harness, its
//! sink numbers and queues its events, and its end is committed with its
//! terminal event (or, when that cannot be stored, a smaller `failed` end).

use std::{sync::Arc, time::Duration};

use chrono::Utc;
use tokio::sync::Mutex;

use super::{LiveTurn, TurnRunner, sink::TurnSink, writer};
use crate::{
    events::{StoredEvent, TurnEvent},
    harness::{TurnError, TurnInput, TurnOutput},
    store::{BeganTurn, StoreError, TurnFinish, TurnStatus},
    turn::TurnRequest,
    when_woken::when_woken,
};

impl TurnRunner {
    /// The life of one turn, from its first event after `turn.started` to its commit.
    pub(super) async fn drive(
        self,
        live: Arc<LiveTurn>,
        spec: Arc<TurnRequest>,
        began: BeganTurn,
        memory_scope: String,
        quota_warning: Option<TurnEvent>,
    ) {
        let started = tokio::time::Instant::now();
        let sink = self.sink(&live, began.first_seq + 1, started);
        if let Some(warning) = quota_warning {
            // Only the event is lost if it cannot be written; the turn's
            // next event finds the log's trouble.
            let _ = crate::harness::EventSink::emit(sink.as_ref(), warning).await;
        }
        // A turn made of messages steered into one that ended first says
        // which, before anything of its own.
        if let Some(from) = &spec.steered_from {
            for steer_id in &from.steer_ids {
                let deferred = TurnEvent::SteerDeferred {
                    steer_id: steer_id.to_string(),
                    steered_turn_id: from.turn_id.to_string(),
                };
                let _ = crate::harness::EventSink::emit(sink.as_ref(), deferred).await;
            }
        }
        Self::open_to_steers(&live, &sink);
        let run = self.execute(&live, &spec, began, memory_scope, sink.clone());
        self.conclude(&live, &sink, (started, spec.background), run)
            .await;
    }

    /// The sink of a turn whose next event takes `next_seq`.
    pub(super) fn sink(
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
            used: std::sync::Mutex::default(),
            next_seq: Mutex::new(Some(next_seq)),
            after_delta: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Lets events made outside the turn's task (`steer.accepted`) into
    /// its log, through `sink`, from now on.
    pub(super) fn open_to_steers(live: &LiveTurn, sink: &Arc<TurnSink>) {
        let shared: Arc<dyn crate::harness::EventSink> = sink.clone();
        // A turn has one sink: a second is never made for one live turn.
        let _ = live.sink.set(Arc::downgrade(&shared));
    }

    /// Runs `run` until it ends or the turn is stopped, and commits the end.
    /// `background`: the turn answers a background response (its end is
    /// the response's webhook message too).
    pub(super) async fn conclude(
        &self,
        live: &Arc<LiveTurn>,
        sink: &TurnSink,
        (started, background): (tokio::time::Instant, bool),
        run: impl std::future::Future<Output = Result<TurnOutput, TurnFailure>>,
    ) {
        let inner = &self.inner;
        // Each stop is polled only after its own wake, not at each wake of
        // the turn (each token: see `when_woken`); the interrupt through a
        // child, whose lock is the turn's own.
        let interrupt = inner.interrupt.child_token();
        let (cancelled, interrupted, lost) = (
            when_woken(live.cancel.cancelled()),
            when_woken(interrupt.cancelled()),
            when_woken(live.write_failed.cancelled()),
        );
        let outcome = tokio::select! {
            biased;
            () = cancelled => Outcome::Cancelled,
            // The grace is over: a turn still mid-step is handed over as it
            // stands (its records say where), or interrupted.
            () = interrupted => if inner.handover.is_cancelled() {
                Outcome::HandedOver
            } else {
                Outcome::Interrupted
            },
            // Some of its events are lost: stop now rather than at its
            // next event (a provider call may take a while).
            () = lost => Outcome::Failed(TurnFailure::LostEvents),
            result = run => match result {
                Ok(output) => Outcome::Completed(Box::new(output)),
                Err(TurnFailure::Turn(TurnError::HandedOver)) => Outcome::HandedOver,
                Err(TurnFailure::Turn(TurnError::Parked(parked))) => Outcome::Parked(parked),
                Err(failure) => Outcome::Failed(failure),
            },
        };
        tracing::debug!(elapsed_ms = started.elapsed().as_millis(), "turn ended");
        if let Outcome::Parked(parked) = outcome {
            self.parked(live, sink, &parked).await;
            return;
        }
        if matches!(outcome, Outcome::HandedOver) {
            self.hand_over(live, sink).await;
            // Billed, whoever finishes the turn.
            self.record_usage(live, sink).await;
            inner
                .handed_over
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((live.session_id.clone(), live.turn_id, live.attempt));
            live.closed.cancel();
            inner.live.remove(live.turn_id);
            inner.metrics.turn_handed_over();
            return;
        }
        // Before the end is seen: the tenant's next turn, started as soon
        // as a client sees this one end, finds it counted.
        self.record_usage(live, sink).await;
        let status = match self.finish(live, sink, outcome, background).await {
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
        // Messages steered in that no step took: the next turn, at once
        // when this process knows of them (it took one, or took the turn
        // over); else the heartbeat's sweep finds them.
        if live.steered.load(std::sync::atomic::Ordering::SeqCst) {
            self.defer_steers_later(live.session_id.clone(), live.turn_id);
        }
    }

    /// Adds what this attempt's provider calls used to its tenant's day,
    /// before the turn's end is committed (the calls were billed, however
    /// the turn ends). A process that dies before it loses that attempt's
    /// count (the quota errs on the tenant's side), never a turn.
    pub(super) async fn record_usage(&self, live: &LiveTurn, sink: &TurnSink) {
        let used = *sink
            .used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if used.tokens() == 0 && used.cost_usd.is_none() {
            return;
        }
        let session = live.session_id.clone();
        let day = Utc::now().date_naive();
        if let Err(e) = self
            .inner
            .store
            .add_usage(session.tenant(), day, &used)
            .await
        {
            tracing::warn!(error = %e, "the turn's usage could not be counted");
        }
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
            branched,
            ..
        } = began;
        let records = match (&spec.history, context.history) {
            (Some(_), _) => None,
            // The first turn of a session has no history to read (a
            // fork's has: a fork is branched).
            (None, _) if turn_number <= 1 && !branched => Some(Vec::new()),
            // Read with the begin.
            (None, Some(read)) => Some(read),
            (None, None) => Some(
                self.inner
                    .store
                    .history(
                        &live.session_id,
                        live.turn_id,
                        branched,
                        self.inner.config.history_max_messages,
                    )
                    .await
                    .map_err(TurnFailure::History)?,
            ),
        };
        let (history, earlier) = match records {
            None => (spec.history.clone().unwrap_or_default(), Vec::new()),
            Some(records) => self
                .history_of(&live.session_id, records)
                .await
                .map_err(TurnFailure::History)?,
        };
        let attachments = self
            .load_attachments(&live.session_id, spec)
            .await
            .map_err(TurnFailure::History)?;
        let request = TurnInput {
            session_id: live.session_id.clone(),
            turn_id: live.turn_id,
            turn_number,
            history,
            asked: spec.clone(),
            attachments,
            earlier,
            session_cost_before,
            reasoning: self
                .reasoning_of(live.session_id.tenant())
                .await
                .map_err(TurnFailure::History)?,
            memory_scope,
            memories: context.memories,
            // The turn's own child: polled as the model streams.
            handover: self.inner.handover.child_token(),
            steered: Some(live.steered.clone()),
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
        background: bool,
    ) -> Result<Option<TurnStatus>, writer::FinishError> {
        // A call still waiting for a person when the turn ends otherwise
        // (cancelled, interrupted, failed) is resolved first: a client
        // never sees a request left open by a terminal event.
        sink.resolve_waiting(outcome.status()).await;
        // Before the end can be seen: a client that saw it and starts
        // again at once finds a place free (see `count_of_tenant`).
        live.ending
            .store(true, std::sync::atomic::Ordering::Release);
        let seq = sink.close().await;
        let finish = build_finish(live, outcome, seq, background)
            .map_err(|e| writer::FinishError::Store(StoreError::Corrupt(e.to_string())))?;
        // A turn some of whose events were lost must not end as if whole.
        let error = if live.lost_events() {
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
                        && !(whole && live.lost_events()) =>
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
pub(super) enum TurnFailure {
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
            Self::Records(_) => "takeover_failed",
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
    /// Waiting for answers from outside, in the database.
    Parked(crate::harness::Parked),
}

impl Outcome {
    fn status(&self) -> TurnStatus {
        match self {
            Self::Completed(_) => TurnStatus::Completed,
            Self::Failed(_) => TurnStatus::Failed,
            Self::Cancelled => TurnStatus::Cancelled,
            Self::Interrupted | Self::HandedOver => TurnStatus::Interrupted,
            Self::Parked(_) => TurnStatus::Running,
        }
    }
}

fn build_finish(
    live: &LiveTurn,
    outcome: Outcome,
    seq: i64,
    background: bool,
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
        Outcome::Interrupted | Outcome::HandedOver | Outcome::Parked(_) => {
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
        background,
        terminal: Arc::new(StoredEvent::new(
            &live.session_id,
            live.turn_id,
            seq,
            &event,
            Utc::now(),
        )?),
    })
}
