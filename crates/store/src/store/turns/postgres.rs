//! [`Turns`] on Postgres: plain sqlx, each call bounded by the call
//! timeout (see [`PostgresStore::bounded`]).

use async_trait::async_trait;
use sqlx::Postgres;

use super::{IDS_PER_UPDATE, ORPHANS_PER_SWEEP, Turns, waited_ms};
use crate::ids::SessionKey;
use crate::store::Result;
use crate::turn::Parent;
use crate::{
    events::{StoredEvent, TurnEvent},
    store::{
        Announcement, Announcements, BeganTurn, BeginTurnError, CANCEL_CHANNEL, Lease, NewTurn,
        Orphan, OrphanScope, RELEASED_PREFIX, StoreError, TurnContext,
        event_log::postgres::insert_events,
        postgres::PostgresStore,
        reader::{args, turn_columns},
        records::{parse_uuid, rows::TurnRow},
    },
};

#[expect(
    clippy::too_many_lines,
    reason = "a turn's begin is one statement's binds and its answer's cases"
)]
#[async_trait]
impl Turns for PostgresStore {
    /// The tenant's running turns are counted from their own partial
    /// index (migration 0034): a join let the planner read every session
    /// of the tenant and probe its turns (up to 9.6 ms of Postgres CPU a
    /// turn at 8,800 sessions), and reading each running turn's session
    /// grew with every tenant's running turns (docs/benchmarks.md).
    async fn insert_turn(&self, turn: &NewTurn) -> Result<BeganTurn, BeginTurnError> {
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
        type Began = (
            Option<i64>,
            Option<f64>,
            Option<i64>,
            bool,
            bool,
            bool,
            bool,
        );
        let request = serde_json::to_string(&turn.request)
            .map_err(|e| StoreError::Corrupt(format!("turn request: {e}")))?;
        // The turn it continues ($12; NULL: the session's newest, unless
        // $13 makes it a root), one of the session's.
        let (named, root) = match turn.request.parent() {
            Parent::Newest => (None, false),
            Parent::Root => (None, true),
            Parent::Turn(id) => (Some(id.to_string()), false),
        };
        let statement = sqlx::query_as::<_, Began>(
            "WITH busy AS ( \
               SELECT $11::int8 IS NOT NULL AND (SELECT count(*) FROM turns t \
                 WHERE t.tenant = $3 AND t.status = 'running' AND t.parked_until IS NULL) \
                 >= $11::int8 AS at_most \
             ), newest AS ( \
               SELECT COALESCE((SELECT id FROM turns WHERE session_id = $1 \
                 ORDER BY created_at DESC, id DESC LIMIT 1), \
                 (SELECT forked_at FROM sessions WHERE id = $1)) AS id \
             ), parent AS ( \
               SELECT CASE WHEN $13 THEN NULL ELSE COALESCE($12::text, newest.id) END AS id, \
                 ($12::text IS NULL OR EXISTS (SELECT 1 FROM turns \
                   WHERE id = $12::text AND session_id = $1) OR EXISTS (SELECT 1 FROM sessions \
                   WHERE id = $1 AND forked_at = $12::text)) AS known, \
                 (CASE WHEN $13 THEN NULL ELSE COALESCE($12::text, newest.id) END) \
                   IS DISTINCT FROM newest.id AS branches \
               FROM newest \
             ), s AS ( \
               INSERT INTO sessions (id, created_at, updated_at, turn_count, last_seq, tenant) \
               SELECT $1, $2, $2, 1, 1, $3 \
               WHERE NOT EXISTS (SELECT 1 FROM turns WHERE session_id = $1 AND status = 'running') \
               AND NOT (SELECT at_most FROM busy) \
               AND (SELECT known FROM parent) \
               AND ($6::text IS NULL OR NOT EXISTS \
                 (SELECT 1 FROM turns WHERE session_id = $1 AND idempotency_key = $6)) \
               ON CONFLICT (id) DO UPDATE SET updated_at = excluded.updated_at, \
               turn_count = sessions.turn_count + 1, last_seq = sessions.last_seq + 1, \
               branched = sessions.branched OR (SELECT branches FROM parent) \
               WHERE sessions.tenant = excluded.tenant \
               RETURNING turn_count, cost_usd, last_seq, branched \
             ), t AS ( \
               INSERT INTO turns (id, session_id, status, request, idempotency_key, \
               owner_instance, owner_process, heartbeat_at, first_seq, created_at, traceparent, \
               tenant, parent_turn_id, run_id) \
               SELECT $4, $1, 'running', $5, $6, $7, $8, $2, s.last_seq, $2, $10, $3, \
                 (SELECT id FROM parent), $14 FROM s \
             ), e AS ( \
               INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) \
               SELECT $1, s.last_seq, $4, 'turn.started', $9, $2 FROM s \
             ) \
             SELECT s.turn_count, s.cost_usd, s.last_seq, \
               EXISTS (SELECT 1 FROM sessions WHERE id = $1 AND tenant <> $3), \
               (SELECT at_most FROM busy), \
               NOT (SELECT known FROM parent), \
               COALESCE(s.branched, FALSE) \
             FROM (VALUES (1)) AS one LEFT JOIN s ON TRUE",
        )
        .bind(turn.session_id.as_str())
        .bind(turn.created_at)
        .bind(&turn.tenant)
        .bind(turn.id.to_string())
        .bind(request)
        .bind(&turn.idempotency_key)
        .bind(&turn.owner_instance)
        .bind(&turn.owner_process)
        .bind(&turn.started_payload)
        .bind(&turn.traceparent)
        .bind(turn.max_running.map(i64::from))
        .bind(named)
        .bind(root)
        .bind(&turn.request.run_id)
        .fetch_one(self.writer());
        match self.bounded(async { Ok(statement.await?) }).await {
            Ok((Some(turn_count), session_cost, Some(seq), _, _, _, branched)) => Ok(BeganTurn {
                first_seq: seq,
                turn_number: u64::try_from(turn_count).unwrap_or(1),
                session_cost_before: session_cost,
                // Read by the turn: each read is its own round trip here.
                context: TurnContext::default(),
                branched,
            }),
            Ok((_, _, _, true, _, _, _)) => Err(BeginTurnError::SessionNotFound),
            Ok((_, _, _, _, _, true, _)) => Err(BeginTurnError::ParentNotFound),
            // Counted in the statement's snapshot: turns starting at the
            // same instant on other replicas may pass it together.
            Ok((_, _, _, _, true, _, _)) => Err(BeginTurnError::TenantBusy),
            // A running turn or a used idempotency key: nothing was
            // written; the caller finds which.
            Ok(_) => Err(StoreError::Conflict.into()),
            Err(StoreError::Database(sqlx::Error::Database(e))) if e.is_unique_violation() => {
                Err(StoreError::Conflict.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn request_cancel(&self, turn_id: uuid::Uuid) -> Result<bool> {
        self.bounded(async {
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
        })
        .await
    }

    async fn hide_turn(
        &self,
        turn_id: uuid::Uuid,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<bool> {
        let sql = "UPDATE turns SET hidden_at = $2 WHERE id = $1 \
             AND status <> 'running' AND hidden_at IS NULL";
        let done = self.execute(sql, args![turn_id, now]).await?;
        Ok(done == 1)
    }

    async fn heartbeat(
        &self,
        leases: &[Lease],
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<(uuid::Uuid, bool)>> {
        self.bounded(async {
            if leases.is_empty() {
                return Ok(Vec::new());
            }
            let mut tx = self.control().begin().await?;
            // The turns are alive now, however long the connection took.
            let now = now.max(chrono::Utc::now());
            let mut refreshed = Vec::new();
            for chunk in leases.chunks(IDS_PER_UPDATE) {
                // A row locked by someone else is being ended (or swept):
                // skip it rather than wait. A heartbeat that waits while
                // holding other turns' rows is half of a deadlock with a
                // transaction ending those turns in another order.
                let mut qb =
                    sqlx::QueryBuilder::<Postgres>::new("UPDATE turns SET heartbeat_at = ");
                qb.push_bind(now);
                qb.push(
                    " WHERE id IN (SELECT id FROM turns WHERE status = 'running' \
                     AND (id, attempt) IN (",
                );
                let mut held = qb.separated(", ");
                for lease in chunk {
                    held.push("(");
                    held.push_bind_unseparated(lease.turn_id.to_string());
                    held.push_unseparated(", ");
                    held.push_bind_unseparated(i32::try_from(lease.attempt).unwrap_or(i32::MAX));
                    held.push_unseparated(")");
                }
                qb.push(
                    ") ORDER BY id FOR NO KEY UPDATE SKIP LOCKED) RETURNING id, cancel_requested",
                );
                let rows: Vec<(String, bool)> = qb.build_query_as().fetch_all(&mut *tx).await?;
                for (id, cancel) in rows {
                    refreshed.push((parse_uuid(&id)?, cancel));
                }
            }
            tx.commit().await?;
            Ok(refreshed)
        })
        .await
    }

    async fn enqueue_turn(
        &self,
        session_id: &SessionKey,
        now_ms: i64,
        stale_ms: i64,
    ) -> Result<i64> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            sqlx::query("DELETE FROM turn_queue WHERE session_id = $1 AND alive_ms < $2")
                .bind(session_id.as_str())
                .bind(stale_ms)
                .execute(&mut *tx)
                .await?;
            let ticket: i64 = sqlx::query_scalar(
                "INSERT INTO turn_queue (session_id, alive_ms) VALUES ($1, $2) RETURNING ticket",
            )
            .bind(session_id.as_str())
            .bind(now_ms)
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(ticket)
        })
        .await
    }

    async fn touch_ticket(&self, ticket: i64, now_ms: i64) -> Result<bool> {
        let sql = "UPDATE turn_queue SET alive_ms = $2 WHERE ticket = $1";
        Ok(self.execute(sql, args![ticket, now_ms]).await? == 1)
    }

    async fn clear_queue(&self, session_id: &SessionKey) -> Result<()> {
        let sql = "DELETE FROM turn_queue WHERE session_id = $1";
        self.execute(sql, args![session_id.as_str()]).await?;
        Ok(())
    }

    async fn leave_queue(&self, ticket: i64) -> Result<()> {
        let sql = "DELETE FROM turn_queue WHERE ticket = $1";
        self.execute(sql, args![ticket]).await?;
        Ok(())
    }

    async fn take_orphans(
        &self,
        scope: &OrphanScope,
        reason: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<Orphan>> {
        self.bounded(async {
            let only = scope.only.map(|id| id.to_string());
            let candidates: Vec<(String, String)> = sqlx::query_as(
                "SELECT id, session_id FROM turns WHERE status = 'running' \
                 AND ((owner_instance = $1 AND owner_process <> $2) OR heartbeat_at < $3) \
                 AND (parked_until IS NULL OR parked_until <= $5) \
                 AND ($6::text IS NULL OR id = $6) \
                 ORDER BY created_at LIMIT $4",
            )
            .bind(&scope.instance)
            .bind(&scope.process)
            .bind(scope.stale_before)
            .bind(ORPHANS_PER_SWEEP)
            .bind(now)
            .bind(&only)
            .fetch_all(self.control())
            .await?;
            let mut taken = Vec::with_capacity(candidates.len());
            for (turn_id, session_id) in candidates {
                if scope.alive.contains(&parse_uuid(&turn_id)?) {
                    continue;
                }
                let mut tx = self.control().begin().await?;
                lock_session(&mut tx, &session_id).await?;
                // Still an orphan under the locks: a heartbeat that landed
                // since the candidates were read keeps its turn. The row is
                // locked for update: its owner's events in flight (which
                // share-lock it) land first, or are refused after.
                type Held = (i32, i32, String, Option<chrono::DateTime<chrono::Utc>>, bool);
                let held: Option<Held> = sqlx::query_as(
                    "SELECT attempt, resumes, owner_process, parked_at, cancel_requested FROM turns \
                     WHERE id = $1 AND status = 'running' \
                     AND ((owner_instance = $2 AND owner_process <> $3) OR heartbeat_at < $4) \
                     AND (parked_until IS NULL OR parked_until <= $5) \
                     FOR UPDATE",
                )
                .bind(&turn_id)
                .bind(&scope.instance)
                .bind(&scope.process)
                .bind(scope.stale_before)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?;
                let Some((attempt, resumes, owner_process, parked_at, cancel_requested)) = held
                else {
                    continue;
                };
                if parked_at.is_some() && !cancel_requested {
                    // Taken up only while its tenant has room (counted as a
                    // begin counts, in this transaction's snapshot).
                    let (most, running): (Option<i64>, i64) =
                        sqlx::query_as(crate::store::TENANT_ROOM)
                            .bind(&turn_id)
                            .bind(scope.max_running_default.map(i64::from))
                            .fetch_one(&mut *tx)
                            .await?;
                    if most.is_some_and(|most| running >= most) {
                        sqlx::query("UPDATE turns SET parked_until = $2 WHERE id = $1")
                            .bind(&turn_id)
                            .bind(crate::store::parked_retry_at(&turn_id, now))
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                        continue;
                    }
                }
                let next_seq: i64 = sqlx::query_scalar(
                    "SELECT COALESCE((SELECT COALESCE(seq_end, seq) FROM events \
                     WHERE session_id = $1 ORDER BY seq DESC LIMIT 1), 0) + 1",
                )
                .bind(&session_id)
                .fetch_one(&mut *tx)
                .await?;
                let takeovers = u32::try_from(attempt.saturating_sub(resumes)).unwrap_or(u32::MAX);
                if parked_at.is_some() || takeovers < scope.max_attempts {
                    // A parked turn woken is not a take-over; what the
                    // park lasted moves its compute deadline.
                    let waited = parked_at.map_or(0, |at| waited_ms(at, now));
                    let sql = concat!(
                        "UPDATE turns SET owner_instance = $2, owner_process = $3, \
                         heartbeat_at = $4, attempt = attempt + 1, \
                         resumes = resumes + CASE WHEN parked_at IS NULL THEN 0 ELSE 1 END, \
                         waited_ms = waited_ms + $5, parked_at = NULL, parked_until = NULL \
                         WHERE id = $1 RETURNING ",
                        turn_columns!()
                    );
                    let row: TurnRow = sqlx::query_as(sql)
                        .bind(&turn_id)
                        .bind(&scope.instance)
                        .bind(&scope.process)
                        .bind(now)
                        .bind(waited)
                        .fetch_one(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    taken.push(Orphan::Claimed {
                        turn: Box::new(row.try_into()?),
                        next_seq,
                        released: owner_process.is_empty(),
                        woken: parked_at.is_some(),
                    });
                    continue;
                }
                sqlx::query(
                    "UPDATE turns SET status = 'interrupted', error_code = 'interrupted', \
                     error_message = $1, finished_at = $2 WHERE id = $3",
                )
                .bind(reason)
                .bind(now)
                .bind(&turn_id)
                .execute(&mut *tx)
                .await?;
                sqlx::query("DELETE FROM turn_steps WHERE turn_id = $1")
                    .bind(&turn_id)
                    .execute(&mut *tx)
                    .await?;
                let event = TurnEvent::TurnInterrupted {
                    reason: reason.to_owned(),
                };
                let stored =
                    StoredEvent::new(&session_id, parse_uuid(&turn_id)?, next_seq, &event, now)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                insert_events(&mut *tx, std::iter::once(&stored)).await?;
                sqlx::query("UPDATE sessions SET last_seq = $1 WHERE id = $2")
                    .bind(next_seq)
                    .bind(&session_id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                taken.push(Orphan::Interrupted(Box::new(stored)));
            }
            Ok(taken)
        })
        .await
    }

    /// A listener on [`CANCEL_CHANNEL`]. The listening connection is idle
    /// for as long as no one cancels, so only its setup is bounded; the
    /// heartbeat finds every request too.
    async fn announcements(&self) -> Result<Option<Announcements>> {
        use futures::StreamExt;
        let mut listener = self
            .bounded(async {
                let mut listener = sqlx::postgres::PgListener::connect_with(self.writer()).await?;
                listener.listen(CANCEL_CHANNEL).await?;
                Ok(listener)
            })
            .await?;
        let announcements = async_stream::stream! {
            loop {
                // `recv` reconnects a lost connection on the next call.
                match listener.recv().await {
                    Ok(notification) => {
                        if let Some(announcement) = Announcement::parse(notification.payload()) {
                            yield Ok(announcement);
                        }
                    }
                    Err(e) => yield Err(StoreError::from(e)),
                }
            }
        };
        Ok(Some(announcements.boxed()))
    }

    async fn park_turn(
        &self,
        lease: &Lease,
        until: chrono::DateTime<chrono::Utc>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<bool> {
        let sql = "UPDATE turns SET owner_process = '', heartbeat_at = 'epoch', \
                   parked_at = $3, parked_until = $4 \
                   WHERE id = $1 AND attempt = $2 AND status = 'running'";
        let parked = self
            .execute(
                sql,
                args![
                    lease.turn_id.to_string(),
                    i64::from(lease.attempt),
                    now,
                    until
                ],
            )
            .await?;
        Ok(parked == 1)
    }

    async fn wake_turn(
        &self,
        turn_id: uuid::Uuid,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<bool> {
        self.bounded(async {
            // Announced as a release: every listening replica sweeps.
            let woken: Vec<(String,)> = sqlx::query_as(
                "WITH w AS ( \
                   UPDATE turns SET parked_until = LEAST(parked_until, $2) \
                   WHERE id = $1 AND status = 'running' AND parked_until IS NOT NULL RETURNING id \
                 ) SELECT w.id FROM w, pg_notify($3, $4 || w.id) n",
            )
            .bind(turn_id.to_string())
            .bind(now)
            .bind(CANCEL_CHANNEL)
            .bind(RELEASED_PREFIX)
            .fetch_all(self.control())
            .await?;
            Ok(!woken.is_empty())
        })
        .await
    }

    async fn release_turn(&self, lease: &Lease) -> Result<bool> {
        self.bounded(async {
            let released: Vec<(String,)> = sqlx::query_as(
                "WITH r AS ( \
                   UPDATE turns SET owner_process = '', heartbeat_at = 'epoch' \
                   WHERE id = $1 AND attempt = $2 AND status = 'running' RETURNING id \
                 ) SELECT r.id FROM r, pg_notify($3, $4 || r.id) n",
            )
            .bind(lease.turn_id.to_string())
            .bind(i32::try_from(lease.attempt).unwrap_or(i32::MAX))
            .bind(CANCEL_CHANNEL)
            .bind(RELEASED_PREFIX)
            .fetch_all(self.control())
            .await?;
            Ok(!released.is_empty())
        })
        .await
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
