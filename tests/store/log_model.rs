//! The event log against a plain model (docs/event-log.md's rules):
//! random appends of deltas and other events, turn ends, refused
//! commits, commits whose answer is lost (Postgres, through the fault
//! proxy), restarts and erases, on both backends; every read, of a
//! session and of a turn, compared with what the model holds.

use std::sync::Arc;

use chrono::Utc;
use harness_base::events::{StoredEvent, TurnEvent};
use harness_store::store::{NewTurn, Store};
use proptest::prelude::*;
use uuid::Uuid;

use super::{Backend, TestDb, completed, delta, key, new_turn};
use crate::support::FaultProxy;

const SESSIONS: usize = 3;

/// One step of a case.
#[derive(Debug, Clone)]
enum Op {
    /// Events of the session's running turn (one begins when there is
    /// none): `deltas` text deltas, then one event that is not a delta
    /// when `other`.
    Append {
        session: usize,
        deltas: u8,
        other: bool,
    },
    /// The running turn ends (its terminal event).
    End { session: usize },
    /// A commit of an event at a seq the session holds: refused, and
    /// nothing of it written.
    Conflict { session: usize },
    /// A commit whose answer is lost after it reached the database
    /// (Postgres; an append on SQLite), tried again: its events are
    /// there once.
    LostAnswer { session: usize, deltas: u8 },
    /// Reads after a point of the session's log (per mille of its last
    /// seq), at most `limit`: the session's, and each turn's.
    Read {
        session: usize,
        after: u16,
        limit: u8,
    },
    /// The process stops and another opens the store.
    Restart,
    /// The session is erased (its running turn ended first).
    Erase { session: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let session = 0..SESSIONS;
    prop_oneof![
        4 => (session.clone(), 0u8..6, any::<bool>())
            .prop_map(|(session, deltas, other)| Op::Append { session, deltas, other }),
        2 => session.clone().prop_map(|session| Op::End { session }),
        1 => session.clone().prop_map(|session| Op::Conflict { session }),
        1 => (session.clone(), 1u8..4)
            .prop_map(|(session, deltas)| Op::LostAnswer { session, deltas }),
        4 => (session.clone(), 0u16..=1000, 1u8..40)
            .prop_map(|(session, after, limit)| Op::Read { session, after, limit }),
        1 => Just(Op::Restart),
        1 => session.prop_map(|session| Op::Erase { session }),
    ]
}

/// What the model holds of an event.
type Seen = (i64, Uuid, String, String);

fn seen(event: &StoredEvent) -> Seen {
    (
        event.seq,
        event.turn_id,
        event.event_type.clone(),
        event.payload.clone(),
    )
}

/// A session as the model sees it.
#[derive(Default)]
struct Session {
    events: Vec<Seen>,
    running: Option<NewTurn>,
}

impl Session {
    fn last_seq(&self) -> i64 {
        self.events.last().map_or(0, |e| e.0)
    }
}

/// One case's store, opened (and opened again) as its backend is.
struct Log {
    db: TestDb,
    proxy: Option<FaultProxy>,
    store: Option<Arc<dyn Store>>,
}

impl Log {
    async fn new(backend: Backend) -> Self {
        let db = TestDb::new(backend).await;
        let proxy = match backend {
            Backend::Postgres => Some(FaultProxy::start(TestDb::postgres_addr()).await),
            Backend::Sqlite => None,
        };
        let mut log = Self {
            db,
            proxy,
            store: None,
        };
        log.open().await;
        log
    }

    async fn open(&mut self) {
        self.store = Some(match &self.proxy {
            Some(proxy) => self.db.open_through(proxy).await,
            None => self.db.open().await,
        });
    }

    fn store(&self) -> &dyn Store {
        self.store.as_deref().expect("an open store")
    }
}

/// The session's running turn, begun if there is none: its first seq is
/// after every event the session holds.
async fn running(log: &Log, session: &mut Session, name: &str) -> NewTurn {
    if let Some(turn) = &session.running {
        return turn.clone();
    }
    let turn = new_turn(name, None);
    let began = log.store().begin_turn(&turn).await.unwrap();
    assert_eq!(
        began.first_seq,
        session.last_seq() + 1,
        "{name}: a begin's seq"
    );
    session.events.push((
        began.first_seq,
        turn.id,
        "turn.started".into(),
        turn.started_payload.clone(),
    ));
    session.running = Some(turn.clone());
    turn
}

fn approval(turn: &NewTurn, seq: i64) -> Arc<StoredEvent> {
    let event = TurnEvent::ApprovalRequested {
        step: 1,
        call_id: format!("call_{seq}"),
        tool: "write_note".into(),
        arguments: serde_json::json!({"path": "a.md"}),
        expires_at: None,
    };
    Arc::new(StoredEvent::new(&turn.session_id, turn.id, seq, &event, Utc::now()).unwrap())
}

/// `count` deltas (and an approval's request when `other`) after the
/// session's last seq.
fn appended(turn: &NewTurn, after: i64, count: u8, other: bool) -> Vec<Arc<StoredEvent>> {
    let mut events: Vec<Arc<StoredEvent>> = (1..=i64::from(count))
        .map(|n| delta(turn, after + n, &format!("d{}", after + n)))
        .collect();
    if other {
        events.push(approval(turn, after + i64::from(count) + 1));
    }
    events
}

async fn apply(log: &mut Log, model: &mut [Session], op: Op) {
    let name = |session: usize| format!("log-{session}");
    match op {
        Op::Append {
            session,
            deltas,
            other,
        } => {
            let turn = running(log, &mut model[session], &name(session)).await;
            let events = appended(&turn, model[session].last_seq(), deltas, other);
            log.store().write_batch(&events, &[]).await.unwrap();
            model[session].events.extend(events.iter().map(|e| seen(e)));
        }
        Op::End { session } => {
            let Some(turn) = model[session].running.take() else {
                return;
            };
            let finish = completed(&turn, model[session].last_seq() + 1, "done");
            let ended = log.store().write_batch(&[], &[&finish]).await.unwrap();
            assert_eq!(ended, [true]);
            model[session].events.push(seen(&finish.terminal));
        }
        Op::Conflict { session } => {
            let Some(turn) = model[session].running.clone() else {
                return;
            };
            let held = model[session].last_seq();
            let events = vec![
                delta(&turn, held, "a seq the session holds"),
                delta(&turn, held + 1, "after it"),
            ];
            assert!(log.store().write_batch(&events, &[]).await.is_err());
        }
        Op::LostAnswer { session, deltas } => {
            let turn = running(log, &mut model[session], &name(session)).await;
            let events = appended(&turn, model[session].last_seq(), deltas, true);
            if let Some(proxy) = &log.proxy {
                proxy.cut_after_next_commit();
                // The answer may be lost, or the cut may come first: either
                // way the writer tries the same batch again.
                let _ = log.store().write_batch(&events, &[]).await;
            }
            log.store().write_batch(&events, &[]).await.unwrap();
            model[session].events.extend(events.iter().map(|e| seen(e)));
        }
        Op::Read {
            session,
            after,
            limit,
        } => read(log, &model[session], &name(session), after, limit).await,
        Op::Restart => {
            log.store = None;
            log.open().await;
        }
        Op::Erase { session } => {
            Box::pin(apply(log, model, Op::End { session })).await;
            log.store()
                .erase_session(&key(&name(session)))
                .await
                .unwrap();
            model[session] = Session::default();
        }
    }
}

async fn read(log: &Log, session: &Session, name: &str, after: u16, limit: u8) {
    let after = session.last_seq() * i64::from(after) / 1000;
    let expected: Vec<Seen> = session
        .events
        .iter()
        .filter(|e| e.0 > after)
        .take(usize::from(limit))
        .cloned()
        .collect();
    let read = log
        .store()
        .list_events(&key(name), None, after, u32::from(limit))
        .await
        .unwrap();
    assert_eq!(
        read.iter().map(seen).collect::<Vec<_>>(),
        expected,
        "{name} after {after}"
    );
    let turns: std::collections::BTreeSet<Uuid> = session.events.iter().map(|e| e.1).collect();
    for turn in turns {
        let expected: Vec<Seen> = session
            .events
            .iter()
            .filter(|e| e.1 == turn && e.0 > after)
            .take(usize::from(limit))
            .cloned()
            .collect();
        let read = log
            .store()
            .list_events(&key(name), Some(turn), after, u32::from(limit))
            .await
            .unwrap();
        assert_eq!(
            read.iter().map(seen).collect::<Vec<_>>(),
            expected,
            "{name}'s turn {turn}"
        );
    }
}

async fn run_case(backend: Backend, ops: Vec<Op>) {
    let mut log = Log::new(backend).await;
    let mut model: Vec<Session> = (0..SESSIONS).map(|_| Session::default()).collect();
    for op in ops {
        apply(&mut log, &mut model, op).await;
    }
    // Whatever happened, the whole log reads as the model says, after a
    // last restart too.
    for restarted in [false, true] {
        if restarted {
            log.store = None;
            log.open().await;
        }
        for (n, session) in model.iter().enumerate() {
            read(&log, session, &format!("log-{n}"), 0, u8::MAX).await;
        }
    }
}

async fn the_log_reads_as_a_plain_model_says(backend: Backend) {
    let config = ProptestConfig {
        cases: 12,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let handle = tokio::runtime::Handle::current();
    let ops = proptest::collection::vec(op(), 1..30);
    let result = tokio::task::block_in_place(|| {
        runner.run(&ops, |ops| {
            handle.block_on(run_case(backend, ops));
            Ok(())
        })
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

crate::on_both_backends!(the_log_reads_as_a_plain_model_says);
