//! [`Jobs`] on Postgres: plain sqlx, each call bounded by the call
//! timeout (see [`PostgresStore::bounded`]); full-text search by
//! `tsvector`.

use async_trait::async_trait;

use super::{Jobs, MemoryParts};
use crate::store::Result;
use crate::store::{
    JobOutcome, JobRecord, JobUsage, JudgementRecord, MemoryQuery, MemoryRecord, NewJob, NewMemory,
    memories::MEMORIES_PER_SCOPE,
    postgres::PostgresStore,
    reader::{Reads, args, memory_columns},
    vault::{searchable, vector_bytes},
};

#[async_trait]
impl Jobs for PostgresStore {
    async fn search_memories(
        &self,
        scope: &str,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<MemoryRecord>> {
        let Some(terms) = searchable(terms, limit) else {
            return Ok(Vec::new());
        };
        let sql = concat!(
            "SELECT ",
            memory_columns!(),
            " FROM memories, to_tsquery('english', $2) q \
             WHERE scope = $1 AND tsv @@ q ORDER BY ts_rank_cd(tsv, q) DESC, updated_at DESC LIMIT $3"
        );
        self.reader()
            .rows(sql, args![scope, terms.join(" | "), limit])
            .await
    }

    /// Both parts in one statement: one round trip, one query for the
    /// server to run per turn.
    async fn memories_for_turn(&self, query: &MemoryQuery) -> Result<MemoryParts> {
        let MemoryQuery {
            scope,
            limit,
            preferences,
            ..
        } = query;
        #[derive(sqlx::FromRow)]
        struct Part {
            part: i32,
            #[sqlx(flatten)]
            memory: MemoryRecord,
        }
        let Some(terms) = searchable(&query.terms, *limit) else {
            let preferences = self
                .list_memories(scope, Some("preference"), *preferences)
                .await?;
            return Ok((Vec::new(), preferences));
        };
        let sql = concat!(
            "SELECT part, ",
            memory_columns!(),
            " FROM ( \
               (SELECT 0 AS part, row_number() OVER (ORDER BY ts_rank_cd(tsv, q) DESC, \
                 updated_at DESC) AS n, ",
            memory_columns!(),
            " FROM memories, to_tsquery('english', $2) q WHERE scope = $1 AND tsv @@ q \
               ORDER BY n LIMIT $3) \
               UNION ALL \
               (SELECT 1, row_number() OVER (ORDER BY updated_at DESC, id DESC), ",
            memory_columns!(),
            " FROM memories WHERE scope = $1 AND kind = 'preference' \
               ORDER BY 2 LIMIT $4) \
             ) both_parts ORDER BY part, n"
        );
        let rows: Vec<Part> = self
            .reader()
            .rows(sql, args![scope, terms.join(" | "), *limit, *preferences])
            .await?;
        let (found, preferred): (Vec<Part>, Vec<Part>) =
            rows.into_iter().partition(|p| p.part == 0);
        Ok((
            found.into_iter().map(|p| p.memory).collect(),
            preferred.into_iter().map(|p| p.memory).collect(),
        ))
    }

    /// Keeps a memory (one per scope and key), then drops the scope's
    /// least recently updated beyond the cap.
    async fn upsert_memory(&self, memory: &NewMemory, of_job: Option<&str>) -> Result<bool> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            if !job_is_there(&mut tx, of_job).await? {
                return Ok(false);
            }
            sqlx::query(
                "INSERT INTO memories (id, scope, kind, key, content, source_session_id, \
                 source_turn_id, embedding, embedding_model, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10) \
                 ON CONFLICT (scope, key) DO UPDATE SET kind = excluded.kind, \
                 content = excluded.content, source_session_id = excluded.source_session_id, \
                 source_turn_id = excluded.source_turn_id, embedding = excluded.embedding, \
                 embedding_model = excluded.embedding_model, updated_at = excluded.updated_at",
            )
            .bind(&memory.id)
            .bind(&memory.scope)
            .bind(&memory.kind)
            .bind(&memory.key)
            .bind(&memory.content)
            .bind(&memory.source_session_id)
            .bind(&memory.source_turn_id)
            .bind(memory.embedding.as_deref().map(vector_bytes))
            .bind(&memory.embedding_model)
            .bind(memory.at)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "DELETE FROM memories WHERE scope = $1 AND id IN (SELECT id FROM memories \
                 WHERE scope = $1 ORDER BY updated_at DESC, id DESC OFFSET $2)",
            )
            .bind(&memory.scope)
            .bind(MEMORIES_PER_SCOPE)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    async fn delete_memories(&self, scope: &str, id: Option<&str>) -> Result<u64> {
        let sql = "DELETE FROM memories WHERE scope = $1 AND ($2::text IS NULL OR id = $2)";
        let deleted = self.execute(sql, args![scope, id]).await?;
        Ok(deleted)
    }

    /// With `of_job`: the insert reads that job's row, locked (`FOR
    /// SHARE`), in its own statement; an erase that took it first makes
    /// the insert write nothing.
    async fn enqueue_job(&self, job: &NewJob, of_job: Option<&str>) -> Result<bool> {
        let sql = "INSERT INTO background_jobs (id, kind, session_id, turn_id, payload, status, \
                 run_after, created_at, updated_at) \
                 SELECT $1, $2, $3, $4, $5, 'pending', $6, $6, $6 \
                 WHERE $7::text IS NULL \
                    OR EXISTS (SELECT 1 FROM background_jobs WHERE id = $7 FOR SHARE)";
        let inserted = self
            .execute(
                sql,
                args![
                    &job.id,
                    &job.kind,
                    &job.session_id,
                    &job.turn_id,
                    &job.payload,
                    job.at,
                    of_job
                ],
            )
            .await?;
        Ok(inserted == 1)
    }

    /// Replicas claim jobs without waiting on each other (`SKIP LOCKED`).
    async fn claim_job(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        stale_before: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<JobRecord>> {
        self.bounded(async {
            let claimed: Option<JobRecord> = sqlx::query_as(
                "UPDATE background_jobs SET status = 'running', attempts = attempts + 1, \
                 claimed_at = $1, updated_at = $1 WHERE id = (SELECT id FROM background_jobs \
                 WHERE (status = 'pending' AND run_after <= $1) \
                 OR (status = 'running' AND claimed_at < $2) \
                 ORDER BY run_after, id LIMIT 1 FOR UPDATE SKIP LOCKED) \
                 RETURNING id, kind, session_id, turn_id, payload, attempts",
            )
            .bind(now)
            .bind(stale_before)
            .fetch_optional(self.writer())
            .await?;
            Ok(claimed)
        })
        .await
    }

    async fn finish_job(
        &self,
        id: &str,
        outcome: &JobOutcome,
        usage: &JobUsage,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<()> {
        // One statement: the outcome, and the run's usage added to the
        // totals (every run counts, whatever its outcome).
        let (status, error, after) = match outcome {
            JobOutcome::Done => ("done", None, None),
            JobOutcome::Retry { error, after } => ("pending", Some(error.as_str()), Some(*after)),
            JobOutcome::Failed { error } => ("failed", Some(error.as_str()), None),
        };
        let sql = "UPDATE background_jobs SET status = $2, last_error = $3, \
             run_after = COALESCE($4, run_after), \
             claimed_at = CASE WHEN $2 = 'pending' THEN NULL ELSE claimed_at END, \
             updated_at = $5, input_tokens = input_tokens + $6, \
             output_tokens = output_tokens + $7, \
             cost_usd = CASE WHEN $8::double precision IS NULL THEN cost_usd \
                             ELSE COALESCE(cost_usd, 0) + $8 END \
             WHERE id = $1";
        let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let args = args![
            id,
            status,
            error,
            after,
            now,
            tokens(usage.input_tokens),
            tokens(usage.output_tokens),
            usage.cost_usd
        ];
        self.execute(sql, args).await?;
        Ok(())
    }

    async fn shed_jobs(
        &self,
        kind: &str,
        keep: u64,
        why: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<u64> {
        let sql = "UPDATE background_jobs SET status = 'failed', last_error = $3, updated_at = $4 \
                 WHERE id IN (SELECT id FROM background_jobs WHERE status = 'pending' AND kind = $1 \
                 ORDER BY created_at, id \
                 LIMIT GREATEST((SELECT COUNT(*) FROM background_jobs WHERE status = 'pending') - $2, 0) \
                 FOR UPDATE SKIP LOCKED)";
        let shed = self
            .execute(
                sql,
                args![kind, i64::try_from(keep).unwrap_or(i64::MAX), why, now],
            )
            .await?;
        Ok(shed)
    }

    async fn put_judgement(
        &self,
        judgement: &JudgementRecord,
        of_job: Option<&str>,
    ) -> Result<bool> {
        let sql = "INSERT INTO judgements (id, session_id, turn_id, judge, prompt_id, prompt_version, \
                 score, passed, rationale, provider, model, created_at) \
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 \
                 WHERE $13::text IS NULL \
                    OR EXISTS (SELECT 1 FROM background_jobs WHERE id = $13 FOR SHARE)";
        let inserted = self
            .execute(
                sql,
                args![
                    &judgement.id,
                    &judgement.session_id,
                    &judgement.turn_id,
                    &judgement.judge,
                    &judgement.prompt_id,
                    &judgement.prompt_version,
                    judgement.score,
                    judgement.passed,
                    &judgement.rationale,
                    &judgement.provider,
                    &judgement.model,
                    judgement.created_at,
                    of_job
                ],
            )
            .await?;
        Ok(inserted == 1)
    }
}

/// Whether the job `id` still has its row (no job given: yes), locked
/// (`FOR SHARE`) until `tx` ends: an erase, which deletes a session's jobs
/// before the rest, then waits for what the job writes, and deletes it.
async fn job_is_there(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    id: Option<&str>,
) -> Result<bool> {
    let Some(id) = id else { return Ok(true) };
    let there: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM background_jobs WHERE id = $1 FOR SHARE")
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
    Ok(there.is_some())
}
