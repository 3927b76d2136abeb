//! The event log writer: one task, group commit.
//!
//! Emitters put events on a bounded queue (a full queue slows them down);
//! the writer takes everything waiting, up to `batch_max`, writes it in one
//! transaction, then publishes it to live subscribers. A turn's finish rides
//! in the same queue, so it commits after every event of its turn and
//! together with its terminal event.
//!
//! If a batch fails (after retries), each turn's part is written on its own,
//! so one broken turn cannot take the others down with it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::live::{LeaseClock, LiveTurn};
use crate::{
    events::StoredEvent,
    metrics::Metrics,
    store::{EventLog, NewStep, StoreError, TurnFinish},
};

/// Attempts of a failing batch before its turns are written one by one:
/// pauses of 20, 80, 320 and 1,280 ms, so a database that restarts within
/// about 1.7 s loses nothing (emitters wait meanwhile: the queue is bounded).
const BATCH_ATTEMPTS: u32 = 5;

/// Whether an event may wait a moment for others to share its commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// Committed with what is waiting now: the first text of a step (its
    /// time to first token), and every event that is not text.
    Now,
    /// A text delta after another: it may wait up to the writer's linger
    /// for the rest of the stream, so a fast answer is a few commits, not
    /// one per chunk.
    MayWait,
}

enum Command {
    Append {
        event: Arc<StoredEvent>,
        live: Arc<LiveTurn>,
        flush: Flush,
    },
    /// A step's record: committed with the events queued before it.
    Step {
        step: Box<NewStep>,
        live: Arc<LiveTurn>,
        ack: oneshot::Sender<Result<(), StoreError>>,
    },
    /// Acknowledged once everything queued before it for its turn is
    /// committed.
    Flush {
        live: Arc<LiveTurn>,
        ack: oneshot::Sender<Result<(), StoreError>>,
    },
    Finish {
        finish: Box<TurnFinish>,
        live: Arc<LiveTurn>,
        /// The turn's whole end (not the smaller one of a turn that lost
        /// events): refused once the turn lost events.
        whole: bool,
        ack: oneshot::Sender<Result<bool, StoreError>>,
    },
}

impl Command {
    fn live(&self) -> &Arc<LiveTurn> {
        match self {
            Self::Append { live, .. }
            | Self::Step { live, .. }
            | Self::Flush { live, .. }
            | Self::Finish { live, .. } => live,
        }
    }

    fn may_wait(&self) -> bool {
        matches!(
            self,
            Self::Append {
                flush: Flush::MayWait,
                ..
            }
        )
    }
}

/// How much the writer queues, groups and waits.
#[derive(Debug, Clone, Copy)]
pub struct WriterLimits {
    /// Commands that may wait in the queue before emitters are slowed.
    pub capacity: usize,
    /// Most commands in one commit.
    pub batch_max: usize,
    /// Longest a [`Flush::MayWait`] event waits for company (zero: never).
    pub linger: Duration,
}

/// Why the writer could not take a command.
#[derive(Debug, thiserror::Error)]
#[error("the event writer has stopped")]
pub struct WriterStopped;

/// Handle to the writer task.
#[derive(Clone)]
pub struct EventWriter {
    sender: mpsc::Sender<Command>,
    /// Wakes a writer that lingers over text deltas: a command that may
    /// not wait was queued.
    urgent: Arc<Notify>,
    /// Wakes a writer that waits for commands ([`in_order`]).
    ready: Arc<Notify>,
    /// Set when a command that may not wait is queued ([`in_order`]).
    urgent_queued: Arc<AtomicBool>,
}

impl EventWriter {
    /// Starts the writer on `tracker`. It stops when `stop` is cancelled and
    /// the queue is drained, or when every handle is dropped.
    pub fn spawn(
        store: Arc<dyn EventLog>,
        metrics: Arc<Metrics>,
        limits: WriterLimits,
        tracker: &TaskTracker,
        stop: CancellationToken,
        lease_clock: LeaseClock,
    ) -> Self {
        let (sender, receiver) = mpsc::channel(limits.capacity);
        let urgent = Arc::new(Notify::new());
        let ready = Arc::new(Notify::new());
        let urgent_queued = Arc::new(AtomicBool::new(false));
        let in_order = store.commits_in_order();
        let sink = Sink {
            store,
            metrics,
            lease_clock,
        };
        if in_order {
            let wake = in_order::Wake {
                ready: ready.clone(),
                urgent: urgent.clone(),
                urgent_queued: urgent_queued.clone(),
            };
            tracker.spawn(in_order::run(sink, receiver, limits, wake, stop));
        } else {
            tracker.spawn(run(sink, receiver, limits, urgent.clone(), stop));
        }
        Self {
            sender,
            urgent,
            ready,
            urgent_queued,
        }
    }

    /// Tells the writer a command was queued, and whether it may wait.
    fn queued(&self, may_wait: bool) {
        if !may_wait {
            self.urgent_queued.store(true, Ordering::Release);
            self.urgent.notify_waiters();
        }
        self.ready.notify_one();
    }

    /// Queues an event; waits while the queue is full.
    pub async fn append(
        &self,
        live: &Arc<LiveTurn>,
        event: Arc<StoredEvent>,
        flush: Flush,
    ) -> Result<(), WriterStopped> {
        self.sender
            .send(Command::Append {
                event,
                live: live.clone(),
                flush,
            })
            .await
            .map_err(|_| WriterStopped)?;
        self.queued(flush == Flush::MayWait);
        Ok(())
    }

    /// Queues a step's record, to be committed with the turn's events
    /// queued before it; waits while the queue is full. The answer says
    /// when it is committed: what the step does next (run its tools)
    /// waits for that.
    pub async fn step(
        &self,
        live: &Arc<LiveTurn>,
        step: NewStep,
    ) -> Result<oneshot::Receiver<Result<(), StoreError>>, WriterStopped> {
        let (ack, done) = oneshot::channel();
        self.sender
            .send(Command::Step {
                step: Box::new(step),
                live: live.clone(),
                ack,
            })
            .await
            .map_err(|_| WriterStopped)?;
        self.queued(false);
        Ok(done)
    }

    /// Waits until the turn's events queued so far are committed.
    pub async fn flush(&self, live: &Arc<LiveTurn>) -> Result<(), FinishError> {
        let live = live.clone();
        self.acked(|ack| Command::Flush { live, ack }).await
    }

    /// Queues the command `make` builds around its acknowledgement, at
    /// once (it may not wait for company), and waits for its answer.
    async fn acked<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command,
    ) -> Result<T, FinishError> {
        let (ack, done) = oneshot::channel();
        self.sender
            .send(make(ack))
            .await
            .map_err(|_| FinishError::Stopped)?;
        self.queued(false);
        match done.await {
            Ok(result) => result.map_err(FinishError::Store),
            Err(_) => Err(FinishError::Stopped),
        }
    }

    /// Queues a turn's finish and waits for its commit. `Ok(false)`: the
    /// turn was no longer running (someone else ended it); nothing was written.
    /// A `whole` finish of a turn that lost events is refused.
    pub async fn finish(
        &self,
        live: &Arc<LiveTurn>,
        finish: TurnFinish,
        whole: bool,
    ) -> Result<bool, FinishError> {
        let live = live.clone();
        self.acked(|ack| Command::Finish {
            finish: Box::new(finish),
            live,
            whole,
            ack,
        })
        .await
    }
}

/// Why a finish was not committed.
#[derive(Debug, thiserror::Error)]
pub enum FinishError {
    #[error("the event writer has stopped")]
    Stopped,
    #[error(transparent)]
    Store(StoreError),
}

/// Where the writer's batches go, and what it tells of them.
struct Sink {
    store: Arc<dyn EventLog>,
    metrics: Arc<Metrics>,
    /// Whether the batches' leases may have been lost (then fenced).
    lease_clock: LeaseClock,
}

async fn run(
    sink: Sink,
    mut receiver: mpsc::Receiver<Command>,
    limits: WriterLimits,
    urgent: Arc<Notify>,
    stop: CancellationToken,
) {
    let batch_max = limits.batch_max;
    let mut batch = Vec::with_capacity(batch_max);
    loop {
        let first = tokio::select! {
            biased;
            command = receiver.recv() => command,
            () = stop.cancelled() => {
                // Drain what is queued, then stop taking more.
                receiver.close();
                receiver.recv().await
            }
        };
        let Some(first) = first else { break };
        batch.push(first);
        let first_waits = batch.iter().all(Command::may_wait);
        let waiting_wait = take_waiting(&mut receiver, &mut batch, batch_max);
        if !limits.linger.is_zero() && first_waits && waiting_wait {
            linger(&mut receiver, &mut batch, &limits, &urgent, &stop).await;
        }
        commit(&sink, &mut batch).await;
    }
    tracing::debug!("event writer stopped");
}

/// Adds what is waiting in the queue to `batch`, up to `batch_max`; true
/// when every command it took may wait.
fn take_waiting(
    receiver: &mut mpsc::Receiver<Command>,
    batch: &mut Vec<Command>,
    batch_max: usize,
) -> bool {
    let mut all_wait = true;
    while batch.len() < batch_max {
        match receiver.try_recv() {
            Ok(command) => {
                all_wait &= command.may_wait();
                batch.push(command);
            }
            Err(_) => break,
        }
    }
    all_wait
}

/// Holds a batch of text deltas that may wait, for up to `linger`, then
/// takes what arrived meanwhile. The deltas do not wake the writer; a
/// command that may not wait does (`urgent`), and ends the wait: it is
/// committed with them, in queue order. The wait also ends when the batch
/// is full or the writer is stopping.
async fn linger(
    receiver: &mut mpsc::Receiver<Command>,
    batch: &mut Vec<Command>,
    limits: &WriterLimits,
    urgent: &Notify,
    stop: &CancellationToken,
) {
    let until = tokio::time::sleep(limits.linger);
    let mut until = std::pin::pin!(until);
    loop {
        // Made before the queue is looked at, so an urgent command queued
        // after the look wakes it (`notify_waiters` reaches every
        // `Notified` made before it, polled or not).
        let woken = urgent.notified();
        let woken = std::pin::pin!(woken);
        if !take_waiting(receiver, batch, limits.batch_max) || batch.len() >= limits.batch_max {
            return;
        }
        tokio::select! {
            biased;
            () = woken => {}
            () = until.as_mut() => {
                take_waiting(receiver, batch, limits.batch_max);
                return;
            }
            () = stop.cancelled() => return,
        }
    }
}

/// Writes `batch` (emptying it) and publishes what was committed.
async fn commit(sink: &Sink, batch: &mut Vec<Command>) {
    commit_after(sink, batch, None).await;
}

/// [`commit`] of a batch whose first attempt already `failed` (none:
/// not tried yet).
async fn commit_after(sink: &Sink, batch: &mut Vec<Command>, failed: Option<StoreError>) {
    let (store, metrics) = (sink.store.as_ref(), sink.metrics.as_ref());
    // Fenced unless no other process can have taken a turn over.
    let fence = !sink.lease_clock.fresh();
    drop_lost_turns(batch);
    if batch.is_empty() {
        return;
    }
    let mut delay = Duration::from_millis(20);
    let (mut attempt, mut failed) = match failed {
        Some(e) => (1, Some(e)),
        None => (0, None),
    };
    loop {
        if let Some(e) = failed.take() {
            if attempt < BATCH_ATTEMPTS && e.is_transient() {
                metrics.batch_failed();
                tracing::warn!(error = %e, attempt, events = batch.len(), "event batch failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 4;
            } else {
                tracing::error!(error = %e, events = batch.len(), "event batch failed; writing turn by turn");
                break;
            }
        }
        attempt += 1;
        match write(store, batch, fence).await {
            Ok(applied) => {
                record(metrics, batch, &applied);
                publish(batch.drain(..), applied);
                return;
            }
            Err(e) => failed = Some(e),
        }
    }
    // Isolate: each turn's commands on their own.
    let mut rest: Vec<Command> = std::mem::take(batch);
    while let Some(first) = rest.first() {
        let turn_id = first.live().turn_id;
        let (mine, others): (Vec<Command>, Vec<Command>) =
            rest.into_iter().partition(|c| c.live().turn_id == turn_id);
        rest = others;
        match write(store, &mine, fence).await {
            Ok(applied) => {
                record(metrics, &mine, &applied);
                publish(mine.into_iter(), applied);
            }
            Err(e) => {
                metrics.batch_failed();
                fail(mine, e);
            }
        }
    }
}

/// Takes out the commands of turns that already lost events: their later
/// events would leave a hole in the log, and their whole end would claim a
/// turn that is not whole (it is refused; the turn then ends `failed`).
fn drop_lost_turns(batch: &mut Vec<Command>) {
    if !batch.iter().any(|c| c.live().lost_events()) {
        return;
    }
    let mut kept = Vec::with_capacity(batch.len());
    for command in batch.drain(..) {
        match command {
            Command::Append { ref live, .. } if live.lost_events() => {}
            Command::Step { live, ack, .. } | Command::Flush { live, ack }
                if live.lost_events() =>
            {
                let _ = ack.send(Err(StoreError::Unavailable(
                    "earlier events of the turn could not be written".into(),
                )));
            }
            Command::Finish {
                whole: true,
                live,
                ack,
                ..
            } if live.lost_events() => {
                let _ = ack.send(Err(StoreError::Unavailable(
                    "earlier events of the turn could not be written".into(),
                )));
            }
            other => kept.push(other),
        }
    }
    *batch = kept;
}

/// A turn whose writes failed: its subscribers are told to fall back to the
/// log, its finish (if any) gets the error, and if events were lost the
/// turn is marked so (it stops, and cannot end as if whole).
fn fail(commands: Vec<Command>, error: StoreError) {
    tracing::error!(error = %error, "writes of a turn could not be committed");
    let message = error.to_string();
    let transient = error.is_transient();
    // A turn has one finish waiting at a time: it gets the error itself, so
    // a value the database refuses is not tried again as if the database
    // were down (any other gets one as transient as it).
    let mut error = Some(error);
    let first_lost = commands
        .iter()
        .filter_map(|c| match c {
            Command::Append { event, .. } => Some(event.seq),
            Command::Step { .. } | Command::Flush { .. } | Command::Finish { .. } => None,
        })
        .min();
    for command in commands {
        if let Some(seq) = first_lost {
            command.live().lost_from(seq);
        }
        command.live().closed.cancel();
        if let Command::Step { ack, .. } | Command::Flush { ack, .. } = command {
            let _ = ack.send(Err(if transient {
                StoreError::Unavailable(message.clone())
            } else {
                StoreError::Corrupt(message.clone())
            }));
            continue;
        }
        if let Command::Finish { ack, .. } = command {
            let error = error.take().unwrap_or_else(|| {
                if transient {
                    StoreError::Unavailable(message.clone())
                } else {
                    StoreError::Corrupt(message.clone())
                }
            });
            let _ = ack.send(Err(error));
        }
    }
}

mod batch;
mod in_order;
use batch::{events_and_leases, publish, record, records, write};
#[cfg(test)]
mod tests;
