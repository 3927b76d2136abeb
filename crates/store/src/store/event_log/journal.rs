//! The journal: where a paced token is committed first (SQLite).
//!
//! The log's table is clustered by session and seq, so a commit that
//! holds one delta of each of 1,000 paced streams rewrote 1,000 B-tree
//! pages (a 4 KiB copy and checksum in the WAL each): the writer thread's
//! whole cost under paced streams, and what held one process to a core
//! (measured: docs/benchmarks.md). Here a session's deltas that follow
//! each other are committed to the journal instead, a table in commit
//! order with no index but its row id, one row (a *pack*, `packs.rs`) a
//! commit: a commit's journal rows are one insert and a few pages at its
//! end, whatever the sessions. The journal is measured in the rows its
//! packs list (a pack's place is its first row's). The process keeps
//! each session's journaled events in memory (they are *pending*) until
//! they are moved, as runs, into the session's table (a *flush*), in the
//! same transaction as the events that end them:
//!
//! - at any event that is not a delta (a tool call, a step's or turn's
//!   end: so between turns nothing is pending),
//! - when [`FLUSH_AT`] are pending (at most [`FLUSH_BUDGET`] sessions a
//!   commit, so streams that started together do not all flush in one
//!   commit; the others wait up to [`PENDING_MAX`]), or the next delta
//!   does not follow (another turn or step, a hole),
//! - when the oldest pending row is [`SWEEP_BEHIND`] rows behind the
//!   newest ([`SWEEP_MAX`] sessions a commit, the oldest first: a slow
//!   turn does not keep the journal from being trimmed).
//!
//! A read of the log is the table's events, then the pending ones after
//! them; the pending ones are read *first*, so a flush between the two
//! reads gives them twice (they are cut by seq), never not at all (a
//! flush moves a prefix of a session's pending events). Packs below the
//! oldest pending row's are deleted, a thousand rows at a time from the
//! table's start. After a crash, the journal is read back when the store
//! is migrated: each row past its session's last seq in the table (and whose
//! turn is still there: an erased session's rows are not brought back)
//! moves into the table, and the journal is emptied.
//!
//! The promise holds as before: an event is sent only once its commit is
//! done, and a client that resumes after any seq gets every later event
//! once, in order. Postgres does not journal: its replicas read each
//! other's turns, so the table is the log.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex, PoisonError},
};

use rusqlite::{Connection, OptionalExtension, params};
use uuid::Uuid;

use super::runs::{self, DELTA};
use crate::events::StoredEvent;
use crate::store::{Result, StoreError, sqlite::time::ts};

/// Pending events of a session past which they are flushed.
pub const FLUSH_AT: usize = 32;

/// Sessions a commit flushes because they hold [`FLUSH_AT`].
pub const FLUSH_BUDGET: usize = 64;

/// Pending events of a session past which it is flushed whatever the
/// budget.
pub const PENDING_MAX: usize = 4 * FLUSH_AT;

/// How far (in journal rows) the oldest pending row may fall behind the
/// newest before its session is flushed, whatever it holds: several
/// flushes' worth of rows at 1,000 streams (32,000 rows a round), about
/// 30 MiB of journal.
pub const SWEEP_BEHIND: i64 = 200_000;

/// Sessions a commit flushes because they are stale.
pub const SWEEP_MAX: usize = 64;

/// Rows below the oldest pending one that wait before they are deleted.
const TRIM_EVERY: i64 = 1_000;

/// Sessions a group's stage has room for before it grows.
const STAGE_SESSIONS: usize = 128;

/// Locks over the sessions' pending events (a read takes one).
const SHARDS: usize = 16;

/// The last seq of a session in its table.
const LAST_IN_TABLE: &str = "SELECT COALESCE(seq_end, seq) FROM events WHERE session_id = ?1 \
                             ORDER BY seq DESC LIMIT 1";

const INSERT_TABLE: &str = "INSERT INTO events (session_id, seq, seq_end, turn_id, type, \
                            payload, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/// A commit's journal rows, as one pack at the next place in the
/// journal's order (or past the last pack, should one be there).
const INSERT_PACK: &str = "INSERT INTO event_journal_packs (id, events) VALUES \
    (MAX(?1, COALESCE((SELECT MAX(id) FROM event_journal_packs), 0) + 1), ?2)";

/// A session's events committed to the journal, not yet to its table.
#[derive(Debug)]
struct Pending {
    /// Where the pack of the first is in the journal's order.
    first_row: i64,
    events: Vec<Arc<StoredEvent>>,
}

/// The pending events of every session, as committed.
#[derive(Debug)]
pub struct Journal {
    shards: Vec<Mutex<HashMap<String, Pending>>>,
    /// Pending events the writer thread let go of (flushed, forgotten),
    /// freed by the next caller of the writer on its own thread
    /// ([`Self::retired`]): freeing them, with what the jobs held, was a
    /// tenth of the writer thread's time under paced streams.
    /// At most what the journal held; each caller of the writer takes
    /// them all.
    retired: Mutex<Vec<Vec<Arc<StoredEvent>>>>,
    /// The writer thread's own: each pending session by its first row
    /// (its pack's place: a pack holds many sessions' rows), the newest
    /// row, and the row below which all are deleted.
    rows: Mutex<Rows>,
}

#[derive(Debug, Default)]
struct Rows {
    oldest: BTreeSet<(i64, String)>,
    newest: i64,
    trimmed: i64,
}

/// A change to the pending events, made by a job and applied once its
/// commit is done.
#[derive(Debug)]
enum Op {
    Append {
        session: String,
        first_row: i64,
        last_row: i64,
        events: Vec<Arc<StoredEvent>>,
    },
    Flush {
        session: String,
    },
}

impl Op {
    fn session(&self) -> &str {
        match self {
            Self::Append { session, .. } | Self::Flush { session } => session,
        }
    }
}

/// The changes a group of jobs made, in order; a job that fails is taken
/// back ([`Stage::rollback`]).
#[derive(Debug)]
pub struct Stage<'j> {
    journal: &'j Journal,
    ops: Vec<Op>,
    /// The ops of each session, by index.
    touched: HashMap<String, Vec<usize>>,
    /// Flushes of sessions that reached [`FLUSH_AT`].
    flushes: usize,
    /// The place of this group's next pack in the journal's order.
    next_row: i64,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Default for Journal {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            retired: Mutex::default(),
            rows: Mutex::default(),
        }
    }
}

impl Journal {
    fn shard(&self, session: &str) -> &Mutex<HashMap<String, Pending>> {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(session);
        &self.shards[(hash as usize) % self.shards.len()]
    }

    /// A session's pending events past `after`, of `turn` if given.
    pub fn read(&self, session: &str, turn: Option<Uuid>, after: i64) -> Vec<Arc<StoredEvent>> {
        let shard = lock(self.shard(session));
        let Some(pending) = shard.get(session) else {
            return Vec::new();
        };
        pending
            .events
            .iter()
            .filter(|e| e.seq > after && turn.is_none_or(|t| e.turn_id == t))
            .cloned()
            .collect()
    }

    /// A session's last pending seq.
    pub fn last_seq(&self, session: &str) -> Option<i64> {
        let shard = lock(self.shard(session));
        shard
            .get(session)
            .and_then(|p| p.events.last())
            .map(|e| e.seq)
    }

    fn committed(&self, session: &str) -> Vec<Arc<StoredEvent>> {
        lock(self.shard(session))
            .get(session)
            .map(|p| p.events.clone())
            .unwrap_or_default()
    }

    pub fn stage(&self) -> Stage<'_> {
        Stage {
            journal: self,
            ops: Vec::new(),
            // A paced commit touches a session per stream it holds:
            // grown from empty, the map was rehashed several times a
            // commit (1.7 % of the writer thread).
            touched: HashMap::with_capacity(STAGE_SESSIONS),
            flushes: 0,
            next_row: lock(&self.rows).newest + 1,
        }
    }

    /// Makes a committed group's changes what readers see.
    pub fn apply(&self, stage: Stage<'_>) {
        let mut rows = lock(&self.rows);
        let mut retired = Vec::new();
        for op in stage.ops {
            let mut shard = lock(self.shard(op.session()));
            match op {
                Op::Append {
                    session,
                    first_row,
                    last_row,
                    events,
                } => {
                    rows.newest = rows.newest.max(last_row);
                    match shard.get_mut(&session) {
                        Some(pending) => pending.events.extend(events),
                        None => {
                            rows.oldest.insert((first_row, session.clone()));
                            shard.insert(session, Pending { first_row, events });
                        }
                    }
                }
                Op::Flush { session } => {
                    if let Some(pending) = shard.remove(&session) {
                        rows.oldest.remove(&(pending.first_row, session));
                        retired.push(pending.events);
                    }
                }
            }
        }
        if !retired.is_empty() {
            lock(&self.retired).append(&mut retired);
        }
    }

    /// The events the writer let go of since the last call (see the
    /// field), for the caller to drop.
    pub fn retired(&self) -> Vec<Vec<Arc<StoredEvent>>> {
        std::mem::take(&mut *lock(&self.retired))
    }

    /// The row below which the journal may be deleted, when enough are.
    pub fn trim_due(&self) -> Option<i64> {
        let rows = lock(&self.rows);
        let below = rows.oldest.first().map_or(rows.newest + 1, |(row, _)| *row);
        (below - rows.trimmed >= TRIM_EVERY).then_some(below)
    }

    /// Deletes the journal's packs below `below` (its first pages).
    pub fn trim(tx: &Connection, below: i64) -> Result<()> {
        tx.prepare_cached("DELETE FROM event_journal_packs WHERE id < ?1")?
            .execute(params![below])?;
        Ok(())
    }

    /// After the trim's commit.
    pub fn trimmed(&self, below: i64) {
        let mut rows = lock(&self.rows);
        rows.trimmed = rows.trimmed.max(below);
    }

    /// Sessions whose oldest pending row is [`SWEEP_BEHIND`] rows behind
    /// the newest, the oldest first, at most [`SWEEP_MAX`].
    pub fn stale(&self) -> Vec<String> {
        let rows = lock(&self.rows);
        rows.oldest
            .range(..(rows.newest - SWEEP_BEHIND, String::new()))
            .take(SWEEP_MAX)
            .map(|(_, session)| session.clone())
            .collect()
    }

    /// Whether nothing is pending.
    fn is_empty(&self) -> bool {
        lock(&self.rows).oldest.is_empty()
    }
}

impl Stage<'_> {
    /// A session's pending events as this group left them.
    fn view(&self, session: &str) -> Vec<Arc<StoredEvent>> {
        let mut events = self.journal.committed(session);
        for &at in self.touched.get(session).into_iter().flatten() {
            match &self.ops[at] {
                Op::Append { events: more, .. } => events.extend(more.iter().cloned()),
                Op::Flush { .. } => events.clear(),
            }
        }
        events
    }

    /// How many events a session has pending, and the last, as this
    /// group left them (without copying the rest).
    fn tail(&self, session: &str) -> (usize, Option<Arc<StoredEvent>>) {
        let (mut count, mut last) = {
            let shard = lock(self.journal.shard(session));
            shard
                .get(session)
                .map_or((0, None), |p| (p.events.len(), p.events.last().cloned()))
        };
        for &at in self.touched.get(session).into_iter().flatten() {
            match &self.ops[at] {
                Op::Append { events, .. } => {
                    count += events.len();
                    last = events.last().cloned().or(last);
                }
                Op::Flush { .. } => (count, last) = (0, None),
            }
        }
        (count, last)
    }

    /// A session's last pending seq, this group's changes included.
    pub fn last_seq(&self, session: &str) -> Option<i64> {
        self.tail(session).1.map(|e| e.seq)
    }

    fn push(&mut self, op: Op) {
        self.touched
            .entry(op.session().to_owned())
            .or_default()
            .push(self.ops.len());
        self.ops.push(op);
    }

    /// Where a job's changes start.
    pub fn mark(&self) -> usize {
        self.ops.len()
    }

    /// Takes back the changes made since `mark` (their job failed).
    pub fn rollback(&mut self, mark: usize) {
        if mark == 0 {
            self.flushes = 0;
        }
        if self.ops.len() <= mark {
            return;
        }
        self.ops.truncate(mark);
        for indexes in self.touched.values_mut() {
            indexes.retain(|&at| at < mark);
        }
        self.touched.retain(|_, indexes| !indexes.is_empty());
    }

    /// Moves `session`'s pending events into its table, then `more`.
    fn flush(&mut self, tx: &Connection, session: &str, more: &[Arc<StoredEvent>]) -> Result<()> {
        let mut events = self.view(session);
        let had = !events.is_empty();
        events.extend(more.iter().cloned());
        insert_rows(tx, &events)?;
        if had {
            self.push(Op::Flush {
                session: session.to_owned(),
            });
        }
        Ok(())
    }

    /// Drops a session's pending events (it is erased: their rows too).
    pub fn forget(&mut self, session: &str) {
        if self.tail(session).0 > 0 {
            self.push(Op::Flush {
                session: session.to_owned(),
            });
        }
    }

    /// Flushes the sessions [`Journal::stale`] named, each in a savepoint
    /// of its own.
    pub fn sweep(&mut self, tx: &Connection, sessions: &[String]) {
        for session in sessions {
            let flushed = tx
                .execute_batch("SAVEPOINT sweep")
                .map_err(StoreError::from)
                .and_then(|()| self.flush(tx, session, &[]));
            let ended = match flushed {
                Ok(()) => tx.execute_batch("RELEASE sweep"),
                Err(e) => {
                    // Its session is gone (an erase cannot leave events
                    // pending: it waits for the turn; this is a defect).
                    // The rows stay in the journal until trimmed, and
                    // nothing is pending.
                    tracing::error!(error = %e, session, "cannot move journaled events");
                    self.push(Op::Flush {
                        session: session.clone(),
                    });
                    tx.execute_batch("ROLLBACK TO sweep; RELEASE sweep")
                }
            };
            if let Err(e) = ended {
                tracing::error!(error = %e, "the journal's sweep could not end its savepoint");
            }
        }
    }
}

/// `events` as rows (runs where deltas follow each other) into the
/// table.
fn insert_rows(tx: &Connection, events: &[Arc<StoredEvent>]) -> Result<()> {
    let rows = runs::rows(events.iter().map(|e| &**e), ts);
    let mut insert = tx.prepare_cached(INSERT_TABLE)?;
    // A turn's id, written once per turn.
    let mut turn = String::new();
    let mut last_turn = None;
    for row in rows {
        let e = row.first();
        if last_turn != Some(e.turn_id) {
            turn = e.turn_id.to_string();
            last_turn = Some(e.turn_id);
        }
        insert.execute(params![
            e.session_id,
            e.seq,
            row.seq_end(),
            turn,
            e.event_type,
            row.payload(),
            ts(e.created_at)
        ])?;
    }
    Ok(())
}

/// Writes events: each session's to the journal while they are deltas
/// that follow its pending ones, else with its pending ones to its table
/// (see the module's text). The journaled ones of the call go in as one
/// pack.
///
/// Two events at one seq are [`StoreError::Conflict`], as a duplicate key
/// is; and since the table's key sees only a run's first seq, a session's
/// events must come after everything it holds (a turn's log only grows):
/// checked against its pending events, or its table when it has none and
/// a run or the journal is written (a row of one event keeps the key's
/// check alone).
pub(in crate::store) fn insert_events(
    tx: &Connection,
    stage: &mut Stage<'_>,
    events: impl Iterator<Item = Arc<StoredEvent>>,
) -> Result<()> {
    let mut events: Vec<Arc<StoredEvent>> = events.collect();
    runs::in_session_order(&mut events)?;
    let mut pack = Vec::new();
    let mut rows = 0;
    let mut journaled = Vec::new();
    for chunk in events.chunk_by(|a, b| a.session_id == b.session_id) {
        let session = chunk[0].session_id.as_str();
        let (count, last) = stage.tail(session);
        let room = if stage.flushes < FLUSH_BUDGET {
            FLUSH_AT
        } else {
            PENDING_MAX
        };
        let journals = count + chunk.len() < room
            && chunk.iter().all(|e| e.event_type == DELTA)
            && chunk.windows(2).all(|w| runs::continues(&w[0], &w[1]))
            && last
                .as_ref()
                .is_none_or(|last| runs::continues(last, &chunk[0]));
        let after = match &last {
            Some(last) => Some(last.seq),
            None if journals || chunk.len() > 1 => tx
                .prepare_cached(LAST_IN_TABLE)?
                .query_row(params![session], |row| row.get(0))
                .optional()?,
            None => None,
        };
        if after.is_some_and(|after| after >= chunk[0].seq) {
            return Err(StoreError::Conflict);
        }
        if !journals {
            stage.flushes += usize::from(count + chunk.len() >= FLUSH_AT);
            stage.flush(tx, session, chunk)?;
            continue;
        }
        rows += pack_rows(&mut pack, chunk)?;
        journaled.push(chunk);
    }
    if journaled.is_empty() {
        return Ok(());
    }
    pack.push(b']');
    let pack =
        String::from_utf8(pack).map_err(|e| StoreError::Corrupt(format!("a journal pack: {e}")))?;
    tx.prepare_cached(INSERT_PACK)?
        .execute(params![stage.next_row, pack])?;
    let first_row = tx.last_insert_rowid();
    stage.next_row = first_row + rows;
    for chunk in journaled {
        stage.push(Op::Append {
            session: chunk[0].session_id.clone(),
            first_row,
            last_row: first_row + rows - 1,
            events: chunk.to_vec(),
        });
    }
    Ok(())
}

mod packs;
use packs::pack_rows;
#[cfg(test)]
use packs::unpack;
pub(in crate::store) use packs::{erase_session, recover};

#[cfg(test)]
mod tests;
