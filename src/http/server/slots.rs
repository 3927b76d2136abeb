//! The connection slots: at most `cap` connections are open, and a full
//! table cannot lock a well-behaved client out.
//!
//! A connection is *waiting* while it has no request in flight: freshly
//! accepted and silent, or kept alive between requests. When every slot is
//! taken, a new connection takes the slot of the connection that has been
//! waiting longest, which is closed; a connection with a request in flight
//! (a turn streaming, a body being read) is never closed for another. Only
//! when every slot holds a request in flight is the new connection refused.
//!
//! So many silent sockets can hold the table only until the next client
//! connects, and each of them for at most the head timeout. A fixed
//! reserve of slots for clients that send a complete head at once was the
//! alternative: it still lets silent sockets fill everything but the
//! reserve, and the reserve itself can be taken by clients that send one
//! head and then keep quiet.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
};

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// Connections without a first request a process keeps to the idle
/// timeout; past this many, they are a flood (see [`Slots::flooded`]).
pub const SILENT_SPARE: usize = 32;

/// The table of one listener.
#[derive(Debug)]
pub struct Slots {
    cap: usize,
    state: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    /// Connections open, closed-for-another ones included until they end.
    open: usize,
    /// Connections closed for another that have not ended yet.
    evicted: usize,
    /// The waiting connections' close tokens, oldest wait first.
    waiting: BTreeMap<u64, CancellationToken>,
    /// Connections whose first request has not arrived.
    silent: usize,
    /// Until when silent connections are held to the head timeout (a
    /// flood of them was seen: see [`Slots::flooded`]).
    flood_until: Option<std::time::Instant>,
    /// The next wait's position in `waiting`.
    next: u64,
}

impl Table {
    fn enqueue(&mut self, token: CancellationToken) -> u64 {
        let key = self.next;
        self.next += 1;
        self.waiting.insert(key, token);
        key
    }
}

impl Slots {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            state: Mutex::new(Table::default()),
        })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // The table holds counts and tokens only: a panic while it was
        // held cannot leave it half-changed.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a connection just accepted, closing the longest-waiting
    /// connection when the table is full; `None`: every slot has a request
    /// in flight.
    pub fn admit(self: &Arc<Self>) -> Option<Arc<Slot>> {
        let close = CancellationToken::new();
        let mut table = self.table();
        if table.open - table.evicted >= self.cap {
            let (_, oldest) = table.waiting.pop_first()?;
            oldest.cancel();
            table.evicted += 1;
        }
        table.open += 1;
        table.silent += 1;
        let key = table.enqueue(close.clone());
        drop(table);
        Some(Arc::new(Slot {
            slots: self.clone(),
            close,
            first_request: CancellationToken::new(),
            state: Mutex::new(SlotState {
                in_flight: 0,
                waiting: Some(key),
                ended: false,
            }),
        }))
    }

    /// Connections open now (closed-for-another ones included until they
    /// end).
    #[cfg(test)]
    fn open(&self) -> usize {
        self.table().open
    }

    /// Whether silent connections are held to the head timeout now: more
    /// than [`SILENT_SPARE`] connections have sent no request, or did so
    /// within `hold` (a flood is held off for that long after it was
    /// seen, so that those closed first do not let the rest wait the idle
    /// timeout). A client pool's few spare connections are not a flood.
    pub fn flooded(&self, hold: std::time::Duration) -> bool {
        let mut table = self.table();
        let now = std::time::Instant::now();
        if table.silent > SILENT_SPARE {
            table.flood_until = Some(now + hold);
        }
        table.flood_until.is_some_and(|until| now < until)
    }
}

/// One connection's place in the table.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    /// Cancelled when another connection takes this one's slot.
    close: CancellationToken,
    /// Cancelled when the connection's first request arrives.
    first_request: CancellationToken,
    state: Mutex<SlotState>,
}

#[derive(Debug)]
struct SlotState {
    in_flight: usize,
    /// Its key in the table's `waiting`, while waiting.
    waiting: Option<u64>,
    ended: bool,
}

impl Slot {
    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Resolves when another connection took this slot.
    pub fn closed_for_another(&self) -> WaitForCancellationFuture<'_> {
        self.close.cancelled()
    }

    /// Resolves once the connection's first request has arrived.
    pub fn first_request(&self) -> WaitForCancellationFuture<'_> {
        self.first_request.cancelled()
    }

    /// A request arrived: the connection is no longer waiting until the
    /// returned guard (kept with the response body) is dropped.
    pub fn request(self: &Arc<Self>) -> InFlight {
        if !self.first_request.is_cancelled() {
            self.first_request.cancel();
            self.slots.table().silent -= 1;
        }
        let mut state = self.state();
        state.in_flight += 1;
        if let Some(key) = state.waiting.take() {
            self.slots.table().waiting.remove(&key);
        }
        InFlight(self.clone())
    }

    /// Whether a request of the connection reached the service and its
    /// answer is not done.
    pub fn has_request_in_flight(&self) -> bool {
        self.state().in_flight > 0
    }

    /// The connection ended: its slot is free.
    pub fn end(&self) {
        let mut state = self.state();
        if state.ended {
            return;
        }
        state.ended = true;
        let mut table = self.slots.table();
        if let Some(key) = state.waiting.take() {
            table.waiting.remove(&key);
        }
        table.open -= 1;
        if self.close.is_cancelled() {
            table.evicted -= 1;
        }
        if !self.first_request.is_cancelled() {
            // Ended silent; and never counted twice.
            self.first_request.cancel();
            table.silent -= 1;
        }
    }
}

/// A request in flight on a connection; dropped with its response body.
#[derive(Debug)]
pub struct InFlight(Arc<Slot>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let slot = &self.0;
        let mut state = slot.state();
        state.in_flight -= 1;
        if state.in_flight == 0 && !state.ended && !slot.close.is_cancelled() {
            state.waiting = Some(slot.slots.table().enqueue(slot.close.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_closes_the_longest_waiting_connection() {
        let slots = Slots::new(2);
        let first = slots.admit().unwrap();
        let second = slots.admit().unwrap();
        let third = slots.admit().unwrap();
        assert!(first.close.is_cancelled());
        assert!(!second.close.is_cancelled());
        // The closed one counts until it ends, but does not hold a slot.
        assert_eq!(slots.open(), 3);
        first.end();
        assert_eq!(slots.open(), 2);
        drop(third);
    }

    #[test]
    fn a_connection_with_a_request_in_flight_is_never_closed_for_another() {
        let slots = Slots::new(2);
        let busy = slots.admit().unwrap();
        let request = busy.request();
        let idle = slots.admit().unwrap();
        let fresh = slots.admit().unwrap();
        assert!(!busy.close.is_cancelled());
        assert!(idle.close.is_cancelled());
        idle.end();
        // The busy one's request ends: it waits again, from now on, so the
        // fresh one has waited longer.
        drop(request);
        let _newer = slots.admit().unwrap();
        assert!(fresh.close.is_cancelled());
        assert!(!busy.close.is_cancelled());
        fresh.end();
        let _newest = slots.admit().unwrap();
        assert!(busy.close.is_cancelled());
    }

    #[test]
    fn when_every_slot_has_a_request_in_flight_a_new_connection_is_refused() {
        let slots = Slots::new(1);
        let busy = slots.admit().unwrap();
        let _request = busy.request();
        assert!(slots.admit().is_none());
        assert_eq!(slots.open(), 1);
    }

    #[test]
    fn an_ended_connection_frees_its_slot_once() {
        let slots = Slots::new(1);
        let slot = slots.admit().unwrap();
        let request = slot.request();
        slot.end();
        slot.end();
        // A response body dropped after its connection ended changes
        // nothing.
        drop(request);
        assert_eq!(slots.open(), 0);
        assert!(slots.table().waiting.is_empty());
    }

    /// More than `SILENT_SPARE` connections without a request are a flood,
    /// and it is held off for the time given even once they went; a pool's
    /// few spare connections are not one.
    #[test]
    fn many_silent_connections_are_a_flood_for_a_while() {
        let slots = Slots::new(1000);
        let hold = std::time::Duration::from_secs(60);
        let spare: Vec<_> = (0..SILENT_SPARE).map(|_| slots.admit().unwrap()).collect();
        assert!(!slots.flooded(hold), "a pool's spares");
        let one_more = slots.admit().unwrap();
        assert!(slots.flooded(hold));
        // Requests came on all of them: no longer silent, still held off.
        let _requests: Vec<_> = spare.iter().map(Slot::request).collect();
        one_more.end();
        assert!(slots.flooded(hold), "held off after the flood");
        assert_eq!(slots.table().silent, 0);
    }
}
