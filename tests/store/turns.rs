//! Sessions and turns on both backends: a turn's begin, one running turn
//! a session, idempotency keys, tenants, a turn read back, lists.

use super::*;

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
        follows: Some(Uuid::nil()),
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

crate::on_both_backends!(
    begin_creates_the_session_and_numbers_after_existing_events,
    one_running_turn_per_session,
    concurrent_begins_let_exactly_one_turn_run,
    an_idempotency_key_names_its_turn,
    a_session_stays_with_the_tenant_that_made_it,
    a_finish_commits_messages_decision_and_terminal_event_together,
    a_turn_reads_back_its_request_and_result_as_they_were_given,
    a_turn_is_found_by_its_id_alone_until_it_is_hidden,
    a_tenant_lists_its_own_sessions_newest_first,
);
