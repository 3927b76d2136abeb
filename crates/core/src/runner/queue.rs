//! `multitask: enqueue`: a session's queue of waiting turns, kept in the
//! store so that it holds across replicas.

use std::time::Duration;

use chrono::Utc;
use uuid::Uuid;

use super::{StartError, StartedTurn, TurnRunner};
use crate::{ids::SessionKey, store::StoreError, turn::TurnRequest};

/// Why a queued turn did not start.
#[derive(Debug, thiserror::Error)]
pub enum QueuedStartError {
    /// The wait ended first; the turn running then.
    #[error("the session's turns did not end in time (turn {0} runs)")]
    TimedOut(Uuid),
    #[error(transparent)]
    Start(#[from] StartError),
}

impl From<StoreError> for QueuedStartError {
    fn from(e: StoreError) -> Self {
        Self::Start(StartError::Store(e))
    }
}

/// A ticket not kept alive this long is passed over (its request's
/// process died); one is kept alive every [`QUEUE_TICKET_TOUCH`].
const QUEUE_TICKET_STALE_MS: i64 = 10_000;
const QUEUE_TICKET_TOUCH: Duration = Duration::from_secs(2);

/// How often a waiting request looks whether the head has begun.
const QUEUE_POLL: Duration = Duration::from_millis(50);

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// A place in a session's queue; left when dropped (the request gave up,
/// or its client went away), by a tracked task.
struct QueueTicket {
    runner: TurnRunner,
    ticket: i64,
    /// Left already: nothing to do on drop.
    left: bool,
}

impl QueueTicket {
    /// Leaves the queue now (the turn began).
    async fn leave(mut self) {
        self.left = true;
        if let Err(e) = self.runner.inner.store.leave_queue(self.ticket).await {
            tracing::warn!(error = %e, ticket = self.ticket, "cannot leave the turn queue; the ticket goes stale");
        }
    }
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        let (store, ticket) = (self.runner.inner.store.clone(), self.ticket);
        self.runner.inner.background.spawn(async move {
            if let Err(e) = store.leave_queue(ticket).await {
                tracing::warn!(error = %e, ticket, "cannot leave the turn queue; the ticket goes stale");
            }
        });
    }
}

impl TurnRunner {
    /// Why a waiter whose ticket is gone gives up: an erase of the session
    /// (or of its tenant) emptied its queue, and what is erased does not
    /// begin again. (A ticket that went stale, its process silent for
    /// 10 s, gives up too: its wait was cut.)
    async fn ticket_gone(&self, session_id: &SessionKey) -> Result<QueuedStartError, StoreError> {
        let session = self.inner.store.get_session(session_id).await?;
        Ok(match session.and_then(|s| s.running_turn_id) {
            Some(running) => QueuedStartError::TimedOut(running),
            None => QueuedStartError::Start(StartError::SessionNotFound),
        })
    }

    /// Whether `session_id` runs no turn and no request waits in its
    /// queue: a turn begun now jumps no one.
    pub(super) async fn session_is_free(
        &self,
        session_id: &SessionKey,
    ) -> Result<bool, StoreError> {
        let store = &self.inner.store;
        if store
            .queue_head(session_id, now_ms() - QUEUE_TICKET_STALE_MS)
            .await?
            .is_some()
        {
            return Ok(false);
        }
        Ok(store
            .get_session(session_id)
            .await?
            .is_some_and(|session| session.running_turn_id.is_none()))
    }

    /// A start that finds the session busy says which turn runs there.
    async fn try_start(
        &self,
        session_id: &SessionKey,
        spec: &TurnRequest,
        idempotency_key: &Option<String>,
    ) -> Result<Result<StartedTurn, Uuid>, StartError> {
        match self
            .start(session_id, spec.clone(), idempotency_key.clone())
            .await
        {
            Err(StartError::AlreadyRunning(running)) => Ok(Err(running)),
            other => other.map(Ok),
        }
    }

    /// Begins a turn of `session_id` after the turns queued before it:
    /// `multitask: enqueue`. A request that finds the session busy, or
    /// others already waiting, takes a ticket in the session's queue (in
    /// the store: it holds across replicas) and starts when the session is
    /// free and its ticket is the lowest; tickets run in the order they
    /// were taken. Gives up at `deadline` with the turn that runs then.
    pub async fn start_queued(
        &self,
        session_id: &SessionKey,
        spec: TurnRequest,
        idempotency_key: Option<String>,
        deadline: tokio::time::Instant,
    ) -> Result<StartedTurn, QueuedStartError> {
        // Its images and files are made files once, before it waits.
        let mut spec = spec;
        let made = self.resolve_attachments(session_id, &mut spec).await?;
        let started = self
            .start_in_turn(session_id, spec, idempotency_key, deadline)
            .await;
        if started.is_err() {
            self.take_back(session_id, &made).await;
        }
        started
    }

    /// [`Self::start_queued`] of a turn whose attachments are files.
    async fn start_in_turn(
        &self,
        session_id: &SessionKey,
        spec: TurnRequest,
        idempotency_key: Option<String>,
        deadline: tokio::time::Instant,
    ) -> Result<StartedTurn, QueuedStartError> {
        let store = &self.inner.store;
        let stale = || now_ms() - QUEUE_TICKET_STALE_MS;
        if store.queue_head(session_id, stale()).await?.is_none()
            && let Ok(started) = self.try_start(session_id, &spec, &idempotency_key).await?
        {
            return Ok(started);
        }
        let ticket = QueueTicket {
            runner: self.clone(),
            ticket: store.enqueue_turn(session_id, now_ms(), stale()).await?,
            left: false,
        };
        let mut touched = tokio::time::Instant::now();
        let mut waiting_for: Option<Uuid> = None;
        // Bounded: each round waits (a poll, a touch interval, the turn
        // that runs) and the deadline ends it.
        loop {
            let due = tokio::time::Instant::now() >= deadline;
            if due || touched.elapsed() >= QUEUE_TICKET_TOUCH {
                if !store.touch_ticket(ticket.ticket, now_ms()).await? {
                    return Err(self.ticket_gone(session_id).await?);
                }
                touched = tokio::time::Instant::now();
            }
            if due {
                // One last try, in or out of turn: the wait is over.
                return match self.try_start(session_id, &spec, &idempotency_key).await? {
                    Err(running) => Err(QueuedStartError::TimedOut(running)),
                    Ok(started) => {
                        ticket.leave().await;
                        Ok(started)
                    }
                };
            }
            if let Some(running) = waiting_for {
                // Woken at least every touch interval to keep the ticket.
                let until = deadline.min(tokio::time::Instant::now() + QUEUE_TICKET_TOUCH);
                if let Ok(ended) =
                    tokio::time::timeout_at(until, self.wait_for_end(session_id, running)).await
                {
                    ended?;
                    waiting_for = None;
                }
                continue;
            }
            if store.queue_head(session_id, stale()).await? == Some(ticket.ticket) {
                match self.try_start(session_id, &spec, &idempotency_key).await? {
                    Err(running) => waiting_for = Some(running),
                    Ok(started) => {
                        ticket.leave().await;
                        return Ok(started);
                    }
                }
            } else {
                // The head is about to begin; its turn is waited for then.
                match store.get_session(session_id).await? {
                    Some(session) if session.running_turn_id.is_some() => {
                        waiting_for = session.running_turn_id;
                    }
                    _ => tokio::time::sleep(QUEUE_POLL).await,
                }
            }
        }
    }
}
