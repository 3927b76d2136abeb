//! Steering a running turn (issue 66, part 5). A message steered in is
//! kept in the store before it is answered, then taken by the turn at its
//! next step boundary (the harness's [`crate::hooks::Steering`]), or, when
//! the turn ends first, made the session's next turn: at once by the
//! process that ran the turn when it knows of the steer, else by a
//! heartbeat's sweep on any replica. Each is claimed once in the store,
//! so a message is applied once, or answered by one turn.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use chrono::Utc;
use uuid::Uuid;

use super::{LiveTurn, TurnRunner};
use crate::{
    events::TurnEvent,
    ids::SessionKey,
    store::{NewSteer, Steer, SteerAdded, StoreError, TurnStatus},
    turn::{SteeredFrom, TurnRequest},
};

/// Steers one next turn answers at most: all a turn may keep waiting.
const DEFERRED_MAX: u32 = 1_000;

/// The longest steered message, in characters: a next turn that answers
/// [`DEFERRED_MAX`] of them stays bounded (32 MB at most).
pub const STEER_MESSAGE_MAX: usize = 32_000;

/// Ended turns with steers left that one sweep takes up at most.
const SWEPT_MAX: u32 = 16;

/// How long a steer through one replica waits for the replica that runs
/// its turn to say it accepted it.
const ACCEPTED_WAIT: Duration = Duration::from_secs(1);

/// Pauses of 5 ms a steer waits at most for a turn just begun to open its
/// log to it.
const SINK_WAITS: u32 = 200;

/// Why a steer was refused (nothing was kept).
#[derive(Debug, thiserror::Error)]
pub enum SteerError {
    #[error("turn not found")]
    NotFound,
    #[error("turn is not running (status {0})")]
    NotRunning(TurnStatus),
    /// The turn keeps as many steers waiting as it may.
    #[error("the turn has as many steered messages waiting as it keeps")]
    Full,
    /// Longer than [`STEER_MESSAGE_MAX`] characters (nothing was kept).
    #[error("a steered message is at most {STEER_MESSAGE_MAX} characters")]
    TooLong,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl TurnRunner {
    /// Steers `message` into the running turn `turn_id` of `session_id`:
    /// kept before this returns its id, and `steer.accepted` is in the
    /// turn's log by then when the turn runs in this process.
    pub async fn steer(
        &self,
        session_id: &SessionKey,
        turn_id: Uuid,
        message: String,
    ) -> Result<Uuid, SteerError> {
        if message.chars().count() > STEER_MESSAGE_MAX {
            return Err(SteerError::TooLong);
        }
        let inner = &self.inner;
        let live = inner
            .live
            .get(turn_id)
            .filter(|live| &live.session_id == session_id);
        // A turn of this process is flagged before the steer is kept: one
        // that ends after the steer was kept sees the flag once its end is
        // committed (the store orders the end and the steer). Of another
        // process: where its log stands, to wait for the event from there.
        let from = match &live {
            Some(live) => {
                live.steered.store(true, Ordering::SeqCst);
                0
            }
            None => inner
                .store
                .get_session(session_id)
                .await?
                .map_or(0, |session| session.last_seq),
        };
        let steer = NewSteer {
            id: Uuid::now_v7(),
            session_id: session_id.clone(),
            turn_id,
            message,
            at: Utc::now(),
        };
        match inner.store.add_steer(&steer).await? {
            SteerAdded::Added => {}
            SteerAdded::TurnNotFound => return Err(SteerError::NotFound),
            SteerAdded::Full => return Err(SteerError::Full),
            SteerAdded::NotRunning => {
                let status = inner
                    .store
                    .get_turn(session_id, turn_id)
                    .await?
                    .map_or(TurnStatus::Completed, |record| record.status);
                return Err(SteerError::NotRunning(status));
            }
        }
        match live {
            Some(live) => self.accepted_here(&live, steer.id).await,
            None => {
                self.accepted_elsewhere(session_id, turn_id, from, steer.id)
                    .await;
            }
        }
        Ok(steer.id)
    }

    /// `steer.accepted` in the log of a turn of this process, once, and
    /// committed. A turn that ended meanwhile has no room for it: its
    /// steer becomes the next turn, whose log says so.
    pub(super) async fn accepted_here(&self, live: &Arc<LiveTurn>, steer_id: Uuid) {
        // A turn just begun opens its log to steers after its first
        // events: a moment's wait, bounded.
        let mut waits = 0;
        while live.sink.get().is_none() && waits < SINK_WAITS && !live.closed.is_cancelled() {
            tokio::time::sleep(Duration::from_millis(5)).await;
            waits += 1;
        }
        let Some(sink) = live.sink.get().and_then(std::sync::Weak::upgrade) else {
            return;
        };
        {
            // Said under the lock: whoever finds it said finds it queued.
            let mut said = live.accepted.lock().await;
            if !said.contains(&steer_id) {
                if said.len() < super::live::ACCEPTED_KEPT {
                    said.insert(steer_id);
                }
                let accepted = TurnEvent::SteerAccepted {
                    steer_id: steer_id.to_string(),
                };
                if sink.emit(accepted).await.is_err() {
                    return;
                }
            }
        }
        if let Err(e) = self.inner.writer.flush(live).await {
            tracing::warn!(error = %e, "steer.accepted may not be in the log yet");
        }
    }

    /// Waits, at most [`ACCEPTED_WAIT`], for the replica that runs the
    /// turn to say it accepted `steer_id` (it hears of it from the store):
    /// so that an answer given through any replica finds it in the log. A
    /// parked turn has no such replica: its steer waits in the store.
    async fn accepted_elsewhere(
        &self,
        session_id: &SessionKey,
        turn_id: Uuid,
        from: i64,
        steer_id: Uuid,
    ) {
        use futures::StreamExt as _;
        match self.inner.store.get_turn(session_id, turn_id).await {
            Ok(Some(record)) if record.parked_until.is_none() => {}
            _ => return,
        }
        let wanted = steer_id.to_string();
        let events = self.subscribe(session_id.clone(), turn_id, from);
        let heard = async move {
            futures::pin_mut!(events);
            while let Some(Ok(event)) = events.next().await {
                match event.event() {
                    Some(TurnEvent::SteerAccepted { steer_id }) if *steer_id == wanted => return,
                    Some(event) if event.is_terminal() => return,
                    _ => {}
                }
            }
        };
        let _ = tokio::time::timeout(ACCEPTED_WAIT, heard).await;
    }

    /// Makes what no step of the ended turn took its session's next turn,
    /// in a tracked task.
    pub(super) fn defer_steers_later(&self, session_id: SessionKey, turn_id: Uuid) {
        let runner = self.clone();
        self.inner.background.spawn(async move {
            runner.defer_steers(&session_id, turn_id).await;
        });
    }

    /// The heartbeat's sweep: ended turns with steers left (their process
    /// died or shut down before it made them a turn).
    pub(super) async fn sweep_steers(&self) {
        if self.is_draining() {
            return;
        }
        match self.inner.store.steers_left(SWEPT_MAX).await {
            Ok(left) => {
                for (session_id, turn_id) in left {
                    self.defer_steers_later(session_id, turn_id);
                }
            }
            Err(e) => tracing::warn!(error = %e, "steers left by ended turns could not be read"),
        }
    }

    /// Claims the ended turn's steers no step took and starts the
    /// session's next turn with them at once. Claimed only when the
    /// session is free (no turn runs, no request waits in its queue), so
    /// that the claim and the begin are a moment apart: a process that
    /// dies between them is the only way to lose them. A busy session, or
    /// a next turn that cannot start (the claim is given back), is tried
    /// again by a later sweep.
    async fn defer_steers(&self, session_id: &SessionKey, turn_id: Uuid) {
        let store = &self.inner.store;
        match self.session_is_free(session_id).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(error = %e, turn.id = %turn_id, "steered messages left by a turn wait for a sweep");
                return;
            }
        }
        let record = match store.get_turn(session_id, turn_id).await {
            Ok(Some(record)) => record,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, turn.id = %turn_id, "steered messages left by a turn wait for a sweep");
                return;
            }
        };
        let token = Uuid::now_v7();
        let steers = match store.defer_steers(turn_id, token, DEFERRED_MAX).await {
            Ok(steers) if steers.is_empty() => return,
            Ok(steers) => steers,
            Err(e) => {
                tracing::warn!(error = %e, turn.id = %turn_id, "steered messages left by a turn could not be claimed; a sweep will");
                return;
            }
        };
        let spec = steered_turn(record.request, turn_id, &steers);
        match self.start(session_id, spec, None).await {
            Ok(next) => {
                tracing::info!(turn.id = %turn_id, next_turn.id = %next.turn_id, steers = steers.len(), "steered messages became the next turn");
            }
            Err(e) => {
                tracing::warn!(error = %e, turn.id = %turn_id, "steered messages could not start the next turn; a sweep tries again");
                if let Err(e) = store.release_steers(token).await {
                    tracing::warn!(error = %e, turn.id = %turn_id, "steered messages stay claimed");
                }
            }
        }
    }
}

/// The next turn made of `steers` of `turn_id`: the steered turn's
/// options (`asked`), the messages in the order they came.
fn steered_turn(asked: TurnRequest, turn_id: Uuid, steers: &[Steer]) -> TurnRequest {
    let message = steers
        .iter()
        .map(|steer| steer.message.as_str())
        .collect::<Vec<_>>()
        .join("\n\n");
    TurnRequest {
        message,
        history: None,
        follows: None,
        run_id: None,
        background: false,
        attachments: Vec::new(),
        steered_from: Some(SteeredFrom {
            turn_id,
            steer_ids: steers.iter().map(|steer| steer.id).collect(),
        }),
        ..asked
    }
}
