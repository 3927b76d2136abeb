//! The event log on both backends: batches and their ends, gathered
//! and chained commits, pages and cursors, runs, the journal.

use super::*;

/// One batch ends the turns of several sessions, given in no particular
/// order: each that still runs is ended with its own messages, decision,
/// totals and terminal event; one that was ended before gets nothing of
/// its second finish; the answer is in the caller's order.
async fn a_batch_ends_many_turns_and_skips_the_ended(backend: Backend) {
    let (_db, store) = store(backend).await;
    let turns: Vec<NewTurn> = ["m-b", "m-c", "m-a"]
        .iter()
        .map(|s| new_turn(s, None))
        .collect();
    for turn in &turns {
        store.begin_turn(turn).await.unwrap();
    }
    // m-c's turn ended already.
    assert_eq!(
        store
            .write_batch(&[], &[&completed(&turns[1], 2, "first end")])
            .await
            .unwrap(),
        vec![true]
    );
    let deltas: Vec<Arc<StoredEvent>> = vec![
        delta(&turns[0], 2, "b"),
        delta(&turns[2], 2, "a"),
        delta(&turns[2], 3, "a"),
    ];
    let finishes = [
        completed(&turns[0], 3, "answer b"),
        completed(&turns[1], 3, "second end"),
        completed(&turns[2], 4, "answer a"),
    ];
    let refs: Vec<&TurnFinish> = finishes.iter().collect();
    let applied = store.write_batch(&deltas, &refs).await.unwrap();
    assert_eq!(applied, vec![true, false, true]);
    for (turn, answer, last) in [
        (&turns[0], "answer b", 3),
        (&turns[1], "first end", 2),
        (&turns[2], "answer a", 4),
    ] {
        let session = store.get_session(&turn.session_id).await.unwrap().unwrap();
        assert_eq!(session.last_seq, last, "{}", turn.session_id);
        assert_eq!(session.cost_usd, Some(0.25), "{}", turn.session_id);
        assert_eq!(session.running_turn_id, None);
        let record = store
            .get_turn(&turn.session_id, turn.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.status, TurnStatus::Completed);
        assert_eq!(record.result.unwrap().text, answer);
        let messages: Vec<(String, String)> = store
            .list_messages(&turn.session_id, 0, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|m| (m.role, m.content))
            .collect();
        assert_eq!(
            messages,
            [
                ("user".to_owned(), "hi".to_owned()),
                ("assistant".to_owned(), answer.to_owned())
            ]
        );
        let decisions = store
            .list_decisions(&turn.session_id, None, None, 10)
            .await
            .unwrap();
        assert_eq!(decisions.len(), 1);
        // The observation of the end that applied, none of the other.
        let observed: Vec<String> = store
            .list_observations(&turn.session_id, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.assistant_text)
            .collect();
        assert_eq!(observed, [answer]);
        // Its job too: one per session, the applied end's.
        let jobs = store.list_jobs(&turn.session_id, 10).await.unwrap();
        assert_eq!(jobs.len(), 1, "{jobs:?}");
        let events: Vec<(i64, String)> = store
            .list_events(&turn.session_id, None, 0, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.seq, e.event_type))
            .collect();
        assert_eq!(events.len(), last as usize, "{events:?}");
        assert_eq!(events.last().unwrap().1, "turn.completed");
    }
}

async fn a_failed_batch_writes_nothing(backend: Backend) {
    let (_db, store) = store(backend).await;
    let turn = new_turn("s1", None);
    store.begin_turn(&turn).await.unwrap();
    // seq 1 is taken by turn.started: the whole batch must roll back.
    let result = store
        .write_batch(
            &[delta(&turn, 2, "ok"), delta(&turn, 1, "dup")],
            &[&completed(&turn, 3, "x")],
        )
        .await;
    assert!(result.is_err());
    assert_eq!(events_in(store.as_ref(), "s1").await, 1);
    assert!(
        store
            .list_messages(&key("s1"), 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .list_observations(&key("s1"), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.list_jobs(&key("s1"), 10).await.unwrap().is_empty());
    let record = store.get_turn(&key("s1"), turn.id).await.unwrap().unwrap();
    assert_eq!(record.status, TurnStatus::Running);
}

async fn a_failed_batch_of_events_alone_writes_nothing(backend: Backend) {
    let (_db, store) = store(backend).await;
    let turn = new_turn("s1", None);
    store.begin_turn(&turn).await.unwrap();
    // No finish: the batch is one statement; seq 1 is taken, so none of it lands.
    let batch = [
        delta(&turn, 2, "a"),
        delta(&turn, 3, "b"),
        delta(&turn, 1, "dup"),
    ];
    assert!(store.write_batch(&batch, &[]).await.is_err());
    assert_eq!(events_in(store.as_ref(), "s1").await, 1);
    // A big batch is equally whole.
    let mut big: Vec<_> = (2..=201).map(|seq| delta(&turn, seq, "x")).collect();
    big.push(delta(&turn, 150, "dup"));
    assert!(store.write_batch(&big, &[]).await.is_err());
    assert_eq!(events_in(store.as_ref(), "s1").await, 1);
    big.pop();
    store.write_batch(&big, &[]).await.unwrap();
    assert_eq!(events_in(store.as_ref(), "s1").await, 201);
}

/// A batch handed over to be taken when the store's writer gets to it.
struct Handed {
    events: Vec<Arc<StoredEvent>>,
    finishes: Vec<TurnFinish>,
    leases: Vec<Lease>,
    gathered: usize,
}

impl Gather for Handed {
    fn gather(&mut self) {
        self.gathered += 1;
    }

    fn parts(&self) -> Parts<'_> {
        Parts {
            events: &self.events,
            steps: Vec::new(),
            finishes: self.finishes.iter().collect(),
            leases: &self.leases,
            fence: true,
        }
    }
}

/// A gathered commit writes what its batch holds once taken, on both
/// backends; where commits apply in order (SQLite), one chained after a
/// failed commit fails without taking or writing anything.
async fn a_gathered_commit_writes_its_batch_and_a_failed_chain_nothing(backend: Backend) {
    let (_db, store) = store(backend).await;
    assert_eq!(store.commits_in_order(), backend == Backend::Sqlite);
    let turn = new_turn("s1", None);
    store.begin_turn(&turn).await.unwrap();
    let lease = Lease {
        turn_id: turn.id,
        attempt: 0,
    };
    let handed = |events, finishes| {
        Arc::new(std::sync::Mutex::new(Handed {
            events,
            finishes,
            leases: vec![lease],
            gathered: 0,
        }))
    };
    if store.commits_in_order() {
        let failed = Chain::default();
        failed.this.set_failed(true);
        let after = Chain {
            after: Some(failed.this.clone()),
            this: Arc::default(),
        };
        let refused = handed(vec![delta(&turn, 2, "a")], Vec::new());
        assert!(
            store
                .commit_gathered(refused.clone(), after.clone())
                .await
                .is_err()
        );
        assert_eq!(refused.lock().unwrap().gathered, 0, "nothing taken");
        assert!(after.this.failed(), "and the next in the chain is told");
        assert_eq!(events_in(store.as_ref(), "s1").await, 1);
    }
    let batch = handed(
        vec![delta(&turn, 2, "a"), delta(&turn, 3, "b")],
        vec![completed(&turn, 4, "ab")],
    );
    let chain = Chain::default();
    let applied = store
        .commit_gathered(batch.clone(), chain.clone())
        .await
        .unwrap();
    assert_eq!(applied, vec![true]);
    assert_eq!(batch.lock().unwrap().gathered, 1);
    assert!(!chain.this.failed());
    assert_eq!(events_in(store.as_ref(), "s1").await, 4);
    let ended = store.get_turn(&key("s1"), turn.id).await.unwrap().unwrap();
    assert_eq!(ended.status, TurnStatus::Completed);
}

async fn concurrent_writes_fail_alone(backend: Backend) {
    let (_db, store) = store(backend).await;
    let mut turns = Vec::new();
    for i in 0..10 {
        let turn = new_turn(&format!("c{i}"), None);
        store.begin_turn(&turn).await.unwrap();
        turns.push(turn);
    }
    // Ten batches at once (they may share a transaction); the fifth reuses
    // a taken seq.
    let writes: Vec<_> = turns
        .iter()
        .enumerate()
        .map(|(i, turn)| {
            let store = store.clone();
            let seq = if i == 4 { 1 } else { 2 };
            let batch = vec![delta(turn, seq, "x")];
            let finish = completed(turn, 3, "done");
            tokio::spawn(async move { store.write_batch(&batch, &[&finish]).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for write in writes {
        outcomes.push(write.await.unwrap().is_ok());
    }
    assert_eq!(outcomes.iter().filter(|ok| !**ok).count(), 1);
    assert!(!outcomes[4]);
    for (i, turn) in turns.iter().enumerate() {
        let record = store
            .get_turn(&turn.session_id, turn.id)
            .await
            .unwrap()
            .unwrap();
        let events = store
            .list_events(&turn.session_id, None, 0, 10)
            .await
            .unwrap();
        if i == 4 {
            assert_eq!(
                record.status,
                TurnStatus::Running,
                "the failed write left nothing"
            );
            assert_eq!(events.len(), 1);
        } else {
            assert_eq!(record.status, TurnStatus::Completed);
            assert_eq!(events.len(), 3);
        }
    }
}

async fn events_and_messages_page_in_order(backend: Backend) {
    let (_db, store) = store(backend).await;
    let mut next_seq = 1;
    for i in 0..3 {
        let turn = new_turn("s1", None);
        assert_eq!(store.begin_turn(&turn).await.unwrap().first_seq, next_seq);
        let deltas: Vec<_> = (1..=4).map(|k| delta(&turn, next_seq + k, "x")).collect();
        store
            .write_batch(
                &deltas,
                &[&completed(&turn, next_seq + 5, &format!("answer {i}"))],
            )
            .await
            .unwrap();
        next_seq += 6;
    }
    let page = store.list_events(&key("s1"), None, 5, 4).await.unwrap();
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), [6, 7, 8, 9]);
    let all = store.list_events(&key("s1"), None, 0, 1000).await.unwrap();
    assert_eq!(all.len(), 18);
    let second_turn = all[6].turn_id;
    let of_turn = store
        .list_events(&key("s1"), Some(second_turn), 0, 100)
        .await
        .unwrap();
    assert_eq!(
        of_turn.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (7..=12).collect::<Vec<_>>()
    );

    let messages = store.list_messages(&key("s1"), 0, 100).await.unwrap();
    assert_eq!(messages.len(), 6);
    let after = store
        .list_messages(&key("s1"), messages[1].id, 2)
        .await
        .unwrap();
    assert_eq!(after, messages[2..4].to_vec());
    let recent = store.recent_messages(&key("s1"), 3).await.unwrap();
    let texts: Vec<_> = recent.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(texts, ["answer 1", "hi", "answer 2"]);
}

/// One cursor pages every reader of a turn's log: it reads past a page
/// boundary to the end, moves past what it was given, and stops where
/// its reader has what it needs.
async fn a_turn_log_cursor_reads_every_page_of_its_turn(backend: Backend) {
    let (_db, store) = store(backend).await;
    let other = new_turn("s1", None);
    store.begin_turn(&other).await.unwrap();
    store
        .write_batch(&[], &[&completed(&other, 2, "before")])
        .await
        .unwrap();
    let turn = new_turn("s1", None);
    let first_seq = store.begin_turn(&turn).await.unwrap().first_seq;
    let page = cursor::PAGE as i64;
    // Two full pages and a part of one, the terminal event last.
    let deltas: Vec<_> = (1..2 * page + 10)
        .map(|k| delta(&turn, first_seq + k, "x"))
        .collect();
    let last = first_seq + 2 * page + 10;
    store
        .write_batch(&deltas, &[&completed(&turn, last, "done")])
        .await
        .unwrap();
    let record = store.get_turn(&key("s1"), turn.id).await.unwrap().unwrap();

    let mut all = TurnLogCursor::of(&record);
    let events = all.all(store.as_ref(), usize::MAX).await.unwrap();
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (first_seq..=last).collect::<Vec<_>>());
    assert!(events.iter().all(|e| e.turn_id == turn.id));
    assert_eq!(all.after(), last);
    assert!(all.read(store.as_ref()).await.unwrap().is_empty());

    let mut seen = Vec::new();
    TurnLogCursor::of(&record)
        .each(store.as_ref(), |event| {
            seen.push(event.seq);
            event.seq == first_seq + page + 3
        })
        .await
        .unwrap();
    assert_eq!(seen, (first_seq..=first_seq + page + 3).collect::<Vec<_>>());

    let mut moved = TurnLogCursor::new(&key("s1"), turn.id, first_seq);
    moved.passed(last - 2);
    let tail = moved.all(store.as_ref(), usize::MAX).await.unwrap();
    assert_eq!(
        tail.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [last - 1, last]
    );
}

async fn stored_events_are_byte_for_byte_what_was_written(backend: Backend) {
    let (_db, store) = store(backend).await;
    let turn = new_turn("s1", None);
    store.begin_turn(&turn).await.unwrap();
    let written = delta(&turn, 2, "quotes \" and unicode ✓ and \\ backslash");
    store
        .write_batch(std::slice::from_ref(&written), &[])
        .await
        .unwrap();
    let read = store.list_events(&key("s1"), None, 1, 10).await.unwrap();
    assert_eq!(read[0], *written);
    assert_eq!(read[0].envelope_json(), written.envelope_json());
}

/// A burst of a turn's deltas committed together with the turn's end is
/// a few rows (runs of at most 256) on both backends; a read after any
/// seq (inside a run, at its edges) gets exactly the events after it, in
/// order, each as it was written, and the session's last seq and the next
/// turn's first count every event. (Before, each delta was a row on
/// SQLite, and on Postgres in a batch that ended a turn: most of the rows
/// of long answers there.)
async fn a_burst_of_deltas_reads_back_whole_after_any_seq(backend: Backend) {
    let (db, store) = store(backend).await;
    let turn = new_turn("s1", None);
    assert_eq!(store.begin_turn(&turn).await.unwrap().first_seq, 1);
    let deltas: Vec<_> = (2..=301)
        .map(|seq| delta(&turn, seq, &format!("t{seq} \"✓")))
        .collect();
    store
        .write_batch(&deltas, &[&completed(&turn, 302, "done")])
        .await
        .unwrap();
    let all = store.list_events(&key("s1"), None, 0, 1000).await.unwrap();
    assert_eq!(all.len(), 302);
    for (read, written) in all[1..301].iter().zip(&deltas) {
        assert_eq!(read, &**written);
        assert_eq!(read.envelope_json(), written.envelope_json());
    }
    for after in [0, 1, 2, 3, 150, 256, 257, 258, 259, 299, 300, 301, 302] {
        let want: Vec<i64> = (after + 1..=302.min(after + 5)).collect();
        for of_turn in [None, Some(turn.id)] {
            let page = store
                .list_events(&key("s1"), of_turn, after, 5)
                .await
                .unwrap();
            let seqs: Vec<i64> = page.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, want, "after {after}, turn {of_turn:?}");
        }
    }
    let session = store.get_session(&key("s1")).await.unwrap().unwrap();
    assert_eq!(session.last_seq, 302);
    let next = new_turn("s1", None);
    assert_eq!(store.begin_turn(&next).await.unwrap().first_seq, 303);
    // Deltas again at seqs a run holds: refused whole, as a duplicate key
    // is (the key of a run is its first seq alone).
    let again: Vec<_> = (150..=160).map(|seq| delta(&turn, seq, "again")).collect();
    assert!(store.write_batch(&again, &[]).await.is_err());
    assert_eq!(events_in(store.as_ref(), "s1").await, 303);
    let rows: Vec<(i64, Option<i64>)> = if backend == Backend::Sqlite {
        let pool = sqlx::SqlitePool::connect(&db.sqlite_url()).await.unwrap();
        let rows =
            sqlx::query_as("SELECT seq, seq_end FROM events WHERE session_id = 's1' ORDER BY seq")
                .fetch_all(&pool)
                .await
                .unwrap();
        pool.close().await;
        rows
    } else {
        db.postgres_event_rows("s1").await
    };
    assert_eq!(
        rows,
        [
            (1, None),
            (2, Some(257)),
            (258, Some(301)),
            (302, None),
            (303, None)
        ]
    );
}

/// A batch's deltas on Postgres are runs too, whether the batch is fenced
/// or not, its sessions' events interleaved in it (before, a row each:
/// the row per event that held Postgres's events/s down). A run read
/// after any seq gives the rest. A batch collides, whole, with a run at
/// its first seq (a take-over numbers after what is stored, so the first
/// rows of two writers start at the same seq), and a run that starts
/// inside what is stored is refused (the key sees a run's first seq
/// only), from a batch that ends the turn too; the same batch tried again
/// is found stored as it is.
async fn deltas_are_runs_on_postgres_and_a_run_still_fences(backend: Backend) {
    let (db, store) = store(backend).await;
    let (one, two) = (new_turn("s1", None), new_turn("s2", None));
    for turn in [&one, &two] {
        assert_eq!(store.begin_turn(turn).await.unwrap().first_seq, 1);
    }
    let lease = |turn: &NewTurn| Lease {
        turn_id: turn.id,
        attempt: 0,
    };
    let leases = [lease(&one), lease(&two)];
    // Unfenced (the writer's lease is fresh), the two sessions' deltas
    // interleaved as the writer queues them; then a fenced batch.
    let mut unfenced = Vec::new();
    for seq in 2..=101 {
        unfenced.push(delta(&one, seq, &format!("a{seq}")));
        if seq <= 51 {
            unfenced.push(delta(&two, seq, &format!("b{seq}")));
        }
    }
    let fenced_deltas: Vec<_> = (102..=120).map(|seq| delta(&one, seq, "c")).collect();
    for (events, fence) in [(&unfenced, false), (&fenced_deltas, true)] {
        store
            .commit(Batch {
                events,
                fence,
                ..fenced(&leases)
            })
            .await
            .unwrap();
    }
    let all = store.list_events(&key("s1"), None, 0, 1000).await.unwrap();
    let seqs: Vec<i64> = all.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=120).collect::<Vec<_>>());
    let written = unfenced.iter().filter(|e| e.session_id == "s1");
    for (read, written) in all[1..].iter().zip(written.chain(&fenced_deltas)) {
        assert_eq!(read, &**written);
    }
    for after in [1, 2, 50, 100, 101, 102, 119] {
        let page = store.list_events(&key("s1"), None, after, 3).await.unwrap();
        let seqs: Vec<i64> = page.iter().map(|e| e.seq).collect();
        let want: Vec<i64> = (after + 1..=120.min(after + 3)).collect();
        assert_eq!(seqs, want, "after {after}");
    }
    assert_eq!(events_in(store.as_ref(), "s2").await, 51);
    if backend == Backend::Postgres {
        assert_eq!(
            db.postgres_event_rows("s1").await,
            [(1, None), (2, Some(101)), (102, Some(120))]
        );
        assert_eq!(
            db.postgres_event_rows("s2").await,
            [(1, None), (2, Some(51))]
        );
    }
    // A run, then another writer's deltas from its first seq and from
    // inside it: refused whole. The same run again (Postgres: the writer's
    // retry after a lost answer): found as it is.
    let run: Vec<_> = (121..=130).map(|seq| delta(&one, seq, "d")).collect();
    fn unfenced_of<'a>(events: &'a [Arc<StoredEvent>], leases: &'a [Lease]) -> Batch<'a> {
        Batch {
            events,
            fence: false,
            ..fenced(leases)
        }
    }
    let unfenced_batch = |events| unfenced_of(events, &leases);
    store.commit(unfenced_batch(&run)).await.unwrap();
    for seq in [121, 125] {
        let other = [delta(&one, seq, "other"), delta(&one, seq + 1, "other")];
        assert!(
            store.commit(unfenced_of(&other, &leases)).await.is_err(),
            "{seq}"
        );
    }
    if backend == Backend::Postgres {
        // (SQLite's writer is in the process: no answer of its is lost.)
        store.commit(unfenced_batch(&run)).await.unwrap();
    }
    // Another writer's event first, then a run from that seq: refused.
    let first = [delta(&one, 131, "first")];
    store.commit(unfenced_of(&first, &leases)).await.unwrap();
    let late: Vec<_> = (131..=140).map(|seq| delta(&one, seq, "late")).collect();
    assert!(store.commit(unfenced_batch(&late)).await.is_err());
    let all = store
        .list_events(&key("s1"), None, 120, 1000)
        .await
        .unwrap();
    let texts: Vec<(i64, bool)> = all
        .iter()
        .map(|e| (e.seq, e.payload.contains("\"d\"")))
        .collect();
    let want: Vec<(i64, bool)> = (121..=130)
        .map(|seq| (seq, true))
        .chain([(131, false)])
        .collect();
    assert_eq!(texts, want);
    assert!(all[10].payload.contains("first"));
    // The same from a batch that ends the turn: a run that starts inside
    // a stored one is refused whole, the end with it.
    let inside: Vec<_> = (125..=129).map(|seq| delta(&one, seq, "inside")).collect();
    let end = completed(&one, 132, "done");
    let ending = Batch {
        events: &inside,
        finishes: &[&end],
        ..unfenced_batch(&[])
    };
    assert!(store.commit(ending).await.is_err());
    let after = store
        .list_events(&key("s1"), None, 120, 1000)
        .await
        .unwrap();
    assert_eq!(after, all);
    let turn = store.get_turn(&key("s1"), one.id).await.unwrap().unwrap();
    assert_eq!(turn.status, TurnStatus::Running);
}

/// Paced deltas, one per session a commit (what 1,000 streams at a token
/// every 50 ms write): on SQLite each is committed to the journal, not a
/// row of the session's table each (before, each was a row: the page
/// rewrite a paced token cost); on both backends every read, of a
/// session, a turn or after any seq, gets each event once, in order, and
/// the session's last seq counts them. A store opened after a crash (the
/// first dropped with deltas pending) moves them into the table; the
/// turn's end then writes after them.
async fn paced_read_back(store: &dyn Store, turns: &[NewTurn]) {
    for turn in turns {
        let id = &turn.session_id;
        let all = store.list_events(&key(id), None, 0, 100).await.unwrap();
        let seqs: Vec<i64> = all.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 2, 3, 4, 5, 6], "{id}");
        assert!(all[3].payload.contains(&format!("{id} 4")), "{id}");
        for after in 0..=6 {
            let page = store
                .list_events(&key(id), Some(turn.id), after, 2)
                .await
                .unwrap();
            let seqs: Vec<i64> = page.iter().map(|e| e.seq).collect();
            let want: Vec<i64> = (after + 1..=6.min(after + 2)).collect();
            assert_eq!(seqs, want, "{id} after {after}");
        }
        let session = store.get_session(&key(id)).await.unwrap().unwrap();
        assert_eq!(session.last_seq, 6, "{id}");
    }
}

async fn paced_deltas_read_back_whole_and_survive_a_crash(backend: Backend) {
    let (db, store) = store(backend).await;
    let sessions: Vec<String> = (0..40).map(|i| format!("paced-{i}")).collect();
    let turns: Vec<NewTurn> = sessions.iter().map(|s| new_turn(s, None)).collect();
    for turn in &turns {
        assert_eq!(store.begin_turn(turn).await.unwrap().first_seq, 1);
    }
    for seq in 2..=6 {
        let round: Vec<_> = turns
            .iter()
            .map(|t| delta(t, seq, &format!("{} {seq}", t.session_id)))
            .collect();
        store.write_batch(&round, &[]).await.unwrap();
    }
    paced_read_back(store.as_ref(), &turns).await;
    // A delta at a seq already written is refused, journaled or not.
    let again = delta(&turns[0], 4, "again");
    assert!(store.write_batch(&[again], &[]).await.is_err());
    if backend == Backend::Sqlite {
        let pool = sqlx::SqlitePool::connect(&db.sqlite_url()).await.unwrap();
        let count = |sql: &'static str| {
            let pool = pool.clone();
            async move {
                let (n,): (i64,) = sqlx::query_as(sql).fetch_one(&pool).await.unwrap();
                n
            }
        };
        // The turns' starts only: the deltas are in the journal, a pack
        // (one row) a commit.
        assert_eq!(count("SELECT count(*) FROM events").await, 40);
        assert_eq!(count(JOURNALED).await, 200);
        assert_eq!(count("SELECT count(*) FROM event_journal_packs").await, 5);
        pool.close().await;
    }
    // The process stops with the deltas pending; the next one reads them.
    drop(store);
    let store = db.open().await;
    paced_read_back(store.as_ref(), &turns).await;
    if backend == Backend::Sqlite {
        let pool = sqlx::SqlitePool::connect(&db.sqlite_url()).await.unwrap();
        let (journal,): (i64,) = sqlx::query_as(JOURNALED).fetch_one(&pool).await.unwrap();
        assert_eq!(journal, 0);
        pool.close().await;
    }
    // The turns go on: 40 more deltas of one turn, one a commit (past
    // the journal's flush point), then its end.
    let turn = &turns[0];
    for seq in 7..=46 {
        store
            .write_batch(&[delta(turn, seq, &format!("late {seq}"))], &[])
            .await
            .unwrap();
    }
    store
        .write_batch(&[], &[&completed(turn, 47, "done")])
        .await
        .unwrap();
    let all = store
        .list_events(&key(&turn.session_id), None, 0, 100)
        .await
        .unwrap();
    let seqs: Vec<i64> = all.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=47).collect::<Vec<_>>());
    let next = new_turn(&turn.session_id, None);
    assert_eq!(store.begin_turn(&next).await.unwrap().first_seq, 48);
    // An erase leaves none of the session's rows in the journal (they
    // stay there, flushed, until it is trimmed).
    let other = &turns[1];
    store
        .write_batch(&[], &[&completed(other, 7, "done")])
        .await
        .unwrap();
    let journaled_of = |session: &str| {
        format!(
            "SELECT count(*) FROM event_journal_packs, json_each(events) \
             WHERE json_extract(json_each.value, '$[0]') = '{session}'"
        )
    };
    if backend == Backend::Sqlite {
        let pool = sqlx::SqlitePool::connect(&db.sqlite_url()).await.unwrap();
        let (before,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(journaled_of(&turn.session_id)))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(before > 0, "the late deltas were journaled");
        pool.close().await;
    }
    let erased = store.erase_session(&key(&other.session_id)).await.unwrap();
    assert!(
        matches!(erased, harness_store::store::Erased::Erased),
        "{erased:?}"
    );
    store
        .write_batch(&[], &[&completed(&next, 49, "done")])
        .await
        .unwrap();
    assert!(matches!(
        store.erase_session(&key(&turn.session_id)).await.unwrap(),
        harness_store::store::Erased::Erased
    ));
    if backend == Backend::Sqlite {
        let pool = sqlx::SqlitePool::connect(&db.sqlite_url()).await.unwrap();
        for session in [&turn.session_id, &other.session_id] {
            let (left,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(journaled_of(session)))
                .fetch_one(&pool)
                .await
                .unwrap();
            assert_eq!(left, 0, "{session}");
        }
        pool.close().await;
    }
}

/// The journal's rows: those its packs list.
const JOURNALED: &str =
    "SELECT COALESCE(SUM(json_array_length(events)), 0) FROM event_journal_packs";

/// Postgres: a batch written again after a commit whose answer was lost
/// (the writer's retry) is stored once and reports its turn ended; an
/// event at a stored seq that is not the stored one fails the batch whole.
#[tokio::test]
async fn a_batch_written_twice_is_stored_once_and_only_a_different_event_conflicts() {
    if !support::postgres_or_skip().await {
        return;
    }
    let (_db, store) = store(Backend::Postgres).await;
    let turn = new_turn("s1", None);
    store.begin_turn(&turn).await.unwrap();
    let deltas = [delta(&turn, 2, "a"), delta(&turn, 3, "b")];
    store.write_batch(&deltas, &[]).await.unwrap();
    store.write_batch(&deltas, &[]).await.unwrap();
    assert_eq!(events_in(store.as_ref(), "s1").await, 3);
    let last = [delta(&turn, 4, "c")];
    let finish = completed(&turn, 5, "abc");
    assert_eq!(
        store.write_batch(&last, &[&finish]).await.unwrap(),
        vec![true]
    );
    // Tried again: nothing twice, and the turn is still reported ended by
    // this batch (its own terminal event is the stored one).
    assert_eq!(
        store.write_batch(&last, &[&finish]).await.unwrap(),
        vec![true]
    );
    assert_eq!(events_in(store.as_ref(), "s1").await, 5);
    assert_eq!(
        store.list_messages(&key("s1"), 0, 10).await.unwrap().len(),
        2
    );
    assert_eq!(store.list_jobs(&key("s1"), 10).await.unwrap().len(), 1);
    let session = store.get_session(&key("s1")).await.unwrap().unwrap();
    assert_eq!(session.cost_usd, Some(0.25), "the totals counted once");
    // Another event at a stored seq: refused, and nothing of its batch
    // is written.
    let other = new_turn("s2", None);
    store.begin_turn(&other).await.unwrap();
    let refused = store
        .write_batch(&[delta(&other, 2, "new"), delta(&turn, 3, "not b")], &[])
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(events_in(store.as_ref(), "s2").await, 1);
    let texts: Vec<String> = store
        .list_events(&key("s1"), None, 0, 10)
        .await
        .unwrap()
        .iter()
        .map(|e| e.payload.clone())
        .collect();
    assert!(texts[2].contains("\"b\""), "{texts:?}");
}

crate::on_both_backends!(
    a_batch_ends_many_turns_and_skips_the_ended,
    a_failed_batch_writes_nothing,
    a_failed_batch_of_events_alone_writes_nothing,
    a_gathered_commit_writes_its_batch_and_a_failed_chain_nothing,
    concurrent_writes_fail_alone,
    events_and_messages_page_in_order,
    a_turn_log_cursor_reads_every_page_of_its_turn,
    stored_events_are_byte_for_byte_what_was_written,
    a_burst_of_deltas_reads_back_whole_after_any_seq,
    deltas_are_runs_on_postgres_and_a_run_still_fences,
    paced_deltas_read_back_whole_and_survive_a_crash,
);
