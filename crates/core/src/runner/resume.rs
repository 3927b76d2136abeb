//! A turn this process took over (its owner died or shut down): what its
//! records and its log say, `turn.resumed`, and the rest of the turn; and
//! the other way, a turn this process hands over at shutdown.

use std::sync::Arc;

use chrono::Utc;

use super::{LiveTurn, TurnRunner, sink::TurnSink, turn::TurnFailure};
use crate::{
    events::{StoredEvent, TurnEvent},
    harness::{
        EventSink, TurnInput, TurnOutput,
        budget::TurnBudget,
        durable::{self, PriorCalls, Resume, StepPhase, StepRecord},
        state::TurnRuntimeState,
    },
    store::{Lease, StoreError, TurnRecord, step_records_as},
};

impl TurnRunner {
    /// The life of a turn this process took over, from its `turn.resumed`
    /// at `next_seq` to its commit.
    pub(super) async fn drive_resumed(self, live: Arc<LiveTurn>, turn: TurnRecord, next_seq: i64) {
        let started = tokio::time::Instant::now();
        let sink = self.sink(&live, next_seq, started);
        Self::open_to_steers(&live, &sink);
        let events = self.turn_events(&turn).await;
        if let Ok(events) = &events {
            // An end that comes first resolves them.
            sink.waiting_in(events);
        }
        // Cancelled while no process ran it (parked): it ends so at once.
        if turn.cancel_requested {
            live.cancel.cancel();
        }
        let run = async {
            let events = events?;
            self.execute_resumed(&live, &turn, sink.clone(), events)
                .await
        };
        let background = turn.request.background;
        self.conclude(&live, &sink, (started, background), run)
            .await;
    }

    /// Gives the turn up for another process: nothing more is written for
    /// it here, what was queued is committed, and its lease is released
    /// (announced to the other replicas, which take it over at once). A
    /// release that cannot be written leaves the turn to the sweep, once
    /// its heartbeat is stale.
    pub(super) async fn hand_over(&self, live: &Arc<LiveTurn>, sink: &TurnSink) {
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

    /// Parks the turn: nothing more is written for it here, what was
    /// queued is committed, and it waits in the database, owned by no
    /// process, until an answer wakes it or `parked.until`. A park that
    /// cannot be written leaves the turn to the sweep, once its heartbeat
    /// is stale (the one that takes it over waits again).
    pub(super) async fn park(
        &self,
        live: &Arc<LiveTurn>,
        sink: &TurnSink,
        parked: &crate::harness::Parked,
    ) {
        let inner = &self.inner;
        sink.close().await;
        if let Err(e) = inner.writer.flush(live).await {
            tracing::warn!(error = %e, "the turn's last events were not committed before it parked");
        }
        let lease = Lease {
            turn_id: live.turn_id,
            attempt: live.attempt,
        };
        match inner
            .store
            .park_turn(&lease, parked.until, Utc::now())
            .await
        {
            Ok(true) => tracing::info!(until = %parked.until, calls = ?parked.calls, "turn parked"),
            Ok(false) => tracing::warn!("the turn was no longer this process's to park"),
            Err(e) => {
                tracing::warn!(error = %e, "the turn's park was not written; the sweep takes it over once its heartbeat is stale");
            }
        }
    }

    /// Ends this process's part in a turn that waits: it parks, leaves the
    /// process, and is woken at once if its answer came meanwhile.
    pub(super) async fn parked(
        &self,
        live: &Arc<LiveTurn>,
        sink: &TurnSink,
        parked: &crate::harness::Parked,
    ) {
        let inner = &self.inner;
        // No longer among its tenant's running turns here from before its
        // park is written: a turn of the tenant's asked for once the park
        // shows finds its place free.
        live.ending
            .store(true, std::sync::atomic::Ordering::Release);
        self.park(live, sink, parked).await;
        inner.metrics.turn_parked();
        live.closed.cancel();
        inner.live.remove_this(live);
        self.record_usage(live, sink).await;
        // An answer or a cancel that came as it parked (its wake found the
        // turn not parked yet) wakes it now.
        if self.answered(live, &parked.calls).await {
            self.wake(live.turn_id).await;
        }
    }

    /// Whether any of `calls` of the turn has its answer in the store (a
    /// decision, a client's result), or someone asked for it to stop.
    pub(super) async fn answered(&self, live: &LiveTurn, calls: &[String]) -> bool {
        let store = &self.inner.store;
        let turn_id = live.turn_id;
        if let Ok(Some(turn)) = store.get_turn(&live.session_id, turn_id).await
            && turn.cancel_requested
        {
            return true;
        }
        for call in calls {
            let decided = store.get_approval(turn_id, call).await;
            let posted = store.get_tool_result(turn_id, call).await;
            if matches!(decided, Ok(Some(_))) || matches!(posted, Ok(Some(_))) {
                return true;
            }
        }
        false
    }

    /// Reads what a turn taken over left (its records and its events), says
    /// `turn.resumed` (and retracts the text of a step it did not finish),
    /// and goes on with it.
    async fn execute_resumed(
        &self,
        live: &LiveTurn,
        turn: &TurnRecord,
        sink: Arc<TurnSink>,
        events: Vec<StoredEvent>,
    ) -> Result<TurnOutput, TurnFailure> {
        let inner = &self.inner;
        let from = self.recorded(turn).await?;
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
        let request = self.resumed_input(turn, live).await?;
        // The deadline and the elapsed time count from the turn's start,
        // less what its parks lasted.
        let age = (Utc::now() - turn.created_at)
            .to_std()
            .unwrap_or_default()
            .saturating_sub(turn.waited);
        let now = tokio::time::Instant::now();
        let started = now.checked_sub(age).unwrap_or(now);
        let harness = &inner.harness;
        let limits = harness.options().budget_limits();
        let deadline = started + limits.timeout;
        let Some(from) = from else {
            // No step was recorded: nothing the turn did must be kept; it
            // starts over, within its own deadline.
            let state = Arc::new(TurnRuntimeState::new(
                request.session_id.clone(),
                TurnBudget::resume(limits, deadline, [0, 0, 0]),
            ));
            state.handed_out_call_ids(handed_out(&events));
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
        state.handed_out_call_ids(handed_out(&events));
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

    /// Where a turn's step records leave it (`None`: no step recorded).
    async fn recorded(&self, turn: &TurnRecord) -> Result<Option<durable::Resumed>, TurnFailure> {
        let records = step_records_as::<StepRecord>(self.inner.store.as_ref(), turn.id)
            .await
            .map_err(|e| match e {
                StoreError::Corrupt(why) => TurnFailure::Records(why),
                other => TurnFailure::History(other),
            })?;
        durable::rebuild(&records).map_err(|e| TurnFailure::Records(e.to_string()))
    }

    /// What a turn taken over is asked, as its begin read it: its session's
    /// history (or its own), its number, the session's cost so far.
    async fn resumed_input(
        &self,
        turn: &TurnRecord,
        live: &LiveTurn,
    ) -> Result<TurnInput, TurnFailure> {
        let inner = &self.inner;
        let store = &inner.store;
        let session = store
            .get_session(&turn.session_id)
            .await
            .map_err(TurnFailure::History)?;
        let (history, earlier) = match &turn.request.history {
            Some(history) => (history.clone(), Vec::new()),
            None => {
                let branched = session.as_ref().is_some_and(|s| s.branched);
                let records = store
                    .history(
                        &turn.session_id,
                        turn.id,
                        branched,
                        inner.config.history_max_messages,
                    )
                    .await
                    .map_err(TurnFailure::History)?;
                self.history_of(&turn.session_id, records)
                    .await
                    .map_err(TurnFailure::History)?
            }
        };
        let key = turn.session_id.clone();
        let attachments = self
            .load_attachments(&key, &turn.request)
            .await
            .map_err(TurnFailure::History)?;
        let request = TurnInput {
            attachments,
            earlier,
            session_id: turn.session_id.clone(),
            turn_id: turn.id,
            turn_number: session
                .as_ref()
                .map_or(1, |s| u64::try_from(s.turn_count).unwrap_or(1)),
            history,
            asked: Arc::new(turn.request.clone()),
            session_cost_before: session.and_then(|s| s.cost_usd),
            reasoning: self
                .reasoning_of(key.tenant())
                .await
                .map_err(TurnFailure::History)?,
            memory_scope: turn.request.memory_scope(&key),
            memories: None,
            handover: inner.handover.child_token(),
            steered: Some(live.steered.clone()),
        };
        Ok(request)
    }

    /// The events of a running turn so far, in seq order (at most
    /// [`TURN_EVENTS_READ_MAX`]).
    async fn turn_events(&self, turn: &TurnRecord) -> Result<Vec<StoredEvent>, TurnFailure> {
        crate::store::TurnLogCursor::of(turn)
            .all(self.inner.store.as_ref(), TURN_EVENTS_READ_MAX)
            .await
            .map_err(TurnFailure::History)
    }
}

/// The call ids a turn's log names: they were handed out, and no later
/// call of the turn may have one (its approval or result would be
/// found), whatever the conversation still holds.
fn handed_out(events: &[StoredEvent]) -> impl Iterator<Item = String> + '_ {
    events
        .iter()
        .filter_map(|e| e.event().and_then(TurnEvent::call_id).map(str::to_owned))
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

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use uuid::Uuid;

    use super::*;

    /// A turn taken over knows every call id its log names, waiting calls
    /// included (before: after a compaction, a call id the messages no
    /// longer held was handed out again, and found an earlier approval).
    #[test]
    fn a_taken_over_turn_knows_the_call_ids_its_log_names() {
        let turn = Uuid::now_v7();
        let events = [
            TurnEvent::ToolStarted {
                step: 1,
                wave: 1,
                call_id: "call_0".into(),
                tool: "append_note".into(),
                arguments: serde_json::json!({}),
                edited: false,
            },
            TurnEvent::MessageDelta {
                step: 2,
                text: "thinking".into(),
            },
            TurnEvent::ApprovalRequested {
                step: 3,
                call_id: "call_s3_0".into(),
                tool: "write_note".into(),
                arguments: serde_json::json!({}),
                expires_at: None,
            },
        ];
        let stored: Vec<StoredEvent> = events
            .into_iter()
            .enumerate()
            .map(|(n, e)| StoredEvent::new("s", turn, n as i64 + 1, &e, Utc::now()).unwrap())
            .collect();
        let ids: Vec<String> = handed_out(&stored).collect();
        assert_eq!(ids, ["call_0", "call_s3_0"]);
    }
}
