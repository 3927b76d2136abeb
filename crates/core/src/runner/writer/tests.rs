use super::*;
use crate::{
    events::TurnEvent,
    runner::live::LiveTurns,
    store::{NewTurn, Store},
};

/// A writer over a real SQLite file, with one turn begun in it.
struct Rig {
    _dir: tempfile::TempDir,
    sqlite: Arc<crate::store::sqlite::SqliteStore>,
    store: Arc<dyn Store>,
    writer: EventWriter,
    live: Arc<LiveTurn>,
    stop: CancellationToken,
    tracker: TaskTracker,
    first_seq: i64,
}

/// Begins a turn of `session` in `store`: its live turn and first seq.
async fn begin(store: &dyn Store, session: &str) -> (Arc<LiveTurn>, i64) {
    let turn_id = uuid::Uuid::now_v7();
    let began = store
        .begin_turn(&NewTurn {
            id: turn_id,
            session_id: session.into(),
            tenant: crate::ids::DEFAULT_TENANT.into(),
            request: crate::turn::TurnRequest::new("hi"),
            idempotency_key: None,
            owner_instance: "i".into(),
            owner_process: "p".into(),
            created_at: chrono::Utc::now(),
            started_payload: "{}".into(),
            reads: Default::default(),
            max_running: None,
            held_back: false,
            traceparent: None,
        })
        .await
        .unwrap();
    let live =
        LiveTurns::default().insert(&crate::ids::SessionKey::from_stored(session), turn_id, 0);
    (live, began.first_seq)
}

async fn rig(linger: Duration) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/writer.db", dir.path().display());
    let sqlite = Arc::new(
        crate::store::sqlite::SqliteStore::connect(&url, 2)
            .await
            .unwrap(),
    );
    let store: Arc<dyn Store> = sqlite.clone();
    store.migrate().await.unwrap();
    let (live, first_seq) = begin(store.as_ref(), "s-linger").await;
    let tracker = TaskTracker::new();
    let stop = CancellationToken::new();
    let writer = EventWriter::spawn(
        store.clone(),
        Arc::new(Metrics::default()),
        WriterLimits {
            capacity: 64,
            batch_max: 512,
            linger,
        },
        &tracker,
        stop.clone(),
        crate::runner::live::LeaseClock::new(Duration::from_secs(60)),
    );
    Rig {
        _dir: dir,
        sqlite,
        store,
        writer,
        live,
        stop,
        tracker,
        first_seq,
    }
}

impl Rig {
    async fn append(&self, seq: i64, event: TurnEvent, flush: Flush) {
        self.append_to(&self.live, self.first_seq + seq, event, flush)
            .await;
    }

    async fn append_to(&self, live: &Arc<LiveTurn>, seq: i64, event: TurnEvent, flush: Flush) {
        let stored = StoredEvent::new(
            &live.session_id,
            live.turn_id,
            seq,
            &event,
            chrono::Utc::now(),
        )
        .unwrap();
        self.writer
            .append(live, Arc::new(stored), flush)
            .await
            .unwrap();
    }

    /// Waits until `n` jobs wait for the store's writer thread.
    async fn until_queued(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.sqlite.queued_writes() != n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{n} jobs queued for the writer thread within 10 s (there are {})",
                self.sqlite.queued_writes()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The seqs (after the first) of the next commit published.
    async fn next_commit(
        &self,
        rx: &mut tokio::sync::broadcast::Receiver<super::super::live::Committed>,
    ) -> Vec<i64> {
        let committed = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a commit within 10 s")
            .unwrap();
        committed.iter().map(|e| e.seq - self.first_seq).collect()
    }

    async fn logged(&self) -> Vec<i64> {
        self.store
            .list_events(
                &self.live.session_id,
                Some(self.live.turn_id),
                self.first_seq,
                100,
            )
            .await
            .unwrap()
            .iter()
            .map(|e| e.seq - self.first_seq)
            .collect()
    }
}

fn text(t: &str) -> TurnEvent {
    TurnEvent::MessageDelta {
        step: 1,
        text: t.into(),
    }
}

/// Text deltas that may wait are neither committed nor published until
/// an event that may not wait arrives; then they share its commit.
#[tokio::test]
async fn text_that_may_wait_shares_the_commit_of_the_next_urgent_event() {
    let rig = rig(Duration::from_secs(60)).await;
    let mut rx = rig.live.subscribe();
    rig.append(1, text("first"), Flush::Now).await;
    assert_eq!(rig.next_commit(&mut rx).await, vec![1]);
    for seq in 2..=5 {
        rig.append(seq, text("more "), Flush::MayWait).await;
    }
    let early = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await;
    assert!(early.is_err(), "the deltas waited: {early:?}");
    assert_eq!(
        rig.logged().await,
        vec![1],
        "nothing of them in the log yet"
    );
    let usage = TurnEvent::Usage {
        step: Some(1),
        input_tokens: 1,
        output_tokens: 4,
        cache_read_tokens: 0,
        cache_creation_tokens: 0,
        reasoning_tokens: 0,
        cost_usd: None,
    };
    rig.append(6, usage, Flush::Now).await;
    assert_eq!(rig.next_commit(&mut rx).await, vec![2, 3, 4, 5, 6]);
    assert_eq!(rig.logged().await, vec![1, 2, 3, 4, 5, 6]);
}

/// A delta with nothing after it waits its linger, not forever.
#[tokio::test]
async fn text_that_may_wait_is_committed_when_its_wait_is_over() {
    let rig = rig(Duration::from_millis(50)).await;
    let mut rx = rig.live.subscribe();
    rig.append(1, text("first"), Flush::Now).await;
    assert_eq!(rig.next_commit(&mut rx).await, vec![1]);
    rig.append(2, text(" and the rest"), Flush::MayWait).await;
    assert_eq!(rig.next_commit(&mut rx).await, vec![2]);
    assert_eq!(rig.logged().await, vec![1, 2]);
}

/// With no linger, each delta is committed as soon as the writer is free.
#[tokio::test]
async fn without_a_linger_text_does_not_wait() {
    let rig = rig(Duration::ZERO).await;
    let mut rx = rig.live.subscribe();
    rig.append(1, text("first"), Flush::Now).await;
    assert_eq!(rig.next_commit(&mut rx).await, vec![1]);
    rig.append(2, text(" more"), Flush::MayWait).await;
    assert_eq!(rig.next_commit(&mut rx).await, vec![2]);
}

/// A writer told to stop commits what it was holding, then ends.
#[tokio::test]
async fn a_stopping_writer_commits_the_text_it_holds() {
    let rig = rig(Duration::from_secs(60)).await;
    let mut rx = rig.live.subscribe();
    rig.append(1, text("first"), Flush::Now).await;
    assert_eq!(rig.next_commit(&mut rx).await, vec![1]);
    rig.append(2, text(" held"), Flush::MayWait).await;
    rig.stop.cancel();
    assert_eq!(rig.next_commit(&mut rx).await, vec![2]);
    drop(rig.writer);
    rig.tracker.close();
    tokio::time::timeout(Duration::from_secs(10), rig.tracker.wait())
        .await
        .expect("the writer ended");
    assert_eq!(
        rig.store
            .list_events(
                &"s-linger".into(),
                Some(rig.live.turn_id),
                rig.first_seq,
                100
            )
            .await
            .unwrap()
            .len(),
        2
    );
}

/// A commit of more events than the fan-out's ring holds (a fast
/// provider's whole answer) reaches a subscriber whole, in one message:
/// it does not lag, so it does not go back to the log.
#[tokio::test]
async fn a_commit_of_many_events_reaches_a_subscriber_in_one_message() {
    let turns = LiveTurns::default();
    let turn_id = uuid::Uuid::now_v7();
    let live = turns.insert(&crate::ids::SessionKey::from_stored("s"), turn_id, 0);
    let other = turns.insert(
        &crate::ids::SessionKey::from_stored("t"),
        uuid::Uuid::now_v7(),
        0,
    );
    let mut receiver = live.subscribe();
    let event = |live: &Arc<LiveTurn>, seq: i64| Command::Append {
        event: Arc::new(
            StoredEvent::new(
                &live.session_id,
                live.turn_id,
                seq,
                &TurnEvent::MessageDelta {
                    step: 1,
                    text: format!("t{seq} "),
                },
                chrono::Utc::now(),
            )
            .unwrap(),
        ),
        live: live.clone(),
        flush: Flush::Now,
    };
    // 100 events of the turn, another turn's interleaved.
    let commands: Vec<Command> = (2..102)
        .flat_map(|seq| [event(&live, seq), event(&other, seq)])
        .collect();
    publish(commands.into_iter(), Vec::new());
    let committed = receiver.recv().await.unwrap();
    let seqs: Vec<i64> = committed.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (2..102).collect::<Vec<_>>());
    assert!(committed.iter().all(|e| e.turn_id == turn_id));
    assert!(receiver.try_recv().is_err(), "nothing more, and no lag");
}

/// Events queued while the store's writer thread is busy share the commit
/// asked for before them: it takes its events when the thread gets to it,
/// not when it was asked for.
#[tokio::test]
async fn events_queued_while_the_writer_thread_is_busy_share_one_commit() {
    let rig = rig(Duration::ZERO).await;
    let mut rx = rig.live.subscribe();
    let held = rig.sqlite.hold_writer().await;
    held.started.await.unwrap();
    rig.append(1, text("a"), Flush::Now).await;
    rig.until_queued(1).await;
    rig.append(2, text("b"), Flush::Now).await;
    rig.append(3, text("c"), Flush::Now).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        rig.sqlite.queued_writes(),
        1,
        "nothing more is asked for before the first commit takes its events"
    );
    held.release.send(()).unwrap();
    assert_eq!(rig.next_commit(&mut rx).await, vec![1, 2, 3]);
    assert_eq!(rig.logged().await, vec![1, 2, 3]);
}

/// The next commit is asked for while the one before it runs, so the
/// writer thread goes on to it without waiting for the first's answer
/// to come back; the answers are published in order.
#[tokio::test]
async fn the_next_commit_is_asked_for_while_one_runs() {
    let rig = rig(Duration::ZERO).await;
    let mut rx = rig.live.subscribe();
    let first = rig.sqlite.hold_writer().await;
    first.started.await.unwrap();
    rig.append(1, text("a"), Flush::Now).await;
    rig.until_queued(1).await;
    // Held in the group of the first commit, after it.
    let second = rig.sqlite.hold_writer().await;
    first.release.send(()).unwrap();
    second.started.await.unwrap();
    rig.append(2, text("b"), Flush::Now).await;
    rig.until_queued(1).await;
    assert!(rx.try_recv().is_err(), "the first commit is not done");
    second.release.send(()).unwrap();
    assert_eq!(rig.next_commit(&mut rx).await, vec![1]);
    assert_eq!(rig.next_commit(&mut rx).await, vec![2]);
    assert_eq!(rig.logged().await, vec![1, 2]);
}

/// A commit that fails fails the one asked for after it; the failed
/// batch is written turn by turn (the turn whose events clash loses
/// them), and the events queued after it are committed next, in order.
#[tokio::test]
async fn after_a_failed_commit_the_next_events_are_committed_in_order() {
    let rig = rig(Duration::ZERO).await;
    let (other, other_first) = begin(rig.store.as_ref(), "s-other").await;
    let mut rx = other.subscribe();
    let first = rig.sqlite.hold_writer().await;
    first.started.await.unwrap();
    // Two events at one seq: the batch is refused.
    rig.append(1, text("a"), Flush::Now).await;
    rig.append(1, text("a again"), Flush::Now).await;
    rig.until_queued(1).await;
    let second = rig.sqlite.hold_writer().await;
    first.release.send(()).unwrap();
    second.started.await.unwrap();
    rig.append_to(&other, other_first + 1, text("b"), Flush::Now)
        .await;
    rig.until_queued(1).await;
    second.release.send(()).unwrap();
    let committed = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a commit within 10 s")
        .unwrap();
    let seqs: Vec<i64> = committed.iter().map(|e| e.seq - other_first).collect();
    assert_eq!(seqs, vec![1]);
    assert!(rig.live.lost_events(), "the clashing turn lost its events");
    assert_eq!(rig.logged().await, Vec::<i64>::new());
    let logged = rig
        .store
        .list_events(&other.session_id, Some(other.turn_id), other_first, 100)
        .await
        .unwrap();
    assert_eq!(logged.len(), 1);
}
