//! The Postgres backend, selected by a `postgres://` `DATABASE_URL`.

use std::time::Duration;

use sqlx::{
    Postgres, Transaction,
    migrate::Migrator,
    postgres::{PgPool, PgPoolOptions},
};

use super::{
    BeganTurn, BeginTurnError, CANCEL_CHANNEL, CancelRequests, IndexedNote, NewArtifact,
    NewCheckpoint, NewTurn, OrphanScope, StoreError, TurnFinish, VaultHit,
    memory::{
        JobOutcome, JobRecord, JudgementRecord, MemoryRecord, NewJob, NewMemory, ObservationRecord,
    },
    records::parse_uuid,
    sql::{IDS_PER_UPDATE, ORPHANS_PER_SWEEP, insert_rows},
};
use crate::events::{StoredEvent, TurnEvent};

/// Chunks per multi-row insert (6 parameters each).
const VAULT_CHUNKS_PER_INSERT: usize = 200;

/// Postgres implementation of [`super::Store`].
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// Connections of their own for the heartbeat and the orphan sweep: a
    /// pool busy with requests must not delay a live turn's heartbeat
    /// until another replica takes the turn for an orphan.
    control: PgPool,
}

/// Connections of [`PostgresStore::control`].
const CONTROL_CONNECTIONS: u32 = 2;

impl PostgresStore {
    pub(super) const MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");

    pub async fn connect(
        url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let pool = Self::pool_options(max_connections, acquire_timeout)
            .connect(url)
            .await?;
        Ok(Self::from_pool(pool))
    }

    /// The pool's settings: a request that cannot get a connection within
    /// `acquire_timeout` (the database is down) fails instead of waiting.
    pub fn pool_options(max_connections: u32, acquire_timeout: Duration) -> PgPoolOptions {
        PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(acquire_timeout)
    }

    /// Uses an existing pool (tests point it at a schema of their own).
    pub fn from_pool(pool: PgPool) -> Self {
        let control = PgPoolOptions::new()
            .max_connections(CONTROL_CONNECTIONS)
            .acquire_timeout(pool.options().get_acquire_timeout())
            .connect_lazy_with((*pool.connect_options()).clone());
        Self { pool, control }
    }

    fn writer(&self) -> &PgPool {
        &self.pool
    }

    fn reader(&self) -> &PgPool {
        &self.pool
    }

    async fn begin_write(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.pool.begin().await
    }
}

impl PostgresStore {
    /// A listener on [`CANCEL_CHANNEL`]; see
    /// [`super::Store::cancel_requests`].
    pub(super) async fn cancel_listener(&self) -> Result<Option<CancelRequests>, StoreError> {
        use futures::StreamExt;
        let mut listener = sqlx::postgres::PgListener::connect_with(&self.pool).await?;
        listener.listen(CANCEL_CHANNEL).await?;
        let requests = async_stream::stream! {
            loop {
                // `recv` reconnects a lost connection on the next call.
                match listener.recv().await {
                    Ok(notification) => {
                        if let Ok(turn_id) = uuid::Uuid::parse_str(notification.payload()) {
                            yield Ok(turn_id);
                        }
                    }
                    Err(e) => yield Err(StoreError::from(e)),
                }
            }
        };
        Ok(Some(requests.boxed()))
    }
}

super::sql::impl_store!(PostgresStore, Postgres, "postgres");

// The write half: plain sqlx, one statement at a time in a transaction.
// (SQLite has its own, a job per transaction on a writer thread: see
// `super::sqlite`.)
impl PostgresStore {
    pub(super) async fn write_begin_turn(
        &self,
        turn: &NewTurn,
    ) -> Result<BeganTurn, BeginTurnError> {
        // One statement, so one round trip and its own transaction: the
        // session row (made, or updated if it is the tenant's: else no row
        // comes back and nothing is written), the turn, and its
        // `turn.started` event. No turn of the session runs (else the
        // unique index refuses the turn and the whole statement), so
        // `last_seq` is the session's newest event: the turn starts after
        // it. The caller looks for the conflict when one is refused.
        let began: Result<Option<(i64, Option<f64>, i64)>, sqlx::Error> = sqlx::query_as(
            "WITH s AS ( \
               INSERT INTO sessions (id, created_at, updated_at, turn_count, last_seq, tenant) \
               VALUES ($1, $2, $2, 1, 1, $3) \
               ON CONFLICT (id) DO UPDATE SET updated_at = excluded.updated_at, \
               turn_count = sessions.turn_count + 1, last_seq = sessions.last_seq + 1 \
               WHERE sessions.tenant = excluded.tenant \
               RETURNING turn_count, cost_usd, last_seq \
             ), t AS ( \
               INSERT INTO turns (id, session_id, status, request, idempotency_key, \
               owner_instance, owner_process, heartbeat_at, first_seq, created_at) \
               SELECT $4, $1, 'running', $5, $6, $7, $8, $2, s.last_seq, $2 FROM s \
             ), e AS ( \
               INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) \
               SELECT $1, s.last_seq, $4, 'turn.started', $9, $2 FROM s \
             ) \
             SELECT turn_count, cost_usd, last_seq FROM s",
        )
        .bind(&turn.session_id)
        .bind(turn.created_at)
        .bind(&turn.tenant)
        .bind(turn.id.to_string())
        .bind(&turn.request)
        .bind(&turn.idempotency_key)
        .bind(&turn.owner_instance)
        .bind(&turn.owner_process)
        .bind(&turn.started_payload)
        .fetch_optional(self.writer())
        .await;
        match began {
            Ok(Some((turn_count, session_cost, seq))) => Ok(BeganTurn {
                first_seq: seq,
                turn_number: u64::try_from(turn_count).unwrap_or(1),
                session_cost_before: session_cost,
            }),
            Ok(None) => Err(BeginTurnError::SessionNotFound),
            // A running turn or a used idempotency key: nothing was
            // written; the caller finds which.
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                Err(StoreError::Conflict.into())
            }
            Err(e) => Err(StoreError::from(e).into()),
        }
    }
    pub(super) async fn write_batch_of(
        &self,
        events: &[std::sync::Arc<StoredEvent>],
        finishes: &[&TurnFinish],
    ) -> Result<Vec<bool>, StoreError> {
        if finishes.is_empty() && insert_rows(events.len()) == events.len() {
            // One statement is its own transaction: no BEGIN and
            // COMMIT round trips for the common batch of deltas.
            if !events.is_empty() {
                let mut conn = self.writer().acquire().await?;
                insert_events(&mut conn, events.iter().map(|e| &**e)).await?;
            }
            return Ok(Vec::new());
        }
        let mut tx = self.begin_write().await?;
        // Rows are locked in one order everywhere: a session before
        // its turns, sessions by id (see `lock_session`). Applied in
        // that order, reported in the caller's.
        let mut order: Vec<usize> = (0..finishes.len()).collect();
        order.sort_by(|&a, &b| {
            (&finishes[a].session_id, finishes[a].turn_id)
                .cmp(&(&finishes[b].session_id, finishes[b].turn_id))
        });
        let mut applied = vec![false; finishes.len()];
        for index in order {
            let finish = finishes[index];
            lock_session(&mut tx, &finish.session_id).await?;
            let updated = sqlx::query(
                "UPDATE turns SET status = $1, result = $2, error_code = $3, \
                 error_message = $4, finished_at = $5, cost_usd = $7 \
                 WHERE id = $6 AND status = 'running'",
            )
            .bind(finish.status.as_str())
            .bind(&finish.result)
            .bind(&finish.error_code)
            .bind(&finish.error_message)
            .bind(finish.terminal.created_at)
            .bind(finish.turn_id.to_string())
            .bind(finish.cost_usd)
            .execute(&mut *tx)
            .await?;
            if updated.rows_affected() != 1 {
                continue;
            }
            applied[index] = true;
            let turn_id = finish.turn_id.to_string();
            if !finish.messages.is_empty() {
                let mut qb = sqlx::QueryBuilder::<Postgres>::new(
                    "INSERT INTO messages (message_id, session_id, turn_id, role, content, created_at) ",
                );
                qb.push_values(&finish.messages, |mut row, message| {
                    row.push_bind(message.id.to_string())
                        .push_bind(finish.session_id.clone())
                        .push_bind(turn_id.clone())
                        .push_bind(message.role.clone())
                        .push_bind(message.content.clone())
                        .push_bind(finish.terminal.created_at);
                });
                qb.build().execute(&mut *tx).await?;
            }
            if let Some(decision) = &finish.decision {
                sqlx::query(
                    "INSERT INTO decisions (id, session_id, turn_id, decision_key, \
                     strategy, record, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(decision.id.to_string())
                .bind(&finish.session_id)
                .bind(&turn_id)
                .bind(&decision.decision_key)
                .bind(&decision.strategy)
                .bind(&decision.record)
                .bind(finish.terminal.created_at)
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query(
                "UPDATE sessions SET updated_at = $1, last_seq = $4, \
                 cost_usd = COALESCE(cost_usd + $3, cost_usd, $3) WHERE id = $2",
            )
            .bind(finish.terminal.created_at)
            .bind(&finish.session_id)
            .bind(finish.cost_usd)
            .bind(finish.terminal.seq)
            .execute(&mut *tx)
            .await?;
        }
        // The events and the terminal events of the finishes that
        // applied, in as few statements as their number allows.
        let terminals = finishes
            .iter()
            .zip(&applied)
            .filter(|(_, applied)| **applied)
            .map(|(finish, _)| &*finish.terminal);
        insert_events(&mut tx, events.iter().map(|e| &**e).chain(terminals)).await?;
        tx.commit().await?;
        Ok(applied)
    }
    pub(super) async fn write_artifact(&self, artifact: &NewArtifact) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO artifacts (id, session_id, turn_id, call_id, tool, content, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&artifact.id)
        .bind(&artifact.session_id)
        .bind(&artifact.turn_id)
        .bind(&artifact.call_id)
        .bind(&artifact.tool)
        .bind(&artifact.content)
        .bind(artifact.created_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
    /// Indexes a note in place of what was indexed at its path; the note's
    /// row is locked first, so two indexers of one note take turns.
    pub(super) async fn write_vault_note(&self, note: &IndexedNote) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO vault_notes (path, content_hash, bytes, indexed_at, embedding_model) \
             VALUES ($1, $2, $3, now(), $4) ON CONFLICT (path) DO UPDATE SET \
             content_hash = excluded.content_hash, bytes = excluded.bytes, \
             indexed_at = excluded.indexed_at, embedding_model = excluded.embedding_model",
        )
        .bind(&note.path)
        .bind(&note.content_hash)
        .bind(note.bytes)
        .bind(&note.embedding_model)
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM vault_chunks WHERE path = $1")
            .bind(&note.path)
            .execute(&mut *tx)
            .await?;
        let mut ordinal: i32 = 0;
        for rows in note.chunks.chunks(VAULT_CHUNKS_PER_INSERT) {
            let mut insert = sqlx::QueryBuilder::<Postgres>::new(
                "INSERT INTO vault_chunks (path, ordinal, heading, anchor, text, embedding) ",
            );
            insert.push_values(rows, |mut row, chunk| {
                row.push_bind(&note.path)
                    .push_bind(ordinal)
                    .push_bind(&chunk.heading)
                    .push_bind(&chunk.anchor)
                    .push_bind(&chunk.text)
                    .push_bind(chunk.embedding.as_deref().map(super::vault::vector_bytes));
                ordinal += 1;
            });
            insert.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn write_vault_removals(&self, paths: &[String]) -> Result<u64, StoreError> {
        let mut tx = self.begin_write().await?;
        let removed = sqlx::query("DELETE FROM vault_notes WHERE path = ANY($1)")
            .bind(paths)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(removed)
    }

    /// `tsvector` matches of any of the terms, ranked by how many of the
    /// terms a chunk matches, then by `ts_rank_cd` (heading weighted above
    /// text): `ts_rank_cd` alone ranks a heading naming one word above a
    /// passage with all of them.
    pub(super) async fn search_vault(
        &self,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<VaultHit>, StoreError> {
        let mut query = sqlx::QueryBuilder::<Postgres>::new(
            "SELECT c.id, c.path, c.heading, c.anchor, c.text, (0",
        );
        for term in terms {
            query.push(" + (c.tsv @@ to_tsquery('english', ");
            query.push_bind(term.clone());
            query.push("))::int");
        }
        query.push(
            ")::float8 + ts_rank_cd(c.tsv, q)::float8 / (1 + ts_rank_cd(c.tsv, q)::float8) AS score \
             FROM vault_chunks c, to_tsquery('english', ",
        );
        query.push_bind(terms.join(" | "));
        query.push(") q WHERE c.tsv @@ q ORDER BY score DESC, c.id LIMIT ");
        query.push_bind(i64::from(limit));
        let rows: Vec<(i64, String, String, String, String, f64)> =
            query.build_query_as().fetch_all(&self.pool).await?;
        Ok(rows
            .into_iter()
            .map(|(id, path, heading, anchor, text, score)| VaultHit {
                id,
                path,
                heading,
                anchor,
                text,
                score,
            })
            .collect())
    }

    pub(super) async fn write_checkpoint(
        &self,
        checkpoint: &NewCheckpoint,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO checkpoints (id, session_id, turn_id, call_id, tool, path, existed, \
             content, bytes, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&checkpoint.id)
        .bind(&checkpoint.session_id)
        .bind(&checkpoint.turn_id)
        .bind(&checkpoint.call_id)
        .bind(&checkpoint.tool)
        .bind(&checkpoint.path)
        .bind(checkpoint.content.is_some())
        .bind(checkpoint.content.as_deref())
        .bind(
            checkpoint
                .content
                .as_ref()
                .map(|c| i64::try_from(c.len()).unwrap_or(i64::MAX)),
        )
        .bind(checkpoint.created_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn write_checkpoint_restored(
        &self,
        id: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE checkpoints SET restored_at = $2 WHERE id = $1 AND restored_at IS NULL",
        )
        .bind(id)
        .bind(at)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(done == 1)
    }

    /// Keeps a memory (one per scope and key), then drops the scope's
    /// least recently updated beyond the cap.
    pub(super) async fn write_memory(&self, memory: &NewMemory) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
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
        .bind(memory.embedding.as_deref().map(super::vault::vector_bytes))
        .bind(&memory.embedding_model)
        .bind(memory.at)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "DELETE FROM memories WHERE scope = $1 AND id IN (SELECT id FROM memories \
             WHERE scope = $1 ORDER BY updated_at DESC, id DESC OFFSET $2)",
        )
        .bind(&memory.scope)
        .bind(super::memory::MEMORIES_PER_SCOPE)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn search_memory_text(
        &self,
        scope: &str,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<MemoryRecord>, StoreError> {
        let sql = concat!(
            "SELECT ",
            super::sql::memory_columns!(),
            " FROM memories, to_tsquery('english', $2) q \
             WHERE scope = $1 AND tsv @@ q ORDER BY ts_rank_cd(tsv, q) DESC, updated_at DESC LIMIT $3"
        );
        Ok(sqlx::query_as::<_, MemoryRecord>(sql)
            .bind(scope)
            .bind(terms.join(" | "))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?)
    }

    pub(super) async fn write_memory_deletion(
        &self,
        scope: &str,
        id: Option<&str>,
    ) -> Result<u64, StoreError> {
        let mut tx = self.begin_write().await?;
        let deleted =
            sqlx::query("DELETE FROM memories WHERE scope = $1 AND ($2::text IS NULL OR id = $2)")
                .bind(scope)
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        tx.commit().await?;
        Ok(deleted)
    }

    pub(super) async fn write_job(&self, job: &NewJob) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO background_jobs (id, kind, session_id, turn_id, payload, status, \
             run_after, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, 'pending', $6, $6, $6)",
        )
        .bind(&job.id)
        .bind(&job.kind)
        .bind(&job.session_id)
        .bind(&job.turn_id)
        .bind(&job.payload)
        .bind(job.at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Replicas claim jobs without waiting on each other (`SKIP LOCKED`).
    pub(super) async fn write_job_claim(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        stale_before: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<JobRecord>, StoreError> {
        let mut tx = self.begin_write().await?;
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
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(claimed)
    }

    pub(super) async fn write_job_outcome(
        &self,
        id: &str,
        outcome: &JobOutcome,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let query = match outcome {
            JobOutcome::Done {
                input_tokens,
                output_tokens,
                cost_usd,
            } => sqlx::query(
                "UPDATE background_jobs SET status = 'done', input_tokens = $2, \
                 output_tokens = $3, cost_usd = $4, last_error = NULL, updated_at = $5 WHERE id = $1",
            )
            .bind(id)
            .bind(i64::try_from(*input_tokens).unwrap_or(i64::MAX))
            .bind(i64::try_from(*output_tokens).unwrap_or(i64::MAX))
            .bind(*cost_usd)
            .bind(now),
            JobOutcome::Retry { error, after } => sqlx::query(
                "UPDATE background_jobs SET status = 'pending', last_error = $2, run_after = $3, \
                 claimed_at = NULL, updated_at = $4 WHERE id = $1",
            )
            .bind(id)
            .bind(error)
            .bind(*after)
            .bind(now),
            JobOutcome::Failed { error } => sqlx::query(
                "UPDATE background_jobs SET status = 'failed', last_error = $2, updated_at = $3 \
                 WHERE id = $1",
            )
            .bind(id)
            .bind(error)
            .bind(now),
        };
        query.execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn write_judgement(
        &self,
        judgement: &JudgementRecord,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO judgements (id, session_id, turn_id, judge, prompt_id, prompt_version, \
             score, passed, rationale, provider, model, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        )
        .bind(&judgement.id)
        .bind(&judgement.session_id)
        .bind(&judgement.turn_id)
        .bind(&judgement.judge)
        .bind(&judgement.prompt_id)
        .bind(&judgement.prompt_version)
        .bind(judgement.score)
        .bind(judgement.passed)
        .bind(&judgement.rationale)
        .bind(&judgement.provider)
        .bind(&judgement.model)
        .bind(judgement.created_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The session row is locked first (as a turn's begin and end lock
    /// it), then no running turn is checked in a statement of its own, so
    /// that a turn that began meanwhile is seen. `event.seq` is not used:
    /// the event takes the session's next.
    pub(super) async fn write_session_event(&self, event: StoredEvent) -> Result<bool, StoreError> {
        let mut tx = self.begin_write().await?;
        let locked: Option<i64> =
            sqlx::query_scalar("SELECT last_seq FROM sessions WHERE id = $1 FOR NO KEY UPDATE")
                .bind(&event.session_id)
                .fetch_optional(&mut *tx)
                .await?;
        if locked.is_none() {
            return Err(StoreError::Corrupt(format!(
                "no session {}",
                event.session_id
            )));
        }
        let running: Option<String> =
            sqlx::query_scalar("SELECT id FROM turns WHERE session_id = $1 AND status = 'running'")
                .bind(&event.session_id)
                .fetch_optional(&mut *tx)
                .await?;
        if running.is_some() {
            return Ok(false);
        }
        let seq: i64 = sqlx::query_scalar(
            "UPDATE sessions SET last_seq = last_seq + 1 WHERE id = $1 RETURNING last_seq",
        )
        .bind(&event.session_id)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&event.session_id)
        .bind(seq)
        .bind(event.turn_id.to_string())
        .bind(event.event_type.as_str())
        .bind(&event.payload)
        .bind(event.created_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    pub(super) async fn write_observation(
        &self,
        observation: &ObservationRecord,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO research_observations (id, session_id, source_id, user_text, \
             assistant_text, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&observation.id)
        .bind(&observation.session_id)
        .bind(&observation.source_id)
        .bind(&observation.user_text)
        .bind(&observation.assistant_text)
        .bind(observation.created_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn write_api_key(
        &self,
        id: &str,
        tenant: &str,
        key_hash: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO api_keys (id, tenant, key_hash, created_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(id)
        .bind(tenant)
        .bind(key_hash)
        .bind(at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn write_api_key_revocation(
        &self,
        id: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin_write().await?;
        let done =
            sqlx::query("UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL")
                .bind(id)
                .bind(at)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        tx.commit().await?;
        Ok(done == 1)
    }

    pub(super) async fn write_approval(
        &self,
        session_id: &str,
        turn_id: uuid::Uuid,
        call_id: &str,
        approved: bool,
        reason: Option<&str>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin_write().await?;
        let inserted = sqlx::query(
            "INSERT INTO approvals (turn_id, call_id, session_id, approved, reason, decided_at) \
             VALUES ($1, $2, $3, $4, $5, now()) ON CONFLICT (turn_id, call_id) DO NOTHING",
        )
        .bind(turn_id.to_string())
        .bind(call_id)
        .bind(session_id)
        .bind(approved)
        .bind(reason)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(inserted == 1)
    }

    pub(super) async fn write_cancel_request(
        &self,
        turn_id: uuid::Uuid,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE turns SET cancel_requested = TRUE WHERE id = $1 AND status = 'running'",
        )
        .bind(turn_id.to_string())
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 1 {
            // Delivered on commit to every listening replica; the
            // flag stays for the owner's heartbeat if none listens.
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(CANCEL_CHANNEL)
                .bind(turn_id.to_string())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }
    pub(super) async fn write_heartbeat(
        &self,
        turn_ids: &[uuid::Uuid],
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<uuid::Uuid>, StoreError> {
        if turn_ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.control.begin().await?;
        // The turns are alive now, however long the connection took.
        let now = now.max(chrono::Utc::now());
        let mut cancelled = Vec::new();
        for chunk in turn_ids.chunks(IDS_PER_UPDATE) {
            // A row locked by someone else is being ended (or swept):
            // skip it rather than wait. A heartbeat that waits while
            // holding other turns' rows is half of a deadlock with a
            // transaction ending those turns in another order.
            let mut qb = sqlx::QueryBuilder::<Postgres>::new("UPDATE turns SET heartbeat_at = ");
            qb.push_bind(now);
            qb.push(" WHERE id IN (SELECT id FROM turns WHERE status = 'running' AND id IN (");
            let mut ids = qb.separated(", ");
            for id in chunk {
                ids.push_bind(id.to_string());
            }
            qb.push(") ORDER BY id FOR NO KEY UPDATE SKIP LOCKED) RETURNING id, cancel_requested");
            let rows: Vec<(String, bool)> = qb.build_query_as().fetch_all(&mut *tx).await?;
            for (id, cancel) in rows {
                if cancel {
                    cancelled.push(parse_uuid(&id)?);
                }
            }
        }
        tx.commit().await?;
        Ok(cancelled)
    }
    pub(super) async fn write_orphan_interrupts(
        &self,
        scope: &OrphanScope,
        reason: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let candidates: Vec<(String, String)> = sqlx::query_as(
            "SELECT id, session_id FROM turns WHERE status = 'running' \
             AND ((owner_instance = $1 AND owner_process <> $2) OR heartbeat_at < $3) \
             ORDER BY created_at LIMIT $4",
        )
        .bind(&scope.instance)
        .bind(&scope.process)
        .bind(scope.stale_before)
        .bind(ORPHANS_PER_SWEEP)
        .fetch_all(&self.control)
        .await?;
        let event = TurnEvent::TurnInterrupted {
            reason: reason.to_owned(),
        };
        let mut interrupted = Vec::with_capacity(candidates.len());
        for (turn_id, session_id) in candidates {
            if scope.alive.contains(&parse_uuid(&turn_id)?) {
                continue;
            }
            let mut tx = self.control.begin().await?;
            lock_session(&mut tx, &session_id).await?;
            // Still an orphan under the lock: a heartbeat that landed
            // since the candidates were read keeps its turn.
            let updated = sqlx::query(
                "UPDATE turns SET status = 'interrupted', error_code = 'interrupted', \
                 error_message = $1, finished_at = $2 WHERE id = $3 AND status = 'running' \
                 AND ((owner_instance = $4 AND owner_process <> $5) OR heartbeat_at < $6)",
            )
            .bind(reason)
            .bind(now)
            .bind(&turn_id)
            .bind(&scope.instance)
            .bind(&scope.process)
            .bind(scope.stale_before)
            .execute(&mut *tx)
            .await?;
            if updated.rows_affected() != 1 {
                continue;
            }
            let seq: i64 = sqlx::query_scalar(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE session_id = $1",
            )
            .bind(&session_id)
            .fetch_one(&mut *tx)
            .await?;
            let stored = StoredEvent::new(&session_id, parse_uuid(&turn_id)?, seq, &event, now)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            insert_events(&mut tx, std::iter::once(&stored)).await?;
            sqlx::query("UPDATE sessions SET last_seq = $1 WHERE id = $2")
                .bind(seq)
                .bind(&session_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            interrupted.push(stored);
        }
        Ok(interrupted)
    }
}

/// Locks a session's row for the rest of the transaction. Every
/// transaction that changes a turn locks its session first (a
/// begin's upsert does so by itself), so no two wait on each other
/// in opposite orders: a begin waiting on a turn's end that waits
/// on the begin's session row was a deadlock.
async fn lock_session(
    conn: &mut <Postgres as sqlx::Database>::Connection,
    session_id: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT 1 FROM sessions WHERE id = $1 FOR NO KEY UPDATE")
        .bind(session_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Inserts events with multi-row `INSERT`s.
async fn insert_events<'e>(
    conn: &mut <Postgres as sqlx::Database>::Connection,
    events: impl Iterator<Item = &'e StoredEvent>,
) -> Result<(), sqlx::Error> {
    let events: Vec<&StoredEvent> = events.collect();
    let mut rest: &[&StoredEvent] = &events;
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(insert_rows(rest.len()));
        rest = tail;
        let mut qb = sqlx::QueryBuilder::<Postgres>::new(
            "INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) ",
        );
        qb.push_values(chunk, |mut row, e| {
            row.push_bind(e.session_id.clone())
                .push_bind(e.seq)
                .push_bind(e.turn_id.to_string())
                .push_bind(e.event_type.clone())
                .push_bind(e.payload.clone())
                .push_bind(e.created_at);
        });
        qb.build().execute(&mut *conn).await?;
    }
    Ok(())
}
