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

use rusqlite::{Connection, ErrorCode};
use tokio::sync::{mpsc, oneshot};

pub(in crate::store) use super::time::{parse_ts, ts};
use crate::store::Result;
use crate::store::StoreError;
use crate::store::event_log::{
    gather::Chain,
    journal::{Journal, Stage},
};

/// Jobs that may wait for the writer thread.
const QUEUE: usize = 1024;

/// Most jobs in one shared transaction.
const GROUP_MAX: usize = 256;

/// How long the checkpointer lets commits gather before it copies them
/// from the WAL into the database file.
const CHECKPOINT_AFTER: Duration = Duration::from_millis(100);

/// Prepared statements the writer's connection keeps. A turn's writes
/// use a few dozen statements, and each one the cache had let go was
/// compiled again: with rusqlite's default of 16 they took turns evicting
/// each other, and compiling them was 6.5 % of the writer thread under
/// short turns at c=256 (measured: docs/benchmarks.md). Above the count
/// of statements the store prepares (a test holds it there).
const STATEMENTS: usize = 256;

/// WAL frames past which the writer starts the WAL over (see
/// [`Writer::start_checkpointer`]).
const RESTART_WAL_AT: i64 = 4000;

/// A write, run inside the group's transaction.
trait Job: Send {
    /// Runs the write; false when it failed (its part is rolled back, and
    /// its changes to the journal's pending events taken back). It may run
    /// again, after a rollback of the whole group (see [`run_group`]): the
    /// last run's outcome is the one reported.
    fn run(&mut self, connection: &Connection, stage: &mut Stage<'_>) -> bool;
    /// Hands over the outcome once the group's commit is known.
    fn report(self: Box<Self>, commit: &Result<(), String>);
}

struct Typed<T, F> {
    work: F,
    outcome: Option<Result<T>>,
    reply: Option<oneshot::Sender<Done<T, F>>>,
    /// A commit chained after another ([`Chain`]): it fails without
    /// running when that one failed, and tells the next how it went.
    chain: Option<Chain>,
}

/// A job's outcome, and the job itself: what its closure holds (a
/// batch's events, a finish's messages) is freed by the caller, on a
/// thread of the runtime, not on the writer thread that every commit
/// waits for.
type Done<T, F> = (Result<T>, F);

impl<T, F> Job for Typed<T, F>
where
    T: Send,
    F: Fn(&Connection, &mut Stage<'_>) -> Result<T> + Send,
{
    fn run(&mut self, connection: &Connection, stage: &mut Stage<'_>) -> bool {
        let outcome = match &self.chain {
            Some(Chain {
                after: Some(after), ..
            }) if after.failed() => Err(StoreError::Unavailable(
                "a commit asked for before this one failed".into(),
            )),
            _ => (self.work)(connection, stage),
        };
        let ok = outcome.is_ok();
        if let Some(chain) = &self.chain {
            chain.this.set_failed(!ok);
        }
        self.outcome = Some(outcome);
        ok
    }

    fn report(self: Box<Self>, commit: &Result<(), String>) {
        let Self {
            work,
            outcome,
            reply,
            chain,
        } = *self;
        if let Some(chain) = chain
            && commit.is_err()
        {
            chain.this.set_failed(true);
        }
        let outcome = match (outcome, commit) {
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (Some(Ok(_)), Err(e)) => Err(StoreError::Unavailable(format!("sqlite commit: {e}"))),
            (None, Err(e)) => Err(StoreError::Unavailable(format!("sqlite: {e}"))),
            (None, Ok(())) => Err(StoreError::Unavailable("a write did not run".into())),
        };
        if let Some(reply) = reply {
            let _ = reply.send((outcome, work));
        }
    }
}

/// Groups run the careful way (each job in a savepoint) after a group in
/// which a job failed, before the quick way is tried again.
const CAREFUL_AFTER_FAILURE: u32 = 8;

/// Runs `group` in one transaction, the journal's chores first (its
/// stale sessions flushed, its old rows deleted).
///
/// The quick way: the jobs one after another, no savepoints. A savepoint
/// copies each page its job changes to a sub-journal first, and the jobs
/// of a group share their hot pages (a table's last leaf, the sessions',
/// the turns'): a tenth of the writer thread under short turns at c=256
/// (measured: docs/benchmarks.md). When a job fails, the whole
/// transaction is rolled back, and the group runs again the careful way:
/// each job in a savepoint of its own, so one that fails is rolled back
/// alone. `careful` asks for the careful way at once (a job failed in a
/// recent group: a caller whose writes keep failing costs the others at
/// most one wasted pass in [`CAREFUL_AFTER_FAILURE`] groups). A job alone
/// runs in the transaction itself either way. Returns the commit's
/// outcome and whether a job failed.
fn run_group(
    connection: &mut Connection,
    group: &mut [Box<dyn Job>],
    stage: &mut Stage<'_>,
    chores: &Chores,
    careful: bool,
) -> (Result<(), String>, bool) {
    let alone = group.len() == 1;
    if alone || !careful {
        match run_quick(connection, group, stage, chores) {
            Ok(true) => return (Ok(()), false),
            // The job reports its own error; nothing of it stays.
            Ok(false) if alone => return (Ok(()), true),
            Ok(false) => {}
            Err(e) => return (Err(e), false),
        }
    }
    run_careful(connection, group, stage, chores)
}

/// A group's transaction, begun and ended by statements the connection
/// keeps compiled. rusqlite's `Transaction` compiles `BEGIN` and `COMMIT`
/// anew each time (`execute_batch`): about 3 % of the writer thread's
/// samples at 32 turns at once (measured: docs/benchmarks.md). Rolled back when dropped uncommitted.
struct Group<'c> {
    connection: &'c mut Connection,
}

impl<'c> Group<'c> {
    fn begin(connection: &'c mut Connection) -> rusqlite::Result<Self> {
        connection.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(Self { connection })
    }

    /// A failed commit leaves the transaction open: dropped, it is
    /// rolled back.
    fn commit(self) -> rusqlite::Result<()> {
        self.connection.prepare_cached("COMMIT")?.execute([])?;
        Ok(())
    }

    fn rollback(self) -> rusqlite::Result<()> {
        self.end()
    }

    fn savepoint(&mut self) -> rusqlite::Result<rusqlite::Savepoint<'_>> {
        self.connection.savepoint()
    }

    fn end(&self) -> rusqlite::Result<()> {
        if self.connection.is_autocommit() {
            return Ok(());
        }
        self.connection.prepare_cached("ROLLBACK")?.execute([])?;
        Ok(())
    }
}

impl std::ops::Deref for Group<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.connection
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.end() {
            tracing::warn!(error = %e, "sqlite rollback failed");
        }
    }
}

/// Begins the group's transaction and does the journal's chores.
fn begin<'c>(
    connection: &'c mut Connection,
    stage: &mut Stage<'_>,
    chores: &Chores,
) -> Result<Group<'c>, String> {
    let tx = Group::begin(connection).map_err(|e| e.to_string())?;
    stage.sweep(&tx, &chores.stale);
    if let Some(below) = chores.trim {
        Journal::trim(&tx, below).map_err(|e| e.to_string())?;
    }
    Ok(tx)
}

/// The quick way: true when every job ran and the group committed; false
/// when a job failed and everything was rolled back (the stage too).
fn run_quick(
    connection: &mut Connection,
    group: &mut [Box<dyn Job>],
    stage: &mut Stage<'_>,
    chores: &Chores,
) -> Result<bool, String> {
    let tx = begin(connection, stage, chores)?;
    if group.iter_mut().all(|job| job.run(&tx, stage)) {
        tx.commit().map_err(|e| e.to_string())?;
        return Ok(true);
    }
    stage.rollback(0);
    tx.rollback().map_err(|e| e.to_string())?;
    Ok(false)
}

/// The careful way (see [`run_group`]): each job in a savepoint.
fn run_careful(
    connection: &mut Connection,
    group: &mut [Box<dyn Job>],
    stage: &mut Stage<'_>,
    chores: &Chores,
) -> (Result<(), String>, bool) {
    let mut tx = match begin(connection, stage, chores) {
        Ok(tx) => tx,
        Err(e) => return (Err(e), false),
    };
    let mut failed = false;
    for job in group.iter_mut() {
        let savepoint = match tx.savepoint() {
            Ok(savepoint) => savepoint,
            Err(e) => return (Err(e.to_string()), failed),
        };
        let mark = stage.mark();
        if job.run(&savepoint, stage) {
            if let Err(e) = savepoint.commit() {
                return (Err(e.to_string()), failed);
            }
        } else {
            // The savepoint rolls back when dropped.
            failed = true;
            stage.rollback(mark);
        }
    }
    (tx.commit().map_err(|e| e.to_string()), failed)
}

/// What the journal asks of the next group.
#[derive(Debug, Default)]
struct Chores {
    stale: Vec<String>,
    trim: Option<i64>,
}

/// Handle to the writer thread; the thread ends when the handle is dropped.
#[derive(Debug)]
pub(in crate::store) struct Writer {
    jobs: mpsc::Sender<Box<dyn Job>>,
    /// The events committed to the journal, not yet to their table.
    journal: Arc<Journal>,
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Unavailable(format!("sqlite: {e}"))
    }
}

pub(in crate::store) fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::ConstraintViolation)
}

impl Writer {
    /// Opens `path` (which the migrations already created) for writing.
    pub(super) fn open(path: &Path) -> Result<Self> {
        let connection = Connection::open(path)?;
        connection.busy_timeout(Duration::from_secs(5))?;
        connection.set_prepared_statement_cache_capacity(STATEMENTS);
        connection.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; \
             PRAGMA mmap_size = 268435456; PRAGMA cache_size = -8192; \
             PRAGMA wal_autocheckpoint = 16000; PRAGMA journal_size_limit = 67108864; \
             PRAGMA temp_store = MEMORY;",
        )?;
        let restart_due = Arc::new(AtomicBool::new(false));
        let checkpoints = Self::start_checkpointer(path, restart_due.clone())?;
        let (jobs, mut queue) = mpsc::channel::<Box<dyn Job>>(QUEUE);
        let journal = Arc::new(Journal::default());
        let pending = journal.clone();
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || {
                let mut connection = connection;
                let mut group: Vec<Box<dyn Job>> = Vec::with_capacity(GROUP_MAX);
                let mut chores = Chores::default();
                // Groups left to run the careful way (see `run_group`).
                let mut careful = 0u32;
                while let Some(first) = queue.blocking_recv() {
                    group.push(first);
                    while group.len() < GROUP_MAX {
                        match queue.try_recv() {
                            Ok(job) => group.push(job),
                            Err(_) => break,
                        }
                    }
                    let mut stage = pending.stage();
                    let (commit, failed) = run_group(
                        &mut connection,
                        &mut group,
                        &mut stage,
                        &chores,
                        careful > 0,
                    );
                    careful = if failed {
                        CAREFUL_AFTER_FAILURE
                    } else {
                        careful.saturating_sub(1)
                    };
                    if commit.is_ok() {
                        // Before any job hears "done": what it sends next
                        // is readable.
                        pending.apply(stage);
                        if let Some(below) = chores.trim {
                            pending.trimmed(below);
                        }
                        chores = Chores {
                            stale: pending.stale(),
                            trim: pending.trim_due(),
                        };
                    }
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
        Ok(Self { jobs, journal })
    }

    /// The events committed to the journal, not yet to their table.
    pub(in crate::store) fn journal(&self) -> &Journal {
        &self.journal
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
        F: Fn(&Connection) -> Result<T> + Send + 'static,
    {
        self.run_logged(move |connection, _| work(connection)).await
    }

    /// [`Self::run`] of a write that may write events (it is given the
    /// journal's pending events, as the jobs before it left them).
    pub(in crate::store) async fn run_logged<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&Connection, &mut Stage<'_>) -> Result<T> + Send + 'static,
    {
        self.run_chained(None, work).await
    }

    /// [`Self::run_logged`] of a commit in a [`Chain`] (none: alone).
    pub(in crate::store) async fn run_chained<T, F>(
        &self,
        chain: Option<Chain>,
        work: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&Connection, &mut Stage<'_>) -> Result<T> + Send + 'static,
    {
        let stopped = || StoreError::Unavailable("the SQLite writer stopped".into());
        let (reply, result) = oneshot::channel();
        let failed = chain.as_ref().map(|c| c.this.clone());
        let sent = self
            .jobs
            .send(Box::new(Typed {
                work,
                outcome: None,
                reply: Some(reply),
                chain,
            }))
            .await;
        if sent.is_err() {
            if let Some(this) = failed {
                this.set_failed(true);
            }
            return Err(stopped());
        }
        let (outcome, work) = result.await.map_err(|_| stopped())?;
        // Freed here, on the caller's thread (see [`Done`]), with the
        // events the journal let go of.
        drop(work);
        drop(self.journal.retired());
        outcome
    }

    /// Jobs waiting for the thread.
    #[cfg(any(test, feature = "testing"))]
    pub(in crate::store) fn queued(&self) -> usize {
        self.jobs.max_capacity() - self.jobs.capacity()
    }

    /// Queues a job that holds the thread from its first run until
    /// `release` is sent (or dropped); `started` says it runs.
    #[cfg(any(test, feature = "testing"))]
    pub(in crate::store) async fn hold(&self) -> Held {
        let (release, held) = std::sync::mpsc::sync_channel::<()>(1);
        let (started_tx, started) = oneshot::channel();
        let once = std::sync::Mutex::new(Some((started_tx, held)));
        let work = move |_: &Connection, _: &mut Stage<'_>| -> Result<()> {
            let first = once
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some((started, held)) = first {
                let _ = started.send(());
                let _ = held.recv();
            }
            Ok(())
        };
        let job = Box::new(Typed {
            work,
            outcome: None,
            reply: None,
            chain: None,
        });
        if self.jobs.send(job).await.is_err() {
            panic!("the writer thread stopped");
        }
        Held { started, release }
    }
}

/// A job holding the writer thread ([`Writer::hold`]).
#[cfg(any(test, feature = "testing"))]
pub struct Held {
    pub started: oneshot::Receiver<()>,
    pub release: std::sync::mpsc::SyncSender<()>,
}

mod rows;
pub(in crate::store) use rows::{
    answered, branch_messages, insert_job, insert_observation, memories_for_turn, recent_messages,
};

#[cfg(test)]
mod tests;
