//! The SQLite write path: one thread owns one connection; a write (a turn's
//! start, a batch of events, a turn's end) is one job sent to it.
//!
//! sqlx's SQLite driver also runs each connection on a thread of its own,
//! but hands every statement across (`BEGIN` and `COMMIT` included): a turn
//! took about 16 thread hand-offs, which was most of its cost (see
//! docs/benchmarks.md). Here each write is one hand-off, and the jobs waiting
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

use crate::ids::SessionKey;
use crate::store::Result;
use crate::{
    events::StoredEvent,
    store::{
        MemoryQuery, MemoryRecord, MessageRecord, NewJob, ObservationRecord, StoreError, jobs,
        records::parse_uuid, turns,
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
    outcome: Option<Result<T>>,
    reply: Option<oneshot::Sender<Result<T>>>,
}

impl<T, F> Job for Typed<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T> + Send,
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
/// 1,000 streams, see docs/benchmarks.md).
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
pub(in crate::store) struct Writer {
    jobs: mpsc::Sender<Box<dyn Job>>,
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Unavailable(format!("sqlite: {e}"))
    }
}

/// Timestamps as sqlx's SQLite driver writes them, so both sides compare.
pub(in crate::store) fn ts(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, false)
}

/// A timestamp as [`ts`] (or sqlx) wrote it.
pub(in crate::store) fn parse_ts(raw: &str) -> Result<DateTime<Utc>> {
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
pub(in crate::store) fn answered<T>(read: &str, result: Result<T>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(e) => {
            tracing::warn!(error = %e, read, "a turn's first read failed on the begin");
            None
        }
    }
}

/// [`crate::store::Turns::recent_messages`], on the writer's connection.
pub(in crate::store) fn recent_messages(
    tx: &Connection,
    session_id: &SessionKey,
    limit: u32,
) -> Result<Vec<MessageRecord>> {
    let mut statement = tx.prepare_cached(turns::RECENT_MESSAGES)?;
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

/// [`crate::store::Jobs::memories_for_turn`], on the writer's connection.
pub(in crate::store) fn memories_for_turn(
    tx: &Connection,
    query: &MemoryQuery,
) -> Result<(Vec<MemoryRecord>, Vec<MemoryRecord>)> {
    // Most scopes have no memories (a new user, extraction off): one
    // index probe answers them, not a full-text query (whose set-up was
    // most of a begin's time on this thread, and every begin queued
    // behind it waited it out: issue 23's profile, in the git history of
    // docs/benchmarks.md).
    let any: Option<i64> = tx
        .prepare_cached("SELECT 1 FROM memories WHERE scope = ?1 LIMIT 1")?
        .query_row(params![query.scope], |row| row.get(0))
        .optional()?;
    if any.is_none() {
        return Ok((Vec::new(), Vec::new()));
    }
    let preferences = memories(
        tx,
        jobs::LIST_MEMORIES,
        params![query.scope, "preference", i64::from(query.preferences)],
    )?;
    let Some(terms) = crate::store::vault::searchable(&query.terms, query.limit) else {
        return Ok((Vec::new(), preferences));
    };
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
) -> Result<Vec<MemoryRecord>> {
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

pub(in crate::store) fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::ConstraintViolation)
}

impl Writer {
    /// Opens `path` (which the migrations already created) for writing.
    pub(super) fn open(path: &Path) -> Result<Self> {
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
    /// to 13% (docs/benchmarks.md). The thread ends when the writer thread does.
    fn start_checkpointer(
        path: &Path,
        restart_due: Arc<AtomicBool>,
    ) -> Result<std::sync::mpsc::SyncSender<()>> {
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
    pub(in crate::store) async fn run<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
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
}

/// Inserts events one row at a time: on this thread a statement costs a
/// few microseconds, not a hand-off.
///
/// In key order, each turn's deltas of one step a run where they follow
/// each other (`event_log/runs.rs`): a fast stream is a few rows a
/// commit, not one per token. Two events at one seq are
/// [`StoreError::Conflict`], as a duplicate key is; and since the primary
/// key sees only a run's first seq, a session the batch writes a run for
/// must have nothing at or past the batch's first seq of it (a turn's
/// log only grows). A row of one event keeps the key's check alone: the
/// query per session would cost a paced token about 5 % more.
pub(in crate::store) fn insert_events<'e>(
    tx: &Connection,
    events: impl Iterator<Item = &'e StoredEvent>,
) -> Result<()> {
    let mut events: Vec<&StoredEvent> = events.collect();
    events.sort_by(|a, b| (&a.session_id, a.seq).cmp(&(&b.session_id, b.seq)));
    let twice = events
        .windows(2)
        .any(|w| w[0].seq == w[1].seq && w[0].session_id == w[1].session_id);
    if twice {
        return Err(StoreError::Conflict);
    }
    let rows = crate::store::event_log::runs::rows(events.iter().copied(), ts);
    let mut last = tx.prepare_cached(
        "SELECT COALESCE(seq_end, seq) FROM events WHERE session_id = ?1 \
         ORDER BY seq DESC LIMIT 1",
    )?;
    // The session the rows are at (they are in key order), its first seq
    // in the batch, and whether it was checked.
    let mut at: Option<(&str, i64, bool)> = None;
    for row in &rows {
        let first = row.first();
        let (session, from, checked) = match at {
            Some((session, from, checked)) if session == first.session_id => {
                (session, from, checked)
            }
            _ => (first.session_id.as_str(), first.seq, false),
        };
        at = Some((session, from, checked || row.seq_end().is_some()));
        if checked || row.seq_end().is_none() {
            continue;
        }
        let end: Option<i64> = last
            .query_row(params![session], |row| row.get(0))
            .optional()?;
        if end.is_some_and(|end| end >= from) {
            return Err(StoreError::Conflict);
        }
    }
    drop(last);
    let mut insert = tx.prepare_cached(
        "INSERT INTO events (session_id, seq, seq_end, turn_id, type, payload, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    // A turn's id, written once per turn of the batch.
    let mut turn = String::new();
    let mut last_turn = None;
    for row in rows {
        let e = row.first();
        if last_turn != Some(e.turn_id) {
            turn = e.turn_id.to_string();
            last_turn = Some(e.turn_id);
        }
        insert.execute(params![
            e.session_id,
            e.seq,
            row.seq_end(),
            turn,
            e.event_type,
            row.payload(),
            ts(e.created_at)
        ])?;
    }
    Ok(())
}

/// Keeps a research learner's observation.
pub(in crate::store) fn insert_observation(tx: &Connection, o: &ObservationRecord) -> Result<()> {
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
pub(in crate::store) fn insert_job(tx: &Connection, job: &NewJob) -> Result<()> {
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
