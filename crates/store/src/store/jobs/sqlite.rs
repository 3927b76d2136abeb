//! [`Jobs`] on SQLite: each write is one job on the writer thread; the
//! full-text reads use FTS5 on the reader pool.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::params;

use super::{Jobs, MemoryParts};
use crate::store::Result;
use crate::store::{
    JobOutcome, JobRecord, JobUsage, JudgementRecord, MemoryQuery, MemoryRecord, NewJob, NewMemory,
    reader::{Reads, args},
    sqlite::{
        SEARCH_MEMORY_TEXT, SqliteStore, any_of,
        writer::{insert_job, ts},
    },
    vault::searchable,
};

#[async_trait]
impl Jobs for SqliteStore {
    /// FTS5 over the scope's memories, any of the terms, by BM25.
    async fn search_memories(
        &self,
        scope: &str,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<MemoryRecord>> {
        let Some(terms) = searchable(terms, limit) else {
            return Ok(Vec::new());
        };
        self.reader()
            .rows(SEARCH_MEMORY_TEXT, args![any_of(&terms), scope, limit])
            .await
    }

    /// The two parts read side by side (the reader pool has connections to
    /// spare; SQLite answers in-process).
    async fn memories_for_turn(&self, query: &MemoryQuery) -> Result<MemoryParts> {
        let scope = query.scope.as_str();
        tokio::try_join!(
            self.search_memories(scope, &query.terms, query.limit),
            self.list_memories(scope, Some("preference"), query.preferences)
        )
    }

    async fn upsert_memory(&self, memory: &NewMemory, of_job: Option<&str>) -> Result<bool> {
        let memory = memory.clone();
        let of_job = of_job.map(str::to_owned);
        self.writes
            .run(move |connection| {
                if !job_is_there(connection, of_job.as_deref())? {
                    return Ok(false);
                }
                connection
                    .prepare_cached(
                        "INSERT INTO memories (id, scope, kind, key, content, source_session_id, \
                     source_turn_id, embedding, embedding_model, created_at, updated_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10) \
                     ON CONFLICT (scope, key) DO UPDATE SET kind = excluded.kind, \
                     content = excluded.content, source_session_id = excluded.source_session_id, \
                     source_turn_id = excluded.source_turn_id, embedding = excluded.embedding, \
                     embedding_model = excluded.embedding_model, updated_at = excluded.updated_at",
                    )?
                    .execute(params![
                        memory.id,
                        memory.scope,
                        memory.kind,
                        memory.key,
                        memory.content,
                        memory.source_session_id,
                        memory.source_turn_id,
                        memory
                            .embedding
                            .as_deref()
                            .map(crate::store::vault::vector_bytes),
                        memory.embedding_model,
                        ts(memory.at)
                    ])?;
                connection
                    .prepare_cached(
                        "DELETE FROM memories WHERE scope = ?1 AND id IN (SELECT id FROM memories \
                     WHERE scope = ?1 ORDER BY updated_at DESC, id DESC LIMIT -1 OFFSET ?2)",
                    )?
                    .execute(params![
                        memory.scope,
                        crate::store::memories::MEMORIES_PER_SCOPE
                    ])?;
                Ok(true)
            })
            .await
    }

    async fn delete_memories(&self, scope: &str, id: Option<&str>) -> Result<u64> {
        let (scope, id) = (scope.to_owned(), id.map(str::to_owned));
        self.writes
            .run(move |connection| {
                // Forgotten is overwritten with zeros in the file (as an
                // erase is), not only unlinked.
                connection.execute_batch("PRAGMA secure_delete = ON")?;
                let deleted = connection
                    .prepare_cached(
                        "DELETE FROM memories WHERE scope = ?1 AND (?2 IS NULL OR id = ?2)",
                    )
                    .and_then(|mut statement| statement.execute(params![scope, id]));
                connection.execute_batch("PRAGMA secure_delete = OFF")?;
                Ok(u64::try_from(deleted?).unwrap_or(u64::MAX))
            })
            .await
    }

    async fn enqueue_job(&self, job: &NewJob, of_job: Option<&str>) -> Result<bool> {
        let job = job.clone();
        let of_job = of_job.map(str::to_owned);
        self.writes
            .run(move |connection| {
                if !job_is_there(connection, of_job.as_deref())? {
                    return Ok(false);
                }
                insert_job(connection, &job)?;
                Ok(true)
            })
            .await
    }

    async fn claim_job(
        &self,
        now: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> Result<Option<JobRecord>> {
        self.writes
            .run(move |connection| {
                let mut claim = connection.prepare_cached(
                    "UPDATE background_jobs SET status = 'running', attempts = attempts + 1, \
                 claimed_at = ?1, updated_at = ?1 WHERE id = (SELECT id FROM background_jobs \
                 WHERE (status = 'pending' AND run_after <= ?1) \
                 OR (status = 'running' AND claimed_at < ?2) ORDER BY run_after, id LIMIT 1) \
                 RETURNING id, kind, session_id, turn_id, payload, attempts",
                )?;
                let mut rows = claim.query(params![ts(now), ts(stale_before)])?;
                match rows.next()? {
                    Some(row) => Ok(Some(JobRecord {
                        id: row.get(0)?,
                        kind: row.get(1)?,
                        session_id: row.get(2)?,
                        turn_id: row.get(3)?,
                        payload: row.get(4)?,
                        attempts: row.get(5)?,
                    })),
                    None => Ok(None),
                }
            })
            .await
    }

    async fn finish_job(
        &self,
        id: &str,
        outcome: &JobOutcome,
        usage: &JobUsage,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let (id, outcome, usage) = (id.to_owned(), outcome.clone(), *usage);
        self.writes
            .run(move |connection| {
                match &outcome {
                    JobOutcome::Done => connection
                        .prepare_cached(
                            "UPDATE background_jobs SET status = 'done', last_error = NULL, \
                         updated_at = ?2 WHERE id = ?1",
                        )?
                        .execute(params![id, ts(now)])?,
                    JobOutcome::Retry { error, after } => connection
                        .prepare_cached(
                            "UPDATE background_jobs SET status = 'pending', last_error = ?2, \
                         run_after = ?3, claimed_at = NULL, updated_at = ?4 WHERE id = ?1",
                        )?
                        .execute(params![id, error, ts(*after), ts(now)])?,
                    JobOutcome::Failed { error } => connection
                        .prepare_cached(
                            "UPDATE background_jobs SET status = 'failed', last_error = ?2, \
                         updated_at = ?3 WHERE id = ?1",
                        )?
                        .execute(params![id, error, ts(now)])?,
                };
                // Every run's usage counts, whatever its outcome (one job:
                // both updates commit together).
                connection
                    .prepare_cached(
                        "UPDATE background_jobs SET input_tokens = input_tokens + ?2, \
                 output_tokens = output_tokens + ?3, \
                 cost_usd = CASE WHEN ?4 IS NULL THEN cost_usd ELSE COALESCE(cost_usd, 0) + ?4 END \
                 WHERE id = ?1",
                    )?
                    .execute(params![
                        id,
                        i64::try_from(usage.input_tokens).unwrap_or(i64::MAX),
                        i64::try_from(usage.output_tokens).unwrap_or(i64::MAX),
                        usage.cost_usd,
                    ])?;
                Ok(())
            })
            .await
    }

    async fn shed_jobs(&self, kind: &str, keep: u64, why: &str, now: DateTime<Utc>) -> Result<u64> {
        let (kind, why) = (kind.to_owned(), why.to_owned());
        self.writes
            .run(move |connection| {
                let shed = connection
                    .prepare_cached(
                        "UPDATE background_jobs SET status = 'failed', last_error = ?3, \
                     updated_at = ?4 WHERE id IN (SELECT id FROM background_jobs \
                     WHERE status = 'pending' AND kind = ?1 ORDER BY created_at, id \
                     LIMIT MAX((SELECT COUNT(*) FROM background_jobs \
                     WHERE status = 'pending') - ?2, 0))",
                    )?
                    .execute(params![
                        kind,
                        i64::try_from(keep).unwrap_or(i64::MAX),
                        why,
                        ts(now)
                    ])?;
                Ok(u64::try_from(shed).unwrap_or(0))
            })
            .await
    }

    async fn put_judgement(
        &self,
        judgement: &JudgementRecord,
        of_job: Option<&str>,
    ) -> Result<bool> {
        let judgement = judgement.clone();
        let of_job = of_job.map(str::to_owned);
        self.writes
            .run(move |connection| {
                if !job_is_there(connection, of_job.as_deref())? {
                    return Ok(false);
                }
                connection
                    .prepare_cached(
                        "INSERT INTO judgements (id, session_id, turn_id, judge, prompt_id, \
                     prompt_version, score, passed, rationale, provider, model, created_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                    )?
                    .execute(params![
                        judgement.id,
                        judgement.session_id,
                        judgement.turn_id,
                        judgement.judge,
                        judgement.prompt_id,
                        judgement.prompt_version,
                        judgement.score,
                        judgement.passed,
                        judgement.rationale,
                        judgement.provider,
                        judgement.model,
                        ts(judgement.created_at)
                    ])?;
                Ok(true)
            })
            .await
    }
}

/// Whether the job `id` still has its row (no job given: yes), read in
/// the writer's transaction that then writes what the job made.
fn job_is_there(connection: &rusqlite::Connection, id: Option<&str>) -> Result<bool> {
    let Some(id) = id else { return Ok(true) };
    let there = connection
        .prepare_cached("SELECT 1 FROM background_jobs WHERE id = ?1")?
        .exists(params![id])?;
    Ok(there)
}
