//! Reads and writes on the writer thread's connection that the store's
//! jobs share: a turn's first reads, answered on its begin, and rows a
//! finish or a job adds.

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};

use super::{parse_ts, ts};
use crate::ids::SessionKey;
use crate::store::Result;
use crate::store::{
    MemoryQuery, MemoryRecord, MessageRecord, NewJob, ObservationRecord, jobs, records::parse_uuid,
    turns,
};

/// A turn's first read as the begin answers it: one that fails is left to
/// the turn (which reads again, and goes on without memories if that
/// fails too), so the begin itself stands.
pub(in crate::store) fn answered<T>(read: &str, result: Result<T>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(e) => {
            tracing::warn!(error = %e, read, "a turn's first read failed on the begin");
            None
        }
    }
}

/// [`crate::store::Turns::recent_messages`], on the writer's connection.
pub(in crate::store) fn recent_messages(
    tx: &Connection,
    session_id: &SessionKey,
    limit: u32,
) -> Result<Vec<MessageRecord>> {
    newest_messages(tx, turns::RECENT_MESSAGES, session_id.as_str(), limit)
}

/// [`crate::store::Turns::history`] of a branched session, on the
/// writer's connection: the last messages of `turn_id`'s branch.
pub(in crate::store) fn branch_messages(
    tx: &Connection,
    turn_id: uuid::Uuid,
    limit: u32,
) -> Result<Vec<MessageRecord>> {
    newest_messages(tx, turns::BRANCH_MESSAGES, &turn_id.to_string(), limit)
}

/// The messages `sql` reads newest first (`?1` its key, `?2` the limit),
/// oldest first.
fn newest_messages(
    tx: &Connection,
    sql: &str,
    key: &str,
    limit: u32,
) -> Result<Vec<MessageRecord>> {
    let mut statement = tx.prepare_cached(sql)?;
    let rows = statement.query_map(params![key, i64::from(limit)], |row| {
        Ok((
            row.get::<_, i64>(0)?,
            row.get::<_, Option<String>>(1)?,
            row.get::<_, String>(2)?,
            row.get::<_, String>(3)?,
            row.get::<_, String>(4)?,
            row.get::<_, String>(5)?,
            row.get::<_, Option<String>>(6)?,
        ))
    })?;
    let mut newest_first = Vec::new();
    for row in rows {
        let (id, message_id, turn_id, role, content, created_at, attachments) = row?;
        newest_first.push(MessageRecord {
            id,
            message_id: message_id.as_deref().map(parse_uuid).transpose()?,
            turn_id: parse_uuid(&turn_id)?,
            role,
            content,
            created_at: parse_ts(&created_at)?,
            attachments,
        });
    }
    newest_first.reverse();
    Ok(newest_first)
}

/// [`crate::store::Jobs::memories_for_turn`], on the writer's connection.
pub(in crate::store) fn memories_for_turn(
    tx: &Connection,
    query: &MemoryQuery,
) -> Result<(Vec<MemoryRecord>, Vec<MemoryRecord>)> {
    // Most scopes have no memories (a new user, extraction off): one
    // index probe answers them, not a full-text query (whose set-up was
    // most of a begin's time on this thread, and every begin queued
    // behind it waited it out: a profile in the git history of
    // docs/benchmarks.md).
    let any: Option<i64> = tx
        .prepare_cached("SELECT 1 FROM memories WHERE scope = ?1 LIMIT 1")?
        .query_row(params![query.scope], |row| row.get(0))
        .optional()?;
    if any.is_none() {
        return Ok((Vec::new(), Vec::new()));
    }
    let preferences = memories(
        tx,
        jobs::LIST_MEMORIES,
        params![query.scope, "preference", i64::from(query.preferences)],
    )?;
    let Some(terms) = crate::store::vault::searchable(&query.terms, query.limit) else {
        return Ok((Vec::new(), preferences));
    };
    let matches = memories(
        tx,
        crate::store::sqlite::SEARCH_MEMORY_TEXT,
        params![
            crate::store::sqlite::any_of(&terms),
            query.scope,
            i64::from(query.limit)
        ],
    )?;
    Ok((matches, preferences))
}

/// The memories `sql` selects (their columns in the usual order).
fn memories(
    tx: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<MemoryRecord>> {
    let mut statement = tx.prepare_cached(sql)?;
    let rows = statement.query_map(params, |row| {
        Ok((
            MemoryRecord {
                id: row.get(0)?,
                scope: row.get(1)?,
                kind: row.get(2)?,
                key: row.get(3)?,
                content: row.get(4)?,
                source_session_id: row.get(5)?,
                source_turn_id: row.get(6)?,
                created_at: DateTime::<Utc>::MIN_UTC,
                updated_at: DateTime::<Utc>::MIN_UTC,
            },
            row.get::<_, String>(7)?,
            row.get::<_, String>(8)?,
        ))
    })?;
    let mut found = Vec::new();
    for row in rows {
        let (mut memory, created_at, updated_at) = row?;
        memory.created_at = parse_ts(&created_at)?;
        memory.updated_at = parse_ts(&updated_at)?;
        found.push(memory);
    }
    Ok(found)
}

/// Keeps a research learner's observation.
pub(in crate::store) fn insert_observation(tx: &Connection, o: &ObservationRecord) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO research_observations (id, session_id, source_id, user_text, \
         assistant_text, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        o.id,
        o.session_id,
        o.source_id,
        o.user_text,
        o.assistant_text,
        ts(o.created_at)
    ])?;
    Ok(())
}

/// Queues a background job.
pub(in crate::store) fn insert_job(tx: &Connection, job: &NewJob) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO background_jobs (id, kind, session_id, turn_id, payload, status, \
         run_after, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?6, ?6)",
    )?
    .execute(params![
        job.id,
        job.kind,
        job.session_id,
        job.turn_id,
        job.payload,
        ts(job.at)
    ])?;
    Ok(())
}
