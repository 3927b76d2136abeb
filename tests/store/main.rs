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
        OrphanScope, Queue, Store, StoreError, TurnFinish, TurnLogCursor, TurnStatus,
        event_log::cursor, step_records_as,
    },
};
use support::{Backend, TestDb};
use uuid::Uuid;

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
                attachments: None,
            },
            NewMessage {
                id: Uuid::now_v7(),
                role: "assistant".into(),
                content: text.into(),
                attachments: None,
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

fn step(turn: &NewTurn, step: u32, phase: &'static str) -> NewStep {
    NewStep {
        turn_id: turn.id,
        step,
        phase,
        record: format!("{{\"step\":{step},\"phase\":\"{phase}\"}}"),
        created_at: Utc::now(),
    }
}

async fn store(backend: Backend) -> (TestDb, Arc<dyn Store>) {
    let db = TestDb::new(backend).await;
    let store = db.open().await;
    (db, store)
}

mod event_log;
mod files;
mod log_model;
mod memory;
mod migrations;
mod outbox;
mod records;
mod steers;
mod takeover;
mod tree;
mod turns;
mod vault;
