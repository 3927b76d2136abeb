//! The journal's packs: a commit's journal rows as one row of
//! `event_journal_packs`, each `[session_id, seq, seq_end, turn_id, type,
//! created_at, payload]` with the payload's JSON as it is; read back only
//! after a stop ([`recover`]) and when a session is erased.

use std::{collections::HashMap, io::Write as _, sync::Arc};

use rusqlite::{Connection, OptionalExtension, params};

use super::{INSERT_TABLE, LAST_IN_TABLE, Stage, runs};
use crate::events::StoredEvent;
use crate::store::{
    Result, StoreError,
    sqlite::time::{parse_ts, ts},
};

/// A journal row as a pack lists it: the session, seq, last seq of a run,
/// turn, type, time and payload an `events` row has.
type Packed = (
    String,
    i64,
    Option<i64>,
    String,
    String,
    String,
    Box<serde_json::value::RawValue>,
);

/// Adds `events` to a pack's JSON as journal rows (runs where deltas
/// follow each other, as the table would hold them); how many rows.
pub(super) fn pack_rows(pack: &mut Vec<u8>, events: &[Arc<StoredEvent>]) -> Result<i64> {
    let corrupt = |e: std::io::Error| StoreError::Corrupt(format!("a journal pack: {e}"));
    let mut count = 0;
    for row in runs::rows(events.iter().map(|e| &**e), ts) {
        let e = row.first();
        pack.extend_from_slice(if pack.is_empty() { b"[[" } else { b",[" });
        serde_json::to_writer(&mut *pack, &e.session_id).map_err(|e| corrupt(e.into()))?;
        match row.seq_end() {
            Some(end) => write!(pack, ",{},{end},\"{}\",", e.seq, e.turn_id),
            None => write!(pack, ",{},null,\"{}\",", e.seq, e.turn_id),
        }
        .map_err(corrupt)?;
        serde_json::to_writer(&mut *pack, &e.event_type).map_err(|e| corrupt(e.into()))?;
        write!(pack, ",\"{}\",", ts(e.created_at)).map_err(corrupt)?;
        // The payload is the event's JSON (a run's, a list of them).
        pack.extend_from_slice(row.payload().as_bytes());
        pack.push(b']');
        count += 1;
    }
    Ok(count)
}

/// A pack's rows.
pub(super) fn unpack(events: &str) -> Result<Vec<Packed>> {
    serde_json::from_str(events)
        .map_err(|e| StoreError::Corrupt(format!("a journal pack does not read: {e}")))
}

/// Deletes a session's rows from the journal (it is erased): from the
/// packs that hold one, each rewritten without them (or deleted when
/// nothing is left), and from what a process before the packs left. The
/// journal is small (it is trimmed behind the oldest pending row) and
/// has no index but its order.
pub(in crate::store) fn erase_session(tx: &Connection, session: &str) -> Result<()> {
    tx.prepare_cached("DELETE FROM event_journal WHERE session_id = ?1")?
        .execute(params![session])?;
    // The session as a pack writes it; a pack that holds it somewhere
    // else (in a payload) is read and left as it is.
    let quoted = serde_json::to_string(session)
        .map_err(|e| StoreError::Corrupt(format!("a session id: {e}")))?;
    let packs: Vec<(i64, String)> = tx
        .prepare_cached("SELECT id, events FROM event_journal_packs WHERE instr(events, ?1) > 0")?
        .query_map(params![quoted], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (id, events) in packs {
        let rows = unpack(&events)?;
        let before = rows.len();
        let kept: Vec<Packed> = rows.into_iter().filter(|row| row.0 != session).collect();
        if kept.len() == before {
            continue;
        }
        if kept.is_empty() {
            tx.prepare_cached("DELETE FROM event_journal_packs WHERE id = ?1")?
                .execute(params![id])?;
            continue;
        }
        let events = serde_json::to_string(&kept)
            .map_err(|e| StoreError::Corrupt(format!("a journal pack: {e}")))?;
        tx.prepare_cached("UPDATE event_journal_packs SET events = ?2 WHERE id = ?1")?
            .execute(params![id, events])?;
    }
    Ok(())
}

/// Moves what a stopped process left in the journal into the table (see
/// the module's text), and empties it. Nothing is pending in this
/// process yet; when something is, the journal is left alone.
pub(in crate::store) fn recover(tx: &Connection, stage: &Stage<'_>) -> Result<usize> {
    if !stage.journal.is_empty() || !stage.ops.is_empty() {
        return Ok(0);
    }
    let mut mover = Mover {
        tx,
        last: HashMap::new(),
        turns: HashMap::new(),
        moved: 0,
    };
    // What a process before the packs left, then the packs, in order.
    let mut select = tx.prepare_cached(
        "SELECT session_id, seq, seq_end, turn_id, type, created_at, payload \
         FROM event_journal ORDER BY id",
    )?;
    let mut rows = select.query([])?;
    while let Some(row) = rows.next()? {
        mover.offer(Recovered::try_from(row)?)?;
    }
    drop(rows);
    let mut packs = tx.prepare_cached("SELECT events FROM event_journal_packs ORDER BY id")?;
    let mut rows = packs.query([])?;
    while let Some(row) = rows.next()? {
        let events: String = row.get(0)?;
        for (session, seq, seq_end, turn, kind, created_at, payload) in unpack(&events)? {
            let payload = String::from(payload.get());
            mover.offer((session, seq, seq_end, turn, kind, created_at, payload))?;
        }
    }
    drop(rows);
    tx.execute("DELETE FROM event_journal", [])?;
    tx.execute("DELETE FROM event_journal_packs", [])?;
    Ok(mover.moved)
}

/// A journal row read back: session, seq, last seq of a run, turn, type,
/// time, payload.
type Recovered = (String, i64, Option<i64>, String, String, String, String);

/// Moves journal rows read back after a stop into their tables.
struct Mover<'c> {
    tx: &'c Connection,
    /// Each session's last seq in its table, as moved so far.
    last: HashMap<String, i64>,
    /// Whether each row's turn is still there, by turn and session.
    turns: HashMap<(String, String), bool>,
    moved: usize,
}

impl Mover<'_> {
    /// Moves a row past its session's last seq in the table, whose turn
    /// is still there (an erased session's is not).
    fn offer(&mut self, row: Recovered) -> Result<()> {
        let (session, seq, seq_end, turn, kind, created_at, payload) = row;
        parse_ts(&created_at)?;
        let known = (turn, session);
        let there = match self.turns.get(&known) {
            Some(&there) => there,
            None => {
                let there = self
                    .tx
                    .prepare_cached("SELECT 1 FROM turns WHERE id = ?1 AND session_id = ?2")?
                    .query_row(params![known.0, known.1], |_| Ok(()))
                    .optional()?
                    .is_some();
                self.turns.insert(known.clone(), there);
                there
            }
        };
        let (turn, session) = known;
        if !there {
            return Ok(());
        }
        let end = match self.last.get(&session) {
            Some(&end) => end,
            None => self
                .tx
                .prepare_cached(LAST_IN_TABLE)?
                .query_row(params![session], |r| r.get(0))
                .optional()?
                .unwrap_or(0),
        };
        if seq > end {
            self.tx.prepare_cached(INSERT_TABLE)?.execute(params![
                session, seq, seq_end, turn, kind, payload, created_at
            ])?;
            self.moved += 1;
        }
        self.last.insert(session, end.max(seq_end.unwrap_or(seq)));
        Ok(())
    }
}
