//! A batch of the writer's commands as the store takes it, and as it is
//! published once committed.

use std::sync::Arc;

use super::Command;
use crate::{
    events::StoredEvent,
    metrics::Metrics,
    runner::live::LiveTurn,
    store::{Batch, EventLog, Lease, NewStep, StoreError, TurnFinish},
};

/// Counts a committed batch.
pub(super) fn record(metrics: &Metrics, batch: &[Command], applied: &[bool]) {
    let appended = batch
        .iter()
        .filter(|c| matches!(c, Command::Append { .. }))
        .count();
    let terminals = applied.iter().filter(|a| **a).count();
    metrics.batch_committed((appended + terminals) as u64);
}

pub(super) async fn write(
    store: &dyn EventLog,
    batch: &[Command],
    fence: bool,
) -> Result<Vec<bool>, StoreError> {
    let (events, leases) = events_and_leases(batch);
    let (steps, finishes) = records(batch);
    store
        .commit(Batch {
            events: &events,
            steps: &steps,
            finishes: &finishes,
            leases: &leases,
            fence,
        })
        .await
}

/// A batch's events, and the lease of each turn it writes for.
pub(super) fn events_and_leases(batch: &[Command]) -> (Vec<Arc<StoredEvent>>, Vec<Lease>) {
    let mut events = Vec::new();
    let mut leases: Vec<Lease> = Vec::new();
    for command in batch {
        let live = command.live();
        if !leases.iter().any(|l| l.turn_id == live.turn_id) {
            leases.push(Lease {
                turn_id: live.turn_id,
                attempt: live.attempt,
            });
        }
        if let Command::Append { event, .. } = command {
            events.push(event.clone());
        }
    }
    (events, leases)
}

/// A batch's step records and finishes.
pub(super) fn records(batch: &[Command]) -> (Vec<&NewStep>, Vec<&TurnFinish>) {
    let mut steps = Vec::new();
    let mut finishes = Vec::new();
    for command in batch {
        match command {
            Command::Step { step, .. } => steps.push(&**step),
            Command::Finish { finish, .. } => finishes.push(&**finish),
            Command::Append { .. } | Command::Flush { .. } => {}
        }
    }
    (steps, finishes)
}

/// Publishes a committed batch: each turn's events in one message (its
/// terminal last, when its end was applied), then closes the turns that
/// ended and acknowledges their finishes.
pub(super) fn publish(commands: impl Iterator<Item = Command>, applied: Vec<bool>) {
    let mut applied = applied.into_iter();
    // Turns in the order they first appear; a batch holds a few.
    let mut turns: Vec<(Arc<LiveTurn>, Vec<Arc<StoredEvent>>)> = Vec::new();
    let mut ends = Vec::new();
    for command in commands {
        let (live, event) = match command {
            Command::Append { event, live, .. } => (live, Some(event)),
            Command::Step { ack, .. } | Command::Flush { ack, .. } => {
                let _ = ack.send(Ok(()));
                continue;
            }
            Command::Finish {
                finish, live, ack, ..
            } => {
                let done = applied.next().unwrap_or(false);
                let terminal = done.then(|| finish.terminal.clone());
                ends.push((live.clone(), ack, done));
                (live, terminal)
            }
        };
        let Some(event) = event else { continue };
        match turns.iter_mut().find(|(l, _)| Arc::ptr_eq(l, &live)) {
            Some((_, events)) => events.push(event),
            None => turns.push((live, vec![event])),
        }
    }
    for (live, events) in turns {
        live.publish(events.into());
    }
    for (live, ack, done) in ends {
        live.closed.cancel();
        // The turn task may be gone (shutdown); the commit stands.
        let _ = ack.send(Ok(done));
    }
}
