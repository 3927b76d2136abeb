//! The SQL of the store, written once for both backends.
//!
//! SQLite and Postgres accept the same statements here (`$n` parameters,
//! `ON CONFLICT`, `RETURNING`, partial indexes), so one macro generates both
//! `Store` implementations. The alternative, a store generic over
//! `sqlx::Database`, needs an `Encode`/`Decode`/`Executor` bound per type at
//! every call site, which buries the SQL; two hand-written copies drift.
//!
//! A backend type provides `reader()` (a pool for reads), `begin_write()`
//! (a write transaction: `BEGIN IMMEDIATE` on SQLite) and `MIGRATOR`.

/// Columns of a turn, in [`super::records::rows::TurnRow`] order (a macro so
/// that `concat!` can splice it into a literal).
macro_rules! turn_columns {
    () => {
        "id, session_id, status, request, result, error_code, error_message, \
         owner_instance, first_seq, created_at, finished_at"
    };
}
pub(super) use turn_columns;

/// Rows of the next multi-row event `INSERT` for `remaining` events.
///
/// Each row count is its own prepared statement, so the counts used are
/// few enough to stay in sqlx's per-connection statement cache (100): any
/// count up to 64, then 128 or 256. A batch of 1,000 events takes 6
/// statements, not 16; the bound parameters stay far below both
/// databases' limits.
pub(super) fn insert_rows(remaining: usize) -> usize {
    match remaining {
        0..=64 => remaining,
        65..=127 => 64,
        128..=255 => 128,
        _ => 256,
    }
}

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
                        " FROM turns WHERE session_id = $1 AND idempotency_key = $2"
                    );
                    let existing = sqlx::query_as::<_, TurnRow>(sql)
                        .bind(&turn.session_id)
                        .bind(key)
                        .fetch_optional(self.reader())
                        .await?;
                    if let Some(row) = existing {
                        return Ok(Some(BeginTurnError::IdempotencyKeyExists(Box::new(
                            row.try_into()?,
                        ))));
                    }
                }
                let running: Option<String> = sqlx::query_scalar(
                    "SELECT id FROM turns WHERE session_id = $1 AND status = 'running'",
                )
                .bind(&turn.session_id)
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
                        "SELECT id, message_id, turn_id, role, content, created_at FROM messages \
                         WHERE session_id = $1 ORDER BY id DESC LIMIT $2",
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
                limit: u32,
            ) -> Result<Vec<$crate::store::DecisionRecord>, $crate::store::StoreError> {
                let mut newest_first: Vec<$crate::store::DecisionRecord> =
                    sqlx::query_as::<_, $crate::store::records::rows::DecisionRow>(
                        "SELECT id, turn_id, decision_key, strategy, record, created_at \
                         FROM decisions WHERE session_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2",
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

/// The write half of the store in the shared SQL, for a backend whose
/// writes go through sqlx (Postgres). SQLite has its own (see
/// [`super::sqlite`]): there, one transaction is one hand-off to a writer
/// thread instead of one per statement.
macro_rules! impl_sql_writes {
    ($store:ty, $db:ty) => {
        impl $store {
            pub(super) async fn write_begin_turn(
                &self,
                turn: &$crate::store::NewTurn,
            ) -> Result<$crate::store::BeganTurn, $crate::store::BeginTurnError> {
                use $crate::store::StoreError;
                // No pre-check for a running turn or a used idempotency key:
                // the unique indexes refuse the insert, and only then do we
                // look for the conflict. The common path is four statements.
                let mut tx = self.begin_write().await.map_err(StoreError::from)?;
                // No turn of the session runs (else the insert below fails),
                // so `last_seq` is its newest event: the turn starts after it.
                let (turn_count, session_cost, seq): (i64, Option<f64>, i64) = sqlx::query_as(
                    "INSERT INTO sessions (id, created_at, updated_at, turn_count, last_seq) \
                     VALUES ($1, $2, $2, 1, 1) \
                     ON CONFLICT (id) DO UPDATE SET updated_at = excluded.updated_at, \
                     turn_count = sessions.turn_count + 1, last_seq = sessions.last_seq + 1 \
                     RETURNING turn_count, cost_usd, last_seq",
                )
                .bind(&turn.session_id)
                .bind(turn.created_at)
                .fetch_one(&mut *tx)
                .await
                .map_err(StoreError::from)?;
                let inserted = sqlx::query(
                    "INSERT INTO turns (id, session_id, status, request, idempotency_key, \
                     owner_instance, owner_process, heartbeat_at, first_seq, created_at) \
                     VALUES ($1, $2, 'running', $3, $4, $5, $6, $7, $8, $7)",
                )
                .bind(turn.id.to_string())
                .bind(&turn.session_id)
                .bind(&turn.request)
                .bind(&turn.idempotency_key)
                .bind(&turn.owner_instance)
                .bind(&turn.owner_process)
                .bind(turn.created_at)
                .bind(seq)
                .execute(&mut *tx)
                .await;
                match inserted {
                    Ok(_) => {}
                    // A running turn or a used idempotency key: the caller
                    // finds which, once this transaction is rolled back.
                    Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                        drop(tx);
                        return Err(StoreError::Conflict.into());
                    }
                    Err(e) => return Err(StoreError::from(e).into()),
                }
                sqlx::query(
                    "INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) \
                     VALUES ($1, $2, $3, 'turn.started', $4, $5)",
                )
                .bind(&turn.session_id)
                .bind(seq)
                .bind(turn.id.to_string())
                .bind(&turn.started_payload)
                .bind(turn.created_at)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::from)?;
                tx.commit().await.map_err(StoreError::from)?;
                Ok($crate::store::BeganTurn {
                    first_seq: seq,
                    turn_number: u64::try_from(turn_count).unwrap_or(1),
                    session_cost_before: session_cost,
                })
            }
            pub(super) async fn write_batch_of(
                &self,
                events: &[std::sync::Arc<$crate::events::StoredEvent>],
                finishes: &[&$crate::store::TurnFinish],
            ) -> Result<Vec<bool>, $crate::store::StoreError> {
                if finishes.is_empty() && $crate::store::sql::insert_rows(events.len()) == events.len() {
                    // One statement is its own transaction: no BEGIN and
                    // COMMIT round trips for the common batch of deltas.
                    if !events.is_empty() {
                        let mut conn = self.writer().acquire().await?;
                        insert_events(&mut *conn, events.iter().map(|e| &**e)).await?;
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
                    lock_session(&mut *tx, &finish.session_id).await?;
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
                        let mut qb = sqlx::QueryBuilder::<$db>::new(
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
                insert_events(&mut *tx, events.iter().map(|e| &**e).chain(terminals)).await?;
                tx.commit().await?;
                Ok(applied)
            }
            pub(super) async fn write_artifact(
                &self,
                artifact: &$crate::store::NewArtifact,
            ) -> Result<(), $crate::store::StoreError> {
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
            pub(super) async fn write_cancel_request(
                &self,
                turn_id: uuid::Uuid,
            ) -> Result<bool, $crate::store::StoreError> {
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
                        .bind($crate::store::CANCEL_CHANNEL)
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
            ) -> Result<Vec<uuid::Uuid>, $crate::store::StoreError> {
                if turn_ids.is_empty() {
                    return Ok(Vec::new());
                }
                let mut tx = self.begin_write().await?;
                let mut cancelled = Vec::new();
                for chunk in turn_ids.chunks($crate::store::sql::IDS_PER_UPDATE) {
                    // A row locked by someone else is being ended (or swept):
                    // skip it rather than wait. A heartbeat that waits while
                    // holding other turns' rows is half of a deadlock with a
                    // transaction ending those turns in another order.
                    let mut qb = sqlx::QueryBuilder::<$db>::new("UPDATE turns SET heartbeat_at = ");
                    qb.push_bind(now);
                    qb.push(
                        " WHERE id IN (SELECT id FROM turns WHERE status = 'running' AND id IN (",
                    );
                    let mut ids = qb.separated(", ");
                    for id in chunk {
                        ids.push_bind(id.to_string());
                    }
                    qb.push(") ORDER BY id FOR NO KEY UPDATE SKIP LOCKED) RETURNING id, cancel_requested");
                    let rows: Vec<(String, bool)> = qb.build_query_as().fetch_all(&mut *tx).await?;
                    for (id, cancel) in rows {
                        if cancel {
                            cancelled.push($crate::store::records::parse_uuid(&id)?);
                        }
                    }
                }
                tx.commit().await?;
                Ok(cancelled)
            }
            pub(super) async fn write_orphan_interrupts(
                &self,
                scope: &$crate::store::OrphanScope,
                reason: &str,
                now: chrono::DateTime<chrono::Utc>,
            ) -> Result<Vec<$crate::events::StoredEvent>, $crate::store::StoreError> {
                use $crate::events::{StoredEvent, TurnEvent};
                let candidates: Vec<(String, String)> = sqlx::query_as(
                    "SELECT id, session_id FROM turns WHERE status = 'running' \
                     AND ((owner_instance = $1 AND owner_process <> $2) OR heartbeat_at < $3) \
                     ORDER BY created_at LIMIT $4",
                )
                .bind(&scope.instance)
                .bind(&scope.process)
                .bind(scope.stale_before)
                .bind($crate::store::sql::ORPHANS_PER_SWEEP)
                .fetch_all(self.writer())
                .await?;
                let event = TurnEvent::TurnInterrupted {
                    reason: reason.to_owned(),
                };
                let mut interrupted = Vec::with_capacity(candidates.len());
                for (turn_id, session_id) in candidates {
                    if scope.alive.contains(&$crate::store::records::parse_uuid(&turn_id)?) {
                        continue;
                    }
                    let mut tx = self.begin_write().await?;
                    lock_session(&mut *tx, &session_id).await?;
                    let updated = sqlx::query(
                        "UPDATE turns SET status = 'interrupted', error_code = 'interrupted', \
                         error_message = $1, finished_at = $2 WHERE id = $3 AND status = 'running'",
                    )
                    .bind(reason)
                    .bind(now)
                    .bind(&turn_id)
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
                    let stored = StoredEvent::new(
                        &session_id,
                        $crate::store::records::parse_uuid(&turn_id)?,
                        seq,
                        &event,
                        now,
                    )
                    .map_err(|e| $crate::store::StoreError::Corrupt(e.to_string()))?;
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
            conn: &mut <$db as sqlx::Database>::Connection,
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
            conn: &mut <$db as sqlx::Database>::Connection,
            events: impl Iterator<Item = &'e $crate::events::StoredEvent>,
        ) -> Result<(), sqlx::Error> {
            let events: Vec<&$crate::events::StoredEvent> = events.collect();
            let mut rest: &[&$crate::events::StoredEvent] = &events;
            while !rest.is_empty() {
                let (chunk, tail) = rest.split_at($crate::store::sql::insert_rows(rest.len()));
                rest = tail;
                let mut qb = sqlx::QueryBuilder::<$db>::new(
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
    };
}

pub(super) use impl_sql_writes;

#[cfg(test)]
mod tests {
    use super::insert_rows;

    #[test]
    fn event_inserts_use_few_distinct_row_counts() {
        let mut counts = std::collections::BTreeSet::new();
        for total in 0..=2000usize {
            let (mut rest, mut statements) = (total, 0);
            while rest > 0 {
                let rows = insert_rows(rest);
                assert!(rows > 0 && rows <= rest, "{total}: {rows}");
                counts.insert(rows);
                rest -= rows;
                statements += 1;
            }
            assert!(statements <= total / 256 + 3, "{total} took {statements}");
        }
        assert!(counts.len() <= 66, "{counts:?}");
    }
}
