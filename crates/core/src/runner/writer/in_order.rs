//! The event writer on a store whose commits apply in the order they are
//! asked for ([`EventLog::commits_in_order`]: SQLite's writer thread).
//!
//! It asks for a commit as soon as a command is queued, and for the next
//! one while that one runs (at most [`DEPTH`] asked for). Each takes its
//! commands from the queue only when the store's writer reaches it
//! ([`Gathered`]): a commit holds what arrived while the one before it
//! ran, and the store's writer goes from one to the next without waiting
//! for this task to hear the answer, publish it and gather again (the
//! round trip each commit of a paced load waited for, measured in the git
//! history of docs/benchmarks.md). The answers come back in
//! order and are published as the other loop publishes them. A commit
//! that fails fails those chained after it, which write nothing
//! ([`Chain`]); their commands are tried again together, in queue order,
//! as a failed batch is ([`super::commit_after`]), before anything more
//! is asked for.
//!
//! A text delta waits for company (the linger) only while no commit is
//! under way: otherwise the commit under way is its wait.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use futures::stream::{FuturesOrdered, StreamExt};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::{
    Command, Sink, WriterLimits, commit_after, drop_lost_turns, events_and_leases, publish, record,
    records,
};
use crate::{
    events::StoredEvent,
    runner::live::LeaseClock,
    store::{
        Lease, StoreError,
        event_log::gather::{Chain, Gather, Link, Parts},
    },
};

/// Commits asked for and not yet answered, at most: one running and the
/// next waiting for the store's writer.
pub(super) const DEPTH: usize = 2;

/// How emitters wake the loop.
pub(super) struct Wake {
    /// A command was queued.
    pub ready: Arc<Notify>,
    /// A command that may not wait was queued (`notify_waiters`).
    pub urgent: Arc<Notify>,
    /// Set with `urgent`; cleared when a commit is asked for (it takes
    /// what is queued).
    pub urgent_queued: Arc<AtomicBool>,
}

/// The writer's queue, shared with the commits that take from it.
struct Queue {
    receiver: Mutex<mpsc::Receiver<Command>>,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, mpsc::Receiver<Command>> {
        self.receiver.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    /// The first `max` commands waiting.
    fn take(&self, max: usize, into: &mut Vec<Command>) {
        let mut receiver = self.lock();
        while into.len() < max {
            match receiver.try_recv() {
                Ok(command) => into.push(command),
                Err(_) => break,
            }
        }
    }
}

/// A commit's commands, taken from the queue when the store's writer
/// runs the commit.
struct Gathered {
    queue: Arc<Queue>,
    batch_max: usize,
    lease_clock: LeaseClock,
    /// Set once it starts taking: a command queued after that is for the
    /// next commit.
    started: Arc<AtomicBool>,
    taken: bool,
    commands: Vec<Command>,
    events: Vec<Arc<StoredEvent>>,
    leases: Vec<Lease>,
    fence: bool,
}

impl Gather for Gathered {
    fn gather(&mut self) {
        if self.taken {
            return;
        }
        self.taken = true;
        self.started.store(true, Ordering::Release);
        self.queue.take(self.batch_max, &mut self.commands);
        // Fenced unless no other process can have taken a turn over.
        self.fence = !self.lease_clock.fresh();
        drop_lost_turns(&mut self.commands);
        (self.events, self.leases) = events_and_leases(&self.commands);
    }

    fn parts(&self) -> Parts<'_> {
        let (steps, finishes) = records(&self.commands);
        Parts {
            events: &self.events,
            steps,
            finishes,
            leases: &self.leases,
            fence: self.fence,
        }
    }
}

/// A commit asked for: its commands and its answer.
type Flight = Pin<Box<dyn Future<Output = (Vec<Command>, Result<Vec<bool>, StoreError>)> + Send>>;

/// The last commit asked for: its link in the chain, and whether it has
/// started taking commands.
struct Last {
    link: Arc<Link>,
    started: Arc<AtomicBool>,
}

pub(super) async fn run(
    sink: Sink,
    receiver: mpsc::Receiver<Command>,
    limits: WriterLimits,
    wake: Wake,
    stop: CancellationToken,
) {
    let queue = Arc::new(Queue {
        receiver: Mutex::new(receiver),
    });
    let mut flights: FuturesOrdered<Flight> = FuturesOrdered::new();
    let mut last: Option<Last> = None;
    let mut closing = false;
    loop {
        let waiting = !queue.is_empty();
        // A second commit is asked for only once the one before it has
        // taken its commands: until then, what waits is for that one.
        let room = flights.is_empty()
            || (flights.len() < DEPTH
                && last
                    .as_ref()
                    .is_some_and(|l| l.started.load(Ordering::Acquire)));
        if waiting && room {
            if flights.is_empty() && !closing && !limits.linger.is_zero() {
                linger(&queue, &limits, &wake, &stop).await;
            }
            let after = match (&last, flights.is_empty()) {
                (Some(last), false) => Some(last.link.clone()),
                _ => None,
            };
            let chain = Chain {
                after,
                this: Arc::default(),
            };
            let started = Arc::new(AtomicBool::new(false));
            last = Some(Last {
                link: chain.this.clone(),
                started: started.clone(),
            });
            wake.urgent_queued.store(false, Ordering::Release);
            flights.push_back(ask(&sink, &queue, &limits, chain, started));
            continue;
        }
        if closing && !waiting && flights.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            Some((commands, result)) = flights.next(), if !flights.is_empty() => {
                settle(&sink, &queue, &limits, &mut flights, commands, result).await;
            }
            // Not while as many are asked for as may be: the next ask
            // waits for an answer anyway, and every queued command would
            // wake this task for nothing (20,000 a second under 1,000
            // paced streams). A command queued meanwhile leaves a permit.
            () = wake.ready.notified(), if !closing && flights.len() < DEPTH => {}
            () = stop.cancelled(), if !closing => {
                // Commit what is queued, then stop taking more.
                closing = true;
                queue.lock().close();
            }
        }
    }
    tracing::debug!("event writer stopped");
}

/// Asks the store for a commit of what is queued when its writer gets
/// to it.
fn ask(
    sink: &Sink,
    queue: &Arc<Queue>,
    limits: &WriterLimits,
    chain: Chain,
    started: Arc<AtomicBool>,
) -> Flight {
    let store = sink.store.clone();
    let gathered = Arc::new(Mutex::new(Gathered {
        queue: queue.clone(),
        batch_max: limits.batch_max,
        lease_clock: sink.lease_clock.clone(),
        started,
        taken: false,
        commands: Vec::new(),
        events: Vec::new(),
        leases: Vec::new(),
        fence: false,
    }));
    Box::pin(async move {
        let result = store.commit_gathered(gathered.clone(), chain).await;
        let mut gathered = gathered.lock().unwrap_or_else(PoisonError::into_inner);
        (std::mem::take(&mut gathered.commands), result)
    })
}

/// Publishes a commit's answer; when it failed, takes the answers of
/// those asked for after it (they failed too) and tries their commands
/// again, after its own, as one batch.
async fn settle(
    sink: &Sink,
    queue: &Queue,
    limits: &WriterLimits,
    flights: &mut FuturesOrdered<Flight>,
    commands: Vec<Command>,
    result: Result<Vec<bool>, StoreError>,
) {
    let error = match result {
        Ok(applied) => {
            if !commands.is_empty() {
                record(&sink.metrics, &commands, &applied);
                publish(commands.into_iter(), applied);
            }
            return;
        }
        Err(error) => error,
    };
    let mut batch = commands;
    // A commit chained after a failed one cannot apply; should one have,
    // its events are published after the earlier ones' retry.
    let mut applied_late = Vec::new();
    while let Some((later, result)) = flights.next().await {
        match result {
            Err(_) => batch.extend(later),
            Ok(applied) => {
                tracing::error!("a commit chained after a failed one applied");
                applied_late.push((later, applied));
            }
        }
    }
    if batch.is_empty() {
        // None took its commands (the store's writer is gone): they are
        // the first in the queue.
        queue.take(limits.batch_max, &mut batch);
    }
    commit_after(sink, &mut batch, Some(error)).await;
    for (later, applied) in applied_late {
        record(&sink.metrics, &later, &applied);
        publish(later.into_iter(), applied);
    }
}

/// Holds off asking for a commit while no command that may not wait is
/// queued, up to the linger, or until a batch's worth waits or the writer
/// is stopping (see [`super::linger`]).
async fn linger(queue: &Queue, limits: &WriterLimits, wake: &Wake, stop: &CancellationToken) {
    let until = tokio::time::sleep(limits.linger);
    let mut until = std::pin::pin!(until);
    loop {
        // Made before the look, so an urgent command queued after it
        // wakes it.
        let woken = wake.urgent.notified();
        let woken = std::pin::pin!(woken);
        if wake.urgent_queued.load(Ordering::Acquire) || queue.len() >= limits.batch_max {
            return;
        }
        tokio::select! {
            biased;
            () = woken => {}
            () = until.as_mut() => return,
            () = stop.cancelled() => return,
        }
    }
}
