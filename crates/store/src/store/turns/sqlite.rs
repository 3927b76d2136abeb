//! [`Turns`] on SQLite: each write is one job on the writer thread.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{OptionalExtension, params};
use uuid::Uuid;

use super::{ORPHANS_PER_SWEEP, Turns, waited_ms};
use crate::ids::SessionKey;
use crate::store::Result;
use crate::turn::Parent;
use crate::{
    events::{StoredEvent, TurnEvent},
    store::{
        BeganTurn, BeginTurnError, Lease, NewTurn, Orphan, OrphanScope, StoreError, TurnContext,
        event_log::journal::insert_events,
        records::parse_uuid,
        sqlite::{
            SqliteStore,
            writer::{
                answered, branch_messages, is_unique_violation, memories_for_turn, parse_ts,
                recent_messages, ts,
            },
        },
    },
};

/// A running turn a sweep may take over, as it reads it.
struct Candidate {
    turn_id: String,
    session_id: String,
    attempt: u32,
    resumes: u32,
    owner_process: String,
    parked_at: Option<String>,
    cancel_requested: bool,
}

/// What one try of a begin found.
enum BeginTry {
    Began(BeganTurn),
    /// The session is another tenant's (nothing written).
    SessionNotFound,
    /// The tenant runs as many turns as it may (nothing written).
    TenantBusy,
    /// The turn it names as its parent is not the session's (nothing
    /// written).
    ParentNotFound,
}

#[expect(
    clippy::too_many_lines,
    reason = "a turn's begin is one transaction's statements in order"
)]
#[async_trait]
impl Turns for SqliteStore {
    fn pending_seq(&self, session_id: &str) -> Option<i64> {
        self.writes.journal().last_seq(session_id)
    }

    /// Begins a turn; [`StoreError::Conflict`]: a unique index refused it
    /// (the caller finds out why) and nothing was written.
    /// `None`: the session belongs to another tenant (nothing written).
    async fn insert_turn(&self, turn: &NewTurn) -> Result<BeganTurn, BeginTurnError> {
        let turn = turn.clone();
        let request = serde_json::to_string(&turn.request)
            .map_err(|e| StoreError::Corrupt(format!("turn request: {e}")))?;
        let began = self.writes.run(move |tx| {
            let created = ts(turn.created_at);
            // One writer: the count and the insert cannot interleave with
            // another start, on any replica. Counted from the index of the
            // tenant's running turns alone (migration 0032).
            if let Some(most) = turn.max_running {
                let running: i64 = tx
                    .prepare_cached(super::RUNNING_OF_TENANT)?
                    .query_row(params![turn.tenant], |row| row.get(0))?;
                if running >= i64::from(most) {
                    return Ok(BeginTry::TenantBusy);
                }
            }
            // The turn it continues: the newest, unless it names one (of
            // this session: a session of another tenant has another key).
            let newest: Option<String> = tx
                .prepare_cached(super::NEWEST_TURN)?
                .query_row(params![turn.session_id.as_str()], |row| row.get(0))?;
            let parent = match turn.request.parent() {
                Parent::Newest => newest.clone(),
                Parent::Root => None,
                Parent::Turn(id) => {
                    let id = id.to_string();
                    let known: Option<i64> = tx
                        .prepare_cached(super::CONTINUABLE)?
                        .query_row(params![turn.session_id.as_str(), id], |row| row.get(0))
                        .optional()?;
                    if known.is_none() {
                        return Ok(BeginTry::ParentNotFound);
                    }
                    Some(id)
                }
            };
            let branches = parent != newest;
            // A session of another tenant is left as it is (no row comes back).
            let began: Option<(i64, Option<f64>, i64, bool)> = tx
                .prepare_cached(
                    "INSERT INTO sessions (id, created_at, updated_at, turn_count, last_seq, tenant) \
                     VALUES (?1, ?2, ?2, 1, 1, ?3) \
                     ON CONFLICT (id) DO UPDATE SET updated_at = excluded.updated_at, \
                     turn_count = sessions.turn_count + 1, last_seq = sessions.last_seq + 1, \
                     branched = sessions.branched OR ?4 \
                     WHERE sessions.tenant = excluded.tenant \
                     RETURNING turn_count, cost_usd, last_seq, branched",
                )?
                .query_row(
                    params![turn.session_id.as_str(), created, turn.tenant, branches],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
                )
                .optional()?;
            let Some((turn_count, session_cost, seq, branched)) = began else {
                return Ok(BeginTry::SessionNotFound);
            };
            let inserted = tx
                .prepare_cached(
                    "INSERT INTO turns (id, session_id, status, request, idempotency_key, \
                     owner_instance, owner_process, heartbeat_at, first_seq, created_at, \
                     traceparent, tenant, parent_turn_id, run_id) \
                     VALUES (?1, ?2, 'running', ?3, ?4, ?5, ?6, ?7, ?8, ?7, ?9, ?10, ?11, ?12)",
                )?
                .execute(params![
                    turn.id.to_string(),
                    turn.session_id.as_str(),
                    request,
                    turn.idempotency_key,
                    turn.owner_instance,
                    turn.owner_process,
                    created,
                    seq,
                    turn.traceparent,
                    turn.tenant,
                    parent,
                    turn.request.run_id
                ]);
            match inserted {
                Ok(_) => {}
                // Refused: roll the session update back with it.
                Err(e) if is_unique_violation(&e) => return Err(StoreError::Conflict),
                Err(e) => return Err(e.into()),
            }
            tx.prepare_cached(
                "INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) \
                 VALUES (?1, ?2, ?3, 'turn.started', ?4, ?5)",
            )?
            .execute(params![
                turn.session_id.as_str(),
                seq,
                turn.id.to_string(),
                turn.started_payload,
                created
            ])?;
            // The turn's first reads, on this connection (the write
            // transaction sees what was committed, and its own rows).
            // A read that fails leaves it to the turn (see `answered`).
            let history = match turn.reads.history {
                // The first turn of a session has no history to read,
                // nor has a new root (a fork's first turn has a parent).
                Some(_) if parent.is_none() => Some(Vec::new()),
                Some(limit) if branched => answered(
                    "history",
                    branch_messages(tx, turn.id, limit),
                ),
                Some(limit) => answered(
                    "history",
                    recent_messages(tx, &turn.session_id, limit),
                ),
                None => None,
            };
            let memories = turn
                .reads
                .memory
                .as_ref()
                .and_then(|query| answered("memories", memories_for_turn(tx, query)));
            Ok(BeginTry::Began(BeganTurn {
                first_seq: seq,
                turn_number: u64::try_from(turn_count).unwrap_or(1),
                session_cost_before: session_cost,
                context: TurnContext { history, memories },
                branched,
            }))
        })
        .await?;
        match began {
            BeginTry::Began(began) => Ok(began),
            BeginTry::SessionNotFound => Err(BeginTurnError::SessionNotFound),
            BeginTry::TenantBusy => Err(BeginTurnError::TenantBusy),
            BeginTry::ParentNotFound => Err(BeginTurnError::ParentNotFound),
        }
    }

    async fn request_cancel(&self, turn_id: Uuid) -> Result<bool> {
        self.writes
            .run(move |connection| {
                let updated = connection
                .prepare_cached(
                    "UPDATE turns SET cancel_requested = 1 WHERE id = ?1 AND status = 'running'",
                )?
                .execute(params![turn_id.to_string()])?;
                Ok(updated == 1)
            })
            .await
    }

    async fn hide_turn(&self, turn_id: Uuid, now: DateTime<Utc>) -> Result<bool> {
        self.writes
            .run(move |connection| {
                let updated = connection
                    .prepare_cached(
                        "UPDATE turns SET hidden_at = ?2 WHERE id = ?1 \
                         AND status <> 'running' AND hidden_at IS NULL",
                    )?
                    .execute(params![turn_id.to_string(), ts(now)])?;
                Ok(updated == 1)
            })
            .await
    }

    async fn heartbeat(&self, leases: &[Lease], now: DateTime<Utc>) -> Result<Vec<(Uuid, bool)>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let leases = leases.to_vec();
        self.writes
            .run(move |tx| {
                let mut refreshed = Vec::new();
                {
                    let mut beat = tx.prepare_cached(
                        "UPDATE turns SET heartbeat_at = ?1 WHERE id = ?2 AND status = 'running' \
                     AND attempt = ?3 RETURNING cancel_requested",
                    )?;
                    let at = ts(now);
                    for lease in &leases {
                        let mut rows =
                            beat.query(params![at, lease.turn_id.to_string(), lease.attempt])?;
                        if let Some(row) = rows.next()? {
                            refreshed.push((lease.turn_id, row.get::<_, bool>(0)?));
                        }
                    }
                }
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
        let session_id = session_id.to_owned();
        self.writes
            .run(move |connection| {
                connection
                    .prepare_cached(
                        "DELETE FROM turn_queue WHERE session_id = ?1 AND alive_ms < ?2",
                    )?
                    .execute(params![session_id.as_str(), stale_ms])?;
                connection
                    .prepare_cached(
                        "INSERT INTO turn_queue (session_id, alive_ms) VALUES (?1, ?2)",
                    )?
                    .execute(params![session_id.as_str(), now_ms])?;
                Ok(connection.last_insert_rowid())
            })
            .await
    }

    async fn touch_ticket(&self, ticket: i64, now_ms: i64) -> Result<bool> {
        self.writes
            .run(move |connection| {
                let touched = connection
                    .prepare_cached("UPDATE turn_queue SET alive_ms = ?2 WHERE ticket = ?1")?
                    .execute(params![ticket, now_ms])?;
                Ok(touched == 1)
            })
            .await
    }

    async fn clear_queue(&self, session_id: &SessionKey) -> Result<()> {
        let session_id = session_id.as_str().to_owned();
        self.writes
            .run(move |connection| {
                connection
                    .prepare_cached("DELETE FROM turn_queue WHERE session_id = ?1")?
                    .execute(params![session_id])?;
                Ok(())
            })
            .await
    }

    async fn leave_queue(&self, ticket: i64) -> Result<()> {
        self.writes
            .run(move |connection| {
                connection
                    .prepare_cached("DELETE FROM turn_queue WHERE ticket = ?1")?
                    .execute(params![ticket])?;
                Ok(())
            })
            .await
    }

    async fn take_orphans(
        &self,
        scope: &OrphanScope,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<Vec<Orphan>> {
        let (scope, reason) = (scope.clone(), reason.to_owned());
        let outcomes = self
            .writes
            .run_logged(move |tx, stage| {
                let at = ts(now);
                let only = scope.only.map(|id| id.to_string());
                let candidates: Vec<Candidate> = tx
                    .prepare_cached(
                        "SELECT id, session_id, attempt, resumes, owner_process, parked_at, \
                     cancel_requested FROM turns \
                     WHERE status = 'running' \
                     AND ((owner_instance = ?1 AND owner_process <> ?2) OR heartbeat_at < ?3) \
                     AND (parked_until IS NULL OR parked_until <= ?5) AND (?6 IS NULL OR id = ?6) \
                     ORDER BY created_at LIMIT ?4",
                    )?
                    .query_map(
                        params![
                            scope.instance,
                            scope.process,
                            ts(scope.stale_before),
                            ORPHANS_PER_SWEEP,
                            at,
                            only
                        ],
                        |row| {
                            Ok(Candidate {
                                turn_id: row.get(0)?,
                                session_id: row.get(1)?,
                                attempt: row.get(2)?,
                                resumes: row.get(3)?,
                                owner_process: row.get(4)?,
                                parked_at: row.get(5)?,
                                cancel_requested: row.get(6)?,
                            })
                        },
                    )?
                    .collect::<Result<_, _>>()?;
                let mut outcomes = Vec::with_capacity(candidates.len());
                for candidate in candidates {
                    let Candidate {
                        turn_id,
                        session_id,
                        attempt,
                        resumes,
                        owner_process,
                        parked_at,
                        cancel_requested,
                    } = candidate;
                    let released = owner_process.is_empty();
                    if scope.alive.contains(&parse_uuid(&turn_id)?) {
                        continue;
                    }
                    let in_table: i64 = tx
                        .prepare_cached(
                            "SELECT COALESCE((SELECT COALESCE(seq_end, seq) FROM events \
                             WHERE session_id = ?1 ORDER BY seq DESC LIMIT 1), 0) + 1",
                        )?
                        .query_row(params![session_id], |row| row.get(0))?;
                    // A turn whose task ended in this process may have
                    // left deltas pending in the journal.
                    let next_seq = stage
                        .last_seq(&session_id)
                        .map_or(in_table, |pending| in_table.max(pending + 1));
                    let parked = match parked_at.as_deref() {
                        Some(raw) => Some(parse_ts(raw)?),
                        None => None,
                    };
                    if parked.is_some() && !cancel_requested {
                        // Taken up only while its tenant has room (one
                        // writer: the count holds until the claim).
                        let (most, running): (Option<i64>, i64) = tx
                            .prepare_cached(crate::store::TENANT_ROOM_SQLITE)?
                            .query_row(
                                params![turn_id, scope.max_running_default.map(i64::from)],
                                |row| Ok((row.get(0)?, row.get(1)?)),
                            )?;
                        if most.is_some_and(|most| running >= most) {
                            tx.prepare_cached("UPDATE turns SET parked_until = ?2 WHERE id = ?1")?
                                .execute(params![
                                    turn_id,
                                    ts(crate::store::parked_retry_at(&turn_id, now))
                                ])?;
                            continue;
                        }
                    }
                    if let Some(parked_at) = parked {
                        // Woken: not a take-over; what the park lasted
                        // moves the turn's compute deadline.
                        tx.prepare_cached(
                            "UPDATE turns SET owner_instance = ?2, owner_process = ?3, \
                             heartbeat_at = ?4, attempt = attempt + 1, resumes = resumes + 1, \
                             waited_ms = waited_ms + ?5, parked_at = NULL, parked_until = NULL \
                             WHERE id = ?1",
                        )?
                        .execute(params![
                            turn_id,
                            scope.instance,
                            scope.process,
                            at,
                            waited_ms(parked_at, now)
                        ])?;
                        outcomes.push((session_id, turn_id, next_seq, released, true, None));
                        continue;
                    }
                    if attempt.saturating_sub(resumes) < scope.max_attempts {
                        tx.prepare_cached(
                            "UPDATE turns SET owner_instance = ?2, owner_process = ?3, \
                             heartbeat_at = ?4, attempt = attempt + 1 WHERE id = ?1",
                        )?
                        .execute(params![
                            turn_id,
                            scope.instance,
                            scope.process,
                            at
                        ])?;
                        outcomes.push((session_id, turn_id, next_seq, released, false, None));
                        continue;
                    }
                    tx.prepare_cached(
                        "UPDATE turns SET status = 'interrupted', error_code = 'interrupted', \
                         error_message = ?1, finished_at = ?2 WHERE id = ?3",
                    )?
                    .execute(params![reason, at, turn_id])?;
                    tx.prepare_cached("DELETE FROM turn_steps WHERE turn_id = ?1")?
                        .execute(params![turn_id])?;
                    let event = TurnEvent::TurnInterrupted {
                        reason: reason.clone(),
                    };
                    let stored =
                        StoredEvent::new(&session_id, parse_uuid(&turn_id)?, next_seq, &event, now)
                            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    insert_events(tx, stage, std::iter::once(Arc::new(stored.clone())))?;
                    tx.prepare_cached("UPDATE sessions SET last_seq = ?1 WHERE id = ?2")?
                        .execute(params![next_seq, session_id])?;
                    outcomes.push((session_id, turn_id, next_seq, released, false, Some(stored)));
                }
                Ok(outcomes)
            })
            .await?;
        let mut taken = Vec::with_capacity(outcomes.len());
        for (session_id, turn_id, next_seq, released, woken, interrupted) in outcomes {
            if let Some(stored) = interrupted {
                taken.push(Orphan::Interrupted(Box::new(stored)));
                continue;
            }
            // Read back as claimed (the writer is this process's only one).
            let turn = self
                .get_turn(&SessionKey::from_stored(&session_id), parse_uuid(&turn_id)?)
                .await?
                .ok_or_else(|| StoreError::Corrupt(format!("claimed turn {turn_id} is gone")))?;
            taken.push(Orphan::Claimed {
                turn: Box::new(turn),
                next_seq,
                released,
                woken,
            });
        }
        Ok(taken)
    }

    async fn park_turn(
        &self,
        lease: &Lease,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let lease = *lease;
        self.writes
            .run(move |connection| {
                let parked = connection
                    .prepare_cached(
                        "UPDATE turns SET owner_process = '', heartbeat_at = ?3, \
                         parked_at = ?4, parked_until = ?5 \
                         WHERE id = ?1 AND attempt = ?2 AND status = 'running'",
                    )?
                    .execute(params![
                        lease.turn_id.to_string(),
                        lease.attempt,
                        ts(DateTime::<Utc>::UNIX_EPOCH),
                        ts(now),
                        ts(until)
                    ])?;
                Ok(parked == 1)
            })
            .await
    }

    async fn wake_turn(&self, turn_id: Uuid, now: DateTime<Utc>) -> Result<bool> {
        self.writes
            .run(move |connection| {
                let woken = connection
                    .prepare_cached(
                        "UPDATE turns SET parked_until = MIN(parked_until, ?2) \
                         WHERE id = ?1 AND status = 'running' AND parked_until IS NOT NULL",
                    )?
                    .execute(params![turn_id.to_string(), ts(now)])?;
                Ok(woken == 1)
            })
            .await
    }

    async fn release_turn(&self, lease: &Lease) -> Result<bool> {
        let lease = *lease;
        self.writes
            .run(move |connection| {
                let released = connection
                    .prepare_cached(
                        "UPDATE turns SET owner_process = '', heartbeat_at = ?3 \
                         WHERE id = ?1 AND attempt = ?2 AND status = 'running'",
                    )?
                    .execute(params![
                        lease.turn_id.to_string(),
                        lease.attempt,
                        ts(DateTime::<Utc>::UNIX_EPOCH)
                    ])?;
                Ok(released == 1)
            })
            .await
    }
}
