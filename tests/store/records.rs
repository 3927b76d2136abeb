//! A turn's records on both backends: step records, the audit trail,
//! message search, artifacts and decisions.

use super::*;

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

crate::on_both_backends!(
    step_records_live_as_long_as_their_turn,
    step_records_come_back_typed,
    the_audit_trail_counts_failures_per_minute_and_trims_only_old_rows,
    message_search_matches_any_term_newest_first,
    artifacts_and_decisions_are_kept_per_session,
);

/// The records the API answers carry the id a tenant knows its session
/// by, whatever key the store holds them under.
#[test]
fn records_are_served_with_the_clients_ids() {
    let at = Utc::now();
    let served = |record: serde_json::Value, field: &str| record[field].clone();
    let checkpoint = harness_store::store::CheckpointRecord {
        id: "c1".into(),
        session_id: "acme/s-1".into(),
        turn_id: "t".into(),
        call_id: "k".into(),
        tool: "write_note".into(),
        path: "a.md".into(),
        existed: true,
        bytes: None,
        created_at: at,
        restored_at: None,
    };
    let artifact = harness_store::store::ArtifactRecord {
        id: "a1".into(),
        session_id: "acme/s-1".into(),
        turn_id: "t".into(),
        call_id: "k".into(),
        tool: "web_fetch".into(),
        content: "x".into(),
        created_at: at,
    };
    let observation = harness_store::store::ObservationRecord {
        id: "o1".into(),
        session_id: "acme/s-1".into(),
        source_id: "chat_message:1".into(),
        user_text: "q".into(),
        assistant_text: "a".into(),
        created_at: at,
    };
    for record in [
        serde_json::to_value(&checkpoint).unwrap(),
        serde_json::to_value(&artifact).unwrap(),
        serde_json::to_value(&observation).unwrap(),
    ] {
        assert_eq!(served(record, "session_id"), "s-1");
    }
    // The default tenant's keys are the ids themselves.
    let default = harness_store::store::ObservationRecord {
        session_id: "s-2".into(),
        ..observation
    };
    assert_eq!(
        served(serde_json::to_value(&default).unwrap(), "session_id"),
        "s-2"
    );
}
