//! The event log: each session's events in seq order, appended in batches
//! with the turn ends they carry, read back by seq.
//!
//! The read is written once here; each backend's writes stand side by
//! side in `event_log/sqlite.rs` and `event_log/postgres.rs`.

pub mod cursor;
pub mod gather;
pub(super) mod journal;
pub(super) mod postgres;
pub(super) mod runs;
mod sqlite;

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use uuid::Uuid;

use super::{
    Lease, NewStep, TurnFinish,
    reader::{Reads, args},
    records::rows::EventRow,
};
use crate::events::StoredEvent;
use crate::ids::SessionKey;
use crate::store::Result;

/// A turn's step records, in the order they were written, each read back
/// as the type it was written from (`T`, the harness's record): one that
/// does not read as `T` is [`super::StoreError::Corrupt`].
pub async fn step_records_as<T: serde::de::DeserializeOwned>(
    log: &(impl EventLog + ?Sized),
    turn_id: Uuid,
) -> Result<Vec<T>> {
    log.step_records(turn_id)
        .await?
        .iter()
        .enumerate()
        .map(|(at, record)| {
            serde_json::from_str(record).map_err(|e| {
                super::StoreError::Corrupt(format!("step record {} of turn {turn_id}: {e}", at + 1))
            })
        })
        .collect()
}

/// What one commit of the event writer holds.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    pub events: &'a [Arc<StoredEvent>],
    pub steps: &'a [&'a NewStep],
    pub finishes: &'a [&'a TurnFinish],
    /// The lease of every turn the batch writes for: a turn's events and
    /// records are refused (the batch fails) once another attempt holds
    /// it, as its finish does not apply.
    pub leases: &'a [Lease],
    /// Whether another process may have taken a turn of the batch over
    /// (its writer's heartbeat is not recent): only then are its events
    /// and records checked against the leases (on Postgres, each turn's
    /// row share-locked while they go in). A finish always is.
    pub fence: bool,
}

/// The event log.
#[async_trait]
pub trait EventLog: Reads + Send + Sync + 'static {
    /// Appends a batch's events, keeps its step records and applies its
    /// turn finishes, in one transaction, in that order. A finish applies
    /// only while its turn is still `running`; the returned flags say which
    /// did (a finish that did not writes nothing). A turn's end deletes its
    /// step records.
    async fn commit(&self, batch: Batch<'_>) -> Result<Vec<bool>>;

    /// Whether the store's commits apply one after another in the order
    /// they are asked for, and one chained after a commit that failed
    /// fails too ([`gather::Chain`]): then the event writer asks for its
    /// next commit before the last one is answered (SQLite's one writer
    /// thread). Not so on Postgres, whose commits run on connections side
    /// by side.
    fn commits_in_order(&self) -> bool {
        false
    }

    /// [`Self::commit`] of what `gather` takes when the store's writer
    /// comes to it, chained as `chain` says (on a store whose commits
    /// apply in order). Here: what it takes now, committed.
    async fn commit_gathered(
        &self,
        gather: Arc<Mutex<dyn gather::Gather>>,
        chain: gather::Chain,
    ) -> Result<Vec<bool>> {
        let _ = chain;
        let (events, steps, finishes, leases, fence) = {
            let mut gather = gather.lock().unwrap_or_else(PoisonError::into_inner);
            gather.gather();
            let parts = gather.parts();
            let steps: Vec<NewStep> = parts.steps.iter().map(|s| (*s).clone()).collect();
            let finishes: Vec<TurnFinish> = parts.finishes.iter().map(|f| (*f).clone()).collect();
            (
                parts.events.to_vec(),
                steps,
                finishes,
                parts.leases.to_vec(),
                parts.fence,
            )
        };
        let steps: Vec<&NewStep> = steps.iter().collect();
        let finishes: Vec<&TurnFinish> = finishes.iter().collect();
        self.commit(Batch {
            events: &events,
            steps: &steps,
            finishes: &finishes,
            leases: &leases,
            fence,
        })
        .await
    }

    /// [`Self::commit`] of events and finishes, each turn's lease the
    /// one its finish holds, else its first (a turn never taken over).
    async fn write_batch(
        &self,
        events: &[Arc<StoredEvent>],
        finishes: &[&TurnFinish],
    ) -> Result<Vec<bool>> {
        let mut leases: Vec<Lease> = finishes
            .iter()
            .map(|f| Lease {
                turn_id: f.turn_id,
                attempt: f.attempt,
            })
            .collect();
        for event in events {
            if !leases.iter().any(|l| l.turn_id == event.turn_id) {
                leases.push(Lease {
                    turn_id: event.turn_id,
                    attempt: 0,
                });
            }
        }
        self.commit(Batch {
            events,
            steps: &[],
            finishes,
            leases: &leases,
            fence: true,
        })
        .await
    }

    /// The step records of a turn, in the order they were written.
    async fn step_records(&self, turn_id: Uuid) -> Result<Vec<String>> {
        let sql = "SELECT record FROM turn_steps WHERE turn_id = $1 ORDER BY step, phase";
        let rows: Vec<(String,)> = self.reader().rows(sql, args![turn_id]).await?;
        Ok(rows.into_iter().map(|(record,)| record).collect())
    }

    /// Events of a session with seq greater than `after`, in seq order,
    /// optionally of one turn, at most `limit`. For a turn, pass an
    /// `after` of at least its `first_seq - 1`: the scan starts there.
    ///
    /// Two index scans: the row just at or before `after`, kept when it is
    /// a run of deltas that goes past `after` (it gives the events past
    /// it), and the rows after `after`, in order, at most `limit`. (One
    /// scan from a bound computed in the query lost Postgres its ordered
    /// index scan: it read every later row of the session and sorted.)
    async fn list_events(
        &self,
        session_id: &SessionKey,
        turn_id: Option<Uuid>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>> {
        list_table(self, session_id, turn_id, after, limit).await
    }

    /// Appends `event` to its session's log at the session's next seq,
    /// between turns (`event.seq` is not used). False, and nothing written,
    /// while a turn of the session runs (its events own the next seqs):
    /// try again later.
    async fn append_session_event(&self, event: &StoredEvent) -> Result<bool>;
}

/// [`EventLog::list_events`] from the table alone.
async fn list_table<L: Reads + Sync + ?Sized>(
    log: &L,
    session_id: &SessionKey,
    turn_id: Option<Uuid>,
    after: i64,
    limit: u32,
) -> Result<Vec<StoredEvent>> {
    let rows: Vec<EventRow> = match turn_id {
        Some(turn_id) => {
            let sql = "SELECT * FROM ( \
                 SELECT * FROM (SELECT session_id, seq, seq_end, turn_id, type, payload, \
                   created_at FROM events WHERE session_id = $1 AND seq <= $2 \
                   ORDER BY seq DESC LIMIT 1) AS held WHERE seq_end > $2 AND turn_id = $4 \
                 UNION ALL \
                 SELECT * FROM (SELECT session_id, seq, seq_end, turn_id, type, payload, \
                   created_at FROM events WHERE session_id = $1 AND seq > $2 AND turn_id = $4 \
                   ORDER BY seq LIMIT $3) AS rest \
               ) AS page ORDER BY seq";
            let bound = args![session_id, after, limit, turn_id];
            log.reader().rows(sql, bound).await?
        }
        None => {
            let sql = "SELECT * FROM ( \
                 SELECT * FROM (SELECT session_id, seq, seq_end, turn_id, type, payload, \
                   created_at FROM events WHERE session_id = $1 AND seq <= $2 \
                   ORDER BY seq DESC LIMIT 1) AS held WHERE seq_end > $2 \
                 UNION ALL \
                 SELECT * FROM (SELECT session_id, seq, seq_end, turn_id, type, payload, \
                   created_at FROM events WHERE session_id = $1 AND seq > $2 \
                   ORDER BY seq LIMIT $3) AS rest \
               ) AS page ORDER BY seq";
            let bound = args![session_id, after, limit];
            log.reader().rows(sql, bound).await?
        }
    };
    let mut events = Vec::with_capacity(rows.len());
    for row in rows {
        for event in runs::expand(row, super::sqlite::writer::parse_ts)? {
            if event.seq > after && events.len() < limit as usize {
                events.push(event);
            }
        }
    }
    Ok(events)
}
