//! Turns left running by a process that is gone: found by the sweep
//! (at start, then by the heartbeat), and taken over here or interrupted.

use chrono::Utc;
use tracing::Instrument as _;

use super::TurnRunner;
use crate::store::{Orphan, OrphanScope, StoreError, TurnRecord};

impl TurnRunner {
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

    pub(super) async fn sweep_orphans(&self) -> Result<usize, StoreError> {
        self.take_over(None).await
    }

    /// An answer (a decision, a client's result) or a cancel came for
    /// `turn_id`: when it is parked, it is made due and taken over here at
    /// once (or, by a process on its way out, left to the others' sweeps).
    /// A failure leaves it parked until its wait ends; it then finds the
    /// answer.
    pub async fn wake(&self, turn_id: uuid::Uuid) -> bool {
        match self.inner.store.wake_turn(turn_id, Utc::now()).await {
            Ok(true) => {
                if let Err(e) = self.take_over(Some(turn_id)).await {
                    tracing::warn!(error = %e, turn.id = %turn_id, "a woken turn was not taken over here; a sweep will");
                }
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!(error = %e, turn.id = %turn_id, "a parked turn could not be woken; it goes on when its wait ends");
                false
            }
        }
    }

    /// Takes over orphans (`only` that one, when given).
    async fn take_over(&self, only: Option<uuid::Uuid>) -> Result<usize, StoreError> {
        // A process on its way out takes nothing over.
        if self.is_draining() {
            return Ok(0);
        }
        let now = Utc::now();
        let stale = chrono::Duration::from_std(self.inner.config.stale_turn_after)
            .unwrap_or(chrono::Duration::MAX);
        let scope = OrphanScope {
            instance: self.inner.config.instance_id.clone(),
            process: self.inner.process_id.clone(),
            stale_before: now.checked_sub_signed(stale).unwrap_or(now),
            alive: self.inner.live.ids().into_iter().collect(),
            max_attempts: self.inner.config.max_attempts,
            only,
            max_running_default: self.inner.config.policy.tenant_defaults.max_running_turns,
        };
        let taken = self
            .inner
            .store
            .take_orphans(&scope, "owner_lost", now)
            .await?;
        let count = taken.len();
        for orphan in taken {
            match orphan {
                Orphan::Interrupted(event) => {
                    tracing::warn!(turn.id = %event.turn_id, session.id = %event.session_id, "interrupted an orphaned turn: its take-overs ran out");
                }
                Orphan::Claimed {
                    turn,
                    next_seq,
                    woken: true,
                    ..
                } => {
                    tracing::info!(turn.id = %turn.id, session.id = %turn.session_id, attempt = turn.attempt, "a parked turn goes on");
                    self.inner.metrics.turn_unparked();
                    self.resume(*turn, next_seq);
                }
                Orphan::Claimed {
                    turn,
                    next_seq,
                    released,
                    woken: false,
                } => {
                    tracing::warn!(turn.id = %turn.id, session.id = %turn.session_id, attempt = turn.attempt, released, "took over an orphaned turn");
                    self.inner.metrics.turn_taken_over(released);
                    self.resume(*turn, next_seq);
                }
            }
        }
        Ok(count)
    }

    /// Goes on with a turn this process has just taken over.
    fn resume(&self, turn: TurnRecord, next_seq: i64) {
        let inner = &self.inner;
        inner.metrics.turn_started();
        let live = inner.live.insert(&turn.session_id, turn.id, turn.attempt);
        // A trace of its own (this is no request's work), linked to the
        // span that began the turn.
        let span = tracing::info_span!(
            parent: None,
            "turn",
            otel.name = "invoke_agent",
            gen_ai.operation.name = "invoke_agent",
            turn.id = %turn.id,
            session.id = %turn.session_id,
            turn.attempt = i64::from(turn.attempt),
            turn.status = tracing::field::Empty,
        );
        if let Some(first) = &turn.traceparent {
            crate::telemetry::link_to(&span, first);
        }
        inner.turns.spawn(
            self.clone()
                .drive_resumed(live, turn, next_seq)
                .instrument(span),
        );
    }
}
