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
    for migration in [
        include_str!("../../../../../../migrations/sqlite/0031_event_journal.sql"),
        include_str!("../../../../../../migrations/sqlite/0033_journal_packs.sql"),
    ] {
        connection.execute_batch(migration).unwrap();
    }
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

/// The journal's rows: those its packs list.
fn journaled(connection: &Connection) -> i64 {
    connection
        .query_row(
            "SELECT COALESCE(SUM(json_array_length(events)), 0) FROM event_journal_packs",
            [],
            |row| row.get(0),
        )
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
    assert_eq!(journaled(&connection), 100 * 31);
    // One pack a commit.
    assert_eq!(count(&connection, "event_journal_packs"), 31);
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
    let first = lock(&journal.rows).oldest.first().unwrap().0;
    Journal::trim(&connection, first).unwrap();
    assert_eq!(journaled(&connection), 6);
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
    assert_eq!(journaled(&connection), 3);
    let fresh = Journal::default();
    let moved = recover(&connection, &fresh.stage()).unwrap();
    assert_eq!(moved, 1, "a's seq 3 only");
    assert_eq!(count(&connection, "event_journal_packs"), 0);
    let seqs: Vec<(String, i64, Option<i64>)> = connection
        .prepare("SELECT session_id, seq, seq_end FROM events ORDER BY session_id, seq")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(seqs, [("a".into(), 1, Some(2)), ("a".into(), 3, None)]);
}

fn packs(connection: &Connection) -> Vec<(i64, String)> {
    connection
        .prepare("SELECT id, events FROM event_journal_packs ORDER BY id")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

fn table(connection: &Connection) -> Vec<(String, i64, Option<i64>, String, String, String)> {
    connection
        .prepare(
            "SELECT session_id, seq, seq_end, turn_id, type, payload FROM events \
             ORDER BY session_id, seq",
        )
        .unwrap()
        .query_map([], |row| row.try_into())
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

/// A commit's journaled events, of any sessions, are one row (a pack),
/// placed after the previous pack's rows; read back after a stop, they
/// are the rows the table would have held had they gone there at once:
/// the same runs, payloads byte for byte, odd session ids whole.
#[test]
fn a_commits_journal_rows_are_one_pack_and_read_back_as_the_table_holds_them() {
    let connection = connection();
    let journal = Journal::default();
    let sessions = ["plain", "t1/with \"quotes\" \\ and é", "text"];
    let turns: Vec<Uuid> = sessions.iter().map(|_| Uuid::now_v7()).collect();
    for (session, turn) in sessions.iter().zip(&turns) {
        connection
            .execute(
                "INSERT INTO turns (id, session_id) VALUES (?1, ?2)",
                params![turn.to_string(), session],
            )
            .unwrap();
    }
    // The first session sends three deltas in the commit (a run), the
    // others one each.
    let mut first = vec![
        delta(sessions[0], turns[0], 1),
        delta(sessions[0], turns[0], 2),
        delta(sessions[0], turns[0], 3),
    ];
    first.extend((1..3).map(|i| delta(sessions[i], turns[i], 1)));
    commit(&connection, &journal, first.clone());
    assert_eq!(count(&connection, "events"), 0);
    let written = packs(&connection);
    assert_eq!(written.len(), 1, "one pack: {written:?}");
    assert_eq!(journaled(&connection), 3, "a run and two rows");
    let second: Vec<_> = (0..3)
        .map(|i| delta(sessions[i], turns[i], if i == 0 { 4 } else { 2 }))
        .collect();
    commit(&connection, &journal, second.clone());
    let written = packs(&connection);
    assert_eq!(
        written[1].0,
        written[0].0 + 3,
        "placed after the first's rows"
    );
    assert_eq!(lock(&journal.rows).newest, written[1].0 + 2);
    // What the table holds when the same events go there directly.
    let direct = self::connection();
    let mut events = first.clone();
    events.extend(second.iter().cloned());
    events.sort_by(|a, b| (&a.session_id, a.seq).cmp(&(&b.session_id, b.seq)));
    for chunk in events.chunk_by(|a, b| a.session_id == b.session_id) {
        let batches: Vec<&[Arc<StoredEvent>]> = if chunk[0].session_id == sessions[0] {
            vec![&chunk[..3], &chunk[3..]]
        } else {
            chunk.chunks(1).collect()
        };
        for batch in batches {
            insert_rows(&direct, batch).unwrap();
        }
    }
    let moved = recover(&connection, &Journal::default().stage()).unwrap();
    assert_eq!(moved, 6);
    assert_eq!(table(&connection), table(&direct));
    assert_eq!(count(&connection, "event_journal_packs"), 0);
}

/// What a process before the packs left in `event_journal` is moved
/// first, then the packs, each row once.
#[test]
fn recovery_reads_the_rows_left_before_the_packs_then_the_packs() {
    let connection = connection();
    let journal = Journal::default();
    let turn = Uuid::now_v7();
    connection
        .execute(
            "INSERT INTO turns (id, session_id) VALUES (?1, 'a')",
            params![turn.to_string()],
        )
        .unwrap();
    let old = delta("a", turn, 1);
    connection
        .execute(
            "INSERT INTO event_journal (session_id, seq, turn_id, type, payload, created_at) \
             VALUES ('a', 1, ?1, ?2, ?3, ?4)",
            params![
                turn.to_string(),
                old.event_type,
                old.payload,
                ts(old.created_at)
            ],
        )
        .unwrap();
    // This process journals seq 2 (its own view of the session starts
    // at the table, which lacks seq 1 until the recovery).
    let mut stage = journal.stage();
    insert_events(&connection, &mut stage, [delta("a", turn, 2)].into_iter()).unwrap();
    let moved = recover(&connection, &Journal::default().stage()).unwrap();
    assert_eq!(moved, 2);
    let seqs: Vec<i64> = table(&connection).iter().map(|row| row.1).collect();
    assert_eq!(seqs, [1, 2]);
    assert_eq!(count(&connection, "event_journal"), 0);
    assert_eq!(count(&connection, "event_journal_packs"), 0);
}

/// An erase takes the session's rows out of every pack (a pack left with
/// none is deleted) and leaves the other sessions' rows, and packs that
/// name it only inside a payload, as they were.
#[test]
fn an_erased_sessions_rows_leave_every_pack() {
    let connection = connection();
    let journal = Journal::default();
    let (a, b, c) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    commit(
        &connection,
        &journal,
        vec![delta("t1", a, 1), delta("b", b, 1)],
    );
    commit(&connection, &journal, vec![delta("t1", a, 2)]);
    // "t1" appears in this pack only as a payload's text.
    commit(&connection, &journal, vec![delta("c", c, 1)]);
    let before = packs(&connection);
    assert!(before[2].1.contains("\"t1\""), "{}", before[2].1);
    erase_session(&connection, "t1").unwrap();
    let after = packs(&connection);
    assert_eq!(after.len(), 2, "{after:?}");
    assert_eq!(after[0].0, before[0].0);
    let rows = unpack(&after[0].1).unwrap();
    let sessions: Vec<&str> = rows.iter().map(|row| row.0.as_str()).collect();
    assert_eq!(sessions, ["b"]);
    assert_eq!(after[1], before[2], "left as it was");
}

/// A flushed session's pending events are let go of by the writer into
/// `retired`, still whole, for the next caller to free; taken once.
#[test]
fn flushed_events_are_retired_for_a_caller_to_free() {
    let connection = connection();
    let journal = Journal::default();
    let turn = Uuid::now_v7();
    let events = [delta("a", turn, 1), delta("a", turn, 2)];
    commit(&connection, &journal, vec![events[0].clone()]);
    commit(&connection, &journal, vec![events[1].clone()]);
    assert!(journal.retired().is_empty());
    let end = Arc::new(
        StoredEvent::from_event(
            "a",
            turn,
            3,
            TurnEvent::MessageRetracted {
                step: 1,
                reason: "a non-delta event ends the run".into(),
            },
            chrono::Utc::now(),
        )
        .unwrap(),
    );
    commit(&connection, &journal, vec![end]);
    assert!(journal.read("a", None, 0).is_empty());
    let retired = journal.retired();
    let seqs: Vec<Vec<i64>> = retired
        .iter()
        .map(|events| events.iter().map(|e| e.seq).collect())
        .collect();
    assert_eq!(seqs, [[1, 2]]);
    // The journal holds no other share of them.
    assert!(events.iter().all(|e| Arc::strong_count(e) == 2));
    assert!(journal.retired().is_empty());
}
