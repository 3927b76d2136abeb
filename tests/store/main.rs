//! The storage contract: every test runs against SQLite and Postgres.

#![allow(
    clippy::disallowed_methods,
    reason = "a test's (the bench's) own servers and clients live as long as it does"
)]
#![allow(
    clippy::too_many_lines,
    reason = "a test (a scenario) is one story told whole; the lint holds in the service code"
)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly; the lint holds in the service code"
)]

#[path = "../support/mod.rs"]
mod support;

use std::sync::Arc;

use chrono::{Duration, Utc};
use harness_base::{
    events::{StoredEvent, TurnEvent},
    turn::TurnRequest,
};
use harness_store::{
    store::event_log::gather::{Chain, Gather, Parts},
    store::{
        Batch, BeginTurnError, Claim, Lease, NewDecision, NewMessage, NewStep, NewTurn, Orphan,
        OrphanScope, Queue, Share, Store, StoreError, TurnFinish, TurnLogCursor, TurnStatus,
        event_log::cursor, step_records_as,
    },
};
use support::{Backend, TestDb};
use uuid::Uuid;

/// A replica's claims of each queue, as the outbox makes them
/// (`outbox::run`): what is due, the rows a claim takes read back, and
/// the leases given back.
#[async_trait::async_trait]
trait Claims {
    async fn pushes_due(&self, now: chrono::DateTime<Utc>) -> Result<bool, StoreError>;
    async fn claim_pushes(
        &self,
        owner: &str,
        now: chrono::DateTime<Utc>,
        until: chrono::DateTime<Utc>,
        limit: u32,
        share: &Share,
    ) -> Result<Vec<harness_store::store::PushDelivery>, StoreError>;
    async fn release_pushes(&self, owner: &str) -> Result<(), StoreError>;
    async fn webhook_deliveries_due(&self, now: chrono::DateTime<Utc>) -> Result<bool, StoreError>;
    async fn claim_webhook_deliveries(
        &self,
        owner: &str,
        now: chrono::DateTime<Utc>,
        until: chrono::DateTime<Utc>,
        limit: u32,
        share: &Share,
    ) -> Result<Vec<harness_store::store::HeldDelivery>, StoreError>;
    async fn release_webhook_deliveries(&self, owner: &str) -> Result<(), StoreError>;
}

#[async_trait::async_trait]
impl<S: Store + ?Sized> Claims for S {
    async fn pushes_due(&self, now: chrono::DateTime<Utc>) -> Result<bool, StoreError> {
        self.due(Queue::Pushes, now).await
    }

    async fn claim_pushes(
        &self,
        owner: &str,
        now: chrono::DateTime<Utc>,
        until: chrono::DateTime<Utc>,
        limit: u32,
        share: &Share,
    ) -> Result<Vec<harness_store::store::PushDelivery>, StoreError> {
        let claim = Claim {
            owner,
            now,
            until,
            limit,
        };
        self.claim(Queue::Pushes, claim, share).await?;
        self.held_pushes(owner).await
    }

    async fn release_pushes(&self, owner: &str) -> Result<(), StoreError> {
        self.release(Queue::Pushes, owner).await
    }

    async fn webhook_deliveries_due(&self, now: chrono::DateTime<Utc>) -> Result<bool, StoreError> {
        self.due(Queue::Webhooks, now).await
    }

    async fn claim_webhook_deliveries(
        &self,
        owner: &str,
        now: chrono::DateTime<Utc>,
        until: chrono::DateTime<Utc>,
        limit: u32,
        share: &Share,
    ) -> Result<Vec<harness_store::store::HeldDelivery>, StoreError> {
        let claim = Claim {
            owner,
            now,
            until,
            limit,
        };
        self.claim(Queue::Webhooks, claim, share).await?;
        self.held_webhook_deliveries(owner).await
    }

    async fn release_webhook_deliveries(&self, owner: &str) -> Result<(), StoreError> {
        self.release(Queue::Webhooks, owner).await
    }
}

/// How many events the default tenant's session `id` holds (at most
/// 1,000 are read).
async fn events_in(store: &dyn Store, id: &str) -> usize {
    store
        .list_events(&key(id), None, 0, 1000)
        .await
        .unwrap()
        .len()
}

/// The stored key of the default tenant's session `id`.
pub fn key(id: &str) -> harness_base::ids::SessionKey {
    harness_base::ids::SessionKey::from_stored(id)
}

fn new_turn(session: &str, key: Option<&str>) -> NewTurn {
    NewTurn {
        id: Uuid::now_v7(),
        session_id: session.into(),
        tenant: harness_base::ids::DEFAULT_TENANT.to_owned(),
        request: TurnRequest::new("hi"),
        idempotency_key: key.map(str::to_owned),
        owner_instance: "instance-a".to_owned(),
        owner_process: "process-a".to_owned(),
        created_at: Utc::now(),
        started_payload: serde_json::to_string(&TurnEvent::TurnStarted {
            message: "hi".into(),
            provider: "openai".into(),
            model: "m".into(),
            warnings: Vec::new(),
        })
        .unwrap(),
        reads: Default::default(),
        max_running: None,
        held_back: false,
        traceparent: None,
    }
}

/// A fenced batch under `leases` that writes nothing: a test names what
/// it adds (`Batch { events: ..., ..fenced(&leases) }`).
fn fenced(leases: &[Lease]) -> Batch<'_> {
    Batch {
        events: &[],
        steps: &[],
        finishes: &[],
        leases,
        fence: true,
    }
}

fn delta(turn: &NewTurn, seq: i64, text: &str) -> Arc<StoredEvent> {
    Arc::new(
        StoredEvent::new(
            &turn.session_id,
            turn.id,
            seq,
            &TurnEvent::MessageDelta {
                step: 1,
                text: text.into(),
            },
            Utc::now(),
        )
        .unwrap(),
    )
}

fn completed(turn: &NewTurn, seq: i64, text: &str) -> TurnFinish {
    let result = harness_base::turn::TurnResult {
        text: text.into(),
        ..Default::default()
    };
    TurnFinish {
        turn_id: turn.id,
        attempt: 0,
        session_id: turn.session_id.clone(),
        background: false,
        status: TurnStatus::Completed,
        result: Some(serde_json::to_string(&result).unwrap()),
        error_code: None,
        error_message: None,
        messages: vec![
            NewMessage {
                id: Uuid::now_v7(),
                role: "user".into(),
                content: "hi".into(),
            },
            NewMessage {
                id: Uuid::now_v7(),
                role: "assistant".into(),
                content: text.into(),
            },
        ],
        decision: Some(NewDecision {
            id: Uuid::now_v7(),
            decision_key: "support.chat.turn".into(),
            strategy: "direct_answer".into(),
            record: "{}".into(),
        }),
        observation: Some(harness_store::store::ObservationRecord {
            id: format!("obs_{}", Uuid::now_v7().simple()),
            session_id: turn.session_id.to_string(),
            source_id: format!("chat_message:{}", turn.id),
            user_text: "hi".into(),
            assistant_text: text.into(),
            created_at: Utc::now(),
        }),
        jobs: vec![harness_store::store::NewJob {
            id: format!("job_{}", Uuid::now_v7().simple()),
            kind: "memory_extraction".into(),
            session_id: turn.session_id.to_string(),
            turn_id: turn.id.to_string(),
            payload: serde_json::json!({ "answer": text }).to_string(),
            at: Utc::now(),
        }],
        cost_usd: Some(0.25),
        terminal: Arc::new(
            StoredEvent::new(
                &turn.session_id,
                turn.id,
                seq,
                &TurnEvent::TurnCompleted { result },
                Utc::now(),
            )
            .unwrap(),
        ),
    }
}

async fn store(backend: Backend) -> (TestDb, Arc<dyn Store>) {
    let db = TestDb::new(backend).await;
    let store = db.open().await;
    (db, store)
}

async fn begin_creates_the_session_and_numbers_after_existing_events(backend: Backend) {
    let (_db, store) = store(backend).await;
    let first = new_turn("s1", None);
    assert_eq!(store.begin_turn(&first).await.unwrap().first_seq, 1);
    store
        .write_batch(
            &[delta(&first, 2, "a"), delta(&first, 3, "b")],
            &[&completed(&first, 4, "ab")],
        )
        .await
        .unwrap();
    let second = new_turn("s1", None);
    let began = store.begin_turn(&second).await.unwrap();
    assert_eq!((began.first_seq, began.turn_number), (5, 2));
    let other_session = new_turn("s2", None);
    assert_eq!(store.begin_turn(&other_session).await.unwrap().first_seq, 1);

    let session = store.get_session(&key("s1")).await.unwrap().unwrap();
    assert_eq!(session.turn_count, 2);
    assert_eq!(session.last_seq, 5);
    assert_eq!(session.running_turn_id, Some(second.id));
    let turn = store
        .get_turn(&key("s1"), second.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(turn.status, TurnStatus::Running);
    assert_eq!(turn.first_seq, 5);
    assert!(
        store
            .get_turn(&key("s2"), second.id)
            .await
            .unwrap()
            .is_none(),
        "turns are per session"
    );
}

async fn one_running_turn_per_session(backend: Backend) {
    let (_db, store) = store(backend).await;
    let first = new_turn("s1", None);
    store.begin_turn(&first).await.unwrap();
    match store.begin_turn(&new_turn("s1", None)).await {
        Err(BeginTurnError::AlreadyRunning(id)) => assert_eq!(id, first.id),
        other => panic!("expected AlreadyRunning, got {other:?}"),
    }
    // The refused turn left nothing behind.
    let events = store.list_events(&key("s1"), None, 0, 100).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(
        store
            .get_session(&key("s1"))
            .await
            .unwrap()
            .unwrap()
            .turn_count,
        1
    );
}

async fn concurrent_begins_let_exactly_one_turn_run(backend: Backend) {
    let (_db, store) = store(backend).await;
    let attempts: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.begin_turn(&new_turn("race", None)).await })
        })
        .collect();
    let mut started = 0;
    let mut refused = 0;
    for attempt in attempts {
        match attempt.await.unwrap() {
            Ok(_) => started += 1,
            Err(BeginTurnError::AlreadyRunning(_)) => refused += 1,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!((started, refused), (1, 7));
    assert_eq!(events_in(store.as_ref(), "race").await, 1);
}

async fn an_idempotency_key_names_its_turn(backend: Backend) {
    let (_db, store) = store(backend).await;
    let first = new_turn("s1", Some("key-1"));
    store.begin_turn(&first).await.unwrap();
    store
        .write_batch(&[], &[&completed(&first, 2, "done")])
        .await
        .unwrap();
    match store.begin_turn(&new_turn("s1", Some("key-1"))).await {
        Err(BeginTurnError::IdempotencyKeyExists(existing)) => {
            assert_eq!(existing.id, first.id);
            assert_eq!(existing.status, TurnStatus::Completed);
            assert_eq!(existing.request, first.request);
        }
        other => panic!("expected IdempotencyKeyExists, got {other:?}"),
    }
    // The same key in another session is another turn.
    store
        .begin_turn(&new_turn("s2", Some("key-1")))
        .await
        .unwrap();
}

async fn a_session_stays_with_the_tenant_that_made_it(backend: Backend) {
    let (_db, store) = store(backend).await;
    let mut first = new_turn("s-owned", None);
    first.tenant = "acme".to_owned();
    store.begin_turn(&first).await.unwrap();
    store
        .write_batch(&[], &[&completed(&first, 2, "done")])
        .await
        .unwrap();
    assert_eq!(
        store
            .session_tenant(&key("s-owned"))
            .await
            .unwrap()
            .as_deref(),
        Some("acme")
    );
    let before = store.get_session(&key("s-owned")).await.unwrap().unwrap();
    // Another tenant's begin is refused and writes nothing.
    let mut other = new_turn("s-owned", None);
    other.tenant = "globex".to_owned();
    match store.begin_turn(&other).await {
        Err(BeginTurnError::SessionNotFound) => {}
        other => panic!("expected SessionNotFound, got {other:?}"),
    }
    let after = store.get_session(&key("s-owned")).await.unwrap().unwrap();
    assert_eq!(
        (after.turn_count, after.last_seq, after.updated_at),
        (1, before.last_seq, before.updated_at)
    );
    assert!(
        store
            .get_turn(&key("s-owned"), other.id)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        store
            .session_tenant(&key("s-owned"))
            .await
            .unwrap()
            .as_deref(),
        Some("acme")
    );
    // The owner goes on.
    let mut next = new_turn("s-owned", None);
    next.tenant = "acme".to_owned();
    assert_eq!(store.begin_turn(&next).await.unwrap().turn_number, 2);
    assert_eq!(store.session_tenant(&key("s-none")).await.unwrap(), None);
}

async fn a_turn_reads_back_its_request_and_result_as_they_were_given(backend: Backend) {
    use harness_base::{
        providers::{ChatMessage, Role},
        turn::WebMode,
    };
    let (_db, store) = store(backend).await;
    let mut turn = new_turn("s1", None);
    turn.request = TurnRequest {
        top_k: 3,
        web_mode: WebMode::On,
        show_citations: true,
        runtime_model: Some("m-2".into()),
        skill_context: Some("Be brief.".into()),
        history: Some(vec![
            ChatMessage::new(Role::User, "earlier".to_owned()),
            ChatMessage::new(Role::Assistant, "answer".to_owned()),
        ]),
        user_id: Some("u-1".into()),
        think_level: Some(harness_base::providers::ThinkLevel::High),
        max_output_tokens: Some(300),
        metadata: [("ticket".to_owned(), "T-1".to_owned())].into(),
        follows: Some(Uuid::now_v7()),
        background: true,
        ..TurnRequest::new("now?")
    };
    store.begin_turn(&turn).await.unwrap();
    let running = store.get_turn(&key("s1"), turn.id).await.unwrap().unwrap();
    assert_eq!(running.request, turn.request);
    assert_eq!(running.result, None);
    store
        .write_batch(&[], &[&completed(&turn, 2, "Typed.")])
        .await
        .unwrap();
    let ended = store.get_turn(&key("s1"), turn.id).await.unwrap().unwrap();
    assert_eq!(ended.request, turn.request);
    let result = ended.result.unwrap();
    assert_eq!(result.text, "Typed.");
    assert_eq!(result.stop_reason, harness_base::turn::StopReason::Answer);
}

async fn a_turn_is_found_by_its_id_alone_until_it_is_hidden(backend: Backend) {
    let (_db, store) = store(backend).await;
    let turn = new_turn("s-find", None);
    store.begin_turn(&turn).await.unwrap();
    let found = store.find_turn(turn.id).await.unwrap().unwrap();
    assert_eq!((found.id, found.session_id.as_str()), (turn.id, "s-find"));
    assert!(store.find_turn(Uuid::now_v7()).await.unwrap().is_none());
    // A running turn is not hidden.
    assert!(!store.hide_turn(turn.id, Utc::now()).await.unwrap());
    assert!(store.find_turn(turn.id).await.unwrap().is_some());
    store
        .write_batch(&[], &[&completed(&turn, 2, "Done.")])
        .await
        .unwrap();
    assert!(store.hide_turn(turn.id, Utc::now()).await.unwrap());
    assert!(!store.hide_turn(turn.id, Utc::now()).await.unwrap(), "once");
    assert!(store.find_turn(turn.id).await.unwrap().is_none());
    // The session keeps it: its turn, history and log are as they were.
    let kept = store
        .get_turn(&key("s-find"), turn.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.status, TurnStatus::Completed);
    assert_eq!(
        store
            .list_messages(&key("s-find"), 0, 10)
            .await
            .unwrap()
            .len(),
        2
    );
    assert!(!store.hide_turn(Uuid::now_v7(), Utc::now()).await.unwrap());
}

async fn a_tenant_lists_its_own_sessions_newest_first(backend: Backend) {
    let (_db, store) = store(backend).await;
    let older = new_turn("s-old", None);
    store.begin_turn(&older).await.unwrap();
    let mut theirs = new_turn("globex/s-theirs", None);
    theirs.tenant = "globex".into();
    store.begin_turn(&theirs).await.unwrap();
    let mut newer = new_turn("s-new", None);
    newer.created_at = older.created_at + Duration::seconds(5);
    store.begin_turn(&newer).await.unwrap();
    let ids = |sessions: Vec<harness_store::store::SessionRecord>| -> Vec<String> {
        sessions.into_iter().map(|s| s.id).collect()
    };
    let default = harness_base::ids::DEFAULT_TENANT;
    assert_eq!(
        ids(store.list_sessions(default, 10).await.unwrap()),
        ["s-new", "s-old"]
    );
    assert_eq!(
        ids(store.list_sessions(default, 1).await.unwrap()),
        ["s-new"]
    );
    assert_eq!(
        ids(store.list_sessions("globex", 10).await.unwrap()),
        ["globex/s-theirs"]
    );
    assert!(store.list_sessions("nobody", 10).await.unwrap().is_empty());
}

async fn a_finish_commits_messages_decision_and_terminal_event_together(backend: Backend) {
    let (_db, store) = store(backend).await;
    let turn = new_turn("s1", None);
    store.begin_turn(&turn).await.unwrap();
    let applied = store
        .write_batch(
            &[delta(&turn, 2, "Hel"), delta(&turn, 3, "lo")],
            &[&completed(&turn, 4, "Hello")],
        )
        .await
        .unwrap();
    assert_eq!(applied, vec![true]);
    let record = store.get_turn(&key("s1"), turn.id).await.unwrap().unwrap();
    assert_eq!(record.status, TurnStatus::Completed);
    assert!(record.finished_at.is_some());
    assert_eq!(record.result.unwrap().text, "Hello");
    let messages = store.list_messages(&key("s1"), 0, 10).await.unwrap();
    let roles: Vec<_> = messages
        .iter()
        .map(|m| (m.role.as_str(), m.content.as_str()))
        .collect();
    assert_eq!(roles, [("user", "hi"), ("assistant", "Hello")]);
    let types: Vec<_> = store
        .list_events(&key("s1"), Some(turn.id), 0, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.seq, e.event_type))
        .collect();
    assert_eq!(
        types,
        [
            (1, "turn.started".to_owned()),
            (2, "message.delta".to_owned()),
            (3, "message.delta".to_owned()),
            (4, "turn.completed".to_owned())
        ]
    );
    // A second finish of the same turn applies nothing.
    let again = store
        .write_batch(&[], &[&completed(&turn, 5, "again")])
        .await
        .unwrap();
    assert_eq!(again, vec![false]);
    assert_eq!(
        store.list_messages(&key("s1"), 0, 10).await.unwrap().len(),
        2
    );
    assert_eq!(events_in(store.as_ref(), "s1").await, 4);
}

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

async fn heartbeat_reports_requested_cancellations(backend: Backend) {
    let (_db, store) = store(backend).await;
    let a = new_turn("s1", None);
    let b = new_turn("s2", None);
    store.begin_turn(&a).await.unwrap();
    store.begin_turn(&b).await.unwrap();
    assert!(store.request_cancel(b.id).await.unwrap());
    let mut refreshed = store
        .heartbeat(&leases_of(&[a.id, b.id]), Utc::now())
        .await
        .unwrap();
    refreshed.sort();
    let mut expected = vec![(a.id, false), (b.id, true)];
    expected.sort();
    assert_eq!(refreshed, expected, "both beat, b's cancel requested");
    store
        .write_batch(&[], &[&completed(&a, 2, "x")])
        .await
        .unwrap();
    // An ended turn is not kept alive.
    assert_eq!(
        store
            .heartbeat(&leases_of(&[a.id]), Utc::now())
            .await
            .unwrap(),
        []
    );
    assert!(
        !store.request_cancel(a.id).await.unwrap(),
        "a finished turn cannot be cancelled"
    );
    assert!(store.heartbeat(&[], Utc::now()).await.unwrap().is_empty());
}

async fn orphans_are_interrupted_once_with_a_final_event(backend: Backend) {
    let (_db, store) = store(backend).await;
    let now = Utc::now();
    // A previous life of this instance.
    let mine_old = new_turn("s1", None);
    store.begin_turn(&mine_old).await.unwrap();
    // Another instance, heartbeat long ago.
    let mut stale = new_turn("s2", None);
    stale.owner_instance = "instance-b".into();
    stale.owner_process = "process-b".into();
    stale.created_at = now - Duration::minutes(10);
    store.begin_turn(&stale).await.unwrap();
    // Another instance, alive.
    let mut alive = new_turn("s3", None);
    alive.owner_instance = "instance-c".into();
    alive.owner_process = "process-c".into();
    store.begin_turn(&alive).await.unwrap();
    // This very process.
    let mut own = new_turn("s4", None);
    own.owner_process = "process-new".into();
    store.begin_turn(&own).await.unwrap();

    // Running here, with a heartbeat late for a moment.
    let mut late = new_turn("s5", None);
    late.owner_process = "process-new".into();
    late.created_at = now - Duration::minutes(10);
    store.begin_turn(&late).await.unwrap();

    let scope = OrphanScope {
        instance: "instance-a".into(),
        process: "process-new".into(),
        stale_before: now - Duration::minutes(1),
        alive: [late.id].into(),
        max_attempts: 0,
        only: None,
        max_running_default: None,
    };
    let events = interrupted_only(store.take_orphans(&scope, "owner_lost", now).await.unwrap());
    let mut interrupted: Vec<_> = events.iter().map(|e| e.turn_id).collect();
    interrupted.sort();
    let mut expected = vec![mine_old.id, stale.id];
    expected.sort();
    assert_eq!(interrupted, expected);
    for event in &events {
        assert_eq!(event.event_type, "turn.interrupted");
        assert_eq!(event.seq, 2, "the next seq of its session");
        let record = store
            .get_turn(&event.session_id.as_str().into(), event.turn_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.status, TurnStatus::Interrupted);
        assert_eq!(record.error_code.as_deref(), Some("interrupted"));
    }
    for live in [&alive, &own, &late] {
        let record = store
            .get_turn(&live.session_id, live.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.status, TurnStatus::Running);
    }
    assert!(
        store
            .take_orphans(&scope, "owner_lost", now)
            .await
            .unwrap()
            .is_empty()
    );
    // The session is free again.
    store.begin_turn(&new_turn("s1", None)).await.unwrap();
}

/// The leases of turns never taken over.
fn leases_of(ids: &[Uuid]) -> Vec<Lease> {
    ids.iter()
        .map(|&turn_id| Lease {
            turn_id,
            attempt: 0,
        })
        .collect()
}

fn interrupted_only(taken: Vec<Orphan>) -> Vec<StoredEvent> {
    taken
        .into_iter()
        .map(|orphan| match orphan {
            Orphan::Interrupted(event) => *event,
            other => panic!("expected an interrupted turn, got {other:?}"),
        })
        .collect()
}

/// An orphan is claimed for the sweeping process, one attempt later, to go
/// on at its session's next seq; the owner that lost it can write nothing
/// more (events, records, end), the new one can. After its take-overs run
/// out, an orphan ends `interrupted`.
async fn an_orphan_is_taken_over_and_its_lost_owner_writes_nothing(backend: Backend) {
    let (_db, store) = store(backend).await;
    let now = Utc::now();
    let turn = new_turn("s-take", None);
    store.begin_turn(&turn).await.unwrap();
    let first = |attempt| {
        [Lease {
            turn_id: turn.id,
            attempt,
        }]
    };
    store
        .commit(Batch {
            events: &[delta(&turn, 2, "half an ans")],
            ..fenced(&first(0))
        })
        .await
        .unwrap();
    let scope = OrphanScope {
        instance: "instance-a".into(),
        process: "process-new".into(),
        stale_before: now - Duration::minutes(1),
        alive: Default::default(),
        max_attempts: 3,
        only: None,
        max_running_default: None,
    };
    let taken = store.take_orphans(&scope, "owner_lost", now).await.unwrap();
    let [
        Orphan::Claimed {
            turn: claimed,
            next_seq,
            released: false,
            woken: false,
        },
    ] = &taken[..]
    else {
        panic!("expected one claim, got {taken:?}");
    };
    assert_eq!((claimed.id, claimed.attempt, *next_seq), (turn.id, 1, 3));
    assert_eq!(claimed.status, TurnStatus::Running);
    assert_eq!(claimed.request, turn.request);
    // Claimed: no longer an orphan.
    assert!(
        store
            .take_orphans(&scope, "owner_lost", now)
            .await
            .unwrap()
            .is_empty()
    );

    // The lost owner: its events and records are refused, its end does
    // not apply.
    let lost_step = step(&turn, 1, "answered");
    for (events, steps) in [
        (vec![delta(&turn, 3, "swer")], vec![]),
        (vec![], vec![&lost_step]),
    ] {
        let refused = store
            .commit(Batch {
                events: &events,
                steps: &steps,
                ..fenced(&first(0))
            })
            .await;
        assert!(refused.is_err(), "{refused:?}");
    }
    let old_end = completed(&turn, 3, "from the lost owner");
    assert_eq!(
        store
            .commit(Batch {
                finishes: &[&old_end],
                ..fenced(&first(0))
            })
            .await
            .unwrap(),
        [false]
    );
    assert!(store.step_records(turn.id).await.unwrap().is_empty());

    // The new owner goes on at seq 3, then hands the turn over (shutdown):
    // released, it is any process's to take at once; the lease that lost
    // it releases nothing.
    store
        .commit(Batch {
            events: &[delta(&turn, 3, "whole")],
            ..fenced(&first(1))
        })
        .await
        .unwrap();
    assert!(!store.release_turn(&first(0)[0]).await.unwrap());
    assert!(store.release_turn(&first(1)[0]).await.unwrap());
    let elsewhere = OrphanScope {
        instance: "instance-b".into(),
        process: "process-b".into(),
        ..scope.clone()
    };
    let taken = store
        .take_orphans(&elsewhere, "owner_lost", now)
        .await
        .unwrap();
    assert!(
        matches!(
            &taken[..],
            [Orphan::Claimed { turn: t, next_seq: 4, released: true, woken: false }] if t.attempt == 2
        ),
        "{taken:?}"
    );
    let mut end = completed(&turn, 5, "whole answer");
    end.attempt = 2;
    let ended = store
        .commit(Batch {
            events: &[delta(&turn, 4, " answer")],
            finishes: &[&end],
            ..fenced(&first(2))
        })
        .await
        .unwrap();
    assert_eq!(ended, [true]);
    let events = store
        .list_events(&key("s-take"), None, 0, 100)
        .await
        .unwrap();
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    assert!(events[2].payload.contains("whole"));

    // A turn whose process dies every time: taken over three times, then
    // interrupted. Each owner is another instance, so only its stale
    // heartbeat makes the turn an orphan.
    let doomed = new_turn("s-doomed", None);
    store.begin_turn(&doomed).await.unwrap();
    let sweep = |k: i64| OrphanScope {
        instance: format!("instance-{k}"),
        process: format!("process-{k}"),
        stale_before: now + Duration::minutes(10 * k - 1),
        ..scope.clone()
    };
    let at = |k: i64| now + Duration::minutes(10 * k);
    for attempt in 1..=3u32 {
        let k = i64::from(attempt);
        if attempt >= 2 {
            // An owner that lost the turn keeps nothing alive by beating.
            let lost = [Lease {
                turn_id: doomed.id,
                attempt: attempt - 2,
            }];
            assert!(store.heartbeat(&lost, at(k)).await.unwrap().is_empty());
        }
        let taken = store
            .take_orphans(&sweep(k), "owner_lost", at(k))
            .await
            .unwrap();
        assert!(
            matches!(&taken[..], [Orphan::Claimed { turn, .. }] if turn.attempt == attempt),
            "{taken:?}"
        );
    }
    let events = interrupted_only(
        store
            .take_orphans(&sweep(4), "owner_lost", at(4))
            .await
            .unwrap(),
    );
    assert_eq!(events.len(), 1);
    let record = store
        .get_turn(&key("s-doomed"), doomed.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, TurnStatus::Interrupted);
}

/// A parked turn (waiting for an answer) is no orphan until it is due:
/// woken, or its wait's deadline passed. Taking it then is no take-over
/// (however few a turn may have), the park's length is added to what it
/// waited, and it holds none of its tenant's running places meanwhile.
async fn a_parked_turn_is_taken_only_when_due_and_not_as_a_takeover(backend: Backend) {
    let (_db, store) = store(backend).await;
    let now = Utc::now();
    let turn = new_turn("s-park", None);
    store.begin_turn(&turn).await.unwrap();
    let lease = |attempt| Lease {
        turn_id: turn.id,
        attempt,
    };
    assert!(
        !store.wake_turn(turn.id, now).await.unwrap(),
        "not parked: nothing to wake"
    );
    assert!(
        store
            .park_turn(&lease(0), now + Duration::hours(1), now)
            .await
            .unwrap()
    );
    let parked = store
        .get_turn(&key("s-park"), turn.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parked.status, TurnStatus::Running);
    assert_eq!(
        parked.parked_until.map(|t| t.timestamp_millis()),
        Some((now + Duration::hours(1)).timestamp_millis())
    );
    // Its tenant may run one turn: the parked one does not count.
    let mut other = new_turn("s-park-other", None);
    other.max_running = Some(1);
    store.begin_turn(&other).await.unwrap();
    let mut third = new_turn("s-park-third", None);
    third.max_running = Some(1);
    assert!(matches!(
        store.begin_turn(&third).await,
        Err(BeginTurnError::TenantBusy)
    ));
    // Every orphan is interrupted at once (no take-overs), and every
    // heartbeat is stale (but the other turn's, running in the sweeping
    // process): the parked turn is neither.
    let sweep = |at: chrono::DateTime<Utc>| OrphanScope {
        instance: "instance-b".into(),
        process: "process-b".into(),
        stale_before: at,
        alive: [other.id].into(),
        max_attempts: 0,
        only: None,
        max_running_default: None,
    };
    let at = |minutes| now + Duration::minutes(minutes);
    assert_eq!(
        store
            .take_orphans(&sweep(at(1)), "owner_lost", at(1))
            .await
            .unwrap(),
        []
    );

    // An answer wakes it: the process it woke takes it (and only it: the
    // other turn is as stale), as a parked turn's resumption, 2 minutes
    // after it parked.
    assert!(store.wake_turn(turn.id, at(1)).await.unwrap());
    let only = OrphanScope {
        only: Some(turn.id),
        max_running_default: None,
        alive: Default::default(),
        ..sweep(at(2))
    };
    let taken = store
        .take_orphans(&only, "owner_lost", at(2))
        .await
        .unwrap();
    let [
        Orphan::Claimed {
            turn: claimed,
            woken: true,
            released: true,
            ..
        },
    ] = &taken[..]
    else {
        panic!("expected the parked turn, got {taken:?}");
    };
    assert_eq!(claimed.attempt, 1, "a new lease");
    assert_eq!(claimed.parked_until, None);
    assert_eq!(claimed.waited.as_secs(), 120);
    assert!(!store.wake_turn(turn.id, at(2)).await.unwrap());
    // The old lease parks nothing; the new one parks it again, and the
    // wait's end makes it due with no answer.
    assert!(!store.park_turn(&lease(0), at(5), at(3)).await.unwrap());
    assert!(store.park_turn(&lease(1), at(5), at(3)).await.unwrap());
    assert_eq!(
        store
            .take_orphans(&sweep(at(4)), "owner_lost", at(4))
            .await
            .unwrap(),
        []
    );
    let taken = store
        .take_orphans(&sweep(at(5)), "owner_lost", at(5))
        .await
        .unwrap();
    let [
        Orphan::Claimed {
            turn: claimed,
            woken: true,
            ..
        },
    ] = &taken[..]
    else {
        panic!("expected the parked turn when its wait ended, got {taken:?}");
    };
    assert_eq!(claimed.attempt, 2);
    assert_eq!(claimed.waited.as_secs(), 120 + 120);
    // Taken over twice, both times parked: the sweep that takes over
    // nothing (no take-overs allowed) interrupts the turn only now, as an
    // orphan of its stale owner.
    let events = interrupted_only(
        store
            .take_orphans(&sweep(at(10)), "owner_lost", at(10))
            .await
            .unwrap(),
    );
    assert_eq!(
        events.iter().map(|e| e.turn_id).collect::<Vec<_>>(),
        [turn.id]
    );
}

/// What the retention sweep reads: sessions inactive since before a time,
/// whose turns have all ended, of one tenant, or of every tenant without a
/// retention of its own; and the lease that lets one replica sweep.
async fn retention_finds_the_inactive_sessions_of_each_tenant_and_one_sweeper(backend: Backend) {
    let (_db, store) = store(backend).await;
    let now = Utc::now();
    let mut made = Vec::new();
    for (tenant, session, ends) in [
        ("default", "r-old", true),
        ("default", "r-running", false),
        ("acme", "r-acme", true),
    ] {
        let mut turn = new_turn(session, None);
        turn.tenant = tenant.to_owned();
        turn.created_at = now - Duration::hours(2);
        let key = harness_base::ids::tenant_scope(tenant, session);
        turn.session_id = harness_base::ids::SessionKey::from_stored(&key);
        store.begin_turn(&turn).await.unwrap();
        if ends {
            let mut end = completed(&turn, 2, "done");
            end.terminal = Arc::new(
                StoredEvent::new(
                    &turn.session_id,
                    turn.id,
                    2,
                    &TurnEvent::TurnCompleted {
                        result: Default::default(),
                    },
                    now - Duration::hours(2),
                )
                .unwrap(),
            );
            store.write_batch(&[], &[&end]).await.unwrap();
        }
        made.push(key);
    }
    let before = now - Duration::hours(1);
    let mut all = store.inactive_sessions(None, before, 100).await.unwrap();
    all.sort();
    let mut expected = vec![made[0].clone(), made[2].clone()];
    expected.sort();
    assert_eq!(all, expected, "not the running one");
    // Acme keeps its sessions for a time of its own: the service's sweep
    // passes them over, Acme's finds them.
    store
        .set_tenant_limits(
            "acme",
            &harness_store::store::TenantLimits {
                retention_s: Some(86_400),
                ..Default::default()
            },
            now,
        )
        .await
        .unwrap();
    assert_eq!(
        store.tenant_limits("acme").await.unwrap().retention_s,
        Some(86_400)
    );
    assert_eq!(
        store.inactive_sessions(None, before, 100).await.unwrap(),
        [made[0].clone()]
    );
    assert_eq!(
        store
            .inactive_sessions(Some("acme"), before, 100)
            .await
            .unwrap(),
        [made[2].clone()]
    );
    assert!(
        store
            .inactive_sessions(None, now - Duration::hours(3), 100)
            .await
            .unwrap()
            .is_empty()
    );

    // One holder at a time, until its lease runs out.
    let until = now + Duration::minutes(1);
    assert!(
        store
            .take_lease("retention", "a", until, now)
            .await
            .unwrap()
    );
    assert!(
        !store
            .take_lease("retention", "b", until, now)
            .await
            .unwrap()
    );
    assert!(
        store
            .take_lease("retention", "a", until, now)
            .await
            .unwrap()
    );
    let later = now + Duration::minutes(2);
    assert!(
        store
            .take_lease("retention", "b", later + Duration::minutes(1), later)
            .await
            .unwrap()
    );
    assert!(
        !store
            .take_lease("retention", "a", later, later)
            .await
            .unwrap()
    );
}

/// Turn ends race heartbeats over the same turns and new turns of the same
/// sessions: on Postgres, rows locked in different orders deadlock (the
/// database then kills one transaction).
async fn heartbeats_and_begins_never_deadlock_with_turn_ends(backend: Backend) {
    let (_db, store) = store(backend).await;
    for round in 0..30 {
        let turns: Vec<NewTurn> = (0..8)
            .map(|i| new_turn(&format!("dl-{round}-{i}"), None))
            .collect();
        for turn in &turns {
            store.begin_turn(turn).await.unwrap();
        }
        let ids: Vec<Uuid> = turns.iter().map(|t| t.id).collect();
        let stop = tokio_util::sync::CancellationToken::new();
        let beating = {
            let (store, stop, ids) = (store.clone(), stop.clone(), ids.clone());
            tokio::spawn(async move {
                for _ in 0..10_000 {
                    if stop.is_cancelled() {
                        break;
                    }
                    store.heartbeat(&leases_of(&ids), Utc::now()).await?;
                }
                Ok::<_, harness_store::store::StoreError>(())
            })
        };
        let beginning = {
            let store = store.clone();
            let sessions: Vec<String> = turns.iter().map(|t| t.session_id.to_string()).collect();
            tokio::spawn(async move {
                for session in sessions.iter().rev() {
                    match store.begin_turn(&new_turn(session, None)).await {
                        Ok(_) | Err(BeginTurnError::AlreadyRunning(_)) => {}
                        Err(e) => return Err(e.to_string()),
                    }
                }
                Ok(())
            })
        };
        // Ends in an order of their own: not the heartbeat's (by id).
        let finishes: Vec<TurnFinish> = turns.iter().rev().map(|t| completed(t, 2, "ok")).collect();
        let refs: Vec<&TurnFinish> = finishes.iter().collect();
        let ended = store.write_batch(&[], &refs).await;
        stop.cancel();
        let beat = beating.await.unwrap();
        let began = beginning.await.unwrap();
        assert!(ended.is_ok(), "round {round}: {:?}", ended.err());
        assert!(beat.is_ok(), "round {round}: {:?}", beat.err());
        assert!(began.is_ok(), "round {round}: {:?}", began.err());
    }
}

async fn readiness_reports_pending_migrations(backend: Backend) {
    let db = TestDb::new(backend).await;
    let fresh = db.open_unmigrated().await;
    let before = fresh.readiness().await;
    assert!(before.reachable);
    assert!(!before.migrations_applied);
    fresh.migrate().await.unwrap();
    let after = fresh.readiness().await;
    assert!(after.reachable && after.migrations_applied);
    // Migrating again is a no-op.
    fresh.migrate().await.unwrap();
}

fn step(turn: &NewTurn, step: u32, phase: &'static str) -> NewStep {
    NewStep {
        turn_id: turn.id,
        step,
        phase,
        record: format!("{{\"step\":{step},\"phase\":\"{phase}\"}}"),
        created_at: Utc::now(),
    }
}

/// Step records come back as the type they were written from, in order;
/// one that is not that type is `Corrupt`, naming the record.
async fn step_records_come_back_typed(backend: Backend) {
    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Record {
        step: u32,
        phase: String,
    }
    let (_db, store) = store(backend).await;
    let turn = new_turn("s-typed", None);
    store.begin_turn(&turn).await.unwrap();
    let leases = [Lease {
        turn_id: turn.id,
        attempt: 0,
    }];
    let (first, second) = (step(&turn, 1, "answered"), step(&turn, 1, "finished"));
    store
        .commit(Batch {
            steps: &[&second, &first],
            ..fenced(&leases)
        })
        .await
        .unwrap();
    let read: Vec<Record> = step_records_as(store.as_ref(), turn.id).await.unwrap();
    assert_eq!(
        read,
        [
            Record {
                step: 1,
                phase: "answered".into()
            },
            Record {
                step: 1,
                phase: "finished".into()
            },
        ]
    );
    let broken = NewStep {
        record: "{\"step\": \"two\"}".into(),
        ..step(&turn, 2, "answered")
    };
    store
        .commit(Batch {
            steps: &[&broken],
            ..fenced(&leases)
        })
        .await
        .unwrap();
    match step_records_as::<Record>(store.as_ref(), turn.id).await {
        Err(StoreError::Corrupt(why)) => assert!(why.contains("step record 3"), "{why}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// Step records are committed with the events before them, read back in
/// step order, kept as they were when a batch is tried again, and gone
/// with the turn's end (a turn that ended needs none).
async fn step_records_live_as_long_as_their_turn(backend: Backend) {
    let (_db, store) = store(backend).await;
    let turn = new_turn("s-steps", None);
    store.begin_turn(&turn).await.unwrap();
    let leases = [Lease {
        turn_id: turn.id,
        attempt: 0,
    }];
    let answered = step(&turn, 1, "answered");
    let finished = step(&turn, 1, "finished");
    let second = step(&turn, 2, "answered");
    // Written out of order across batches, the later phase first.
    store
        .commit(Batch {
            events: &[delta(&turn, 2, "a")],
            steps: &[&second, &finished],
            ..fenced(&leases)
        })
        .await
        .unwrap();
    store
        .commit(Batch {
            steps: &[&answered],
            ..fenced(&leases)
        })
        .await
        .unwrap();
    // A record written again (its batch tried again after a commit whose
    // answer was lost): the record stays as it was.
    let again = NewStep {
        record: "{}".into(),
        ..answered.clone()
    };
    store
        .commit(Batch {
            steps: &[&again],
            ..fenced(&leases)
        })
        .await
        .unwrap();
    let kept = store.step_records(turn.id).await.unwrap();
    assert_eq!(
        kept,
        [&answered, &finished, &second].map(|s| s.record.clone())
    );
    // Another turn's records are its own.
    assert!(store.step_records(Uuid::now_v7()).await.unwrap().is_empty());
    // The end deletes them, in the same commit as a last record.
    let last = step(&turn, 2, "finished");
    let ended = store
        .commit(Batch {
            steps: &[&last],
            finishes: &[&completed(&turn, 3, "done")],
            ..fenced(&leases)
        })
        .await
        .unwrap();
    assert_eq!(ended, [true]);
    assert!(store.step_records(turn.id).await.unwrap().is_empty());
}

on_both_backends!(
    step_records_live_as_long_as_their_turn,
    step_records_come_back_typed,
    heartbeats_and_begins_never_deadlock_with_turn_ends,
    begin_creates_the_session_and_numbers_after_existing_events,
    one_running_turn_per_session,
    concurrent_begins_let_exactly_one_turn_run,
    an_idempotency_key_names_its_turn,
    a_session_stays_with_the_tenant_that_made_it,
    a_finish_commits_messages_decision_and_terminal_event_together,
    a_turn_reads_back_its_request_and_result_as_they_were_given,
    a_turn_is_found_by_its_id_alone_until_it_is_hidden,
    a_tenant_lists_its_own_sessions_newest_first,
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
    heartbeat_reports_requested_cancellations,
    orphans_are_interrupted_once_with_a_final_event,
    an_orphan_is_taken_over_and_its_lost_owner_writes_nothing,
    a_parked_turn_is_taken_only_when_due_and_not_as_a_takeover,
    retention_finds_the_inactive_sessions_of_each_tenant_and_one_sweeper,
    the_audit_trail_counts_failures_per_minute_and_trims_only_old_rows,
    readiness_reports_pending_migrations,
);

/// The audit trail: rows read back by filter and page; failed
/// authentications of one address in one minute are one row with their
/// count; the trim removes only rows older than its time.
async fn the_audit_trail_counts_failures_per_minute_and_trims_only_old_rows(backend: Backend) {
    use harness_store::store::{AuditEntry, AuditFilter, audit::kinds};
    let (_db, store) = store(backend).await;
    let ago = (Utc::now() - Duration::days(10)).timestamp();
    let minute = chrono::DateTime::from_timestamp(ago - ago % 60, 0).unwrap();
    for at in [minute, minute + Duration::seconds(30)] {
        store.audit_auth_failure("10.0.0.1", at).await.unwrap();
    }
    store
        .audit_auth_failure("10.0.0.1", minute + Duration::seconds(60))
        .await
        .unwrap();
    store.audit_auth_failure("10.0.0.2", minute).await.unwrap();
    let entry = AuditEntry::new("acme", kinds::SESSION_ERASED).subject("s1");
    store.audit(&entry, Utc::now()).await.unwrap();
    let all = AuditFilter {
        limit: 100,
        ..Default::default()
    };
    let rows = store.audit_rows(&all).await.unwrap();
    let counts: Vec<(Option<&str>, i64)> = rows
        .iter()
        .map(|r| (r.address.as_deref(), r.count))
        .collect();
    assert_eq!(
        counts,
        [
            (Some("10.0.0.1"), 2),
            (Some("10.0.0.1"), 1),
            (Some("10.0.0.2"), 1),
            (None, 1)
        ]
    );
    assert_eq!(rows[0].at, minute);
    assert_eq!(rows[3].actor, "service");
    assert_eq!(rows[3].tenant.as_deref(), Some("acme"));
    let acme = AuditFilter {
        tenant: Some("acme".into()),
        ..all.clone()
    };
    assert_eq!(store.audit_rows(&acme).await.unwrap(), rows[3..]);
    let page = AuditFilter {
        after: rows[1].id,
        limit: 1,
        ..all.clone()
    };
    assert_eq!(store.audit_rows(&page).await.unwrap(), rows[2..3]);
    let trimmed = store
        .trim_audit(Utc::now() - Duration::days(1), 2)
        .await
        .unwrap();
    assert_eq!(trimmed, 2);
    let trimmed = store
        .trim_audit(Utc::now() - Duration::days(1), 10)
        .await
        .unwrap();
    assert_eq!(trimmed, 1);
    assert_eq!(store.audit_rows(&all).await.unwrap(), rows[3..]);
}

async fn message_search_matches_any_term_newest_first(backend: Backend) {
    let (_db, store) = store(backend).await;
    for text in [
        "Trip to Paris in May",
        "Budget for the trip",
        "Nothing relevant",
    ] {
        let turn = new_turn("s1", None);
        let seq = store.begin_turn(&turn).await.unwrap().first_seq + 1;
        store
            .write_batch(&[], &[&completed(&turn, seq, text)])
            .await
            .unwrap();
    }
    let found = store
        .search_messages(&key("s1"), &["paris".into(), "budget".into()], 10)
        .await
        .unwrap();
    let texts: Vec<_> = found.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(texts, ["Budget for the trip", "Trip to Paris in May"]);
    assert!(
        store
            .search_messages(&key("s2"), &["paris".into()], 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .search_messages(&key("s1"), &[], 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .search_messages(&key("s1"), &["zzz".into()], 10)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn artifacts_and_decisions_are_kept_per_session(backend: Backend) {
    let (_db, store) = store(backend).await;
    let turn = new_turn("s1", None);
    store.begin_turn(&turn).await.unwrap();
    store
        .write_batch(&[], &[&completed(&turn, 2, "x")])
        .await
        .unwrap();
    let artifact = harness_store::store::NewArtifact {
        id: "art_1".into(),
        session_id: "s1".into(),
        turn_id: turn.id.to_string(),
        call_id: "c1".into(),
        tool: "dump".into(),
        content: "y".repeat(20_000),
        created_at: Utc::now(),
    };
    store.put_artifact(&artifact).await.unwrap();
    let read = store
        .get_artifact(&key("s1"), "art_1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.content.len(), 20_000);
    assert_eq!(read.call_id, "c1");
    assert!(
        store
            .get_artifact(&key("s2"), "art_1")
            .await
            .unwrap()
            .is_none()
    );
    let decisions = store
        .list_decisions(&key("s1"), None, None, 10)
        .await
        .unwrap();
    assert_eq!(decisions.len(), 1);
    assert_eq!(decisions[0].strategy, "direct_answer");
    assert_eq!(decisions[0].turn_id, turn.id.to_string());
    assert!(
        store
            .list_decisions(&key("s2"), None, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let after = decisions[0].id.clone();
    assert!(
        store
            .list_decisions(&key("s1"), Some(&after), None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .list_decisions(&key("s1"), None, Some("web_augmented"), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// The last migration before session ids became per tenant.
fn before_per_tenant_ids(backend: Backend) -> i64 {
    match backend {
        Backend::Sqlite => 13,
        Backend::Postgres => 15,
    }
}

/// Everything the store holds of a session, as a client would see it.
async fn session_contents(store: &dyn Store, key: &str) -> String {
    let key = &harness_base::ids::SessionKey::from_stored(key);
    let session = store.get_session(key).await.unwrap().unwrap();
    let events: Vec<_> = store
        .list_events(key, None, 0, 100)
        .await
        .unwrap()
        .iter()
        .map(|e| (e.seq, e.turn_id, e.payload.clone()))
        .collect();
    let messages = store.list_messages(key, 0, 100).await.unwrap();
    let decisions = store.list_decisions(key, None, None, 10).await.unwrap();
    let checkpoints: Vec<_> = store
        .list_checkpoints(key, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.id, c.turn_id, c.path, c.bytes))
        .collect();
    let artifact = store
        .get_artifact(
            key,
            &format!("art_{}", harness_base::ids::client_session_id(key)),
        )
        .await
        .unwrap()
        .unwrap();
    let jobs: Vec<_> = store
        .list_jobs(key, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|j| (j.id, j.kind, j.turn_id, j.status))
        .collect();
    let observations: Vec<_> = store
        .list_observations(key, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|o| (o.id, o.source_id, o.assistant_text))
        .collect();
    format!(
        "{:?}",
        (
            (session.created_at, session.turn_count, session.last_seq),
            (session.running_turn_id, session.cost_usd),
            events,
            messages,
            decisions,
            checkpoints,
            (artifact.turn_id, artifact.content),
            jobs,
            observations,
        )
    )
}

/// Adds (`up`) or drops the table and the columns that migrations after
/// the move to per-tenant ids made and the service's writes (or reads)
/// touch.
async fn later_schema(db: &TestDb, backend: Backend, up: bool) {
    match (backend, up) {
        (Backend::Sqlite, true) => {
            db.execute_sqlite(include_str!("../../migrations/sqlite/0017_turn_steps.sql"))
                .await;
            db.execute_sqlite(include_str!(
                "../../migrations/sqlite/0018_turn_attempts.sql"
            ))
            .await;
            db.execute_sqlite(include_str!(
                "../../migrations/sqlite/0019_turn_traceparent.sql"
            ))
            .await;
            db.execute_sqlite(include_str!("../../migrations/sqlite/0027_turn_parked.sql"))
                .await;
            db.execute_sqlite(include_str!("../../migrations/sqlite/0030_event_runs.sql"))
                .await;
            db.execute_sqlite(include_str!(
                "../../migrations/sqlite/0031_event_journal.sql"
            ))
            .await;
            db.execute_sqlite(include_str!("../../migrations/sqlite/0032_turn_tenant.sql"))
                .await;
            db.execute_sqlite(include_str!(
                "../../migrations/sqlite/0033_journal_packs.sql"
            ))
            .await;
            for outbox in [
                include_str!("../../migrations/sqlite/0025_push_configs.sql"),
                include_str!("../../migrations/sqlite/0026_webhooks.sql"),
                include_str!("../../migrations/sqlite/0036_outbox_in_rust.sql"),
            ] {
                db.execute_sqlite(outbox).await;
            }
        }
        (Backend::Postgres, true) => {
            db.execute_postgres(include_str!(
                "../../migrations/postgres/0019_turn_steps.sql"
            ))
            .await;
            db.execute_postgres(include_str!(
                "../../migrations/postgres/0020_turn_attempts.sql"
            ))
            .await;
            db.execute_postgres(include_str!(
                "../../migrations/postgres/0021_turn_traceparent.sql"
            ))
            .await;
            db.execute_postgres(include_str!(
                "../../migrations/postgres/0030_turn_parked.sql"
            ))
            .await;
            db.execute_postgres(include_str!(
                "../../migrations/postgres/0033_event_runs.sql"
            ))
            .await;
            db.execute_postgres(include_str!(
                "../../migrations/postgres/0034_turn_tenant.sql"
            ))
            .await;
            for outbox in [
                include_str!("../../migrations/postgres/0028_push_configs.sql"),
                include_str!("../../migrations/postgres/0029_webhooks.sql"),
                include_str!("../../migrations/postgres/0037_outbox_in_rust.sql"),
            ] {
                db.execute_postgres(outbox).await;
            }
        }
        (Backend::Sqlite, false) => {
            db.execute_sqlite(
                "DROP INDEX turns_running_by_tenant; ALTER TABLE turns DROP COLUMN tenant; \
                 DROP TABLE turn_steps; ALTER TABLE turns DROP COLUMN attempt; \
                 ALTER TABLE turns DROP COLUMN traceparent; \
                 ALTER TABLE turns DROP COLUMN parked_at; \
                 ALTER TABLE turns DROP COLUMN parked_until; \
                 ALTER TABLE turns DROP COLUMN waited_ms; \
                 ALTER TABLE turns DROP COLUMN resumes; \
                 ALTER TABLE events DROP COLUMN seq_end; DROP TABLE event_journal; \
                 DROP TABLE event_journal_packs; DROP TABLE webhook_deliveries; \
                 DROP TABLE webhooks; DROP TABLE push_configs;",
            )
            .await;
        }
        (Backend::Postgres, false) => {
            db.execute_postgres(
                "DROP TABLE turn_steps; ALTER TABLE turns DROP COLUMN attempt; \
                 ALTER TABLE turns DROP COLUMN traceparent; \
                 ALTER TABLE turns DROP COLUMN parked_at, DROP COLUMN parked_until, \
                 DROP COLUMN waited_ms, DROP COLUMN resumes; \
                 ALTER TABLE events DROP COLUMN seq_end; ALTER TABLE turns DROP COLUMN tenant; \
                 DROP FUNCTION harness_lease_lost(BIGINT); DROP TABLE webhook_deliveries; \
                 DROP TABLE webhooks; DROP TABLE push_configs;",
            )
            .await;
        }
    }
}

/// Session ids became per tenant: a store made before keeps every row of
/// every session. The default tenant's stay where they were; another
/// tenant's move, whole, to the key `{tenant}/{id}`.
async fn sessions_of_every_tenant_survive_the_move_to_per_tenant_ids(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.migrate_to(before_per_tenant_ids(backend)).await;
    // The service as it is writes the rows (the migration changes no
    // column): sessions made before, when every id was global. Its writes
    // touch a table and a column added after the move: made for them, and
    // dropped before the migration, which finds the database as the older
    // release left it.
    later_schema(&db, backend, true).await;
    let store = db.open_unmigrated().await;
    let mut made = Vec::new();
    for (tenant, id) in [("default", "d-1"), ("acme", "chat-1"), ("acme", "chat-2")] {
        let mut turn = new_turn(id, None);
        turn.tenant = tenant.to_owned();
        store.begin_turn(&turn).await.unwrap();
        store
            .write_batch(&[delta(&turn, 2, "Hi")], &[&completed(&turn, 3, "Hi")])
            .await
            .unwrap();
        store
            .put_artifact(&harness_store::store::NewArtifact {
                id: format!("art_{id}"),
                session_id: id.into(),
                turn_id: turn.id.to_string(),
                call_id: "c1".into(),
                tool: "web_fetch".into(),
                content: format!("page of {id}"),
                created_at: Utc::now(),
            })
            .await
            .unwrap();
        store
            .put_checkpoint(&harness_store::store::NewCheckpoint {
                id: format!("ckpt_{}", Uuid::now_v7().simple()),
                session_id: id.into(),
                turn_id: turn.id.to_string(),
                call_id: "c2".into(),
                tool: "vault_write".into(),
                path: format!("{id}.md"),
                content: Some(b"before".to_vec()),
                created_at: Utc::now(),
            })
            .await
            .unwrap();
        store
            .upsert_memory(
                &harness_store::store::NewMemory {
                    id: format!("mem_{}", Uuid::now_v7().simple()),
                    scope: harness_base::ids::tenant_scope(tenant, &format!("session:{id}")),
                    kind: "fact".into(),
                    key: "city".into(),
                    content: "Lives in Lyon".into(),
                    source_session_id: id.into(),
                    source_turn_id: turn.id.to_string(),
                    embedding: None,
                    embedding_model: None,
                    at: Utc::now(),
                },
                None,
            )
            .await
            .unwrap();
        made.push((tenant, id, session_contents(store.as_ref(), id).await));
    }
    later_schema(&db, backend, false).await;

    store.migrate().await.unwrap();
    assert!(store.readiness().await.migrations_applied);
    for (tenant, id, before) in &made {
        let key = harness_base::ids::SessionKey::new(
            tenant,
            &harness_base::ids::SessionId::parse(id).unwrap(),
        );
        assert_eq!(
            key.as_str() == *id,
            *tenant == "default",
            "only another tenant's sessions move"
        );
        assert_eq!(
            &session_contents(store.as_ref(), key.as_str()).await,
            before,
            "{tenant}'s {id}"
        );
        assert_eq!(
            store.session_tenant(&key).await.unwrap().as_deref(),
            Some(*tenant)
        );
        if key.as_str() != *id {
            let id = &harness_base::ids::SessionKey::from_stored(id);
            assert!(store.get_session(id).await.unwrap().is_none());
            let artifact = format!("art_{}", id.as_str());
            assert!(store.get_artifact(id, &artifact).await.unwrap().is_none());
            assert!(store.list_events(id, None, 0, 10).await.unwrap().is_empty());
        }
        let memories = store
            .list_memories(
                &harness_base::ids::tenant_scope(tenant, &format!("session:{id}")),
                None,
                10,
            )
            .await
            .unwrap();
        assert_eq!(memories.len(), 1);
        assert_eq!(memories[0].source_session_id, key.as_str());
    }
    // A job carries its session in its payload too: the worker that runs
    // it after the move writes under the new key.
    let mut claimed = Vec::new();
    let long_ago = Utc::now() - Duration::hours(1);
    while let Some(job) = store.claim_job(Utc::now(), long_ago).await.unwrap() {
        assert!(claimed.len() < 3, "three jobs were queued");
        let payload: serde_json::Value = serde_json::from_str(&job.payload).unwrap();
        if job.session_id.contains('/') {
            assert_eq!(payload["session_id"], job.session_id.as_str());
        }
        assert_eq!(payload["answer"], "Hi", "the rest of the payload is kept");
        claimed.push(job.session_id);
    }
    claimed.sort();
    assert_eq!(claimed, ["acme/chat-1", "acme/chat-2", "d-1"]);
    // Now acme's ids are its own: the default tenant may begin `chat-1`.
    let turn = new_turn("chat-1", None);
    assert_eq!(store.begin_turn(&turn).await.unwrap().turn_number, 1);
}

/// A turn running when the store is migrated to name each turn's tenant
/// (the begin's count reads that column) still counts toward its
/// tenant's limit: the migration fills the column from the turn's
/// session, for the other tenant's too.
async fn a_turn_running_across_the_tenant_column_migration_still_counts(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.migrate_to(match backend {
        Backend::Sqlite => 31,
        Backend::Postgres => 33,
    })
    .await;
    let at = "2026-11-28T00:00:00Z";
    let mut rows = String::new();
    for (tenant, key) in [("acme", "acme/before"), ("globex", "globex/before")] {
        rows.push_str(&format!(
            "INSERT INTO sessions (id, created_at, updated_at, turn_count, last_seq, tenant) \
             VALUES ('{key}', '{at}', '{at}', 1, 1, '{tenant}'); \
             INSERT INTO turns (id, session_id, status, request, owner_instance, \
             owner_process, heartbeat_at, first_seq, created_at) \
             VALUES ('{}', '{key}', 'running', '{{}}', 'i', 'p', '{at}', 1, '{at}');",
            Uuid::now_v7()
        ));
    }
    match backend {
        Backend::Sqlite => db.execute_sqlite(&rows).await,
        Backend::Postgres => db.execute_postgres(&rows).await,
    }
    let store = db.open().await;
    let mut next = new_turn("after", None);
    next.tenant = "acme".to_owned();
    next.max_running = Some(1);
    assert!(matches!(
        store.begin_turn(&next).await,
        Err(BeginTurnError::TenantBusy)
    ));
    next.max_running = Some(2);
    store.begin_turn(&next).await.unwrap();
}

on_both_backends!(
    message_search_matches_any_term_newest_first,
    artifacts_and_decisions_are_kept_per_session,
    sessions_of_every_tenant_survive_the_move_to_per_tenant_ids,
    a_turn_running_across_the_tenant_column_migration_still_counts,
);

/// SQLite: commits are copied from the WAL into the database file by the
/// store's checkpointer thread, not inside a commit that writes wait on.
#[tokio::test]
async fn sqlite_commits_reach_the_database_file_in_the_background() {
    let db = TestDb::new(Backend::Sqlite).await;
    let store = db.open().await;
    let path = db.sqlite_path();
    let turn = new_turn("s1", None);
    store.begin_turn(&turn).await.unwrap();
    // Let a checkpoint of the migrations and the begin settle first.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let before = std::fs::metadata(&path).unwrap().len();
    let text = "x".repeat(500);
    let events: Vec<_> = (2..1002).map(|seq| delta(&turn, seq, &text)).collect();
    store.write_batch(&events, &[]).await.unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let size = std::fs::metadata(&path).unwrap().len();
        // 1,000 events of 500 characters: the file grows by at least 400 KB.
        if size >= before + 400_000 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the database file stayed at {size} bytes (before: {before})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // And the data reads back whole through the readers.
    let read = store
        .list_events(&key("s1"), Some(turn.id), 1, 2000)
        .await
        .unwrap();
    assert_eq!(read.len(), 1000);
}

/// SQLite: under writes that never pause, the WAL still starts over: it
/// stays near the restart point (about 16 MiB) or, when the checkpointer
/// lags, the writer's backstop (16,000 pages, 64 MiB), and does not grow
/// with everything written.
#[tokio::test]
async fn sqlite_wal_stays_bounded_under_sustained_writes() {
    let db = TestDb::new(Backend::Sqlite).await;
    let store = db.open().await;
    let wal = db.sqlite_path().with_extension("db-wal");
    let turn = new_turn("s1", None);
    store.begin_turn(&turn).await.unwrap();
    let text = "x".repeat(1000);
    let mut seq = 1;
    // 120 MB of events, written back to back.
    for _ in 0..120 {
        let events: Vec<_> = (0..1000)
            .map(|_| {
                seq += 1;
                delta(&turn, seq, &text)
            })
            .collect();
        store.write_batch(&events, &[]).await.unwrap();
    }
    let size = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert!(size < 90_000_000, "the WAL grew to {size} bytes");
    let last = store
        .list_events(&key("s1"), Some(turn.id), seq - 1, 10)
        .await
        .unwrap();
    assert_eq!(last.len(), 1);
}

mod log_model;
mod memory;
mod outbox;
mod vault;

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

fn push_config(task_id: Uuid, id: &str) -> harness_store::store::PushConfig {
    harness_store::store::PushConfig {
        task_id,
        id: id.into(),
        url: "https://hooks.example.com/a2a".into(),
        token: Some("t".into()),
        auth: None,
        created_at: Utc::now(),
    }
}

/// A push delivery is held by one replica at a time: a claim takes what
/// is due and free; a live lease keeps it from others, one that ran out
/// or was given back does not; only the holder records progress, which
/// the next claim starts from.
async fn a_push_delivery_is_held_by_one_replica_at_a_time(backend: Backend) {
    use harness_store::store::PushProgress;
    let (_db, store) = store(backend).await;
    let turn = new_turn("s-push", None);
    store.begin_turn(&turn).await.unwrap();
    assert!(
        store
            .put_push_config(&push_config(turn.id, "c1"), &key("s-push"), 1)
            .await
            .unwrap()
    );
    let now = Utc::now();
    assert!(store.pushes_due(now).await.unwrap());
    let taken = store
        .claim_pushes(
            "a",
            now,
            now + Duration::seconds(30),
            10,
            &Share::unlimited(),
        )
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert!(!store.pushes_due(now).await.unwrap(), "held by a");
    assert_eq!((taken[0].sent_seq, taken[0].config.id.as_str()), (1, "c1"));
    assert!(
        store
            .claim_pushes(
                "b",
                now,
                now + Duration::seconds(30),
                10,
                &Share::unlimited()
            )
            .await
            .unwrap()
            .is_empty(),
        "held by a"
    );
    let progress = PushProgress {
        sent_seq: 3,
        attempts: 0,
        failing_since: None,
        next_at: now,
        done: false,
        last_error: None,
    };
    assert!(
        !store
            .record_push(turn.id, "c1", "b", &progress, true)
            .await
            .unwrap()
    );
    assert!(
        store
            .record_push(turn.id, "c1", "a", &progress, false)
            .await
            .unwrap()
    );
    // Its lease runs out: b takes it, from where a got.
    let later = now + Duration::seconds(31);
    let taken = store
        .claim_pushes(
            "b:1",
            later,
            later + Duration::seconds(30),
            10,
            &Share::unlimited(),
        )
        .await
        .unwrap();
    assert_eq!(taken[0].sent_seq, 3);
    assert!(
        !store
            .record_push(turn.id, "c1", "a", &progress, true)
            .await
            .unwrap(),
        "a lost it"
    );
    // Given back at once by a replica that stops (its claims `b:{n}`).
    store.release_pushes("a").await.unwrap();
    assert!(!store.pushes_due(later).await.unwrap(), "still b's");
    store.release_pushes("b").await.unwrap();
    let taken = store
        .claim_pushes(
            "c",
            later,
            later + Duration::seconds(30),
            10,
            &Share::unlimited(),
        )
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    // Done: never due again; a replacement keeps the cursor; at most ten.
    let done = PushProgress {
        done: true,
        ..progress
    };
    assert!(
        store
            .record_push(turn.id, "c1", "c", &done, true)
            .await
            .unwrap()
    );
    let much_later = later + Duration::days(3);
    assert!(
        store
            .claim_pushes("d", much_later, much_later, 10, &Share::unlimited())
            .await
            .unwrap()
            .is_empty()
    );
    for n in 2..=10 {
        let id = format!("c{n}");
        assert!(
            store
                .put_push_config(&push_config(turn.id, &id), &key("s-push"), 0)
                .await
                .unwrap()
        );
    }
    assert!(
        !store
            .put_push_config(&push_config(turn.id, "c11"), &key("s-push"), 0)
            .await
            .unwrap()
    );
    let mut replaced = push_config(turn.id, "c1");
    replaced.url = "https://hooks.example.com/new".into();
    assert!(
        store
            .put_push_config(&replaced, &key("s-push"), 0)
            .await
            .unwrap()
    );
    let listed = store.push_configs(turn.id).await.unwrap();
    assert_eq!(listed.len(), 10);
    assert_eq!(
        store.push_config(turn.id, "c1").await.unwrap().unwrap().url,
        replaced.url
    );
    assert!(store.delete_push_config(turn.id, "c1").await.unwrap());
    assert!(!store.delete_push_config(turn.id, "c1").await.unwrap());
}

on_both_backends!(a_push_delivery_is_held_by_one_replica_at_a_time);

fn webhook(id: &str, tenant: &str, events: &str) -> harness_store::store::Webhook {
    harness_store::store::Webhook {
        id: id.into(),
        tenant: tenant.into(),
        url: "https://hooks.example.com/x".into(),
        events: events.into(),
        secret: "whsec_c2VjcmV0LW9mLXRoZS1vcGVyYXRvci1mb3ItY2k=".into(),
        created_at: Utc::now(),
    }
}

/// The event log writes webhook deliveries in the event's transaction:
/// one for each endpoint of the event's tenant (and the operator's) that
/// wants its type; a delivery is held by one replica at a time, recorded
/// only by its holder, and given back by a replica that stops.
async fn a_logged_event_has_its_webhook_deliveries(backend: Backend) {
    use harness_store::store::DeliveryOutcome;
    let (_db, store) = store(backend).await;
    for hook in [
        webhook("wh_acme", "acme", r#"["turn.completed"]"#),
        webhook("wh_acme_waits", "acme", r#"["turn.waiting"]"#),
        webhook("wh_globex", "globex", r#"["turn.completed"]"#),
    ] {
        assert!(store.create_webhook(&hook, 2).await.unwrap());
    }
    assert!(
        !store
            .create_webhook(&webhook("wh_acme_3", "acme", "[]"), 2)
            .await
            .unwrap(),
        "acme has two, as many as it may"
    );
    let operator = webhook(
        harness_store::store::OPERATOR_WEBHOOK_ID,
        "*",
        r#"["turn.completed"]"#,
    );
    store.put_operator_webhook(Some(&operator)).await.unwrap();

    let mut turn = new_turn("acme/s-hook", None);
    turn.tenant = "acme".into();
    store.begin_turn(&turn).await.unwrap();
    store
        .write_batch(&[delta(&turn, 2, "a")], &[&completed(&turn, 3, "done")])
        .await
        .unwrap();
    let listed = |id: &'static str| {
        let store = store.clone();
        async move { store.webhook_deliveries(id, None, 10).await.unwrap() }
    };
    let acme = listed("wh_acme").await;
    assert_eq!(acme.len(), 1, "the end, not the delta: {acme:?}");
    assert_eq!((acme[0].seq, acme[0].kind.as_str()), (3, "turn"));
    assert_eq!(acme[0].tenant, "acme");
    assert_eq!(acme[0].id, format!("msg_{}_3", turn.id.simple()));
    assert!(listed("wh_acme_waits").await.is_empty(), "not a wait");
    assert!(listed("wh_globex").await.is_empty(), "another tenant's");
    assert_eq!(
        listed(harness_store::store::OPERATOR_WEBHOOK_ID)
            .await
            .len(),
        1
    );
    assert!(
        store.webhooks("globex").await.unwrap()[0].id == "wh_globex"
            && store.webhook("globex", "wh_acme").await.unwrap().is_none()
    );

    let now = Utc::now();
    assert!(store.webhook_deliveries_due(now).await.unwrap());
    let taken = store
        .claim_webhook_deliveries(
            "a:1",
            now,
            now + Duration::seconds(30),
            10,
            &Share::unlimited(),
        )
        .await
        .unwrap();
    assert_eq!(taken.len(), 2, "acme's and the operator's");
    assert!(!store.webhook_deliveries_due(now).await.unwrap(), "held");
    assert!(
        store
            .claim_webhook_deliveries(
                "b:1",
                now,
                now + Duration::seconds(30),
                10,
                &Share::unlimited()
            )
            .await
            .unwrap()
            .is_empty()
    );
    let held = taken
        .iter()
        .find(|h| h.delivery.webhook_id == "wh_acme")
        .unwrap();
    assert_eq!(held.url, "https://hooks.example.com/x");
    let delivered = DeliveryOutcome {
        status: "delivered",
        attempts: 1,
        next_at: now,
        last_status: Some(204),
        last_error: None,
        delivered_at: Some(now),
    };
    let d = &held.delivery;
    assert!(
        !store
            .record_webhook_delivery(&d.webhook_id, &d.id, "b:1", &delivered)
            .await
            .unwrap(),
        "not b's"
    );
    assert!(
        store
            .record_webhook_delivery(&d.webhook_id, &d.id, "a:1", &delivered)
            .await
            .unwrap()
    );
    assert_eq!(listed("wh_acme").await[0].status, "delivered");
    // The operator's is given back by a replica that stops (`a`, its
    // claims `a:{n}`), and another takes it.
    store.release_webhook_deliveries("a").await.unwrap();
    let again = store
        .claim_webhook_deliveries(
            "b:2",
            now,
            now + Duration::seconds(30),
            10,
            &Share::unlimited(),
        )
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(
        again[0].delivery.webhook_id,
        harness_store::store::OPERATOR_WEBHOOK_ID
    );
    // A deleted endpoint's deliveries go with it; another tenant cannot
    // delete it.
    assert!(!store.delete_webhook("globex", "wh_acme").await.unwrap());
    assert!(store.delete_webhook("acme", "wh_acme").await.unwrap());
    assert!(listed("wh_acme").await.is_empty());
}

/// Issue 63: a claim takes each tenant's due deliveries within its share
/// (less what it has in flight), round robin, so one tenant's backlog is
/// never claimed ahead of another's due work, and nothing is claimed that
/// would not be sent; the operator's endpoint has a share of its own.
/// (Before, the oldest were claimed across tenants: acme's backlog filled
/// every claim, and globex's delivery waited behind it.)
async fn a_claim_takes_each_tenants_share_round_robin(backend: Backend) {
    let (_db, store) = store(backend).await;
    for hook in [
        webhook("wh_acme", "acme", r#"["turn.completed"]"#),
        webhook("wh_globex", "globex", r#"["turn.completed"]"#),
    ] {
        assert!(store.create_webhook(&hook, 2).await.unwrap());
    }
    let operator = webhook(
        harness_store::store::OPERATOR_WEBHOOK_ID,
        "*",
        r#"["turn.completed"]"#,
    );
    store.put_operator_webhook(Some(&operator)).await.unwrap();
    // Acme's backlog first (older), then one turn of globex.
    for (tenant, n) in [
        ("acme", 0),
        ("acme", 1),
        ("acme", 2),
        ("acme", 3),
        ("globex", 0),
    ] {
        let mut turn = new_turn(&format!("{tenant}/s-share-{n}"), None);
        turn.tenant = tenant.into();
        store.begin_turn(&turn).await.unwrap();
        store
            .write_batch(&[], &[&completed(&turn, 2, "done")])
            .await
            .unwrap();
    }
    let now = Utc::now() + Duration::seconds(1);
    let share = Share {
        per_tenant: 2,
        busy: [("acme".to_owned(), 1)].into_iter().collect(),
    };
    let taken = store
        .claim_webhook_deliveries("a:1", now, now + Duration::seconds(30), 10, &share)
        .await
        .unwrap();
    let count = |key: &str| {
        taken
            .iter()
            .filter(|h| harness_store::store::webhooks::share_key(&h.delivery) == key)
            .count()
    };
    assert_eq!(
        (count("acme"), count("globex"), count("*")),
        (1, 1, 2),
        "{taken:?}"
    );
    // A limit below what is due takes the tenants in turn: each one's
    // oldest before anyone's second.
    let later = now + Duration::seconds(60);
    let taken = store
        .claim_webhook_deliveries(
            "b:1",
            later,
            later + Duration::seconds(30),
            2,
            &Share {
                per_tenant: 4,
                busy: Default::default(),
            },
        )
        .await
        .unwrap();
    let keys: std::collections::BTreeSet<&str> = taken
        .iter()
        .map(|h| harness_store::store::webhooks::share_key(&h.delivery))
        .collect();
    assert_eq!(keys.len(), 2, "two shares, one each: {taken:?}");
}

on_both_backends!(
    a_logged_event_has_its_webhook_deliveries,
    a_claim_takes_each_tenants_share_round_robin,
);
