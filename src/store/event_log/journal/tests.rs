//! The journal's rules on a SQLite connection of its own: what goes to
//! the journal, what to the table, and when.

use super::*;
use crate::events::TurnEvent;

fn connection() -> Connection {
    let connection = Connection::open_in_memory().unwrap();
    connection
        .execute_batch(
            "CREATE TABLE events (session_id TEXT NOT NULL, seq INTEGER NOT NULL, \
               seq_end INTEGER, turn_id TEXT NOT NULL, type TEXT NOT NULL, \
               payload TEXT NOT NULL, created_at TEXT NOT NULL, \
               PRIMARY KEY (session_id, seq)) WITHOUT ROWID;
             CREATE TABLE turns (id TEXT PRIMARY KEY, session_id TEXT NOT NULL);",
        )
        .unwrap();
    connection
        .execute_batch(include_str!(
            "../../../../migrations/sqlite/0031_event_journal.sql"
        ))
        .unwrap();
    connection
}

fn delta(session: &str, turn: Uuid, seq: i64) -> Arc<StoredEvent> {
    let event = TurnEvent::MessageDelta {
        step: 1,
        text: format!("t{seq}"),
    };
    Arc::new(StoredEvent::from_event(session, turn, seq, event, chrono::Utc::now()).unwrap())
}

/// One commit: `events` through a stage of their own, applied.
fn commit(connection: &Connection, journal: &Journal, events: Vec<Arc<StoredEvent>>) {
    let mut stage = journal.stage();
    insert_events(connection, &mut stage, events.into_iter()).unwrap();
    journal.apply(stage);
}

fn count(connection: &Connection, table: &str) -> i64 {
    connection
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
            row.get(0)
        })
        .unwrap()
}

/// 100 streams that started together reach [`FLUSH_AT`] in the same
/// commit: [`FLUSH_BUDGET`] of them flush there, each as one run, and the
/// rest keep journaling until a later commit has room; every session's
/// events read back whole all along.
#[test]
fn streams_in_step_do_not_all_flush_in_one_commit() {
    let connection = connection();
    let journal = Journal::default();
    let sessions: Vec<(String, Uuid)> = (0..100)
        .map(|i| (format!("s{i}"), Uuid::now_v7()))
        .collect();
    let round = |seq: i64| -> Vec<Arc<StoredEvent>> {
        sessions.iter().map(|(s, t)| delta(s, *t, seq)).collect()
    };
    for seq in 1..FLUSH_AT as i64 {
        commit(&connection, &journal, round(seq));
    }
    assert_eq!(count(&connection, "events"), 0);
    assert_eq!(count(&connection, "event_journal"), 100 * 31);
    // Each session's 32nd: only the budget's worth flush.
    commit(&connection, &journal, round(FLUSH_AT as i64));
    assert_eq!(count(&connection, "events"), FLUSH_BUDGET as i64);
    let pending: Vec<usize> = sessions
        .iter()
        .map(|(s, _)| journal.read(s, None, 0).len())
        .collect();
    assert_eq!(pending.iter().filter(|&&n| n == 0).count(), FLUSH_BUDGET);
    assert_eq!(
        pending.iter().filter(|&&n| n == FLUSH_AT).count(),
        100 - FLUSH_BUDGET
    );
    // The next commit flushes the others (they are past the flush point).
    commit(&connection, &journal, round(FLUSH_AT as i64 + 1));
    assert_eq!(count(&connection, "events"), 100);
    // Those flushed first journal again; the others hold nothing.
    let pending: Vec<Vec<i64>> = sessions
        .iter()
        .map(|(s, _)| journal.read(s, None, 0).iter().map(|e| e.seq).collect())
        .collect();
    let again = [FLUSH_AT as i64 + 1];
    assert_eq!(
        pending.iter().filter(|p| **p == again).count(),
        FLUSH_BUDGET
    );
    assert_eq!(
        pending.iter().filter(|p| p.is_empty()).count(),
        100 - FLUSH_BUDGET
    );
}

/// A session whose oldest pending row falls [`SWEEP_BEHIND`] rows behind
/// the newest is named stale, the oldest first, at most [`SWEEP_MAX`] a
/// commit; a sweep moves its events to its table; rows below the oldest
/// pending one are then due for deletion.
#[test]
fn stale_sessions_are_swept_oldest_first_and_the_journal_trimmed() {
    let mut connection = connection();
    let journal = Journal::default();
    let sessions: Vec<(String, Uuid)> = (0..SWEEP_MAX + 6)
        .map(|i| (format!("s{i:03}"), Uuid::now_v7()))
        .collect();
    for (s, t) in &sessions {
        commit(&connection, &journal, vec![delta(s, *t, 1)]);
    }
    assert!(journal.stale().is_empty());
    assert_eq!(journal.trim_due(), None);
    // Many rows later (as if other sessions wrote them).
    lock(&journal.rows).newest += SWEEP_BEHIND + 3;
    let stale = journal.stale();
    let oldest: Vec<String> = sessions
        .iter()
        .take(SWEEP_MAX)
        .map(|(s, _)| s.clone())
        .collect();
    assert_eq!(stale, oldest);
    let tx = connection.transaction().unwrap();
    let mut stage = journal.stage();
    stage.sweep(&tx, &stale);
    tx.commit().unwrap();
    journal.apply(stage);
    assert_eq!(count(&connection, "events"), SWEEP_MAX as i64);
    assert_eq!(journal.stale().len(), 6);
    assert!(journal.read(&sessions[0].0, None, 0).is_empty());
    assert_eq!(journal.read(&sessions[SWEEP_MAX].0, None, 0).len(), 1);
    // Rows of the swept sessions are below the oldest pending one.
    let below = journal.trim_due();
    assert_eq!(below, None, "fewer than {TRIM_EVERY} rows below");
    let first = lock(&journal.rows).oldest.keys().next().copied().unwrap();
    Journal::trim(&connection, first).unwrap();
    assert_eq!(count(&connection, "event_journal"), 6);
}

/// After a crash: rows past their session's table move into it, rows
/// already there (flushed before the crash) and rows of a turn that is
/// gone (its session erased) do not; the journal is emptied.
#[test]
fn recovery_moves_only_what_the_table_lacks() {
    let connection = connection();
    let journal = Journal::default();
    let (kept, gone) = (Uuid::now_v7(), Uuid::now_v7());
    connection
        .execute(
            "INSERT INTO turns (id, session_id) VALUES (?1, 'a')",
            params![kept.to_string()],
        )
        .unwrap();
    commit(&connection, &journal, vec![delta("a", kept, 1)]);
    commit(&connection, &journal, vec![delta("b", gone, 1)]);
    // `a`'s first is flushed (with a second), its journal row stays.
    let mut stage = journal.stage();
    stage
        .flush(&connection, "a", &[delta("a", kept, 2)])
        .unwrap();
    journal.apply(stage);
    commit(&connection, &journal, vec![delta("a", kept, 3)]);
    assert_eq!(count(&connection, "event_journal"), 3);
    let fresh = Journal::default();
    let moved = recover(&connection, &fresh.stage()).unwrap();
    assert_eq!(moved, 1, "a's seq 3 only");
    assert_eq!(count(&connection, "event_journal"), 0);
    let seqs: Vec<(String, i64, Option<i64>)> = connection
        .prepare("SELECT session_id, seq, seq_end FROM events ORDER BY session_id, seq")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(seqs, [("a".into(), 1, Some(2)), ("a".into(), 3, None)]);
}
