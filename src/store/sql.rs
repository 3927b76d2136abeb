//! The reads of the store, written once for both backends, and the
//! `Store` trait implementation that routes every call.
//!
//! SQLite and Postgres accept the same statements here (`$n` parameters,
//! `ON CONFLICT`, `RETURNING`, partial indexes), so one macro
//! ([`impl_store`]) generates both implementations: the reads, and the
//! calls into each backend's own writes (`write_*` methods: plain sqlx in
//! `postgres.rs`, jobs on a writer thread in `sqlite/writer.rs`). The
//! alternative, a store generic over `sqlx::Database`, needs an
//! `Encode`/`Decode`/`Executor` bound per type at every call site, which
//! buries the SQL; two hand-written copies of the reads drift.
//!
//! A backend type provides `reader()` (a pool for reads), `writer()` (the
//! pool migrations run on), `MIGRATOR`, `cancel_listener()` and the
//! `write_*` methods.

/// Columns of a turn, in [`super::records::rows::TurnRow`] order (a macro so
/// that `concat!` can splice it into a literal).
macro_rules! turn_columns {
    () => {
        "id, session_id, status, request, result, error_code, error_message, \
         owner_instance, first_seq, created_at, finished_at"
    };
}
pub(super) use turn_columns;

/// Columns of a [`super::MemoryRecord`], for `SELECT`s.
macro_rules! memory_columns {
    () => {
        "id, scope, kind, key, content, source_session_id, source_turn_id, created_at, updated_at"
    };
}
pub(super) use memory_columns;

/// A session's last messages, newest first: `$1` session, `$2` limit.
pub(super) const RECENT_MESSAGES: &str = "SELECT id, message_id, turn_id, role, content, created_at \
     FROM messages WHERE session_id = $1 ORDER BY id DESC LIMIT $2";

/// A scope's memories, newest first: `$1` scope, `$2` kind or NULL, `$3` limit.
pub(super) const LIST_MEMORIES: &str = concat!(
    "SELECT ",
    memory_columns!(),
    " FROM memories WHERE scope = $1 AND ($2 IS NULL OR kind = $2) \
     ORDER BY updated_at DESC, id DESC LIMIT $3"
);

/// Rows per chunk of the heartbeat's `IN` list.
pub(super) const IDS_PER_UPDATE: usize = 64;

/// Tries of a begin whose conflict vanished before it was named.
pub(super) const BEGIN_ATTEMPTS: usize = 3;

/// Orphans interrupted per call, so one sweep is bounded.
pub(super) const ORPHANS_PER_SWEEP: i64 = 100;

macro_rules! impl_store {
    ($store:ty, $db:ty, $backend:literal) => {
        impl $store {
            /// Why a unique index refused `turn` (after its transaction
            /// rolled back): a used idempotency key first, else the running
            /// turn of its session. `None`: nothing conflicts any more (the
            /// running turn ended in between).
            async fn begin_conflict(
                &self,
                turn: &$crate::store::NewTurn,
            ) -> Result<Option<$crate::store::BeginTurnError>, $crate::store::StoreError> {
                use $crate::store::{BeginTurnError, records::rows::TurnRow};
                if let Some(key) = &turn.idempotency_key {
                    let sql = concat!(
                        "SELECT ",
                        $crate::store::sql::turn_columns!(),
                        " FROM turns WHERE session_id = $1 AND idempotency_key = $2 \
                         AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND s.tenant = $3)"
                    );
                    let existing = sqlx::query_as::<_, TurnRow>(sql)
                        .bind(&turn.session_id)
                        .bind(key)
                        .bind(&turn.tenant)
                        .fetch_optional(self.reader())
                        .await?;
                    if let Some(row) = existing {
                        return Ok(Some(BeginTurnError::IdempotencyKeyExists(Box::new(
                            row.try_into()?,
                        ))));
                    }
                }
                let running: Option<String> = sqlx::query_scalar(
                    "SELECT t.id FROM turns t JOIN sessions s ON s.id = t.session_id \
                     WHERE t.session_id = $1 AND t.status = 'running' AND s.tenant = $2",
                )
                .bind(&turn.session_id)
                .bind(&turn.tenant)
                .fetch_optional(self.reader())
                .await?;
                running
                    .map(|id| {
                        $crate::store::records::parse_uuid(&id).map(BeginTurnError::AlreadyRunning)
                    })
                    .transpose()
            }
        }

        #[async_trait::async_trait]
        impl $crate::store::Store for $store {
            fn backend(&self) -> &'static str {
                $backend
            }

            async fn migrate(&self) -> Result<(), $crate::store::StoreError> {
                Self::MIGRATOR.run(self.writer()).await?;
                Ok(())
            }

            async fn readiness(&self) -> $crate::store::Readiness {
                let applied: Result<Vec<i64>, sqlx::Error> =
                    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success = TRUE")
                        .fetch_all(self.reader())
                        .await;
                match applied {
                    Ok(versions) => $crate::store::Readiness {
                        reachable: true,
                        migrations_applied: Self::MIGRATOR
                            .iter()
                            .all(|m| versions.contains(&m.version)),
                    },
                    // The migrations table is missing on a fresh database;
                    // tell that apart from a database that does not answer.
                    Err(sqlx::Error::Database(_)) => $crate::store::Readiness {
                        reachable: sqlx::query("SELECT 1").execute(self.reader()).await.is_ok(),
                        migrations_applied: false,
                    },
                    Err(_) => $crate::store::Readiness {
                        reachable: false,
                        migrations_applied: false,
                    },
                }
            }

            async fn begin_turn(
                &self,
                turn: &$crate::store::NewTurn,
            ) -> Result<$crate::store::BeganTurn, $crate::store::BeginTurnError> {
                use $crate::store::{BeginTurnError, StoreError};
                // A replay or a double text is answered by a read, without
                // the write below: a burst of POSTs on a busy session does
                // not queue on its row lock. (Another tenant's session
                // shows no conflict here; the write refuses it.) A backend
                // whose begin checks this in its own statement skips it.
                if Self::READ_BEFORE_BEGIN
                    && let Some(conflict) = self.begin_conflict(turn).await?
                {
                    return Err(conflict);
                }
                // A unique index refusing the turn names a conflict that may
                // be gone by the time it is looked up (the running turn ended
                // in between): then the session is free, so begin again.
                for _ in 0..$crate::store::sql::BEGIN_ATTEMPTS {
                    match self.write_begin_turn(turn).await {
                        Err(BeginTurnError::Store(StoreError::Conflict)) => {
                            if let Some(conflict) = self.begin_conflict(turn).await? {
                                return Err(conflict);
                            }
                        }
                        other => return other,
                    }
                }
                Err(StoreError::Conflict.into())
            }

            async fn write_batch(
                &self,
                events: &[std::sync::Arc<$crate::events::StoredEvent>],
                finishes: &[&$crate::store::TurnFinish],
            ) -> Result<Vec<bool>, $crate::store::StoreError> {
                self.write_batch_of(events, finishes).await
            }

            async fn get_turn(
                &self,
                session_id: &str,
                turn_id: uuid::Uuid,
            ) -> Result<Option<$crate::store::TurnRecord>, $crate::store::StoreError> {
                let sql = concat!(
                    "SELECT ",
                    $crate::store::sql::turn_columns!(),
                    " FROM turns WHERE id = $1 AND session_id = $2"
                );
                sqlx::query_as::<_, $crate::store::records::rows::TurnRow>(sql)
                    .bind(turn_id.to_string())
                    .bind(session_id)
                    .fetch_optional(self.reader())
                    .await?
                    .map(TryInto::try_into)
                    .transpose()
            }

            async fn session_tenant(
                &self,
                session_id: &str,
            ) -> Result<Option<String>, $crate::store::StoreError> {
                Ok(sqlx::query_scalar("SELECT tenant FROM sessions WHERE id = $1")
                    .bind(session_id)
                    .fetch_optional(self.reader())
                    .await?)
            }

            async fn checkpoint_tenant(
                &self,
                checkpoint_id: &str,
            ) -> Result<Option<String>, $crate::store::StoreError> {
                Ok(sqlx::query_scalar(
                    "SELECT s.tenant FROM checkpoints c JOIN sessions s ON s.id = c.session_id \
                     WHERE c.id = $1",
                )
                .bind(checkpoint_id)
                .fetch_optional(self.reader())
                .await?)
            }

            async fn get_session(
                &self,
                session_id: &str,
            ) -> Result<Option<$crate::store::SessionRecord>, $crate::store::StoreError> {
                sqlx::query_as::<_, $crate::store::records::rows::SessionRow>(
                    "SELECT s.id, s.created_at, s.updated_at, s.turn_count, s.cost_usd, \
                     (SELECT COALESCE(MAX(e.seq), 0) FROM events e WHERE e.session_id = s.id) AS last_seq, \
                     (SELECT t.id FROM turns t WHERE t.session_id = s.id AND t.status = 'running') \
                       AS running_turn_id \
                     FROM sessions s WHERE s.id = $1",
                )
                .bind(session_id)
                .fetch_optional(self.reader())
                .await?
                .map(TryInto::try_into)
                .transpose()
            }

            async fn list_messages(
                &self,
                session_id: &str,
                after: i64,
                limit: u32,
            ) -> Result<Vec<$crate::store::MessageRecord>, $crate::store::StoreError> {
                sqlx::query_as::<_, $crate::store::records::rows::MessageRow>(
                    "SELECT id, message_id, turn_id, role, content, created_at FROM messages \
                     WHERE session_id = $1 AND id > $2 ORDER BY id LIMIT $3",
                )
                .bind(session_id)
                .bind(after)
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?
                .into_iter()
                .map(TryInto::try_into)
                .collect()
            }

            async fn recent_messages(
                &self,
                session_id: &str,
                limit: u32,
            ) -> Result<Vec<$crate::store::MessageRecord>, $crate::store::StoreError> {
                let mut newest_first: Vec<$crate::store::MessageRecord> =
                    sqlx::query_as::<_, $crate::store::records::rows::MessageRow>(
                        $crate::store::sql::RECENT_MESSAGES,
                    )
                    .bind(session_id)
                    .bind(i64::from(limit))
                    .fetch_all(self.reader())
                    .await?
                    .into_iter()
                    .map(TryInto::try_into)
                    .collect::<Result<_, _>>()?;
                newest_first.reverse();
                Ok(newest_first)
            }

            async fn list_events(
                &self,
                session_id: &str,
                turn_id: Option<uuid::Uuid>,
                after: i64,
                limit: u32,
            ) -> Result<Vec<$crate::events::StoredEvent>, $crate::store::StoreError> {
                let rows = match turn_id {
                    Some(turn_id) => {
                        sqlx::query_as::<_, $crate::store::records::rows::EventRow>(
                            "SELECT session_id, seq, turn_id, type, payload, created_at \
                             FROM events WHERE session_id = $2 AND seq > $3 AND turn_id = $1 \
                             ORDER BY seq LIMIT $4",
                        )
                        .bind(turn_id.to_string())
                        .bind(session_id)
                        .bind(after)
                        .bind(i64::from(limit))
                        .fetch_all(self.reader())
                        .await?
                    }
                    None => {
                        sqlx::query_as::<_, $crate::store::records::rows::EventRow>(
                            "SELECT session_id, seq, turn_id, type, payload, created_at \
                             FROM events WHERE session_id = $1 AND seq > $2 \
                             ORDER BY seq LIMIT $3",
                        )
                        .bind(session_id)
                        .bind(after)
                        .bind(i64::from(limit))
                        .fetch_all(self.reader())
                        .await?
                    }
                };
                rows.into_iter().map(TryInto::try_into).collect()
            }

            async fn search_messages(
                &self,
                session_id: &str,
                terms: &[String],
                limit: u32,
            ) -> Result<Vec<$crate::store::MessageRecord>, $crate::store::StoreError> {
                if terms.is_empty() {
                    return Ok(Vec::new());
                }
                let mut qb = sqlx::QueryBuilder::<$db>::new(
                    "SELECT id, message_id, turn_id, role, content, created_at FROM messages WHERE session_id = ",
                );
                qb.push_bind(session_id.to_owned());
                qb.push(" AND (");
                let mut any = qb.separated(" OR ");
                for term in terms.iter().take(16) {
                    any.push("LOWER(content) LIKE ");
                    any.push_bind_unseparated(format!("%{}%", term.to_lowercase()));
                }
                qb.push(") ORDER BY id DESC LIMIT ");
                qb.push_bind(i64::from(limit));
                qb.build_query_as::<$crate::store::records::rows::MessageRow>()
                    .fetch_all(self.reader())
                    .await?
                    .into_iter()
                    .map(TryInto::try_into)
                    .collect()
            }

            async fn list_decisions(
                &self,
                session_id: &str,
                after: Option<&str>,
                strategy: Option<&str>,
                limit: u32,
            ) -> Result<Vec<$crate::store::DecisionRecord>, $crate::store::StoreError> {
                sqlx::query_as::<_, $crate::store::records::rows::DecisionRow>(
                    "SELECT id, turn_id, decision_key, strategy, record, created_at \
                     FROM decisions WHERE session_id = $1 AND ($2 IS NULL OR id > $2) \
                     AND ($3 IS NULL OR strategy = $3) ORDER BY id LIMIT $4",
                )
                .bind(session_id)
                .bind(after)
                .bind(strategy)
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?
                .into_iter()
                .map(TryInto::try_into)
                .collect()
            }

            async fn put_artifact(
                &self,
                artifact: &$crate::store::NewArtifact,
            ) -> Result<(), $crate::store::StoreError> {
                self.write_artifact(artifact).await
            }

            async fn get_artifact(
                &self,
                session_id: &str,
                artifact_id: &str,
            ) -> Result<Option<$crate::store::ArtifactRecord>, $crate::store::StoreError> {
                Ok(sqlx::query_as::<_, $crate::store::ArtifactRecord>(
                    "SELECT id, session_id, turn_id, call_id, tool, content, created_at \
                     FROM artifacts WHERE id = $1 AND session_id = $2",
                )
                .bind(artifact_id)
                .bind(session_id)
                .fetch_optional(self.reader())
                .await?)
            }

            async fn put_checkpoint(
                &self,
                checkpoint: &$crate::store::NewCheckpoint,
            ) -> Result<(), $crate::store::StoreError> {
                self.write_checkpoint(checkpoint).await
            }

            async fn list_checkpoints(
                &self,
                session_id: &str,
                limit: u32,
            ) -> Result<Vec<$crate::store::CheckpointRecord>, $crate::store::StoreError> {
                let mut newest_first: Vec<$crate::store::CheckpointRecord> = sqlx::query_as(
                    "SELECT id, session_id, turn_id, call_id, tool, path, existed, bytes, \
                     created_at, restored_at FROM checkpoints WHERE session_id = $1 \
                     ORDER BY created_at DESC, id DESC LIMIT $2",
                )
                .bind(session_id)
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?;
                newest_first.reverse();
                Ok(newest_first)
            }

            async fn get_checkpoint(
                &self,
                id: &str,
            ) -> Result<
                Option<($crate::store::CheckpointRecord, Option<Vec<u8>>)>,
                $crate::store::StoreError,
            > {
                let Some(record) = sqlx::query_as::<_, $crate::store::CheckpointRecord>(
                    "SELECT id, session_id, turn_id, call_id, tool, path, existed, bytes, \
                     created_at, restored_at FROM checkpoints WHERE id = $1",
                )
                .bind(id)
                .fetch_optional(self.reader())
                .await?
                else {
                    return Ok(None);
                };
                let content: Option<Vec<u8>> =
                    sqlx::query_scalar("SELECT content FROM checkpoints WHERE id = $1")
                        .bind(id)
                        .fetch_one(self.reader())
                        .await?;
                Ok(Some((record, content)))
            }

            async fn mark_checkpoint_restored(
                &self,
                id: &str,
                at: chrono::DateTime<chrono::Utc>,
            ) -> Result<bool, $crate::store::StoreError> {
                self.write_checkpoint_restored(id, at).await
            }

            async fn upsert_memory(
                &self,
                memory: &$crate::store::NewMemory,
            ) -> Result<(), $crate::store::StoreError> {
                self.write_memory(memory).await
            }

            async fn search_memories(
                &self,
                scope: &str,
                terms: &[String],
                limit: u32,
            ) -> Result<Vec<$crate::store::MemoryRecord>, $crate::store::StoreError> {
                let terms = $crate::store::vault::clean_terms(terms);
                if terms.is_empty() || limit == 0 {
                    return Ok(Vec::new());
                }
                self.search_memory_text(scope, &terms, limit).await
            }

            async fn memories_for_turn(
                &self,
                scope: &str,
                terms: &[String],
                limit: u32,
                preferences: u32,
            ) -> Result<
                (Vec<$crate::store::MemoryRecord>, Vec<$crate::store::MemoryRecord>),
                $crate::store::StoreError,
            > {
                let terms = $crate::store::vault::clean_terms(terms);
                if terms.is_empty() || limit == 0 {
                    let preferences = self.list_memories(scope, Some("preference"), preferences).await?;
                    return Ok((Vec::new(), preferences));
                }
                self.read_memories_for_turn(scope, &terms, limit, preferences).await
            }

            async fn list_memories(
                &self,
                scope: &str,
                kind: Option<&str>,
                limit: u32,
            ) -> Result<Vec<$crate::store::MemoryRecord>, $crate::store::StoreError> {
                Ok(sqlx::query_as::<_, $crate::store::MemoryRecord>($crate::store::sql::LIST_MEMORIES)
                    .bind(scope)
                    .bind(kind)
                    .bind(i64::from(limit))
                    .fetch_all(self.reader())
                    .await?)
            }

            async fn memory_vectors(
                &self,
                scope: &str,
                model: &str,
            ) -> Result<Vec<(String, Vec<f32>)>, $crate::store::StoreError> {
                let rows: Vec<(String, Vec<u8>)> = sqlx::query_as(
                    "SELECT id, embedding FROM memories \
                     WHERE scope = $1 AND embedding_model = $2 AND embedding IS NOT NULL",
                )
                .bind(scope)
                .bind(model)
                .fetch_all(self.reader())
                .await?;
                Ok(rows
                    .into_iter()
                    .filter_map(|(id, bytes)| {
                        $crate::store::vault::vector_of(&bytes).map(|v| (id, v))
                    })
                    .collect())
            }

            async fn delete_memories(
                &self,
                scope: &str,
                id: Option<&str>,
            ) -> Result<u64, $crate::store::StoreError> {
                self.write_memory_deletion(scope, id).await
            }

            async fn enqueue_job(
                &self,
                job: &$crate::store::NewJob,
            ) -> Result<(), $crate::store::StoreError> {
                self.write_job(job).await
            }

            async fn claim_job(
                &self,
                now: chrono::DateTime<chrono::Utc>,
                stale_before: chrono::DateTime<chrono::Utc>,
            ) -> Result<Option<$crate::store::JobRecord>, $crate::store::StoreError> {
                self.write_job_claim(now, stale_before).await
            }

            async fn finish_job(
                &self,
                id: &str,
                outcome: &$crate::store::JobOutcome,
                usage: &$crate::store::JobUsage,
                now: chrono::DateTime<chrono::Utc>,
            ) -> Result<(), $crate::store::StoreError> {
                self.write_job_outcome(id, outcome, usage, now).await
            }

            async fn job_backlog(
                &self,
            ) -> Result<$crate::store::JobBacklog, $crate::store::StoreError> {
                let (pending, oldest): (i64, Option<chrono::DateTime<chrono::Utc>>) =
                    sqlx::query_as(
                        "SELECT COUNT(*), MIN(created_at) FROM background_jobs \
                         WHERE status = 'pending'",
                    )
                    .fetch_one(self.reader())
                    .await?;
                Ok($crate::store::JobBacklog {
                    pending: u64::try_from(pending).unwrap_or(0),
                    oldest,
                })
            }

            async fn shed_jobs(
                &self,
                kind: &str,
                keep: u64,
                why: &str,
                now: chrono::DateTime<chrono::Utc>,
            ) -> Result<u64, $crate::store::StoreError> {
                self.write_job_shedding(kind, keep, why, now).await
            }

            async fn list_jobs(
                &self,
                session_id: &str,
                limit: u32,
            ) -> Result<Vec<$crate::store::JobSummary>, $crate::store::StoreError> {
                let mut newest_first: Vec<$crate::store::JobSummary> = sqlx::query_as(
                    "SELECT id, kind, turn_id, status, attempts, last_error, input_tokens, \
                     output_tokens, cost_usd, created_at, updated_at FROM background_jobs \
                     WHERE session_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2",
                )
                .bind(session_id)
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?;
                newest_first.reverse();
                Ok(newest_first)
            }

            async fn put_judgement(
                &self,
                judgement: &$crate::store::JudgementRecord,
            ) -> Result<(), $crate::store::StoreError> {
                self.write_judgement(judgement).await
            }

            async fn append_session_event(
                &self,
                session_id: &str,
                event_turn_id: uuid::Uuid,
                event: &$crate::events::TurnEvent,
                at: chrono::DateTime<chrono::Utc>,
            ) -> Result<bool, $crate::store::StoreError> {
                let stored = $crate::events::StoredEvent::new(session_id, event_turn_id, 0, event, at)
                    .map_err(|e| $crate::store::StoreError::Corrupt(e.to_string()))?;
                self.write_session_event(stored).await
            }

            async fn list_judgements(
                &self,
                session_id: &str,
                turn_id: uuid::Uuid,
            ) -> Result<Vec<$crate::store::JudgementRecord>, $crate::store::StoreError> {
                Ok(sqlx::query_as(
                    "SELECT id, session_id, turn_id, judge, prompt_id, prompt_version, score, \
                     passed, rationale, provider, model, created_at FROM judgements \
                     WHERE session_id = $1 AND turn_id = $2 ORDER BY created_at, id",
                )
                .bind(session_id)
                .bind(turn_id.to_string())
                .fetch_all(self.reader())
                .await?)
            }

            async fn list_observations(
                &self,
                session_id: &str,
                limit: u32,
            ) -> Result<Vec<$crate::store::ObservationRecord>, $crate::store::StoreError> {
                let mut newest_first: Vec<$crate::store::ObservationRecord> = sqlx::query_as(
                    "SELECT id, session_id, source_id, user_text, assistant_text, created_at \
                     FROM research_observations WHERE session_id = $1 \
                     ORDER BY created_at DESC, id DESC LIMIT $2",
                )
                .bind(session_id)
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?;
                newest_first.reverse();
                Ok(newest_first)
            }

            async fn decide_approval(
                &self,
                session_id: &str,
                turn_id: uuid::Uuid,
                call_id: &str,
                approved: bool,
                reason: Option<&str>,
            ) -> Result<bool, $crate::store::StoreError> {
                self.write_approval(session_id, turn_id, call_id, approved, reason)
                    .await
            }

            async fn get_approval(
                &self,
                turn_id: uuid::Uuid,
                call_id: &str,
            ) -> Result<Option<(bool, Option<String>)>, $crate::store::StoreError> {
                Ok(sqlx::query_as(
                    "SELECT approved, reason FROM approvals WHERE turn_id = $1 AND call_id = $2",
                )
                .bind(turn_id.to_string())
                .bind(call_id)
                .fetch_optional(self.reader())
                .await?)
            }

            async fn create_api_key(
                &self,
                id: &str,
                tenant: &str,
                key_hash: &str,
                at: chrono::DateTime<chrono::Utc>,
            ) -> Result<(), $crate::store::StoreError> {
                self.write_api_key(id, tenant, key_hash, at).await
            }

            async fn find_api_key(
                &self,
                key_hash: &str,
            ) -> Result<Option<(String, String)>, $crate::store::StoreError> {
                Ok(sqlx::query_as(
                    "SELECT id, tenant FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL",
                )
                .bind(key_hash)
                .fetch_optional(self.reader())
                .await?)
            }

            async fn enqueue_turn(
                &self,
                session_id: &str,
                now_ms: i64,
                stale_ms: i64,
            ) -> Result<i64, $crate::store::StoreError> {
                self.write_queue_ticket(session_id, now_ms, stale_ms).await
            }

            async fn queue_head(
                &self,
                session_id: &str,
                stale_ms: i64,
            ) -> Result<Option<i64>, $crate::store::StoreError> {
                Ok(sqlx::query_scalar(
                    "SELECT MIN(ticket) FROM turn_queue WHERE session_id = $1 AND alive_ms >= $2",
                )
                .bind(session_id)
                .bind(stale_ms)
                .fetch_one(self.reader())
                .await?)
            }

            async fn touch_ticket(
                &self,
                ticket: i64,
                now_ms: i64,
            ) -> Result<(), $crate::store::StoreError> {
                self.write_ticket_alive(ticket, now_ms).await
            }

            async fn leave_queue(&self, ticket: i64) -> Result<(), $crate::store::StoreError> {
                self.write_ticket_removal(ticket).await
            }

            async fn revoke_api_key(
                &self,
                id: &str,
                at: chrono::DateTime<chrono::Utc>,
            ) -> Result<bool, $crate::store::StoreError> {
                self.write_api_key_revocation(id, at).await
            }

            async fn list_api_keys(
                &self,
            ) -> Result<
                Vec<(
                    String,
                    String,
                    chrono::DateTime<chrono::Utc>,
                    Option<chrono::DateTime<chrono::Utc>>,
                )>,
                $crate::store::StoreError,
            > {
                Ok(sqlx::query_as(
                    "SELECT id, tenant, created_at, revoked_at FROM api_keys ORDER BY created_at, id",
                )
                .fetch_all(self.reader())
                .await?)
            }

            async fn request_cancel(
                &self,
                turn_id: uuid::Uuid,
            ) -> Result<bool, $crate::store::StoreError> {
                self.write_cancel_request(turn_id).await
            }

            async fn cancel_requests(
                &self,
            ) -> Result<Option<$crate::store::CancelRequests>, $crate::store::StoreError> {
                self.cancel_listener().await
            }

            async fn vault_notes(
                &self,
            ) -> Result<
                std::collections::HashMap<String, $crate::store::NoteState>,
                $crate::store::StoreError,
            > {
                let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
                    "SELECT path, content_hash, embedding_model FROM vault_notes",
                )
                .fetch_all(self.reader())
                .await?;
                Ok(rows
                    .into_iter()
                    .map(|(path, content_hash, embedding_model)| {
                        (
                            path,
                            $crate::store::NoteState {
                                content_hash,
                                embedding_model,
                            },
                        )
                    })
                    .collect())
            }

            async fn vault_vectors(
                &self,
                model: &str,
                limit: u32,
            ) -> Result<Vec<(i64, Vec<f32>)>, $crate::store::StoreError> {
                let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(
                    "SELECT c.id, c.embedding FROM vault_chunks c \
                     JOIN vault_notes n ON n.path = c.path \
                     WHERE n.embedding_model = $1 AND c.embedding IS NOT NULL \
                     ORDER BY c.id LIMIT $2",
                )
                .bind(model)
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?;
                Ok(rows
                    .into_iter()
                    .filter_map(|(id, bytes)| {
                        $crate::store::vault::vector_of(&bytes).map(|v| (id, v))
                    })
                    .collect())
            }

            async fn vault_chunks(
                &self,
                ids: &[i64],
            ) -> Result<Vec<$crate::store::VaultHit>, $crate::store::StoreError> {
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                let mut query = sqlx::QueryBuilder::<$db>::new(
                    "SELECT id, path, heading, anchor, text FROM vault_chunks WHERE id IN (",
                );
                let mut list = query.separated(", ");
                for id in ids.iter().take(256) {
                    list.push_bind(*id);
                }
                query.push(")");
                let rows: Vec<(i64, String, String, String, String)> = query
                    .build_query_as()
                    .fetch_all(self.reader())
                    .await?;
                Ok(rows
                    .into_iter()
                    .map(|(id, path, heading, anchor, text)| $crate::store::VaultHit {
                        id,
                        path,
                        heading,
                        anchor,
                        text,
                        score: 0.0,
                    })
                    .collect())
            }

            async fn vault_put_note(
                &self,
                note: &$crate::store::IndexedNote,
            ) -> Result<(), $crate::store::StoreError> {
                self.write_vault_note(note).await
            }

            async fn vault_remove_notes(
                &self,
                paths: &[String],
            ) -> Result<u64, $crate::store::StoreError> {
                if paths.is_empty() {
                    return Ok(0);
                }
                self.write_vault_removals(paths).await
            }

            async fn vault_search(
                &self,
                terms: &[String],
                limit: u32,
            ) -> Result<Vec<$crate::store::VaultHit>, $crate::store::StoreError> {
                let terms = $crate::store::vault::clean_terms(terms);
                if terms.is_empty() || limit == 0 {
                    return Ok(Vec::new());
                }
                self.search_vault(&terms, limit).await
            }

            async fn heartbeat(
                &self,
                turn_ids: &[uuid::Uuid],
                now: chrono::DateTime<chrono::Utc>,
            ) -> Result<Vec<uuid::Uuid>, $crate::store::StoreError> {
                self.write_heartbeat(turn_ids, now).await
            }

            async fn interrupt_orphans(
                &self,
                scope: &$crate::store::OrphanScope,
                reason: &str,
                now: chrono::DateTime<chrono::Utc>,
            ) -> Result<Vec<$crate::events::StoredEvent>, $crate::store::StoreError> {
                self.write_orphan_interrupts(scope, reason, now).await
            }
        }

    };
}

pub(super) use impl_store;
