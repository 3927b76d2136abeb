//! Turns running in this process, and their live fan-out.
//!
//! A [`LiveTurn`] broadcasts its events after the event log committed them,
//! a commit's worth at a time. That order is what makes resuming exact: a
//! subscriber subscribes first and reads the log second, so every event is
//! either in what it read or in what it receives (or both, and the seq
//! tells the duplicate).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{events::StoredEvent, ids::SessionKey, store::Lease};

/// Commits a slow subscriber may fall behind before it re-reads the log.
/// The ring is allocated whole for every running turn (about 48 bytes a
/// slot), and a lagging reader loses nothing (it reads the log), so it is
/// kept small. A slot holds all of the turn's events of one commit: a
/// burst of deltas committed together (a fast provider's whole answer)
/// takes one slot, not one each, and does not send its reader to the log.
const BROADCAST_CAPACITY: usize = 32;

/// The events of one turn that one commit made durable, in seq order.
pub type Committed = Arc<[Arc<StoredEvent>]>;

/// One running turn of this process.
#[derive(Debug)]
pub struct LiveTurn {
    pub session_id: SessionKey,
    /// The session's tenant (counted per start: read once here).
    tenant: String,
    pub turn_id: Uuid,
    /// The turn's lease: its writes hold this attempt.
    pub attempt: u32,
    sender: broadcast::Sender<Committed>,
    /// Cancelled by `POST .../cancel`.
    pub cancel: CancellationToken,
    /// Cancelled once the turn's terminal event is committed and published,
    /// or once its events can no longer be written.
    pub closed: CancellationToken,
    /// Cancelled when some of the turn's events could not be written: the
    /// turn stops at its next event (its log would have a hole) and ends
    /// `failed` with `event_log_unavailable`.
    pub write_failed: CancellationToken,
    /// Whether `write_failed` is cancelled, read without its lock: the
    /// turn's sink and the writer ask at every event.
    lost: std::sync::atomic::AtomicBool,
    /// The first seq of the turn's events that could not be written.
    first_lost: Mutex<Option<i64>>,
    /// Set before the turn's end is committed (so before any client sees
    /// its terminal event): it no longer counts among its tenant's
    /// running turns here.
    pub ending: std::sync::atomic::AtomicBool,
    /// Set before a message is steered into the turn through this
    /// process, or when this process hears of one made through another
    /// (and from the start for a turn taken over or woken, which may have
    /// some): its steps look for them in the store, and at its end what no
    /// step took becomes the next turn at once (not at a sweep).
    pub steered: Arc<std::sync::atomic::AtomicBool>,
    /// The turn's sink, for an event made outside its task
    /// (`steer.accepted`).
    pub(super) sink: std::sync::OnceLock<std::sync::Weak<dyn crate::harness::EventSink>>,
    /// The steers the turn's log says it accepted (at most
    /// [`ACCEPTED_KEPT`]): a steer heard twice (its route here, and the
    /// store's announcement) is said once. Held while one is said.
    pub(super) accepted: tokio::sync::Mutex<std::collections::HashSet<Uuid>>,
}

/// Steers a live turn remembers having said it accepted (past them, a
/// steer heard twice may be said twice; a turn keeps at most 1,000
/// waiting).
pub(super) const ACCEPTED_KEPT: usize = 4_096;

impl LiveTurn {
    pub fn subscribe(&self) -> broadcast::Receiver<Committed> {
        self.sender.subscribe()
    }

    /// Some of the turn's events, from `seq` on, could not be written.
    pub fn lost_from(&self, seq: i64) {
        let mut first = self
            .first_lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *first = Some(first.map_or(seq, |known| known.min(seq)));
        self.lost.store(true, std::sync::atomic::Ordering::Release);
        self.write_failed.cancel();
    }

    /// Whether some of the turn's events could not be written (as
    /// `write_failed.is_cancelled()`, without taking its lock).
    pub fn lost_events(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The first seq of the turn's events that could not be written.
    pub fn first_lost(&self) -> Option<i64> {
        *self
            .first_lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends the turn's events of one commit to the subscribers.
    pub fn publish(&self, events: Committed) {
        // No subscriber is not an error: the log has the events.
        let _ = self.sender.send(events);
    }
}

/// When this process last kept its turns alive (a heartbeat that landed,
/// or its start: a turn begun or claimed since has a fresh heartbeat of
/// its own). While that is recent, no other process can have taken one of
/// its turns over (a take-over needs a heartbeat 1.5 intervals old), so
/// its writes need no fence; past half of that, they are fenced.
#[derive(Debug, Clone)]
pub struct LeaseClock {
    since: std::time::Instant,
    last_beat_ms: Arc<std::sync::atomic::AtomicU64>,
    fresh_for: std::time::Duration,
}

impl LeaseClock {
    /// A clock whose leases are fresh for `fresh_for` after each beat.
    pub fn new(fresh_for: std::time::Duration) -> Self {
        Self {
            since: std::time::Instant::now(),
            last_beat_ms: Arc::default(),
            fresh_for,
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A heartbeat landed (it was sent at `sent`).
    pub fn beat(&self, sent: std::time::Instant) {
        let at = u64::try_from(sent.saturating_duration_since(self.since).as_millis())
            .unwrap_or(u64::MAX);
        self.last_beat_ms
            .fetch_max(at, std::sync::atomic::Ordering::AcqRel);
    }

    /// Whether no other process can have taken this one's turns over.
    pub fn fresh(&self) -> bool {
        let last = self.last_beat_ms.load(std::sync::atomic::Ordering::Acquire);
        self.now_ms().saturating_sub(last) < u64::try_from(self.fresh_for.as_millis()).unwrap_or(0)
    }
}

/// The registry of live turns, by turn id.
#[derive(Debug, Default, Clone)]
pub struct LiveTurns {
    turns: Arc<Mutex<HashMap<Uuid, Arc<LiveTurn>>>>,
}

impl LiveTurns {
    pub fn insert(&self, session_id: &SessionKey, turn_id: Uuid, attempt: u32) -> Arc<LiveTurn> {
        let (sender, _) = broadcast::channel(BROADCAST_CAPACITY);
        let turn = Arc::new(LiveTurn {
            session_id: session_id.clone(),
            tenant: session_id.tenant().to_owned(),
            turn_id,
            attempt,
            sender,
            cancel: CancellationToken::new(),
            closed: CancellationToken::new(),
            write_failed: CancellationToken::new(),
            lost: std::sync::atomic::AtomicBool::new(false),
            first_lost: Mutex::new(None),
            ending: std::sync::atomic::AtomicBool::new(false),
            steered: Arc::new(std::sync::atomic::AtomicBool::new(attempt > 0)),
            sink: std::sync::OnceLock::new(),
            accepted: tokio::sync::Mutex::default(),
        });
        self.lock().insert(turn_id, turn.clone());
        turn
    }

    pub fn get(&self, turn_id: Uuid) -> Option<Arc<LiveTurn>> {
        self.lock().get(&turn_id).cloned()
    }

    pub fn remove(&self, turn_id: Uuid) {
        self.lock().remove(&turn_id);
    }

    /// Removes `turn` if it is still the one registered under its id (a
    /// parked turn woken at once may have another by then).
    pub fn remove_this(&self, turn: &Arc<LiveTurn>) {
        let mut turns = self.lock();
        if turns
            .get(&turn.turn_id)
            .is_some_and(|held| Arc::ptr_eq(held, turn))
        {
            turns.remove(&turn.turn_id);
        }
    }

    /// How many of the turns running here are of `tenant`'s sessions.
    pub fn count_of_tenant(&self, tenant: &str) -> usize {
        self.lock()
            .values()
            .filter(|turn| !turn.ending.load(std::sync::atomic::Ordering::Acquire))
            .filter(|turn| turn.tenant == tenant)
            .count()
    }

    pub fn ids(&self) -> Vec<Uuid> {
        self.lock().keys().copied().collect()
    }

    /// The leases of the turns running here.
    pub fn leases(&self) -> Vec<Lease> {
        self.lock()
            .values()
            .map(|turn| Lease {
                turn_id: turn.turn_id,
                attempt: turn.attempt,
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Arc<LiveTurn>>> {
        // The map holds no invariant a panic could break halfway.
        self.turns.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fresh from the start and after each beat, for `fresh_for`; a beat
    /// sent earlier than the last one counted does not move it back.
    #[test]
    fn a_lease_clock_is_fresh_for_a_while_after_a_beat() {
        let clock = LeaseClock::new(std::time::Duration::from_millis(30));
        assert!(clock.fresh(), "a process's start counts as a beat");
        let sent = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert!(!clock.fresh(), "no beat for longer than it is fresh");
        clock.beat(std::time::Instant::now());
        assert!(clock.fresh());
        clock.beat(sent);
        assert!(clock.fresh(), "an older beat does not age it");
    }
}
