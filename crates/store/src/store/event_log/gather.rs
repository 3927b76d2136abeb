//! Commits whose contents are taken when the store's writer comes to
//! them, asked for one after another (see [`super::EventLog::commits_in_order`]).
//!
//! The event writer used to take what its queue held, hand that batch to
//! the store and wait for the answer before it took the next: the SQLite
//! writer thread then sat idle while the answer crossed back, the batch was
//! published and the next one was gathered and sent (each commit of a paced load waited for the one before it and for
//! that round trip). On a store whose one writer applies commits in the
//! order they are asked for, the event writer now asks for the next commit
//! while the last one runs, and each takes its events from the queue only
//! when the writer reaches it: what arrived while the commit before ran.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use super::Batch;
use crate::events::StoredEvent;
use crate::store::{Lease, NewStep, TurnFinish};

/// A commit's outcome as the commits chained after it see it.
#[derive(Debug, Default)]
pub struct Link {
    failed: AtomicBool,
}

impl Link {
    /// Whether the commit failed (its write, its group's commit, or one
    /// it was chained after).
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Says how the commit's last run went (a group run again after a
    /// rollback runs its commits again).
    pub fn set_failed(&self, failed: bool) {
        self.failed.store(failed, Ordering::Release);
    }
}

/// Where a commit stands in its chain: a commit chained `after` one that
/// failed fails too, without writing, so nothing of a later batch is
/// committed before an earlier one that is to be tried again.
#[derive(Debug, Clone, Default)]
pub struct Chain {
    pub after: Option<Arc<Link>>,
    pub this: Arc<Link>,
}

/// A batch taken from its source when the store's writer comes to it.
pub trait Gather: Send {
    /// Takes what waits now; a second call takes nothing more (a commit
    /// run again after a rollback writes the same batch).
    fn gather(&mut self);
    /// The batch taken.
    fn parts(&self) -> Parts<'_>;
}

/// What [`Gather::parts`] gives: a [`Batch`]'s parts.
#[derive(Debug)]
pub struct Parts<'a> {
    pub events: &'a [Arc<StoredEvent>],
    pub steps: Vec<&'a NewStep>,
    pub finishes: Vec<&'a TurnFinish>,
    pub leases: &'a [Lease],
    pub fence: bool,
}

impl Parts<'_> {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.steps.is_empty() && self.finishes.is_empty()
    }

    pub fn batch(&self) -> Batch<'_> {
        Batch {
            events: self.events,
            steps: &self.steps,
            finishes: &self.finishes,
            leases: self.leases,
            fence: self.fence,
        }
    }
}
