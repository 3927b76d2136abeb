//! One reader of a turn's log, a page at a time: what a turn taken over
//! is rebuilt from, what a protocol folds a turn from, and what a
//! follower catches up with.

use uuid::Uuid;

use super::EventLog;
use crate::{
    events::StoredEvent,
    ids::SessionKey,
    store::{Result, TurnRecord},
};

/// Events read at a time.
pub const PAGE: u32 = 500;

/// Where a reader of one turn's log is: the seq it has read up to. Each
/// page moves it past the events the page held; a page shorter than
/// [`PAGE`] is the log's end for now (a follower reads again later).
#[derive(Debug, Clone)]
pub struct TurnLogCursor {
    session_id: SessionKey,
    turn_id: Uuid,
    after: i64,
}

impl TurnLogCursor {
    /// The events of `turn_id` (of the session stored as `session_id`)
    /// after seq `after`.
    pub fn new(session_id: &SessionKey, turn_id: Uuid, after: i64) -> Self {
        Self {
            session_id: session_id.clone(),
            turn_id,
            after,
        }
    }

    /// A turn's events from its first.
    pub fn of(turn: &TurnRecord) -> Self {
        Self::new(&turn.session_id, turn.id, turn.first_seq - 1)
    }

    /// The seq read up to.
    pub fn after(&self) -> i64 {
        self.after
    }

    /// Moves the cursor past `seq` (an event had from elsewhere: the
    /// live broadcast, a stream's first event).
    pub fn passed(&mut self, seq: i64) {
        self.after = self.after.max(seq);
    }

    /// The next page after the cursor, without moving it ([`Self::took`]
    /// moves it): a read that may be tried again.
    pub async fn read(&self, log: &(impl EventLog + ?Sized)) -> Result<Vec<StoredEvent>> {
        log.list_events(&self.session_id, Some(self.turn_id), self.after, PAGE)
            .await
    }

    /// Moves the cursor past `page`; whether the log may hold more after
    /// it (the page was full).
    pub fn took(&mut self, page: &[StoredEvent]) -> bool {
        if let Some(last) = page.last() {
            self.after = self.after.max(last.seq);
        }
        page.len() == PAGE as usize
    }

    /// Feeds `feed` the events after the cursor, in order, page by page,
    /// until the log runs out or `feed` says it has what it needs (true).
    pub async fn each(
        &mut self,
        log: &(impl EventLog + ?Sized),
        mut feed: impl FnMut(&StoredEvent) -> bool,
    ) -> Result<()> {
        // Bounded: a turn's events are finite, and each full page moves on.
        loop {
            let page = self.read(log).await?;
            let more = self.took(&page);
            for event in &page {
                if feed(event) {
                    return Ok(());
                }
            }
            if !more {
                return Ok(());
            }
        }
    }

    /// The events after the cursor, in order: at most `most` (rounded up
    /// to a page).
    pub async fn all(
        &mut self,
        log: &(impl EventLog + ?Sized),
        most: usize,
    ) -> Result<Vec<StoredEvent>> {
        let mut events = Vec::new();
        while events.len() < most {
            let page = self.read(log).await?;
            let more = self.took(&page);
            events.extend(page);
            if !more {
                break;
            }
        }
        Ok(events)
    }
}
