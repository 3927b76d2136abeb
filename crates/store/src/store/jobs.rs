//! The work beside turns: memories, the background jobs that make them
//! (and judge turns), judgements and the research learner's observations.
//!
//! The shared reads are written once here; each backend's writes (and
//! its full-text search) stand side by side in `jobs/sqlite.rs` and
//! `jobs/postgres.rs`.

mod postgres;
mod sqlite;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    JobBacklog, JobOutcome, JobRecord, JobSummary, JobUsage, JudgementRecord, MemoryQuery,
    MemoryRecord, NewJob, NewMemory, ObservationRecord,
    reader::{Reads, args, memory_columns},
};
use crate::ids::SessionKey;
use crate::store::Result;

/// A scope's memories, newest first: `$1` scope, `$2` kind or NULL, `$3` limit.
pub(super) const LIST_MEMORIES: &str = concat!(
    "SELECT ",
    memory_columns!(),
    " FROM memories WHERE scope = $1 AND ($2 IS NULL OR kind = $2) \
     ORDER BY updated_at DESC, id DESC LIMIT $3"
);

/// A turn's memories: those matching its message, and the preferences.
pub type MemoryParts = (Vec<MemoryRecord>, Vec<MemoryRecord>);

/// Memories, jobs, judgements and observations.
#[async_trait]
pub trait Jobs: Reads + Send + Sync + 'static {
    /// Keeps a memory, replacing the scope's memory of the same key; the
    /// scope keeps its newest [`super::memories::MEMORIES_PER_SCOPE`].
    /// With `of_job`: only while that job's row is there, checked in the
    /// same transaction (an erase takes a session's jobs first): false,
    /// and nothing written, once it is gone.
    async fn upsert_memory(&self, memory: &NewMemory, of_job: Option<&str>) -> Result<bool>;

    /// Memories of `scope` matching any of `terms`, best first.
    async fn search_memories(
        &self,
        scope: &str,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<MemoryRecord>>;

    /// What a turn reads of a scope's memories before it asks the model,
    /// in one read: the memories matching any of the query's terms (best
    /// first, up to its `limit`, as [`Self::search_memories`]) and the
    /// scope's preferences (newest first, up to its `preferences`).
    async fn memories_for_turn(&self, query: &MemoryQuery) -> Result<MemoryParts>;

    /// Memories of `scope` (of one kind, if given), newest first.
    async fn list_memories(
        &self,
        scope: &str,
        kind: Option<&str>,
        limit: u32,
    ) -> Result<Vec<MemoryRecord>> {
        self.reader()
            .rows(LIST_MEMORIES, args![scope, kind, limit])
            .await
    }

    /// The embeddings `model` made of `scope`'s memories, by memory id.
    async fn memory_vectors(&self, scope: &str, model: &str) -> Result<Vec<(String, Vec<f32>)>> {
        let sql = "SELECT id, embedding FROM memories \
             WHERE scope = $1 AND embedding_model = $2 AND embedding IS NOT NULL";
        let rows: Vec<(String, Vec<u8>)> = self.reader().rows(sql, args![scope, model]).await?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, bytes)| super::vault::vector_of(&bytes).map(|v| (id, v)))
            .collect())
    }

    /// Forgets one memory of `scope` (`id`) or all of them; how many went.
    async fn delete_memories(&self, scope: &str, id: Option<&str>) -> Result<u64>;

    /// Queues work to run after a turn; with `of_job`, only while that
    /// job's row is there (false, and nothing queued, once it is gone).
    async fn enqueue_job(&self, job: &NewJob, of_job: Option<&str>) -> Result<bool>;

    /// Claims the oldest job due at `now` (or a running one claimed before
    /// `stale_before`: its runner died); its attempts go up by one.
    async fn claim_job(
        &self,
        now: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> Result<Option<JobRecord>>;

    /// Records how a claimed job's run ended, adding the usage it took to
    /// the job's totals.
    async fn finish_job(
        &self,
        id: &str,
        outcome: &JobOutcome,
        usage: &JobUsage,
        now: DateTime<Utc>,
    ) -> Result<()>;

    /// The jobs waiting to run (`pending`), of every session.
    async fn job_backlog(&self) -> Result<JobBacklog> {
        let sql = "SELECT COUNT(*), MIN(created_at) FROM background_jobs WHERE status = 'pending'";
        let row: Option<(i64, Option<DateTime<Utc>>)> = self.reader().row(sql, args![]).await?;
        let (pending, oldest) = row.unwrap_or((0, None));
        Ok(JobBacklog {
            pending: u64::try_from(pending).unwrap_or(0),
            oldest,
        })
    }

    /// Gives up the oldest waiting jobs of `kind` (`failed`, with `why`)
    /// until at most `keep` jobs of any kind wait; returns how many.
    async fn shed_jobs(&self, kind: &str, keep: u64, why: &str, now: DateTime<Utc>) -> Result<u64>;

    /// The newest `limit` jobs of a session, oldest first.
    async fn list_jobs(&self, session_id: &SessionKey, limit: u32) -> Result<Vec<JobSummary>> {
        let sql = "SELECT id, kind, turn_id, status, attempts, last_error, input_tokens, \
             output_tokens, cost_usd, created_at, updated_at FROM background_jobs \
             WHERE session_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2";
        let mut newest_first: Vec<JobSummary> =
            self.reader().rows(sql, args![session_id, limit]).await?;
        newest_first.reverse();
        Ok(newest_first)
    }

    /// Keeps a judgement; with `of_job`, only while that job's row is
    /// there (as [`Self::upsert_memory`]).
    async fn put_judgement(
        &self,
        judgement: &JudgementRecord,
        of_job: Option<&str>,
    ) -> Result<bool>;

    /// The judgements of a turn, oldest first.
    async fn list_judgements(
        &self,
        session_id: &SessionKey,
        turn_id: Uuid,
    ) -> Result<Vec<JudgementRecord>> {
        let sql = "SELECT id, session_id, turn_id, judge, prompt_id, prompt_version, score, \
             passed, rationale, provider, model, created_at FROM judgements \
             WHERE session_id = $1 AND turn_id = $2 ORDER BY created_at, id";
        self.reader().rows(sql, args![session_id, turn_id]).await
    }

    /// The newest `limit` observations of a session, oldest first.
    async fn list_observations(
        &self,
        session_id: &SessionKey,
        limit: u32,
    ) -> Result<Vec<ObservationRecord>> {
        let sql = "SELECT id, session_id, source_id, user_text, assistant_text, created_at \
             FROM research_observations WHERE session_id = $1 \
             ORDER BY created_at DESC, id DESC LIMIT $2";
        let mut newest_first: Vec<ObservationRecord> =
            self.reader().rows(sql, args![session_id, limit]).await?;
        newest_first.reverse();
        Ok(newest_first)
    }
}
