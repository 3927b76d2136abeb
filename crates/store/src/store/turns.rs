//! Sessions and their turns: a turn's begin (and why one cannot begin),
//! its liveness (heartbeats, cancel requests, orphans), a session's queue
//! of waiting turns, and what the turn reads of its session (history,
//! decisions).
//!
//! The reads are written once here; each backend's writes stand side by
//! side in `turns/sqlite.rs` and `turns/postgres.rs`.

pub(super) mod branch;
mod postgres;
mod sqlite;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    Announcements, BeganTurn, BeginTurnError, DecisionRecord, Lease, MessageRecord, NewTurn,
    Orphan, OrphanScope, SessionRecord, StoreError, TurnFilter, TurnRecord,
    reader::{Reader, Reads, args, turn_columns},
    records::{
        parse_uuid,
        rows::{DecisionRow, MessageRow, SessionRow, TurnRow},
    },
};
use crate::ids::SessionKey;
use crate::store::Result;
pub(super) use branch::BRANCH_MESSAGES;
use branch::BRANCH_PAGE;

/// A session's last messages, newest first: `$1` session, `$2` limit.
pub(super) const RECENT_MESSAGES: &str = "SELECT id, message_id, turn_id, role, content, created_at, \
     attachments FROM messages WHERE session_id = $1 ORDER BY id DESC LIMIT $2";

/// The most turns a branch read walks up: a bound on the walk, far above
/// any conversation's length.
pub const BRANCH_DEPTH_MAX: u32 = 100_000;

/// A session's newest turn (`$1` the session): the one a turn continues
/// unless it names another. A fork without turns of its own continues
/// the turn it was forked at. One row, `NULL` when there is neither.
pub(super) const NEWEST_TURN: &str = "SELECT COALESCE((SELECT id FROM turns WHERE session_id = $1 \
     ORDER BY created_at DESC, id DESC LIMIT 1), (SELECT forked_at FROM sessions WHERE id = $1))";

/// Whether `$2` is a turn the session `$1` may continue: one of its own,
/// or the turn it was forked at.
pub(super) const CONTINUABLE: &str = "SELECT 1 FROM turns WHERE session_id = $1 AND id = $2 \
     UNION ALL SELECT 1 FROM sessions WHERE id = $1 AND forked_at = $2";

/// How many turns a tenant runs (`?1`): read from the partial index of
/// running turns by tenant (migration 0032) alone, so a begin's count
/// grows with the tenant's own running turns, not with every tenant's.
pub(super) const RUNNING_OF_TENANT: &str = "SELECT count(*) FROM turns \
     WHERE tenant = ?1 AND status = 'running' AND parked_until IS NULL";

/// A [`SessionRecord`]'s columns, from `sessions s`: a `WHERE` follows.
macro_rules! session_select {
    () => {
        "SELECT s.id, s.created_at, s.updated_at, s.turn_count, s.cost_usd, s.branched, \
         s.forked_from, s.forked_at, \
         COALESCE((SELECT COALESCE(e.seq_end, e.seq) FROM events e WHERE e.session_id = s.id \
           ORDER BY e.seq DESC LIMIT 1), 0) AS last_seq, \
         (SELECT t.id FROM turns t WHERE t.session_id = s.id AND t.status = 'running') \
           AS running_turn_id \
         FROM sessions s"
    };
}

/// Rows per chunk of the heartbeat's `IN` list.
const IDS_PER_UPDATE: usize = 64;

/// Tries of a begin whose conflict vanished before it was named.
const BEGIN_ATTEMPTS: usize = 3;

/// Orphans interrupted per call, so one sweep is bounded.
const ORPHANS_PER_SWEEP: i64 = 100;

/// Sessions and turns.
#[async_trait]
pub trait Turns: Reads + Send + Sync + 'static {
    /// Creates the session if needed, the turn as `running`, and its
    /// `turn.started` event, atomically.
    ///
    /// No read comes before the write: a replay or a double text costs a
    /// refused insert and then the read that names the conflict, while the
    /// usual begin saves a read (on SQLite, also its hand-off to sqlx's
    /// reader thread: about a tenth of a turn's CPU, a profile in the
    /// git history of docs/benchmarks.md; the Postgres statement checks both conflicts itself). A unique
    /// index refusing the turn names a conflict that may be gone by the
    /// time it is looked up (the running turn ended in between): then the
    /// session is free, so the begin is tried again.
    ///
    /// A turn held back (`NewTurn::held_back`, or refused as its tenant's
    /// one too many) is answered by its conflict when it has one, so that
    /// a request sent again with its key still finds its turn, and a
    /// session's running turn still says so (a queued start waits on it).
    async fn begin_turn(&self, turn: &NewTurn) -> Result<BeganTurn, BeginTurnError> {
        let held_back = |refusal: BeginTurnError| async move {
            Err(begin_conflict(self.reader(), turn)
                .await?
                .unwrap_or(refusal))
        };
        if turn.held_back {
            return held_back(BeginTurnError::HeldBack).await;
        }
        for _ in 0..BEGIN_ATTEMPTS {
            match self.insert_turn(turn).await {
                Err(BeginTurnError::Store(StoreError::Conflict)) => {
                    if let Some(conflict) = begin_conflict(self.reader(), turn).await? {
                        return Err(conflict);
                    }
                }
                Err(BeginTurnError::TenantBusy) => {
                    return held_back(BeginTurnError::TenantBusy).await;
                }
                other => return other,
            }
        }
        Err(StoreError::Conflict.into())
    }

    /// One try of [`Self::begin_turn`], in one transaction.
    /// [`StoreError::Conflict`]: a unique index refused the turn (a running
    /// turn, a used idempotency key) and nothing was written.
    async fn insert_turn(&self, turn: &NewTurn) -> Result<BeganTurn, BeginTurnError>;

    async fn get_turn(&self, session_id: &SessionKey, turn_id: Uuid) -> Result<Option<TurnRecord>> {
        let sql = concat!(
            "SELECT ",
            turn_columns!(),
            " FROM turns WHERE id = $1 AND session_id = $2"
        );
        self.reader()
            .row::<TurnRow>(sql, args![turn_id, session_id])
            .await?
            .map(TryInto::try_into)
            .transpose()
    }

    /// A turn by its id alone, unless it was hidden ([`Self::hide_turn`]);
    /// the caller checks that its session is the tenant's.
    async fn find_turn(&self, turn_id: Uuid) -> Result<Option<TurnRecord>> {
        let sql = concat!(
            "SELECT ",
            turn_columns!(),
            " FROM turns WHERE id = $1 AND hidden_at IS NULL"
        );
        self.reader()
            .row::<TurnRow>(sql, args![turn_id])
            .await?
            .map(TryInto::try_into)
            .transpose()
    }

    /// A session's turns, newest first, before `before` (a turn id: ids
    /// are UUID v7, in the order the turns began), at most `limit`; a
    /// hidden turn (a deleted response) is not among them.
    async fn list_turns(
        &self,
        session_id: &SessionKey,
        before: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<TurnRecord>> {
        let rows: Vec<TurnRow> = match before {
            Some(before) => {
                let sql = concat!(
                    "SELECT ",
                    turn_columns!(),
                    " FROM turns WHERE session_id = $1 AND id < $2 AND hidden_at IS NULL \
                      ORDER BY id DESC LIMIT $3"
                );
                self.reader()
                    .rows(sql, args![session_id, before, limit])
                    .await?
            }
            None => {
                let sql = concat!(
                    "SELECT ",
                    turn_columns!(),
                    " FROM turns WHERE session_id = $1 AND hidden_at IS NULL \
                      ORDER BY id DESC LIMIT $2"
                );
                self.reader().rows(sql, args![session_id, limit]).await?
            }
        };
        rows.into_iter().map(TryInto::try_into).collect()
    }

    /// A tenant's turns across its sessions, newest first, that `filter`
    /// takes, before `before` (a turn id, as [`Self::list_turns`]), at
    /// most `limit`; and how many turns the filter takes in all. Hidden
    /// turns are not among them.
    async fn list_tenant_turns(
        &self,
        tenant: &str,
        filter: &TurnFilter,
        before: Option<Uuid>,
        limit: u32,
    ) -> Result<(Vec<TurnRecord>, u64)> {
        // Each filter is a parameter that is NULL when not asked for.
        const WHERE: &str = " FROM turns t JOIN sessions s ON s.id = t.session_id \
             WHERE s.tenant = $1 AND t.hidden_at IS NULL \
               AND ($2 IS NULL OR t.session_id = $2) \
               AND ($3 IS NULL OR t.status = $3 OR t.status = $4) \
               AND ($5 IS NULL OR COALESCE(t.finished_at, t.heartbeat_at) >= $5)";
        let session = filter.session.as_ref().map(|s| s.as_str());
        let mut statuses = filter.statuses.iter().map(|s| s.as_str());
        let first = statuses.next();
        let second = statuses.next().or(first);
        let since = filter.changed_since;
        let count_sql = format!("SELECT COUNT(*){WHERE}");
        let (total,): (i64,) = self
            .reader()
            .row(
                sqlx::AssertSqlSafe(count_sql),
                args![tenant, session, first, second, since],
            )
            .await?
            .unwrap_or((0,));
        let before = before.map(|b| b.to_string());
        let page_args = args![
            tenant,
            session,
            first,
            second,
            since,
            before.as_deref(),
            limit
        ];
        let page_sql = format!(
            "SELECT {}{WHERE} AND ($6 IS NULL OR t.id < $6) ORDER BY t.id DESC LIMIT $7",
            turn_columns!()
                .split(", ")
                .map(|c| format!("t.{c}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let rows: Vec<TurnRow> = self
            .reader()
            .rows(sqlx::AssertSqlSafe(page_sql), page_args)
            .await?;
        let turns = rows
            .into_iter()
            .map(TryInto::try_into)
            .collect::<Result<Vec<_>>>()?;
        Ok((turns, u64::try_from(total).unwrap_or(0)))
    }

    /// Hides an ended turn from [`Self::find_turn`] (its session's log and
    /// history keep it). False when the turn is running, already hidden or
    /// not there.
    async fn hide_turn(&self, turn_id: Uuid, now: DateTime<Utc>) -> Result<bool>;

    /// The last seq of a session's events that are written but not in
    /// its table yet (SQLite's journal); `None`: none are.
    fn pending_seq(&self, _session_id: &str) -> Option<i64> {
        None
    }

    async fn get_session(&self, session_id: &SessionKey) -> Result<Option<SessionRecord>> {
        let sql = concat!(session_select!(), " WHERE s.id = $1");
        self.reader()
            .row::<SessionRow>(sql, args![session_id])
            .await?
            .map(|row| self.with_pending(row))
            .transpose()
    }

    /// A session's row read as its record, its last seq counting its
    /// pending events.
    fn with_pending(&self, row: SessionRow) -> Result<SessionRecord> {
        let mut record: SessionRecord = row.try_into()?;
        if let Some(pending) = self.pending_seq(&record.id) {
            record.last_seq = record.last_seq.max(pending);
        }
        Ok(record)
    }

    /// A tenant's sessions, the most recently used first, at most `limit`;
    /// a session whose every turn is hidden (deleted responses) is not
    /// among them.
    async fn list_sessions(&self, tenant: &str, limit: u32) -> Result<Vec<SessionRecord>> {
        let sql = concat!(
            session_select!(),
            " WHERE s.tenant = $1 \
               AND (s.forked_at IS NOT NULL OR EXISTS (SELECT 1 FROM turns t \
                 WHERE t.session_id = s.id AND t.hidden_at IS NULL)) \
             ORDER BY s.updated_at DESC, s.id LIMIT $2"
        );
        self.reader()
            .rows::<SessionRow>(sql, args![tenant, limit])
            .await?
            .into_iter()
            .map(|row| self.with_pending(row))
            .collect()
    }

    /// The tenant a session belongs to; `None`: no such session.
    async fn session_tenant(&self, session_id: &SessionKey) -> Result<Option<String>> {
        let sql = "SELECT tenant FROM sessions WHERE id = $1";
        let row: Option<(String,)> = self.reader().row(sql, args![session_id]).await?;
        Ok(row.map(|(tenant,)| tenant))
    }

    /// History of a session in order, after message id `after`.
    async fn list_messages(
        &self,
        session_id: &SessionKey,
        after: i64,
        limit: u32,
    ) -> Result<Vec<MessageRecord>> {
        let sql = "SELECT id, message_id, turn_id, role, content, created_at FROM messages \
             WHERE session_id = $1 AND id > $2 ORDER BY id LIMIT $3";
        let rows: Vec<MessageRow> = self
            .reader()
            .rows(sql, args![session_id, after, limit])
            .await?;
        rows.into_iter().map(TryInto::try_into).collect()
    }

    /// The last `limit` messages of a session, oldest first.
    async fn recent_messages(
        &self,
        session_id: &SessionKey,
        limit: u32,
    ) -> Result<Vec<MessageRecord>> {
        let rows: Vec<MessageRow> = self
            .reader()
            .rows(RECENT_MESSAGES, args![session_id, limit])
            .await?;
        rows.into_iter().rev().map(TryInto::try_into).collect()
    }

    /// The history a turn reads: the last `limit` messages of its branch,
    /// oldest first. A session that was never `branched` is one branch:
    /// its last messages are the branch's.
    async fn history(
        &self,
        session_id: &SessionKey,
        turn_id: Uuid,
        branched: bool,
        limit: u32,
    ) -> Result<Vec<MessageRecord>> {
        if !branched {
            return self.recent_messages(session_id, limit).await;
        }
        let rows: Vec<MessageRow> = self
            .reader()
            .rows(BRANCH_MESSAGES, args![turn_id, limit])
            .await?;
        rows.into_iter().rev().map(TryInto::try_into).collect()
    }

    /// The messages of `turn_id`'s branch (its own and its ancestors'), in
    /// order, after message id `after`; the caller checked the turn is
    /// the session's.
    async fn list_branch_messages(
        &self,
        turn_id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Vec<MessageRecord>> {
        let rows: Vec<MessageRow> = self
            .reader()
            .rows(BRANCH_PAGE, args![turn_id, after, limit, BRANCH_DEPTH_MAX])
            .await?;
        rows.into_iter().map(TryInto::try_into).collect()
    }

    /// A session's newest turn: the head of its current branch.
    async fn newest_turn(&self, session_id: &SessionKey) -> Result<Option<Uuid>> {
        let row: Option<(Option<String>,)> =
            self.reader().row(NEWEST_TURN, args![session_id]).await?;
        row.and_then(|(id,)| id)
            .map(|id| parse_uuid(&id))
            .transpose()
    }

    /// The turns of a session that continue the same turn as `turn`
    /// (itself included), oldest first, at most `limit`.
    async fn sibling_turns(&self, turn: &TurnRecord, limit: u32) -> Result<Vec<TurnRecord>> {
        let sql = concat!(
            "SELECT ",
            turn_columns!(),
            " FROM turns WHERE session_id = $1 AND parent_turn_id IS NOT DISTINCT FROM $2 \
              ORDER BY created_at, id LIMIT $3"
        );
        let parent = turn.parent_turn_id.map(|p| p.to_string());
        let rows: Vec<TurnRow> = self
            .reader()
            .rows(sql, args![&turn.session_id, parent.as_deref(), limit])
            .await?;
        rows.into_iter().map(TryInto::try_into).collect()
    }

    /// The newest turn of a session that its client named `run_id` (an
    /// AG-UI `runId`).
    async fn turn_of_run(&self, session_id: &SessionKey, run_id: &str) -> Result<Option<Uuid>> {
        let sql = "SELECT id FROM turns WHERE session_id = $1 AND run_id = $2 \
             ORDER BY created_at DESC, id DESC LIMIT 1";
        let row: Option<(String,)> = self.reader().row(sql, args![session_id, run_id]).await?;
        row.map(|(id,)| parse_uuid(&id)).transpose()
    }

    /// Messages of a session containing any of `terms` (lower-case words),
    /// newest first.
    async fn search_messages(
        &self,
        session_id: &SessionKey,
        terms: &[String],
        limit: u32,
    ) -> Result<Vec<MessageRecord>> {
        let terms = &terms[..terms.len().min(16)];
        if terms.is_empty() {
            return Ok(Vec::new());
        }
        let mut sql = String::from(
            "SELECT id, message_id, turn_id, role, content, created_at FROM messages \
             WHERE session_id = $1 AND (",
        );
        let mut bound = args![session_id];
        for (n, term) in terms.iter().enumerate() {
            if n > 0 {
                sql.push_str(" OR ");
            }
            sql.push_str(&format!("LOWER(content) LIKE ${}", n + 2));
            bound.push(format!("%{}%", term.to_lowercase()).into());
        }
        sql.push_str(&format!(") ORDER BY id DESC LIMIT ${}", terms.len() + 2));
        bound.push(limit.into());
        let rows: Vec<MessageRow> = self.reader().rows(sqlx::AssertSqlSafe(sql), bound).await?;
        rows.into_iter().map(TryInto::try_into).collect()
    }

    /// Decision records of a session, oldest first: after the record
    /// `after` (an id; they are UUID v7, in time order), of `strategy` if
    /// given, at most `limit`.
    async fn list_decisions(
        &self,
        session_id: &SessionKey,
        after: Option<&str>,
        strategy: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DecisionRecord>> {
        let sql = "SELECT id, turn_id, decision_key, strategy, record, created_at \
             FROM decisions WHERE session_id = $1 AND ($2 IS NULL OR id > $2) \
             AND ($3 IS NULL OR strategy = $3) ORDER BY id LIMIT $4";
        let rows: Vec<DecisionRow> = self
            .reader()
            .rows(sql, args![session_id, after, strategy, limit])
            .await?;
        rows.into_iter().map(TryInto::try_into).collect()
    }

    /// Flags a running turn for cancellation by its owner. False when the
    /// turn is not running.
    async fn request_cancel(&self, turn_id: Uuid) -> Result<bool>;

    /// Cancel requests and releases as they are made, by any process
    /// (Postgres: LISTEN/NOTIFY), so that a turn's owner stops it at once
    /// rather than at its next heartbeat, and a released turn is taken
    /// over at once rather than at the next sweep. `None`: the backend has
    /// no such channel (the heartbeat and the sweep are then the only
    /// ways). An error item is a lost connection: the next poll
    /// reconnects; what was announced meanwhile is found by the heartbeat
    /// and the sweep.
    async fn announcements(&self) -> Result<Option<Announcements>> {
        Ok(None)
    }

    /// Gives a running turn up, while `lease` holds it, for another
    /// process to take over at once (no owner process, the oldest
    /// heartbeat), and announces it where the backend can; false when the
    /// lease no longer held it.
    async fn release_turn(&self, lease: &Lease) -> Result<bool>;

    /// Parks a running turn, while `lease` holds it: no process owns it
    /// until it is woken ([`Turns::wake_turn`]) or `until` passes,
    /// and a sweep then takes it over (not counted as a take-over); false
    /// when the lease no longer held it.
    async fn park_turn(
        &self,
        lease: &Lease,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool>;

    /// Makes a parked turn due at once (an answer came, or a cancel), and
    /// announces it where the backend can; false when it is not parked.
    async fn wake_turn(&self, turn_id: Uuid, now: DateTime<Utc>) -> Result<bool>;

    /// Refreshes the heartbeat of these running turns, each while its
    /// lease holds (a turn taken over is another process's to keep alive);
    /// returns those it refreshed, each with whether its cancellation was
    /// requested.
    async fn heartbeat(&self, leases: &[Lease], now: DateTime<Utc>) -> Result<Vec<(Uuid, bool)>>;

    /// Marks orphaned running turns `interrupted`, each with a final
    /// `turn.interrupted` event; returns those events.
    /// Takes over up to a page of orphaned turns for the caller's process
    /// (owner, heartbeat `now`, attempt one more), or ends `interrupted`
    /// (with `reason`) those taken over `scope.max_attempts` times already.
    /// A claim locks the turn's row for update, so the lost owner's writes
    /// in flight land before it (and the turn goes on after them) or are
    /// refused after it.
    async fn take_orphans(
        &self,
        scope: &OrphanScope,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<Vec<Orphan>>;

    /// Takes a place in the queue of `session_id` (passing over, and
    /// removing, the session's tickets not kept alive since `stale_ms`);
    /// returns its ticket. Times are milliseconds since the epoch.
    async fn enqueue_turn(
        &self,
        session_id: &SessionKey,
        now_ms: i64,
        stale_ms: i64,
    ) -> Result<i64>;

    /// The ticket that goes next in `session_id`'s queue: the lowest kept
    /// alive since `stale_ms`.
    async fn queue_head(&self, session_id: &SessionKey, stale_ms: i64) -> Result<Option<i64>> {
        let sql = "SELECT MIN(ticket) FROM turn_queue WHERE session_id = $1 AND alive_ms >= $2";
        self.reader()
            .value::<Option<i64>>(sql, args![session_id, stale_ms])
            .await
    }

    /// Keeps a ticket alive.
    /// (false: the ticket is gone: an erase took the session's queue, or
    /// it went stale and another waiter dropped it).
    async fn touch_ticket(&self, ticket: i64, now_ms: i64) -> Result<bool>;

    /// Leaves the queue (the turn began, or the request gave up).
    async fn leave_queue(&self, ticket: i64) -> Result<()>;

    /// Empties `session_id`'s queue (its erase begins): every request that
    /// waits in it finds its ticket gone, and none begins a turn.
    async fn clear_queue(&self, session_id: &SessionKey) -> Result<()>;
}

/// Milliseconds from `parked_at` to `now` (none when the clock went back):
/// what a park lasted.
fn waited_ms(parked_at: DateTime<Utc>, now: DateTime<Utc>) -> i64 {
    (now - parked_at).num_milliseconds().max(0)
}

/// Why a unique index refused `turn` (after its transaction rolled back):
/// a used idempotency key first, else the running turn of its session.
/// `None`: nothing conflicts any more (the running turn ended in between).
async fn begin_conflict(reader: Reader<'_>, turn: &NewTurn) -> Result<Option<BeginTurnError>> {
    if let Some(key) = &turn.idempotency_key {
        let sql = concat!(
            "SELECT ",
            turn_columns!(),
            " FROM turns WHERE session_id = $1 AND idempotency_key = $2 \
             AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND s.tenant = $3)"
        );
        let existing: Option<TurnRow> = reader
            .row(sql, args![&turn.session_id, key, &turn.tenant])
            .await?;
        if let Some(row) = existing {
            return Ok(Some(BeginTurnError::IdempotencyKeyExists(Box::new(
                row.try_into()?,
            ))));
        }
    }
    let sql = "SELECT t.id FROM turns t JOIN sessions s ON s.id = t.session_id \
         WHERE t.session_id = $1 AND t.status = 'running' AND s.tenant = $2";
    let running: Option<(String,)> = reader
        .row(sql, args![&turn.session_id, &turn.tenant])
        .await?;
    running
        .map(|(id,)| parse_uuid(&id).map(BeginTurnError::AlreadyRunning))
        .transpose()
}

#[cfg(test)]
mod tests;
