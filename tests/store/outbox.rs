//! The outbox's rows on both backends: which webhook deliveries an event
//! makes (decided by the service in the event's transaction, not by a
//! trigger), the tenant each is counted for, and that both backends'
//! migrated schemas agree.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{Duration, Utc};
use harness_base::events::{StoredEvent, TurnEvent};
use harness_store::store::{OPERATOR_WEBHOOK_ID, Share};
use std::sync::Arc;

use super::*;

/// What an event says to webhooks is the service's decision, written in
/// the event's own transaction: an approval's request is `turn.waiting`,
/// a background turn's end is its response's end too (whatever the turn
/// was asked: the runner says so on the finish), each row counted for
/// its tenant (`*` for the operator's endpoint). No trigger on `events`
/// parses a session key or names `turn.waiting` any more (before, one
/// did, and read `background` from the stored request).
async fn the_service_decides_which_deliveries_an_event_makes(backend: Backend) {
    let (db, store) = store(backend).await;
    let wanted = r#"["turn.waiting","response.completed"]"#;
    assert!(
        store
            .create_webhook(&webhook("wh_acme", "acme", wanted), 2)
            .await
            .unwrap()
    );
    let operator = webhook(
        OPERATOR_WEBHOOK_ID,
        "*",
        r#"["turn.completed","turn.waiting"]"#,
    );
    store.put_operator_webhook(Some(&operator)).await.unwrap();
    let mut turn = new_turn("acme/s-routes", None);
    turn.tenant = "acme".into();
    store.begin_turn(&turn).await.unwrap();
    let wait = Arc::new(
        StoredEvent::new(
            &turn.session_id,
            turn.id,
            2,
            &TurnEvent::ApprovalRequested {
                step: 1,
                call_id: "call_1".into(),
                tool: "write_note".into(),
                arguments: serde_json::json!({"path": "a.md"}),
                expires_at: None,
            },
            Utc::now(),
        )
        .unwrap(),
    );
    store.write_batch(&[wait], &[]).await.unwrap();
    let listed = |id: &'static str| {
        let store = store.clone();
        async move {
            let mut rows: Vec<(i64, String)> = store
                .webhook_deliveries(id, None, 10)
                .await
                .unwrap()
                .into_iter()
                .map(|d| (d.seq, d.kind))
                .collect();
            rows.sort();
            rows
        }
    };
    // An end whose attempt lost the turn ends nothing, and says nothing.
    let mut stale = completed(&turn, 3, "done");
    stale.attempt += 1;
    stale.background = true;
    assert_eq!(store.write_batch(&[], &[&stale]).await.unwrap(), [false]);
    assert_eq!(listed("wh_acme").await, [(2, "turn".to_owned())]);
    let mut end = completed(&turn, 3, "done");
    end.background = true;
    store.write_batch(&[], &[&end]).await.unwrap();

    assert_eq!(
        listed("wh_acme").await,
        [(2, "turn".to_owned()), (3, "response".to_owned())],
        "the wait, and the response's end"
    );
    assert_eq!(
        listed(OPERATOR_WEBHOOK_ID).await,
        [(2, "turn".to_owned()), (3, "turn".to_owned())],
        "the operator wants the turn's own events, not responses"
    );
    // The operator's rows are counted for `*`: with its share in use,
    // only acme's are taken.
    let now = Utc::now() + Duration::seconds(1);
    let share = Share {
        per_tenant: 4,
        busy: [("*".to_owned(), 4)].into_iter().collect(),
    };
    let taken = store
        .claim_webhook_deliveries("a:1", now, now + Duration::seconds(30), 10, &share)
        .await
        .unwrap();
    let hooks: BTreeSet<&str> = taken
        .iter()
        .map(|h| h.delivery.webhook_id.as_str())
        .collect();
    assert_eq!(hooks, BTreeSet::from(["wh_acme"]), "{taken:?}");
    let triggers: Vec<String> = db
        .schema()
        .await
        .into_keys()
        .filter(|name| name.starts_with("trigger:events."))
        .collect();
    assert!(triggers.is_empty(), "{triggers:?}");
}

crate::on_both_backends!(the_service_decides_which_deliveries_an_event_makes);

/// What the two backends' migrations make differs only where this list
/// says why: the same tables, with the same columns.
#[tokio::test]
async fn both_backends_migrated_schemas_agree() {
    if !super::support::postgres_or_skip().await {
        return;
    }
    let schema = async |backend| {
        let db = TestDb::new(backend).await;
        let _store = db.open().await;
        db.schema().await
    };
    let sqlite = schema(Backend::Sqlite).await;
    let postgres = schema(Backend::Postgres).await;
    // Where they differ, and why.
    let fts =
        "full-text search: an FTS5 table kept by triggers on SQLite, a tsvector column on Postgres";
    let journal = "the event journal is SQLite's (docs/event-log.md): Postgres appends to a heap";
    let expected: BTreeMap<&str, &str> = BTreeMap::from([
        ("sqlite:event_journal", journal),
        ("sqlite:event_journal_packs", journal),
        ("postgres:memories.tsv", fts),
        ("postgres:vault_chunks.tsv", fts),
        ("sqlite:memories_fts", fts),
        ("sqlite:memories_fts_config", fts),
        ("sqlite:memories_fts_data", fts),
        ("sqlite:memories_fts_docsize", fts),
        ("sqlite:memories_fts_idx", fts),
        ("sqlite:trigger:memories.memories_delete", fts),
        ("sqlite:trigger:memories.memories_insert", fts),
        ("sqlite:trigger:memories.memories_update", fts),
        ("sqlite:trigger:vault_chunks.vault_chunks_delete", fts),
        ("sqlite:trigger:vault_chunks.vault_chunks_insert", fts),
        ("sqlite:vault_fts", fts),
        ("sqlite:vault_fts_config", fts),
        ("sqlite:vault_fts_data", fts),
        ("sqlite:vault_fts_docsize", fts),
        ("sqlite:vault_fts_idx", fts),
    ]);
    let mut found: BTreeMap<String, String> = BTreeMap::new();
    for (side, own, other) in [
        ("sqlite", &sqlite, &postgres),
        ("postgres", &postgres, &sqlite),
    ] {
        for (table, columns) in own {
            match other.get(table) {
                None => {
                    found.insert(format!("{side}:{table}"), String::new());
                }
                Some(theirs) => {
                    for column in columns.difference(theirs) {
                        found.insert(format!("{side}:{table}.{column}"), String::new());
                    }
                }
            }
        }
    }
    let found: BTreeSet<&str> = found.keys().map(String::as_str).collect();
    let expected_keys: BTreeSet<&str> = expected.keys().copied().collect();
    assert_eq!(found, expected_keys);
}

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

crate::on_both_backends!(
    a_push_delivery_is_held_by_one_replica_at_a_time,
    a_logged_event_has_its_webhook_deliveries,
    a_claim_takes_each_tenants_share_round_robin,
);
