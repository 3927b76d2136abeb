//! [`EventLog`] on SQLite: each write is one job on the writer thread.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};
use uuid::Uuid;

use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::Connection;

use super::{
    Batch, EventLog,
    gather::{Chain, Gather},
    journal::{Stage, insert_events},
};
use crate::ids::SessionKey;
use crate::store::Result;
use crate::{
    events::StoredEvent,
    store::{
        NewStep, StoreError, TurnFinish,
        sqlite::{
            SqliteStore,
            writer::{insert_job, insert_observation, ts},
        },
        webhooks::{routes, sqlite::insert_deliveries},
    },
};

#[async_trait]
impl EventLog for SqliteStore {
    async fn commit(&self, batch: Batch<'_>) -> Result<Vec<bool>> {
        let events = batch.events.to_vec();
        let leases = batch.leases.to_vec();
        let fence = batch.fence;
        let steps: Vec<NewStep> = batch.steps.iter().map(|s| (*s).clone()).collect();
        let finishes: Vec<TurnFinish> = batch.finishes.iter().map(|f| (*f).clone()).collect();
        self.writes
            .run_logged(move |tx, stage| {
                let steps: Vec<&NewStep> = steps.iter().collect();
                let finishes: Vec<&TurnFinish> = finishes.iter().collect();
                let batch = Batch {
                    events: &events,
                    steps: &steps,
                    finishes: &finishes,
                    leases: &leases,
                    fence,
                };
                write_on(tx, stage, batch)
            })
            .await
    }

    fn commits_in_order(&self) -> bool {
        true
    }

    /// One job on the writer thread, chained; it takes its batch when
    /// the thread runs it.
    async fn commit_gathered(
        &self,
        gather: Arc<Mutex<dyn Gather>>,
        chain: Chain,
    ) -> Result<Vec<bool>> {
        self.writes
            .run_chained(Some(chain), move |tx, stage| {
                let mut gather = gather.lock().unwrap_or_else(PoisonError::into_inner);
                gather.gather();
                let parts = gather.parts();
                if parts.is_empty() {
                    return Ok(Vec::new());
                }
                write_on(tx, stage, parts.batch())
            })
            .await
    }

    /// The table's events, then those still pending in the journal (read
    /// first: see `journal.rs`).
    async fn list_events(
        &self,
        session_id: &SessionKey,
        turn_id: Option<Uuid>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>> {
        let pending = self
            .writes
            .journal()
            .read(session_id.as_str(), turn_id, after);
        let mut events = super::list_table(self, session_id, turn_id, after, limit).await?;
        let last = events.last().map_or(after, |e| e.seq);
        let room = (limit as usize).saturating_sub(events.len());
        let later = pending.iter().filter(|e| e.seq > last).take(room);
        events.extend(later.map(|e| StoredEvent::clone(e)));
        Ok(events)
    }

    async fn append_session_event(&self, event: &StoredEvent) -> Result<bool> {
        let event = event.clone();
        self.writes
            .run(move |connection| {
                let running: Option<String> = connection
                    .prepare_cached(
                        "SELECT id FROM turns WHERE session_id = ?1 AND status = 'running'",
                    )?
                    .query_row(params![event.session_id], |row| row.get(0))
                    .optional()?;
                if running.is_some() {
                    return Ok(false);
                }
                let seq: i64 = connection
                .prepare_cached(
                    "UPDATE sessions SET last_seq = last_seq + 1 WHERE id = ?1 RETURNING last_seq",
                )?
                .query_row(params![event.session_id], |row| row.get(0))?;
                connection
                    .prepare_cached(
                        "INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    )?
                    .execute(params![
                        event.session_id,
                        seq,
                        event.turn_id.to_string(),
                        event.event_type,
                        event.payload,
                        ts(event.created_at)
                    ])?;
                Ok(true)
            })
            .await
    }
}

/// Writes `batch` in the writer's transaction (see [`EventLog::commit`]).
fn write_on(tx: &Connection, stage: &mut Stage<'_>, batch: Batch<'_>) -> Result<Vec<bool>> {
    let Batch {
        events,
        steps,
        finishes,
        leases,
        fence,
    } = batch;
    // One process writes a SQLite store; a lease is lost only to
    // a take-over by the same process after a restart, but the
    // rule holds here as on Postgres: a fenced batch's events
    // and records are checked against their turns' leases.
    let mut held = tx.prepare_cached("SELECT attempt FROM turns WHERE id = ?1")?;
    // A finish holds its own lease (it does not apply once lost);
    // the events and records of a turn hold theirs here.
    let writes = |turn_id| {
        events.iter().any(|e| e.turn_id == turn_id) || steps.iter().any(|s| s.turn_id == turn_id)
    };
    let fenced = leases.iter().filter(|l| fence && writes(l.turn_id));
    for lease in fenced {
        let attempt: Option<u32> = held
            .query_row(params![lease.turn_id.to_string()], |row| row.get(0))
            .optional()?;
        if attempt.is_some_and(|a| a != lease.attempt) {
            return Err(StoreError::LeaseLost(lease.turn_id));
        }
    }
    drop(held);
    let mut step = tx.prepare_cached(
        "INSERT INTO turn_steps (turn_id, step, phase, record, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
    )?;
    for s in steps {
        step.execute(params![
            s.turn_id.to_string(),
            s.step,
            s.phase,
            s.record,
            ts(s.created_at)
        ])?;
    }
    drop(step);
    let mut applied = Vec::with_capacity(finishes.len());
    for finish in finishes {
        applied.push(apply_finish(tx, finish)?);
    }
    let ended = || {
        finishes
            .iter()
            .zip(&applied)
            .filter(|(_, applied)| **applied)
            .map(|(finish, _)| finish)
    };
    let terminals = ended().map(|finish| finish.terminal.clone());
    insert_events(tx, stage, events.iter().cloned().chain(terminals))?;
    // The webhook messages of what was written, with it.
    let waits = events.iter().flat_map(|event| routes(event, false));
    let ends = ended().flat_map(|finish| routes(&finish.terminal, finish.background));
    insert_deliveries(tx, waits.chain(ends))?;
    Ok(applied)
}

/// Ends a finish's turn, unless it no longer runs as the finish's attempt
/// (false: nothing written), with its messages, decision, observation,
/// jobs and its session's totals.
fn apply_finish(tx: &Connection, finish: &TurnFinish) -> Result<bool> {
    let at = ts(finish.terminal.created_at);
    let turn_id = finish.turn_id.to_string();
    let updated = tx
        .prepare_cached(
            "UPDATE turns SET status = ?1, result = ?2, error_code = ?3, \
             error_message = ?4, finished_at = ?5, cost_usd = ?7 \
             WHERE id = ?6 AND status = 'running' AND attempt = ?8",
        )?
        .execute(params![
            finish.status.as_str(),
            finish.result,
            finish.error_code,
            finish.error_message,
            at,
            turn_id,
            finish.cost_usd,
            finish.attempt
        ])?;
    if updated != 1 {
        return Ok(false);
    }
    tx.prepare_cached("DELETE FROM turn_steps WHERE turn_id = ?1")?
        .execute(params![turn_id])?;
    let mut message = tx.prepare_cached(
        "INSERT INTO messages (message_id, session_id, turn_id, role, content, \
         created_at, attachments) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    for m in &finish.messages {
        message.execute(params![
            m.id.to_string(),
            finish.session_id.as_str(),
            turn_id,
            m.role,
            m.content,
            at,
            m.attachments
        ])?;
    }
    if let Some(d) = &finish.decision {
        tx.prepare_cached(
            "INSERT INTO decisions (id, session_id, turn_id, decision_key, strategy, \
             record, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            d.id.to_string(),
            finish.session_id.as_str(),
            turn_id,
            d.decision_key,
            d.strategy,
            d.record,
            at
        ])?;
    }
    if let Some(o) = &finish.observation {
        insert_observation(tx, o)?;
    }
    for job in &finish.jobs {
        insert_job(tx, job)?;
    }
    tx.prepare_cached(
        "UPDATE sessions SET updated_at = ?1, last_seq = ?4, \
         cost_usd = COALESCE(cost_usd + ?3, cost_usd, ?3) WHERE id = ?2",
    )?
    .execute(params![
        at,
        finish.session_id.as_str(),
        finish.cost_usd,
        finish.terminal.seq
    ])?;
    Ok(true)
}
