//! The Postgres backend, selected by a `postgres://` `DATABASE_URL`.

use std::time::Duration;

use sqlx::{
    Postgres, Transaction,
    migrate::Migrator,
    postgres::{PgPool, PgPoolOptions},
};

use super::{
    BeganTurn, BeginTurnError, CANCEL_CHANNEL, CancelRequests, IndexedNote, NewArtifact,
    NewCheckpoint, NewTurn, OrphanScope, PoolLimits, StoreError, TurnContext, TurnFinish, VaultHit,
    memories::{JobOutcome, JobRecord, JobUsage, JudgementRecord, MemoryRecord, NewJob, NewMemory},
    records::parse_uuid,
    sql::{IDS_PER_UPDATE, ORPHANS_PER_SWEEP},
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
    /// The longest a call waits for an answer (see [`Self::into_store`]).
    call_timeout: Duration,
}

/// Connections of [`PostgresStore::control`].
const CONTROL_CONNECTIONS: u32 = 2;

/// How long a connection coming back after a call gave up on it has to
/// answer a ping before it is dropped.
const RELEASE_TEST: Duration = Duration::from_secs(1);

impl PostgresStore {
    pub(super) const MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");
    /// The begin statement checks for a running turn and a used
    /// idempotency key itself.
    pub(super) const READ_BEFORE_BEGIN: bool = false;

    pub async fn connect(url: &str, limits: PoolLimits) -> Result<Self, StoreError> {
        let pool = Self::pool_options(limits).connect(url).await?;
        Ok(Self::from_pool(pool, limits.call_timeout))
    }

    /// The pool's settings: a request that cannot get a connection within
    /// `acquire_timeout` (the database is down) fails instead of waiting.
    ///
    /// A session the server holds for a client that went silent inside a
    /// transaction (its link cut) keeps its row locks until the server
    /// ends it: each connection asks the server to end such a session
    /// after `call_timeout` idle in a transaction (no transaction of the
    /// service waits between its statements). A connection coming back
    /// just after a call gave up on it is tested within a bound, and
    /// dropped if it does not answer, instead of holding its slot for as
    /// long as TCP waits.
    pub fn pool_options(limits: PoolLimits) -> PgPoolOptions {
        let idle_in_transaction = format!(
            "SET idle_in_transaction_session_timeout = {}",
            limits.call_timeout.as_millis().max(1)
        );
        PgPoolOptions::new()
            .max_connections(limits.max_connections.max(1))
            .acquire_timeout(limits.acquire_timeout)
            .after_connect(move |conn, _| {
                let statement = idle_in_transaction.clone();
                Box::pin(async move {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
                        .execute(conn)
                        .await
                        .map(|_| ())
                })
            })
            .after_release(|conn, _| {
                Box::pin(async move {
                    if !super::bounded::recently_abandoned() {
                        return Ok(true);
                    }
                    match tokio::time::timeout(RELEASE_TEST, sqlx::Connection::ping(conn)).await {
                        Ok(answered) => answered.map(|()| true),
                        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "the connection did not answer",
                        ))),
                    }
                })
            })
    }

    /// Uses an existing pool made with [`Self::pool_options`] (tests point
    /// it at a schema of their own).
    pub fn from_pool(pool: PgPool, call_timeout: Duration) -> Self {
        let limits = PoolLimits {
            max_connections: CONTROL_CONNECTIONS,
            acquire_timeout: pool.options().get_acquire_timeout(),
            call_timeout,
        };
        let control =
            Self::pool_options(limits).connect_lazy_with((*pool.connect_options()).clone());
        Self {
            pool,
            control,
            call_timeout,
        }
    }

    /// The store, each call bounded by the call timeout (see
    /// [`super::bounded`]).
    pub fn into_store(self) -> std::sync::Arc<dyn super::Store> {
        let limit = self.call_timeout;
        super::bounded::Bounded::wrap(std::sync::Arc::new(self), limit)
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
        // session row (made, or updated if it is the tenant's), the turn,
        // and its `turn.started` event. Nothing is written, and no lock
        // taken, when the session has a running turn or the idempotency
        // key was used (as of the statement's snapshot; one that commits
        // meanwhile makes the unique index refuse the turn instead), so a
        // burst of POSTs on a busy session does not queue on its row. No
        // turn of the session runs, so `last_seq` is the session's newest
        // event: the turn starts after it. The row that always comes back
        // says why nothing was written; the caller names the conflict.
        type Began = (Option<i64>, Option<f64>, Option<i64>, bool);
        let began: Result<Began, sqlx::Error> = sqlx::query_as(
            "WITH s AS ( \
               INSERT INTO sessions (id, created_at, updated_at, turn_count, last_seq, tenant) \
               SELECT $1, $2, $2, 1, 1, $3 \
               WHERE NOT EXISTS (SELECT 1 FROM turns WHERE session_id = $1 AND status = 'running') \
               AND ($6::text IS NULL OR NOT EXISTS \
                 (SELECT 1 FROM turns WHERE session_id = $1 AND idempotency_key = $6)) \
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
             SELECT s.turn_count, s.cost_usd, s.last_seq, \
               EXISTS (SELECT 1 FROM sessions WHERE id = $1 AND tenant <> $3) \
             FROM (VALUES (1)) AS one LEFT JOIN s ON TRUE",
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
        .fetch_one(self.writer())
        .await;
        match began {
            Ok((Some(turn_count), session_cost, Some(seq), _)) => Ok(BeganTurn {
                first_seq: seq,
                turn_number: u64::try_from(turn_count).unwrap_or(1),
                session_cost_before: session_cost,
                // Read by the turn: each read is its own round trip here.
                context: TurnContext::default(),
            }),
            Ok((_, _, _, true)) => Err(BeginTurnError::SessionNotFound),
            // A running turn or a used idempotency key: nothing was
            // written; the caller finds which.
            Ok(_) => Err(StoreError::Conflict.into()),
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
        if finishes.is_empty() {
            // One statement is its own transaction: no BEGIN and COMMIT
            // round trips for the common batch of deltas.
            if !events.is_empty() {
                insert_events(self.writer(), events.iter().map(|e| &**e)).await?;
            }
            return Ok(Vec::new());
        }
        // However many turns end in the batch, four round trips: BEGIN,
        // the sessions' locks, one statement for everything, COMMIT.
        let mut tx = self.begin_write().await?;
        // Rows are locked in one order everywhere: a session before its
        // turns, sessions by id (see `lock_session`). In a statement of
        // its own, so that the locks are held before any turn is touched.
        let mut sessions: Vec<&str> = finishes.iter().map(|f| f.session_id.as_str()).collect();
        sessions.sort_unstable();
        sessions.dedup();
        sqlx::query("SELECT 1 FROM sessions WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE")
            .bind(&sessions)
            .execute(&mut *tx)
            .await?;
        let (ended, _): (Vec<String>, i64) = finish_statement(events, finishes)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(finishes
            .iter()
            .map(|finish| ended.contains(&finish.turn_id.to_string()))
            .collect())
    }
    pub(super) async fn write_artifact(&self, artifact: &NewArtifact) -> Result<(), StoreError> {
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
        .execute(self.writer())
        .await?;
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
        let removed = sqlx::query("DELETE FROM vault_notes WHERE path = ANY($1)")
            .bind(paths)
            .execute(self.writer())
            .await?
            .rows_affected();
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
        .execute(self.writer())
        .await?;
        Ok(())
    }

    pub(super) async fn write_checkpoint_restored(
        &self,
        id: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE checkpoints SET restored_at = $2 WHERE id = $1 AND restored_at IS NULL",
        )
        .bind(id)
        .bind(at)
        .execute(self.writer())
        .await?
        .rows_affected();
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
        .bind(super::memories::MEMORIES_PER_SCOPE)
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

    /// Both parts in one statement: one round trip, one query for the
    /// server to run per turn.
    pub(super) async fn read_memories_for_turn(
        &self,
        scope: &str,
        terms: &[String],
        limit: u32,
        preferences: u32,
    ) -> Result<(Vec<MemoryRecord>, Vec<MemoryRecord>), StoreError> {
        #[derive(sqlx::FromRow)]
        struct Part {
            part: i32,
            #[sqlx(flatten)]
            memory: MemoryRecord,
        }
        let sql = concat!(
            "SELECT part, ",
            super::sql::memory_columns!(),
            " FROM ( \
               (SELECT 0 AS part, row_number() OVER (ORDER BY ts_rank_cd(tsv, q) DESC, \
                 updated_at DESC) AS n, ",
            super::sql::memory_columns!(),
            " FROM memories, to_tsquery('english', $2) q WHERE scope = $1 AND tsv @@ q \
               ORDER BY n LIMIT $3) \
               UNION ALL \
               (SELECT 1, row_number() OVER (ORDER BY updated_at DESC, id DESC), ",
            super::sql::memory_columns!(),
            " FROM memories WHERE scope = $1 AND kind = 'preference' \
               ORDER BY 2 LIMIT $4) \
             ) both_parts ORDER BY part, n"
        );
        let rows: Vec<Part> = sqlx::query_as(sql)
            .bind(scope)
            .bind(terms.join(" | "))
            .bind(i64::from(limit))
            .bind(i64::from(preferences))
            .fetch_all(&self.pool)
            .await?;
        let (found, preferred): (Vec<Part>, Vec<Part>) =
            rows.into_iter().partition(|p| p.part == 0);
        Ok((
            found.into_iter().map(|p| p.memory).collect(),
            preferred.into_iter().map(|p| p.memory).collect(),
        ))
    }

    pub(super) async fn write_memory_deletion(
        &self,
        scope: &str,
        id: Option<&str>,
    ) -> Result<u64, StoreError> {
        let deleted =
            sqlx::query("DELETE FROM memories WHERE scope = $1 AND ($2::text IS NULL OR id = $2)")
                .bind(scope)
                .bind(id)
                .execute(self.writer())
                .await?
                .rows_affected();
        Ok(deleted)
    }

    pub(super) async fn write_job(&self, job: &NewJob) -> Result<(), StoreError> {
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
        .execute(self.writer())
        .await?;
        Ok(())
    }

    /// Replicas claim jobs without waiting on each other (`SKIP LOCKED`).
    pub(super) async fn write_job_claim(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        stale_before: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<JobRecord>, StoreError> {
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
    }

    pub(super) async fn write_job_outcome(
        &self,
        id: &str,
        outcome: &JobOutcome,
        usage: &JobUsage,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), StoreError> {
        // One statement: the outcome, and the run's usage added to the
        // totals (every run counts, whatever its outcome).
        let (status, error, after) = match outcome {
            JobOutcome::Done => ("done", None, None),
            JobOutcome::Retry { error, after } => ("pending", Some(error.as_str()), Some(*after)),
            JobOutcome::Failed { error } => ("failed", Some(error.as_str()), None),
        };
        sqlx::query(
            "UPDATE background_jobs SET status = $2, last_error = $3, \
             run_after = COALESCE($4, run_after), \
             claimed_at = CASE WHEN $2 = 'pending' THEN NULL ELSE claimed_at END, \
             updated_at = $5, input_tokens = input_tokens + $6, \
             output_tokens = output_tokens + $7, \
             cost_usd = CASE WHEN $8::double precision IS NULL THEN cost_usd \
                             ELSE COALESCE(cost_usd, 0) + $8 END \
             WHERE id = $1",
        )
        .bind(id)
        .bind(status)
        .bind(error)
        .bind(after)
        .bind(now)
        .bind(i64::try_from(usage.input_tokens).unwrap_or(i64::MAX))
        .bind(i64::try_from(usage.output_tokens).unwrap_or(i64::MAX))
        .bind(usage.cost_usd)
        .execute(self.writer())
        .await?;
        Ok(())
    }

    pub(super) async fn write_judgement(
        &self,
        judgement: &JudgementRecord,
    ) -> Result<(), StoreError> {
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
        .execute(self.writer())
        .await?;
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

    pub(super) async fn write_api_key(
        &self,
        id: &str,
        tenant: &str,
        key_hash: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO api_keys (id, tenant, key_hash, created_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(id)
        .bind(tenant)
        .bind(key_hash)
        .bind(at)
        .execute(self.writer())
        .await?;
        Ok(())
    }

    pub(super) async fn write_job_shedding(
        &self,
        kind: &str,
        keep: u64,
        why: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<u64, StoreError> {
        let shed = sqlx::query(
            "UPDATE background_jobs SET status = 'failed', last_error = $3, updated_at = $4 \
             WHERE id IN (SELECT id FROM background_jobs WHERE status = 'pending' AND kind = $1 \
             ORDER BY created_at, id \
             LIMIT GREATEST((SELECT COUNT(*) FROM background_jobs WHERE status = 'pending') - $2, 0) \
             FOR UPDATE SKIP LOCKED)",
        )
        .bind(kind)
        .bind(i64::try_from(keep).unwrap_or(i64::MAX))
        .bind(why)
        .bind(now)
        .execute(self.writer())
        .await?
        .rows_affected();
        Ok(shed)
    }

    pub(super) async fn write_queue_ticket(
        &self,
        session_id: &str,
        now_ms: i64,
        stale_ms: i64,
    ) -> Result<i64, StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query("DELETE FROM turn_queue WHERE session_id = $1 AND alive_ms < $2")
            .bind(session_id)
            .bind(stale_ms)
            .execute(&mut *tx)
            .await?;
        let ticket: i64 = sqlx::query_scalar(
            "INSERT INTO turn_queue (session_id, alive_ms) VALUES ($1, $2) RETURNING ticket",
        )
        .bind(session_id)
        .bind(now_ms)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(ticket)
    }

    pub(super) async fn write_ticket_alive(
        &self,
        ticket: i64,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE turn_queue SET alive_ms = $2 WHERE ticket = $1")
            .bind(ticket)
            .bind(now_ms)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    pub(super) async fn write_ticket_removal(&self, ticket: i64) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM turn_queue WHERE ticket = $1")
            .bind(ticket)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    pub(super) async fn write_api_key_revocation(
        &self,
        id: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<bool, StoreError> {
        let done =
            sqlx::query("UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL")
                .bind(id)
                .bind(at)
                .execute(self.writer())
                .await?
                .rows_affected();
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
        let inserted = sqlx::query(
            "INSERT INTO approvals (turn_id, call_id, session_id, approved, reason, decided_at) \
             VALUES ($1, $2, $3, $4, $5, now()) ON CONFLICT (turn_id, call_id) DO NOTHING",
        )
        .bind(turn_id.to_string())
        .bind(call_id)
        .bind(session_id)
        .bind(approved)
        .bind(reason)
        .execute(self.writer())
        .await?
        .rows_affected();
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
            insert_events(&mut *tx, std::iter::once(&stored)).await?;
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

/// Inserts events in one statement, whatever their number: each column is
/// one array parameter, so the statement's text (and its prepared plan) is
/// the same for every batch.
///
/// Idempotent: a batch tried again after a commit whose answer was lost
/// (the connection cut just after COMMIT was sent) finds its rows there,
/// and goes on. Only a row that holds another event at one of the batch's
/// seqs (or one the statement could not see) is a conflict: the statement
/// fails whole (see migration 0015), as a unique index would fail it.
async fn insert_events<'e, 'c, E>(
    executor: E,
    events: impl Iterator<Item = &'e StoredEvent>,
) -> Result<(), StoreError>
where
    E: sqlx::Executor<'c, Database = Postgres>,
{
    let columns = EventColumns::of(events.map(|e| (e, false)));
    let _: i64 = sqlx::query_scalar(
        "WITH e AS ( \
           SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], \
           $6::timestamptz[]) AS e(session_id, seq, turn_id, type, payload, created_at) \
         ), logged AS ( \
           INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) \
           SELECT * FROM e ON CONFLICT (session_id, seq) DO NOTHING RETURNING 1 \
         ) \
         SELECT harness_event_conflicts((SELECT count(*) FROM e) \
           - (SELECT count(*) FROM logged) \
           - (SELECT count(*) FROM e JOIN events x ON x.session_id = e.session_id \
              AND x.seq = e.seq AND x.turn_id = e.turn_id AND x.type = e.type \
              AND x.payload = e.payload))",
    )
    .bind(columns.session_id)
    .bind(columns.seq)
    .bind(columns.turn_id)
    .bind(columns.event_type)
    .bind(columns.payload)
    .bind(columns.created_at)
    .fetch_one(executor)
    .await?;
    Ok(())
}

/// Events as columns, for `unnest`.
#[derive(Default)]
struct EventColumns<'a> {
    session_id: Vec<&'a str>,
    seq: Vec<i64>,
    turn_id: Vec<String>,
    event_type: Vec<&'a str>,
    payload: Vec<&'a str>,
    created_at: Vec<chrono::DateTime<chrono::Utc>>,
    /// Written only if its turn's finish applies.
    terminal: Vec<bool>,
}

impl<'a> EventColumns<'a> {
    fn of(events: impl Iterator<Item = (&'a StoredEvent, bool)>) -> Self {
        let mut columns = Self::default();
        for (e, terminal) in events {
            columns.session_id.push(&e.session_id);
            columns.seq.push(e.seq);
            columns.turn_id.push(e.turn_id.to_string());
            columns.event_type.push(&e.event_type);
            columns.payload.push(&e.payload);
            columns.created_at.push(e.created_at);
            columns.terminal.push(terminal);
        }
        columns
    }
}

/// The one statement that ends a batch's turns: each turn still running
/// is ended and its messages, decision, observation, jobs, session totals
/// and terminal event written; the batch's other events are written
/// whatever happens. It returns the ids of the turns it ended (a turn
/// someone else ended meanwhile is left as it is, with nothing of its
/// finish written); an event that finds another at its seq fails it.
///
/// Idempotent, as [`insert_events`]: tried again after a commit whose
/// answer was lost, it finds its events stored, ends nothing twice, and
/// reports as ended the turns whose own terminal event is already there.
fn finish_statement<'q>(
    events: &'q [std::sync::Arc<StoredEvent>],
    finishes: &'q [&'q TurnFinish],
) -> sqlx::query::QueryAs<'q, Postgres, (Vec<String>, i64), sqlx::postgres::PgArguments> {
    let mut turn_id = Vec::with_capacity(finishes.len());
    let mut session_id = Vec::with_capacity(finishes.len());
    let mut status = Vec::with_capacity(finishes.len());
    let mut result = Vec::with_capacity(finishes.len());
    let mut error_code = Vec::with_capacity(finishes.len());
    let mut error_message = Vec::with_capacity(finishes.len());
    let mut finished_at = Vec::with_capacity(finishes.len());
    let mut cost_usd = Vec::with_capacity(finishes.len());
    let mut last_seq = Vec::with_capacity(finishes.len());
    #[derive(Default)]
    struct Messages<'a> {
        id: Vec<String>,
        session_id: Vec<&'a str>,
        turn_id: Vec<String>,
        role: Vec<&'a str>,
        content: Vec<&'a str>,
        created_at: Vec<chrono::DateTime<chrono::Utc>>,
    }
    #[derive(Default)]
    struct Decisions<'a> {
        id: Vec<String>,
        session_id: Vec<&'a str>,
        turn_id: Vec<String>,
        key: Vec<&'a str>,
        strategy: Vec<&'a str>,
        record: Vec<&'a str>,
        created_at: Vec<chrono::DateTime<chrono::Utc>>,
    }
    #[derive(Default)]
    struct Observations<'a> {
        id: Vec<&'a str>,
        turn_id: Vec<String>,
        session_id: Vec<&'a str>,
        source_id: Vec<&'a str>,
        user_text: Vec<&'a str>,
        assistant_text: Vec<&'a str>,
        created_at: Vec<chrono::DateTime<chrono::Utc>>,
    }
    #[derive(Default)]
    struct Jobs<'a> {
        id: Vec<&'a str>,
        /// The finish's turn, whose end decides whether the job is kept.
        owner: Vec<String>,
        kind: Vec<&'a str>,
        session_id: Vec<&'a str>,
        turn_id: Vec<&'a str>,
        payload: Vec<&'a str>,
        at: Vec<chrono::DateTime<chrono::Utc>>,
    }
    let mut messages = Messages::default();
    let mut decisions = Decisions::default();
    let mut observations = Observations::default();
    let mut jobs = Jobs::default();
    for finish in finishes {
        let id = finish.turn_id.to_string();
        let at = finish.terminal.created_at;
        for message in &finish.messages {
            messages.id.push(message.id.to_string());
            messages.session_id.push(&finish.session_id);
            messages.turn_id.push(id.clone());
            messages.role.push(&message.role);
            messages.content.push(&message.content);
            messages.created_at.push(at);
        }
        if let Some(decision) = &finish.decision {
            decisions.id.push(decision.id.to_string());
            decisions.session_id.push(&finish.session_id);
            decisions.turn_id.push(id.clone());
            decisions.key.push(&decision.decision_key);
            decisions.strategy.push(&decision.strategy);
            decisions.record.push(&decision.record);
            decisions.created_at.push(at);
        }
        if let Some(o) = &finish.observation {
            observations.id.push(&o.id);
            observations.turn_id.push(id.clone());
            observations.session_id.push(&o.session_id);
            observations.source_id.push(&o.source_id);
            observations.user_text.push(&o.user_text);
            observations.assistant_text.push(&o.assistant_text);
            observations.created_at.push(o.created_at);
        }
        for job in &finish.jobs {
            jobs.id.push(&job.id);
            jobs.owner.push(id.clone());
            jobs.kind.push(&job.kind);
            jobs.session_id.push(&job.session_id);
            jobs.turn_id.push(&job.turn_id);
            jobs.payload.push(&job.payload);
            jobs.at.push(job.at);
        }
        turn_id.push(id);
        session_id.push(finish.session_id.as_str());
        status.push(finish.status.as_str());
        result.push(finish.result.as_deref());
        error_code.push(finish.error_code.as_deref());
        error_message.push(finish.error_message.as_deref());
        finished_at.push(at);
        cost_usd.push(finish.cost_usd);
        last_seq.push(finish.terminal.seq);
    }
    let events = EventColumns::of(
        events
            .iter()
            .map(|e| (&**e, false))
            .chain(finishes.iter().map(|f| (&*f.terminal, true))),
    );
    // The sub-statements of one statement see one snapshot and cannot see
    // each other's writes: each writes a different table, and all but the
    // plain events are filtered by the turns `ended` returned.
    sqlx::query_as(
        "WITH f AS ( \
           SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
           $6::text[], $7::timestamptz[], $8::float8[], $9::int8[]) \
           AS f(turn_id, session_id, status, result, error_code, error_message, finished_at, \
           cost_usd, last_seq) \
         ), ended AS ( \
           UPDATE turns SET status = f.status, result = f.result, error_code = f.error_code, \
           error_message = f.error_message, finished_at = f.finished_at, cost_usd = f.cost_usd \
           FROM f WHERE turns.id = f.turn_id AND turns.status = 'running' \
           RETURNING turns.id \
         ), totals AS ( \
           UPDATE sessions SET updated_at = f.finished_at, last_seq = f.last_seq, \
           cost_usd = COALESCE(sessions.cost_usd + f.cost_usd, sessions.cost_usd, f.cost_usd) \
           FROM f JOIN ended ON ended.id = f.turn_id WHERE sessions.id = f.session_id \
         ), said AS ( \
           INSERT INTO messages (message_id, session_id, turn_id, role, content, created_at) \
           SELECT m.message_id, m.session_id, m.turn_id, m.role, m.content, m.created_at \
           FROM unnest($10::text[], $11::text[], $12::text[], $13::text[], $14::text[], \
           $15::timestamptz[]) WITH ORDINALITY \
           AS m(message_id, session_id, turn_id, role, content, created_at, n) \
           WHERE m.turn_id IN (SELECT id FROM ended) ORDER BY m.n \
         ), decided AS ( \
           INSERT INTO decisions (id, session_id, turn_id, decision_key, strategy, record, \
           created_at) \
           SELECT * FROM unnest($16::text[], $17::text[], $18::text[], $19::text[], \
           $20::text[], $21::text[], $22::timestamptz[]) \
           AS d(id, session_id, turn_id, decision_key, strategy, record, created_at) \
           WHERE d.turn_id IN (SELECT id FROM ended) \
         ), e AS ( \
           SELECT * FROM unnest($23::text[], $24::int8[], $25::text[], $26::text[], \
           $27::text[], $28::timestamptz[], $29::bool[]) \
           AS e(session_id, seq, turn_id, type, payload, created_at, terminal) \
         ), due AS ( \
           SELECT * FROM e WHERE NOT e.terminal OR e.turn_id IN (SELECT id FROM ended) \
         ), stored AS ( \
           SELECT e.turn_id, e.terminal, e.turn_id IN (SELECT id FROM ended) AS due \
           FROM e JOIN events x ON x.session_id = e.session_id AND x.seq = e.seq \
           AND x.turn_id = e.turn_id AND x.type = e.type AND x.payload = e.payload \
         ), logged AS ( \
           INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) \
           SELECT session_id, seq, turn_id, type, payload, created_at FROM due \
           ON CONFLICT (session_id, seq) DO NOTHING RETURNING 1 \
         ), observed AS ( \
           INSERT INTO research_observations (id, session_id, source_id, user_text, \
           assistant_text, created_at) \
           SELECT o.id, o.session_id, o.source_id, o.user_text, o.assistant_text, o.created_at \
           FROM unnest($30::text[], $31::text[], $32::text[], $33::text[], $34::text[], \
           $35::text[], $36::timestamptz[]) \
           AS o(id, turn_id, session_id, source_id, user_text, assistant_text, created_at) \
           WHERE o.turn_id IN (SELECT id FROM ended) \
         ), queued AS ( \
           INSERT INTO background_jobs (id, kind, session_id, turn_id, payload, status, \
           run_after, created_at, updated_at) \
           SELECT j.id, j.kind, j.session_id, j.turn_id, j.payload, 'pending', j.at, j.at, j.at \
           FROM unnest($37::text[], $38::text[], $39::text[], $40::text[], $41::text[], \
           $42::text[], $43::timestamptz[]) \
           AS j(id, owner, kind, session_id, turn_id, payload, at) \
           WHERE j.owner IN (SELECT id FROM ended) \
         ) \
         SELECT ARRAY(SELECT id FROM ended \
                      UNION SELECT turn_id FROM stored WHERE terminal), \
           harness_event_conflicts((SELECT count(*) FROM due) \
           - (SELECT count(*) FROM logged) \
           - (SELECT count(*) FROM stored WHERE NOT terminal OR due))",
    )
    .bind(turn_id)
    .bind(session_id)
    .bind(status)
    .bind(result)
    .bind(error_code)
    .bind(error_message)
    .bind(finished_at)
    .bind(cost_usd)
    .bind(last_seq)
    .bind(messages.id)
    .bind(messages.session_id)
    .bind(messages.turn_id)
    .bind(messages.role)
    .bind(messages.content)
    .bind(messages.created_at)
    .bind(decisions.id)
    .bind(decisions.session_id)
    .bind(decisions.turn_id)
    .bind(decisions.key)
    .bind(decisions.strategy)
    .bind(decisions.record)
    .bind(decisions.created_at)
    .bind(events.session_id)
    .bind(events.seq)
    .bind(events.turn_id)
    .bind(events.event_type)
    .bind(events.payload)
    .bind(events.created_at)
    .bind(events.terminal)
    .bind(observations.id)
    .bind(observations.turn_id)
    .bind(observations.session_id)
    .bind(observations.source_id)
    .bind(observations.user_text)
    .bind(observations.assistant_text)
    .bind(observations.created_at)
    .bind(jobs.id)
    .bind(jobs.owner)
    .bind(jobs.kind)
    .bind(jobs.session_id)
    .bind(jobs.turn_id)
    .bind(jobs.payload)
    .bind(jobs.at)
}
