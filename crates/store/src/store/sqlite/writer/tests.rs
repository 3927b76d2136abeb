//! The writer thread's groups and its statement cache.

use std::sync::atomic::AtomicUsize;

use super::*;

type Work = Box<dyn Fn(&Connection, &mut Stage<'_>) -> Result<()> + Send>;
type Reply = oneshot::Receiver<Done<(), Work>>;

/// A job that inserts `value` into `t`, then fails when `fails`; it
/// counts its runs.
fn insert(value: i64, fails: bool) -> (Box<dyn Job>, Reply, Arc<AtomicUsize>) {
    insert_chained(value, fails, None)
}

/// [`insert`] in a [`Chain`].
fn insert_chained(
    value: i64,
    fails: bool,
    chain: Option<Chain>,
) -> (Box<dyn Job>, Reply, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let (reply, replied) = oneshot::channel();
    let work: Work = Box::new(move |tx: &Connection, _: &mut Stage<'_>| {
        counted.fetch_add(1, Ordering::Relaxed);
        tx.execute("INSERT INTO t (v) VALUES (?1)", [value])?;
        if fails {
            return Err(StoreError::Conflict);
        }
        Ok(())
    });
    let job = Typed {
        work,
        outcome: None,
        reply: Some(reply),
        chain,
    };
    (Box::new(job), replied, runs)
}

fn values(connection: &Connection) -> Vec<i64> {
    let mut select = connection.prepare("SELECT v FROM t ORDER BY v").unwrap();
    select
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

/// Runs `jobs` as one group; each job's outcome (true: done) and runs.
fn group(
    connection: &mut Connection,
    jobs: &[(i64, bool)],
    careful: bool,
) -> (bool, Vec<(bool, usize)>) {
    let journal = Journal::default();
    let mut stage = journal.stage();
    let (mut group, mut replies, mut runs) = (Vec::new(), Vec::new(), Vec::new());
    for &(value, fails) in jobs {
        let (job, reply, counted) = insert(value, fails);
        group.push(job);
        replies.push(reply);
        runs.push(counted);
    }
    let (commit, failed) = run_group(
        connection,
        &mut group,
        &mut stage,
        &Chores::default(),
        careful,
    );
    for job in group.drain(..) {
        job.report(&commit);
    }
    let outcomes = replies
        .iter_mut()
        .zip(&runs)
        .map(|(reply, runs)| {
            let done = matches!(reply.try_recv(), Ok((Ok(()), _)));
            (done, runs.load(Ordering::Relaxed))
        })
        .collect();
    (failed, outcomes)
}

/// A group runs without savepoints; when a job fails, everything is
/// rolled back and the group runs again, each job in a savepoint: the
/// failed job's writes are gone, the others' committed, and each hears
/// its own outcome. A group asked to be careful runs once.
#[test]
fn a_failed_job_is_rolled_back_alone_when_its_group_runs_again() {
    let mut connection = Connection::open_in_memory().unwrap();
    connection
        .execute_batch("CREATE TABLE t (v INTEGER NOT NULL)")
        .unwrap();
    let (failed, outcomes) = group(&mut connection, &[(1, false), (2, false)], false);
    assert!(!failed);
    assert_eq!(outcomes, [(true, 1), (true, 1)]);
    assert_eq!(values(&connection), [1, 2]);

    let jobs = [(3, false), (4, true), (5, false)];
    let (failed, outcomes) = group(&mut connection, &jobs, false);
    assert!(failed);
    // The first ran in the quick pass and again; the third only once,
    // after the failure.
    assert_eq!(outcomes, [(true, 2), (false, 2), (true, 1)]);
    assert_eq!(values(&connection), [1, 2, 3, 5]);

    let jobs = [(6, false), (7, true), (8, false)];
    let (failed, outcomes) = group(&mut connection, &jobs, true);
    assert!(failed);
    assert_eq!(outcomes, [(true, 1), (false, 1), (true, 1)]);
    assert_eq!(values(&connection), [1, 2, 3, 5, 6, 8]);

    // A job alone that fails leaves nothing, the quick way or not.
    let (failed, outcomes) = group(&mut connection, &[(9, true)], false);
    assert!(failed);
    assert_eq!(outcomes, [(false, 1)]);
    assert_eq!(values(&connection), [1, 2, 3, 5, 6, 8]);
}

/// A group's `BEGIN` and `COMMIT` are compiled once for the connection,
/// not once a group (the authorizer is asked at each compile); a group
/// that fails and runs again the careful way still rolls back and
/// commits as it should.
#[test]
fn a_groups_begin_and_commit_are_compiled_once() {
    use rusqlite::hooks::{AuthAction, Authorization};
    let mut connection = Connection::open_in_memory().unwrap();
    connection
        .execute_batch("CREATE TABLE t (v INTEGER NOT NULL)")
        .unwrap();
    let compiled = Arc::new(AtomicUsize::new(0));
    let counted = compiled.clone();
    connection
        .authorizer(Some(move |context: rusqlite::hooks::AuthContext<'_>| {
            if matches!(context.action, AuthAction::Transaction { .. }) {
                counted.fetch_add(1, Ordering::Relaxed);
            }
            Authorization::Allow
        }))
        .unwrap();
    for value in 0..5 {
        let (failed, outcomes) = group(&mut connection, &[(value, false), (value, false)], false);
        assert!(!failed);
        assert_eq!(outcomes, [(true, 1), (true, 1)]);
    }
    // BEGIN and COMMIT.
    assert_eq!(compiled.load(Ordering::Relaxed), 2);
    // The quick pass rolled back (ROLLBACK compiled once), the careful
    // one committed what did not fail.
    let (failed, outcomes) = group(&mut connection, &[(5, false), (6, true)], false);
    assert!(failed);
    assert_eq!(outcomes, [(true, 2), (false, 2)]);
    let (failed, _) = group(&mut connection, &[(7, true)], false);
    assert!(failed);
    assert_eq!(compiled.load(Ordering::Relaxed), 3);
    assert!(connection.is_autocommit());
    assert_eq!(values(&connection), [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5]);
}

/// Runs `group` the quick way, then reports each job's outcome.
fn run_and_report(
    connection: &mut Connection,
    journal: &Journal,
    group: &mut Vec<Box<dyn Job>>,
) -> (Result<(), String>, bool) {
    let mut stage = journal.stage();
    let (commit, failed) = run_group(connection, group, &mut stage, &Chores::default(), false);
    for job in group.drain(..) {
        job.report(&commit);
    }
    (commit, failed)
}

/// A commit chained after one that failed fails without running, in the
/// same group or a later one, and so does the next in its chain; one
/// after a commit that succeeded runs. Nothing of a later batch of
/// events is committed before an earlier one that will be tried again.
#[test]
fn a_commit_chained_after_a_failed_one_fails_without_running() {
    let mut connection = Connection::open_in_memory().unwrap();
    connection
        .execute_batch("CREATE TABLE t (v INTEGER NOT NULL)")
        .unwrap();
    let journal = Journal::default();
    let first = Chain::default();
    let second = Chain {
        after: Some(first.this.clone()),
        this: Arc::default(),
    };
    let third = Chain {
        after: Some(second.this.clone()),
        this: Arc::default(),
    };
    let (a, mut a_reply, a_runs) = insert_chained(1, true, Some(first));
    let (b, mut b_reply, b_runs) = insert_chained(2, false, Some(second.clone()));
    let (c, mut c_reply, c_runs) = insert(3, false);
    let mut group = vec![a, b, c];
    let (commit, failed) = run_and_report(&mut connection, &journal, &mut group);
    assert!(commit.is_ok() && failed);
    assert!(matches!(
        a_reply.try_recv(),
        Ok((Err(StoreError::Conflict), _))
    ));
    assert!(matches!(
        b_reply.try_recv(),
        Ok((Err(StoreError::Unavailable(_)), _))
    ));
    assert!(matches!(c_reply.try_recv(), Ok((Ok(()), _))));
    assert_eq!(b_runs.load(Ordering::Relaxed), 0, "never ran");
    assert!(a_runs.load(Ordering::Relaxed) >= 1);
    assert_eq!(c_runs.load(Ordering::Relaxed), 1);
    assert!(second.this.failed());
    assert_eq!(values(&connection), [3]);

    // The next in the chain, in a group of its own, fails too.
    let (d, mut d_reply, d_runs) = insert_chained(4, false, Some(third.clone()));
    let mut group = vec![d];
    let (commit, _) = run_and_report(&mut connection, &journal, &mut group);
    assert!(commit.is_ok(), "the group commits; the job alone failed");
    assert!(matches!(d_reply.try_recv(), Ok((Err(_), _))));
    assert_eq!(d_runs.load(Ordering::Relaxed), 0);
    assert!(third.this.failed());

    // After one that succeeded, it runs.
    let ok = Chain::default();
    let after_ok = Chain {
        after: Some(ok.this.clone()),
        this: Arc::default(),
    };
    let (e, mut e_reply, _) = insert_chained(5, false, Some(ok));
    let (f, mut f_reply, _) = insert_chained(6, false, Some(after_ok.clone()));
    let mut group = vec![e, f];
    let (commit, failed) = run_and_report(&mut connection, &journal, &mut group);
    assert!(commit.is_ok() && !failed);
    assert!(matches!(e_reply.try_recv(), Ok((Ok(()), _))));
    assert!(matches!(f_reply.try_recv(), Ok((Ok(()), _))));
    assert!(!after_ok.this.failed());
    assert_eq!(values(&connection), [3, 5, 6]);
}

/// What a job's closure holds goes back to its caller with its outcome,
/// to be freed there, not on the writer thread.
#[test]
fn a_jobs_closure_goes_back_to_its_caller() {
    let mut connection = Connection::open_in_memory().unwrap();
    connection
        .execute_batch("CREATE TABLE t (v INTEGER NOT NULL)")
        .unwrap();
    let (job, mut reply, runs) = insert(1, false);
    let journal = Journal::default();
    let mut stage = journal.stage();
    let mut group = vec![job];
    let (commit, failed) = run_group(
        &mut connection,
        &mut group,
        &mut stage,
        &Chores::default(),
        false,
    );
    assert!(!failed);
    for job in group.drain(..) {
        job.report(&commit);
    }
    // The closure's share of `runs` is in the reply, not dropped.
    assert_eq!(Arc::strong_count(&runs), 2);
    let (outcome, work) = reply.try_recv().unwrap();
    assert!(outcome.is_ok());
    drop(work);
    assert_eq!(Arc::strong_count(&runs), 1);
}

fn count_in(dir: &std::path::Path, needle: &str) -> usize {
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            count += count_in(&path, needle);
        } else if path.extension().is_some_and(|e| e == "rs") {
            count += std::fs::read_to_string(&path)
                .unwrap()
                .matches(needle)
                .count();
        }
    }
    count
}

/// Every statement the store prepares on the writer fits in its cache
/// at once (each call site is at most one statement, but the export's
/// inserts, one per part of a session).
#[test]
fn the_writers_cache_holds_every_statement_it_prepares() {
    let store = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store");
    let sites = count_in(&store, ".prepare_cached(") + crate::store::export::PARTS.len();
    assert!(
        sites <= STATEMENTS,
        "{sites} statements, a cache of {STATEMENTS}"
    );
}
