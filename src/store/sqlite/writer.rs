//! The SQLite write path: one thread owns one connection; a write (a turn's
//! start, a batch of events, a turn's end) is one job sent to it.
//!
//! sqlx's SQLite driver also runs each connection on a thread of its own,
//! but hands every statement across (`BEGIN` and `COMMIT` included): a turn
//! took about 16 thread hand-offs, which was most of its cost (see
//! BENCHMARKS.md). Here each write is one hand-off, and the jobs waiting
//! when the thread comes round share one transaction (group commit), each
//! in a savepoint of its own (a job alone needs none): a job that fails is
//! rolled back alone, and no job hears "done" before the shared commit
//! succeeded. Reads stay on sqlx's pool; WAL lets them run beside the
//! writer, and a checkpointer thread copies the WAL into the file.

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::{
    events::{StoredEvent, TurnEvent},
    store::{
        BeganTurn, IndexedNote, JobOutcome, JobRecord, JobUsage, JudgementRecord, MemoryQuery,
        MemoryRecord, MessageRecord, NewArtifact, NewCheckpoint, NewJob, NewMemory, NewTurn,
        ObservationRecord, OrphanScope, StoreError, TurnContext, TurnFinish, records::parse_uuid,
        sql,
    },
};

/// Jobs that may wait for the writer thread.
const QUEUE: usize = 1024;

/// Most jobs in one shared transaction.
const GROUP_MAX: usize = 256;

/// How long the checkpointer lets commits gather before it copies them
/// from the WAL into the database file.
const CHECKPOINT_AFTER: Duration = Duration::from_millis(100);

/// WAL frames past which the writer starts the WAL over (see
/// [`Writer::start_checkpointer`]).
const RESTART_WAL_AT: i64 = 4000;

/// A write, run inside the group's transaction.
trait Job: Send {
    /// Runs the write; false when it failed (its part is rolled back).
    fn run(&mut self, connection: &Connection) -> bool;
    /// Hands over the outcome once the group's commit is known.
    fn report(self: Box<Self>, commit: &Result<(), String>);
}

struct Typed<T, F> {
    work: Option<F>,
    outcome: Option<Result<T, StoreError>>,
    reply: Option<oneshot::Sender<Result<T, StoreError>>>,
}

impl<T, F> Job for Typed<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send,
{
    fn run(&mut self, connection: &Connection) -> bool {
        let outcome = match self.work.take() {
            Some(work) => work(connection),
            None => Err(StoreError::Unavailable("a write ran twice".into())),
        };
        let ok = outcome.is_ok();
        self.outcome = Some(outcome);
        ok
    }

    fn report(mut self: Box<Self>, commit: &Result<(), String>) {
        let outcome = match (self.outcome.take(), commit) {
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (Some(Ok(_)), Err(e)) => Err(StoreError::Unavailable(format!("sqlite commit: {e}"))),
            (None, Err(e)) => Err(StoreError::Unavailable(format!("sqlite: {e}"))),
            (None, Ok(())) => Err(StoreError::Unavailable("a write did not run".into())),
        };
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(outcome);
        }
    }
}

/// Runs `group` in one transaction, each job in its own savepoint; a
/// job alone runs in the transaction itself (a savepoint copies each page
/// it changes to a sub-journal first: a third of the writer's time under
/// 1,000 streams, see BENCHMARKS.md).
fn run_group(connection: &mut Connection, group: &mut [Box<dyn Job>]) -> Result<(), String> {
    let mut tx = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| e.to_string())?;
    if let [job] = group {
        return if job.run(&tx) {
            tx.commit().map_err(|e| e.to_string())
        } else {
            // The job reports its own error; nothing of it stays.
            tx.rollback().map_err(|e| e.to_string())
        };
    }
    for job in group.iter_mut() {
        let savepoint = tx.savepoint().map_err(|e| e.to_string())?;
        if job.run(&savepoint) {
            savepoint.commit().map_err(|e| e.to_string())?;
        }
        // A failed job's savepoint rolls back when dropped.
    }
    tx.commit().map_err(|e| e.to_string())
}

/// Handle to the writer thread; the thread ends when the handle is dropped.
#[derive(Debug)]
pub(super) struct Writer {
    jobs: mpsc::Sender<Box<dyn Job>>,
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Unavailable(format!("sqlite: {e}"))
    }
}

/// Timestamps as sqlx's SQLite driver writes them, so both sides compare.
fn ts(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, false)
}

/// A timestamp as [`ts`] (or sqlx) wrote it.
fn parse_ts(raw: &str) -> Result<DateTime<Utc>, StoreError> {
    DateTime::parse_from_rfc3339(raw)
        .map(|at| at.with_timezone(&Utc))
        .or_else(|_| {
            chrono::NaiveDateTime::parse_from_str(raw, "%Y-%m-%d %H:%M:%S%.f")
                .map(|at| at.and_utc())
        })
        .map_err(|e| StoreError::Corrupt(format!("timestamp {raw:?}: {e}")))
}

/// A turn's first read as the begin answers it: one that fails is left to
/// the turn (which reads again, and goes on without memories if that
/// fails too), so the begin itself stands.
fn answered<T>(read: &str, result: Result<T, StoreError>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(e) => {
            tracing::warn!(error = %e, read, "a turn's first read failed on the begin");
            None
        }
    }
}

/// [`crate::store::Store::recent_messages`], on the writer's connection.
fn recent_messages(
    tx: &Connection,
    session_id: &str,
    limit: u32,
) -> Result<Vec<MessageRecord>, StoreError> {
    let mut statement = tx.prepare_cached(sql::RECENT_MESSAGES)?;
    let rows = statement.query_map(params![session_id, i64::from(limit)], |row| {
        Ok((
            row.get::<_, i64>(0)?,
            row.get::<_, Option<String>>(1)?,
            row.get::<_, String>(2)?,
            row.get::<_, String>(3)?,
            row.get::<_, String>(4)?,
            row.get::<_, String>(5)?,
        ))
    })?;
    let mut newest_first = Vec::new();
    for row in rows {
        let (id, message_id, turn_id, role, content, created_at) = row?;
        newest_first.push(MessageRecord {
            id,
            message_id: message_id.as_deref().map(parse_uuid).transpose()?,
            turn_id: parse_uuid(&turn_id)?,
            role,
            content,
            created_at: parse_ts(&created_at)?,
        });
    }
    newest_first.reverse();
    Ok(newest_first)
}

/// [`crate::store::Store::memories_for_turn`], on the writer's connection.
fn memories_for_turn(
    tx: &Connection,
    query: &MemoryQuery,
) -> Result<(Vec<MemoryRecord>, Vec<MemoryRecord>), StoreError> {
    // Most scopes have no memories (a new user, extraction off): one
    // index probe answers them, not a full-text query (whose set-up was
    // most of a begin's time on this thread, and every begin queued
    // behind it waited it out: BENCHMARKS.md, "Issue 23").
    let any: Option<i64> = tx
        .prepare_cached("SELECT 1 FROM memories WHERE scope = ?1 LIMIT 1")?
        .query_row(params![query.scope], |row| row.get(0))
        .optional()?;
    if any.is_none() {
        return Ok((Vec::new(), Vec::new()));
    }
    let preferences = memories(
        tx,
        sql::LIST_MEMORIES,
        params![query.scope, "preference", i64::from(query.preferences)],
    )?;
    let terms = crate::store::vault::clean_terms(&query.terms);
    if terms.is_empty() || query.limit == 0 {
        return Ok((Vec::new(), preferences));
    }
    let matches = memories(
        tx,
        super::SEARCH_MEMORY_TEXT,
        params![super::any_of(&terms), query.scope, i64::from(query.limit)],
    )?;
    Ok((matches, preferences))
}

/// The memories `sql` selects (their columns in the usual order).
fn memories(
    tx: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<MemoryRecord>, StoreError> {
    let mut statement = tx.prepare_cached(sql)?;
    let rows = statement.query_map(params, |row| {
        Ok((
            MemoryRecord {
                id: row.get(0)?,
                scope: row.get(1)?,
                kind: row.get(2)?,
                key: row.get(3)?,
                content: row.get(4)?,
                source_session_id: row.get(5)?,
                source_turn_id: row.get(6)?,
                created_at: DateTime::<Utc>::MIN_UTC,
                updated_at: DateTime::<Utc>::MIN_UTC,
            },
            row.get::<_, String>(7)?,
            row.get::<_, String>(8)?,
        ))
    })?;
    let mut found = Vec::new();
    for row in rows {
        let (mut memory, created_at, updated_at) = row?;
        memory.created_at = parse_ts(&created_at)?;
        memory.updated_at = parse_ts(&updated_at)?;
        found.push(memory);
    }
    Ok(found)
}

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::ConstraintViolation)
}

impl Writer {
    /// Opens `path` (which the migrations already created) for writing.
    pub(super) fn open(path: &Path) -> Result<Self, StoreError> {
        let connection = Connection::open(path)?;
        connection.busy_timeout(Duration::from_secs(5))?;
        connection.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; \
             PRAGMA mmap_size = 268435456; PRAGMA cache_size = -8192; \
             PRAGMA wal_autocheckpoint = 16000; PRAGMA journal_size_limit = 67108864; \
             PRAGMA temp_store = MEMORY;",
        )?;
        let restart_due = Arc::new(AtomicBool::new(false));
        let checkpoints = Self::start_checkpointer(path, restart_due.clone())?;
        let (jobs, mut queue) = mpsc::channel::<Box<dyn Job>>(QUEUE);
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || {
                let mut connection = connection;
                let mut group: Vec<Box<dyn Job>> = Vec::with_capacity(GROUP_MAX);
                while let Some(first) = queue.blocking_recv() {
                    group.push(first);
                    while group.len() < GROUP_MAX {
                        match queue.try_recv() {
                            Ok(job) => group.push(job),
                            Err(_) => break,
                        }
                    }
                    let commit = run_group(&mut connection, &mut group);
                    for job in group.drain(..) {
                        job.report(&commit);
                    }
                    // Full: a checkpoint is already due.
                    let _ = checkpoints.try_send(());
                    // Only when no write waits: the copy ends with two
                    // fsyncs (3-30 ms here), which writes queued behind it
                    // would wait out.
                    if queue.is_empty() && restart_due.swap(false, Ordering::Relaxed) {
                        // Copies the few frames committed since the
                        // checkpointer's pass; the next write starts the
                        // WAL over. Failing is harmless: the next pass
                        // asks again.
                        let _ =
                            connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
                    }
                }
            })
            .map_err(|e| StoreError::Unavailable(format!("cannot start the SQLite writer: {e}")))?;
        Ok(Self { jobs })
    }

    /// Starts the thread that checkpoints the WAL, and returns how to tell
    /// it that commits are waiting.
    ///
    /// SQLite would otherwise checkpoint inside the commit that crosses
    /// 1,000 WAL pages, copying and syncing pages while every write queued
    /// behind it waits. Here a passive checkpoint on a connection of its
    /// own copies the WAL into the database file beside the writer. SQLite
    /// starts the WAL over only when a write begins with every frame
    /// copied, which a writer that never pauses does not see; so when the
    /// WAL has grown past [`RESTART_WAL_AT`] frames, the checkpointer sets
    /// `restart_due` after its pass, and the writer copies the few frames
    /// committed since (cheap, most of the WAL is copied and synced) so
    /// that its next write starts the WAL over. The writer's own
    /// checkpoint at 16,000 pages stays as the backstop. Under 1,000
    /// streams this took the writer thread's time in checkpoints from 33%
    /// to 13% (BENCHMARKS.md). The thread ends when the writer thread does.
    fn start_checkpointer(
        path: &Path,
        restart_due: Arc<AtomicBool>,
    ) -> Result<std::sync::mpsc::SyncSender<()>, StoreError> {
        let connection = Connection::open(path)?;
        connection.busy_timeout(Duration::from_secs(5))?;
        connection.execute_batch("PRAGMA synchronous = NORMAL;")?;
        let (due, pending) = std::sync::mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || {
                while pending.recv().is_ok() {
                    std::thread::sleep(CHECKPOINT_AFTER);
                    // Commits after this point wait for the next round.
                    while pending.try_recv().is_ok() {}
                    // (busy, frames in the WAL, frames copied)
                    match connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
                        Ok((
                            row.get::<_, i64>(0)?,
                            row.get::<_, i64>(1)?,
                            row.get::<_, i64>(2)?,
                        ))
                    }) {
                        Ok((0, frames, copied)) if frames >= RESTART_WAL_AT && copied == frames => {
                            restart_due.store(true, Ordering::Relaxed);
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "sqlite checkpoint failed; retrying later");
                        }
                    }
                }
            })
            .map_err(|e| {
                StoreError::Unavailable(format!("cannot start the SQLite checkpointer: {e}"))
            })?;
        Ok(due)
    }

    /// Runs `work` on the writer thread, in a transaction (shared with
    /// the writes queued beside it); answers once that commits.
    async fn run<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let stopped = || StoreError::Unavailable("the SQLite writer stopped".into());
        let (reply, result) = oneshot::channel();
        self.jobs
            .send(Box::new(Typed {
                work: Some(work),
                outcome: None,
                reply: Some(reply),
            }))
            .await
            .map_err(|_| stopped())?;
        result.await.map_err(|_| stopped())?
    }

    /// Begins a turn; [`StoreError::Conflict`]: a unique index refused it
    /// (the caller finds out why) and nothing was written.
    /// `None`: the session belongs to another tenant (nothing written).
    pub(super) async fn begin_turn(&self, turn: NewTurn) -> Result<Option<BeganTurn>, StoreError> {
        self.run(move |tx| {
            let created = ts(turn.created_at);
            // A session of another tenant is left as it is (no row comes back).
            let began: Option<(i64, Option<f64>, i64)> = tx
                .prepare_cached(
                    "INSERT INTO sessions (id, created_at, updated_at, turn_count, last_seq, tenant) \
                     VALUES (?1, ?2, ?2, 1, 1, ?3) \
                     ON CONFLICT (id) DO UPDATE SET updated_at = excluded.updated_at, \
                     turn_count = sessions.turn_count + 1, last_seq = sessions.last_seq + 1 \
                     WHERE sessions.tenant = excluded.tenant \
                     RETURNING turn_count, cost_usd, last_seq",
                )?
                .query_row(params![turn.session_id, created, turn.tenant], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                })
                .optional()?;
            let Some((turn_count, session_cost, seq)) = began else {
                return Ok(None);
            };
            let inserted = tx
                .prepare_cached(
                    "INSERT INTO turns (id, session_id, status, request, idempotency_key, \
                     owner_instance, owner_process, heartbeat_at, first_seq, created_at) \
                     VALUES (?1, ?2, 'running', ?3, ?4, ?5, ?6, ?7, ?8, ?7)",
                )?
                .execute(params![
                    turn.id.to_string(),
                    turn.session_id,
                    turn.request,
                    turn.idempotency_key,
                    turn.owner_instance,
                    turn.owner_process,
                    created,
                    seq
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
                turn.session_id,
                seq,
                turn.id.to_string(),
                turn.started_payload,
                created
            ])?;
            // The turn's first reads, on this connection (the write
            // transaction sees what was committed, and its own rows).
            // A read that fails leaves it to the turn (see `answered`).
            let history = match turn.reads.history {
                // The first turn of a session has no history to read.
                Some(_) if turn_count <= 1 => Some(Vec::new()),
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
            Ok(Some(BeganTurn {
                first_seq: seq,
                turn_number: u64::try_from(turn_count).unwrap_or(1),
                session_cost_before: session_cost,
                context: TurnContext { history, memories },
            }))
        })
        .await
    }

    /// Events and turn ends in one transaction; see [`crate::store::Store::write_batch`].
    pub(super) async fn write_batch(
        &self,
        events: Vec<Arc<StoredEvent>>,
        finishes: Vec<TurnFinish>,
    ) -> Result<Vec<bool>, StoreError> {
        self.run(move |tx| {
            let mut applied = Vec::with_capacity(finishes.len());
            for finish in &finishes {
                let at = ts(finish.terminal.created_at);
                let turn_id = finish.turn_id.to_string();
                let updated = tx
                    .prepare_cached(
                        "UPDATE turns SET status = ?1, result = ?2, error_code = ?3, \
                         error_message = ?4, finished_at = ?5, cost_usd = ?7 \
                         WHERE id = ?6 AND status = 'running'",
                    )?
                    .execute(params![
                        finish.status.as_str(),
                        finish.result,
                        finish.error_code,
                        finish.error_message,
                        at,
                        turn_id,
                        finish.cost_usd
                    ])?;
                applied.push(updated == 1);
                if updated != 1 {
                    continue;
                }
                let mut message = tx.prepare_cached(
                    "INSERT INTO messages (message_id, session_id, turn_id, role, content, \
                     created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )?;
                for m in &finish.messages {
                    message.execute(params![
                        m.id.to_string(),
                        finish.session_id,
                        turn_id,
                        m.role,
                        m.content,
                        at
                    ])?;
                }
                if let Some(d) = &finish.decision {
                    tx.prepare_cached(
                        "INSERT INTO decisions (id, session_id, turn_id, decision_key, strategy, \
                         record, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    )?
                    .execute(params![
                        d.id.to_string(),
                        finish.session_id,
                        turn_id,
                        d.decision_key,
                        d.strategy,
                        d.record,
                        at
                    ])?;
                }
                if let Some(o) = &finish.observation {
                    insert_observation(tx, o)?;
                }
                for job in &finish.jobs {
                    insert_job(tx, job)?;
                }
                tx.prepare_cached(
                    "UPDATE sessions SET updated_at = ?1, last_seq = ?4, \
                     cost_usd = COALESCE(cost_usd + ?3, cost_usd, ?3) WHERE id = ?2",
                )?
                .execute(params![
                    at,
                    finish.session_id,
                    finish.cost_usd,
                    finish.terminal.seq
                ])?;
            }
            let terminals = finishes
                .iter()
                .zip(&applied)
                .filter(|(_, applied)| **applied)
                .map(|(finish, _)| &*finish.terminal);
            insert_events(tx, events.iter().map(|e| &**e).chain(terminals))?;
            Ok(applied)
        })
        .await
    }

    pub(super) async fn put_artifact(&self, artifact: NewArtifact) -> Result<(), StoreError> {
        self.run(move |connection| {
            connection
                .prepare_cached(
                    "INSERT INTO artifacts (id, session_id, turn_id, call_id, tool, content, \
                     created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?
                .execute(params![
                    artifact.id,
                    artifact.session_id,
                    artifact.turn_id,
                    artifact.call_id,
                    artifact.tool,
                    artifact.content,
                    ts(artifact.created_at)
                ])?;
            Ok(())
        })
        .await
    }

    pub(super) async fn request_cancel(&self, turn_id: Uuid) -> Result<bool, StoreError> {
        self.run(move |connection| {
            let updated = connection
                .prepare_cached(
                    "UPDATE turns SET cancel_requested = 1 WHERE id = ?1 AND status = 'running'",
                )?
                .execute(params![turn_id.to_string()])?;
            Ok(updated == 1)
        })
        .await
    }

    pub(super) async fn heartbeat(
        &self,
        turn_ids: Vec<Uuid>,
        now: DateTime<Utc>,
    ) -> Result<Vec<Uuid>, StoreError> {
        self.run(move |tx| {
            let mut cancelled = Vec::new();
            {
                let mut beat = tx.prepare_cached(
                    "UPDATE turns SET heartbeat_at = ?1 WHERE id = ?2 AND status = 'running' \
                     RETURNING cancel_requested",
                )?;
                let at = ts(now);
                for id in turn_ids {
                    let mut rows = beat.query(params![at, id.to_string()])?;
                    if let Some(row) = rows.next()?
                        && row.get::<_, bool>(0)?
                    {
                        cancelled.push(id);
                    }
                }
            }
            Ok(cancelled)
        })
        .await
    }

    pub(super) async fn put_checkpoint(&self, checkpoint: NewCheckpoint) -> Result<(), StoreError> {
        self.run(move |connection| {
            let bytes = checkpoint
                .content
                .as_ref()
                .map(|c| i64::try_from(c.len()).unwrap_or(i64::MAX));
            connection
                .prepare_cached(
                    "INSERT INTO checkpoints (id, session_id, turn_id, call_id, tool, path, \
                     existed, content, bytes, created_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                )?
                .execute(params![
                    checkpoint.id,
                    checkpoint.session_id,
                    checkpoint.turn_id,
                    checkpoint.call_id,
                    checkpoint.tool,
                    checkpoint.path,
                    checkpoint.content.is_some(),
                    checkpoint.content,
                    bytes,
                    ts(checkpoint.created_at)
                ])?;
            Ok(())
        })
        .await
    }

    pub(super) async fn mark_checkpoint_restored(
        &self,
        id: String,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.run(move |connection| {
            let updated = connection
                .prepare_cached(
                    "UPDATE checkpoints SET restored_at = ?2 WHERE id = ?1 AND restored_at IS NULL",
                )?
                .execute(params![id, ts(at)])?;
            Ok(updated == 1)
        })
        .await
    }

    pub(super) async fn api_key(
        &self,
        id: String,
        tenant: String,
        key_hash: String,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.run(move |connection| {
            connection
                .prepare_cached(
                    "INSERT INTO api_keys (id, tenant, key_hash, created_at) VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![id, tenant, key_hash, ts(at)])?;
            Ok(())
        })
        .await
    }

    pub(super) async fn shed_jobs(
        &self,
        kind: String,
        keep: u64,
        why: String,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        self.run(move |connection| {
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

    pub(super) async fn queue_ticket(
        &self,
        session_id: String,
        now_ms: i64,
        stale_ms: i64,
    ) -> Result<i64, StoreError> {
        self.run(move |connection| {
            connection
                .prepare_cached("DELETE FROM turn_queue WHERE session_id = ?1 AND alive_ms < ?2")?
                .execute(params![session_id, stale_ms])?;
            connection
                .prepare_cached("INSERT INTO turn_queue (session_id, alive_ms) VALUES (?1, ?2)")?
                .execute(params![session_id, now_ms])?;
            Ok(connection.last_insert_rowid())
        })
        .await
    }

    pub(super) async fn ticket_alive(&self, ticket: i64, now_ms: i64) -> Result<(), StoreError> {
        self.run(move |connection| {
            connection
                .prepare_cached("UPDATE turn_queue SET alive_ms = ?2 WHERE ticket = ?1")?
                .execute(params![ticket, now_ms])?;
            Ok(())
        })
        .await
    }

    pub(super) async fn ticket_removal(&self, ticket: i64) -> Result<(), StoreError> {
        self.run(move |connection| {
            connection
                .prepare_cached("DELETE FROM turn_queue WHERE ticket = ?1")?
                .execute(params![ticket])?;
            Ok(())
        })
        .await
    }

    pub(super) async fn revoke_api_key(
        &self,
        id: String,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.run(move |connection| {
            let done = connection
                .prepare_cached(
                    "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                )?
                .execute(params![id, ts(at)])?;
            Ok(done == 1)
        })
        .await
    }

    pub(super) async fn decide_approval(
        &self,
        session_id: String,
        turn_id: Uuid,
        call_id: String,
        approved: bool,
        reason: Option<String>,
    ) -> Result<bool, StoreError> {
        self.run(move |connection| {
            let inserted = connection
                .prepare_cached(
                    "INSERT INTO approvals (turn_id, call_id, session_id, approved, reason, \
                     decided_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                     ON CONFLICT (turn_id, call_id) DO NOTHING",
                )?
                .execute(params![
                    turn_id.to_string(),
                    call_id,
                    session_id,
                    approved,
                    reason,
                    ts(Utc::now())
                ])?;
            Ok(inserted == 1)
        })
        .await
    }

    pub(super) async fn put_memory(&self, memory: NewMemory) -> Result<(), StoreError> {
        self.run(move |connection| {
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
            Ok(())
        })
        .await
    }

    pub(super) async fn delete_memories(
        &self,
        scope: String,
        id: Option<String>,
    ) -> Result<u64, StoreError> {
        self.run(move |connection| {
            let deleted = connection
                .prepare_cached(
                    "DELETE FROM memories WHERE scope = ?1 AND (?2 IS NULL OR id = ?2)",
                )?
                .execute(params![scope, id])?;
            Ok(u64::try_from(deleted).unwrap_or(u64::MAX))
        })
        .await
    }

    pub(super) async fn put_job(&self, job: NewJob) -> Result<(), StoreError> {
        self.run(move |connection| insert_job(connection, &job))
            .await
    }

    pub(super) async fn claim_job(
        &self,
        now: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> Result<Option<JobRecord>, StoreError> {
        self.run(move |connection| {
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

    pub(super) async fn finish_job(
        &self,
        id: String,
        outcome: JobOutcome,
        usage: JobUsage,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.run(move |connection| {
            match outcome {
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
                    .execute(params![id, error, ts(after), ts(now)])?,
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

    pub(super) async fn put_judgement(&self, judgement: JudgementRecord) -> Result<(), StoreError> {
        self.run(move |connection| {
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
            Ok(())
        })
        .await
    }

    /// `event` at the session's next seq, unless a turn of the session runs
    /// (false: nothing written); `event.seq` is not used.
    pub(super) async fn append_session_event(
        &self,
        event: StoredEvent,
    ) -> Result<bool, StoreError> {
        self.run(move |connection| {
            let running: Option<String> = connection
                .prepare_cached(
                    "SELECT id FROM turns WHERE session_id = ?1 AND status = 'running'",
                )?
                .query_row(params![event.session_id], |row| row.get(0))
                .optional()?;
            if running.is_some() {
                return Ok(false);
            }
            let seq: i64 = connection
                .prepare_cached(
                    "UPDATE sessions SET last_seq = last_seq + 1 WHERE id = ?1 RETURNING last_seq",
                )?
                .query_row(params![event.session_id], |row| row.get(0))?;
            connection
                .prepare_cached(
                    "INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )?
                .execute(params![
                    event.session_id,
                    seq,
                    event.turn_id.to_string(),
                    event.event_type,
                    event.payload,
                    ts(event.created_at)
                ])?;
            Ok(true)
        })
        .await
    }

    /// Indexes a note in place of what was indexed at its path.
    pub(super) async fn put_vault_note(&self, note: IndexedNote) -> Result<(), StoreError> {
        self.run(move |connection| {
            connection
                .prepare_cached("DELETE FROM vault_chunks WHERE path = ?1")?
                .execute(params![note.path])?;
            connection
                .prepare_cached(
                    "INSERT INTO vault_notes (path, content_hash, bytes, indexed_at, embedding_model) \
                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (path) DO UPDATE SET \
                     content_hash = excluded.content_hash, bytes = excluded.bytes, \
                     indexed_at = excluded.indexed_at, embedding_model = excluded.embedding_model",
                )?
                .execute(params![
                    note.path,
                    note.content_hash,
                    note.bytes,
                    ts(Utc::now()),
                    note.embedding_model
                ])?;
            let mut insert = connection.prepare_cached(
                "INSERT INTO vault_chunks (path, ordinal, heading, anchor, text, embedding) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for (ordinal, chunk) in note.chunks.iter().enumerate() {
                insert.execute(params![
                    note.path,
                    i64::try_from(ordinal).unwrap_or(i64::MAX),
                    chunk.heading,
                    chunk.anchor,
                    chunk.text,
                    chunk
                        .embedding
                        .as_deref()
                        .map(crate::store::vault::vector_bytes)
                ])?;
            }
            Ok(())
        })
        .await
    }

    /// Removes notes and their chunks from the index.
    pub(super) async fn remove_vault_notes(&self, paths: Vec<String>) -> Result<u64, StoreError> {
        self.run(move |connection| {
            let mut removed = 0;
            for path in &paths {
                connection
                    .prepare_cached("DELETE FROM vault_chunks WHERE path = ?1")?
                    .execute(params![path])?;
                removed += connection
                    .prepare_cached("DELETE FROM vault_notes WHERE path = ?1")?
                    .execute(params![path])?;
            }
            Ok(u64::try_from(removed).unwrap_or(u64::MAX))
        })
        .await
    }

    pub(super) async fn interrupt_orphans(
        &self,
        scope: OrphanScope,
        reason: String,
        now: DateTime<Utc>,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.run(move |connection| {
            let candidates: Vec<(String, String)> = connection
                .prepare_cached(
                    "SELECT id, session_id FROM turns WHERE status = 'running' \
                     AND ((owner_instance = ?1 AND owner_process <> ?2) OR heartbeat_at < ?3) \
                     ORDER BY created_at LIMIT ?4",
                )?
                .query_map(
                    params![
                        scope.instance,
                        scope.process,
                        ts(scope.stale_before),
                        super::super::sql::ORPHANS_PER_SWEEP
                    ],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )?
                .collect::<Result<_, _>>()?;
            let event = TurnEvent::TurnInterrupted {
                reason: reason.clone(),
            };
            let at = ts(now);
            let mut interrupted = Vec::with_capacity(candidates.len());
            let tx = connection;
            for (turn_id, session_id) in candidates {
                if scope
                    .alive
                    .contains(&super::super::records::parse_uuid(&turn_id)?)
                {
                    continue;
                }
                let updated = tx
                    .prepare_cached(
                        "UPDATE turns SET status = 'interrupted', error_code = 'interrupted', \
                         error_message = ?1, finished_at = ?2 WHERE id = ?3 AND status = 'running'",
                    )?
                    .execute(params![reason, at, turn_id])?;
                if updated != 1 {
                    continue;
                }
                let seq: i64 = tx
                    .prepare_cached(
                        "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE session_id = ?1",
                    )?
                    .query_row(params![session_id], |row| row.get(0))?;
                let stored = StoredEvent::new(
                    &session_id,
                    super::super::records::parse_uuid(&turn_id)?,
                    seq,
                    &event,
                    now,
                )
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                insert_events(tx, std::iter::once(&stored))?;
                tx.prepare_cached("UPDATE sessions SET last_seq = ?1 WHERE id = ?2")?
                    .execute(params![seq, session_id])?;
                interrupted.push(stored);
            }
            Ok(interrupted)
        })
        .await
    }
}

/// Inserts events one row at a time: on this thread a statement costs a
/// few microseconds, not a hand-off.
fn insert_events<'e>(
    tx: &Connection,
    events: impl Iterator<Item = &'e StoredEvent>,
) -> Result<(), StoreError> {
    let mut insert = tx.prepare_cached(
        "INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for e in events {
        insert.execute(params![
            e.session_id,
            e.seq,
            e.turn_id.to_string(),
            e.event_type,
            e.payload,
            ts(e.created_at)
        ])?;
    }
    Ok(())
}

/// Keeps a research learner's observation.
fn insert_observation(tx: &Connection, o: &ObservationRecord) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO research_observations (id, session_id, source_id, user_text, \
         assistant_text, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        o.id,
        o.session_id,
        o.source_id,
        o.user_text,
        o.assistant_text,
        ts(o.created_at)
    ])?;
    Ok(())
}

/// Queues a background job.
fn insert_job(tx: &Connection, job: &NewJob) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO background_jobs (id, kind, session_id, turn_id, payload, status, \
         run_after, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?6, ?6)",
    )?
    .execute(params![
        job.id,
        job.kind,
        job.session_id,
        job.turn_id,
        job.payload,
        ts(job.at)
    ])?;
    Ok(())
}
