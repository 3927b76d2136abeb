//! The outbox's rows on both backends: which webhook deliveries an event
//! makes (decided by the service in the event's transaction, not by a
//! trigger), the tenant each is counted for, and that both backends'
//! migrated schemas agree.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{Duration, Utc};
use harness_base::events::{StoredEvent, TurnEvent};
use harness_store::store::{OPERATOR_WEBHOOK_ID, Share};
use std::sync::Arc;

use super::{Backend, Claims, TestDb, completed, new_turn, store, webhook};

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
    let mut end = completed(&turn, 3, "done");
    end.background = true;
    store.write_batch(&[], &[&end]).await.unwrap();

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
