//! A session's turns as a tree, on both backends: a turn continues the
//! newest turn or the one it names (or none: a new root), its history is
//! its own branch, a session that branched says so, and siblings and a
//! branch's messages read back.

use super::*;
use harness_store::store::{BeganTurn, TurnReads};

/// Begins a turn of `session` asking `text` that continues `follows`
/// (the nil id: a new root), with its history read by the begin where the
/// backend can, and completes it with the answer `re: {text}`.
async fn ask(
    store: &dyn Store,
    session: &str,
    text: &str,
    follows: Option<Uuid>,
) -> (NewTurn, BeganTurn) {
    let mut turn = new_turn(session, None);
    turn.request = TurnRequest {
        follows,
        run_id: Some(format!("run-{text}")),
        ..TurnRequest::new(text)
    };
    turn.reads = TurnReads {
        history: Some(50),
        memory: None,
    };
    let began = store.begin_turn(&turn).await.unwrap();
    let mut finish = completed(&turn, began.first_seq + 1, &format!("re: {text}"));
    finish.messages[0].content = text.into();
    store.write_batch(&[], &[&finish]).await.unwrap();
    (turn, began)
}

/// The texts of `turn`'s history as the store reads it, and as the begin
/// read it (when the backend reads it there).
async fn history(store: &dyn Store, turn: &NewTurn, began: &BeganTurn) -> Vec<String> {
    let read: Vec<String> = store
        .history(&turn.session_id, turn.id, began.branched, 50)
        .await
        .unwrap()
        .into_iter()
        // The turn's own messages are written by its finish, after the
        // begin read its history.
        .filter(|m| m.turn_id != turn.id)
        .map(|m| m.content)
        .collect();
    if let Some(at_begin) = &began.context.history {
        let at_begin: Vec<String> = at_begin.iter().map(|m| m.content.clone()).collect();
        assert_eq!(at_begin, read, "the begin read the same branch");
    }
    read
}

async fn a_turn_reads_its_own_branch_and_never_a_siblings(backend: Backend) {
    let (_db, store) = store(backend).await;
    let store = store.as_ref();
    let (one, _) = ask(store, "s1", "one", None).await;
    let (two, _) = ask(store, "s1", "two", None).await;
    let (three, began_three) = ask(store, "s1", "three", None).await;
    // One straight branch: each turn continues the one before.
    assert!(!began_three.branched);
    let record = |id| async move {
        store
            .get_turn(&key("s1"), id)
            .await
            .unwrap()
            .unwrap()
            .parent_turn_id
    };
    assert_eq!(record(one.id).await, None);
    assert_eq!(record(two.id).await, Some(one.id));
    assert_eq!(record(three.id).await, Some(two.id));
    assert_eq!(
        history(store, &three, &began_three).await,
        ["one", "re: one", "two", "re: two"]
    );
    assert!(
        !store
            .get_session(&key("s1"))
            .await
            .unwrap()
            .unwrap()
            .branched
    );

    // A new answer to "two": a sibling of `two`, on `one`'s branch.
    let (again, began_again) = ask(store, "s1", "two", Some(one.id)).await;
    assert!(began_again.branched);
    assert_eq!(record(again.id).await, Some(one.id));
    assert_eq!(
        history(store, &again, &began_again).await,
        ["one", "re: one"]
    );
    assert!(
        store
            .get_session(&key("s1"))
            .await
            .unwrap()
            .unwrap()
            .branched
    );
    // The next turn continues the newest: `again`, not `three`.
    let (four, began_four) = ask(store, "s1", "four", None).await;
    assert_eq!(record(four.id).await, Some(again.id));
    assert_eq!(
        history(store, &four, &began_four).await,
        ["one", "re: one", "two", "re: two"],
        "the branch of the new answer, never `three`"
    );
    // An edit of the first message: a new root, with no history.
    let (root, began_root) = ask(store, "s1", "uno", Some(Uuid::nil())).await;
    assert_eq!(record(root.id).await, None);
    assert!(history(store, &root, &began_root).await.is_empty());

    // Siblings: the turns that continue the same turn, oldest first.
    let two_record = store.get_turn(&key("s1"), two.id).await.unwrap().unwrap();
    let siblings: Vec<Uuid> = store
        .sibling_turns(&two_record, 10)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(siblings, [two.id, again.id]);
    let root_record = store.get_turn(&key("s1"), root.id).await.unwrap().unwrap();
    let roots: Vec<Uuid> = store
        .sibling_turns(&root_record, 10)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(roots, [one.id, root.id]);
    // A branch's messages in order, a page at a time.
    let branch: Vec<String> = store
        .list_branch_messages(three.id, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.content)
        .collect();
    assert_eq!(
        branch,
        ["one", "re: one", "two", "re: two", "three", "re: three"]
    );
    let page = store.list_branch_messages(four.id, 0, 3).await.unwrap();
    let rest = store
        .list_branch_messages(four.id, page[2].id, 100)
        .await
        .unwrap();
    let texts: Vec<&str> = page
        .iter()
        .chain(&rest)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(
        texts,
        ["one", "re: one", "two", "re: two", "four", "re: four"]
    );
    assert_eq!(store.newest_turn(&key("s1")).await.unwrap(), Some(root.id));
    // A run's turn by the client's name for it.
    assert_eq!(
        store.turn_of_run(&key("s1"), "run-two").await.unwrap(),
        Some(again.id),
        "the newest turn of that name"
    );
    assert_eq!(
        store.turn_of_run(&key("s2"), "run-two").await.unwrap(),
        None
    );
}

async fn a_turn_continues_only_a_turn_of_its_own_session(backend: Backend) {
    let (_db, store) = store(backend).await;
    let store = store.as_ref();
    let (elsewhere, _) = ask(store, "other", "one", None).await;
    ask(store, "s1", "one", None).await;
    let before = store.get_session(&key("s1")).await.unwrap().unwrap();
    for parent in [elsewhere.id, Uuid::now_v7()] {
        let mut turn = new_turn("s1", None);
        turn.request.follows = Some(parent);
        match store.begin_turn(&turn).await {
            Err(BeginTurnError::ParentNotFound) => {}
            other => panic!("expected ParentNotFound, got {other:?}"),
        }
        assert!(store.get_turn(&key("s1"), turn.id).await.unwrap().is_none());
    }
    // Nothing was written: no turn, no event, the session as it was.
    let after = store.get_session(&key("s1")).await.unwrap().unwrap();
    assert_eq!(
        (after.turn_count, after.last_seq, after.branched),
        (before.turn_count, before.last_seq, false)
    );
    // Nor does a new session begin with a parent it cannot have.
    let mut turn = new_turn("fresh", None);
    turn.request.follows = Some(elsewhere.id);
    assert!(matches!(
        store.begin_turn(&turn).await,
        Err(BeginTurnError::ParentNotFound)
    ));
    assert!(store.get_session(&key("fresh")).await.unwrap().is_none());
}

/// A fork is one row that reads through its source: its first turn's
/// history is the source's branch up to the turn it was forked at, the
/// source never sees the fork's turns, and the source is neither erased
/// nor swept by retention while the fork holds it.
async fn a_fork_reads_through_its_source_which_it_holds(backend: Backend) {
    use harness_store::store::{Erased, Forked};
    let (_db, store) = store(backend).await;
    let store = store.as_ref();
    let (one, _) = ask(store, "src", "one", None).await;
    let (two, _) = ask(store, "src", "two", None).await;
    ask(store, "src", "three", None).await;
    let now = Utc::now();
    assert_eq!(
        store
            .fork_session(&key("src"), two.id, &key("fork"), now)
            .await
            .unwrap(),
        Forked::Made
    );
    let fork = store.get_session(&key("fork")).await.unwrap().unwrap();
    assert_eq!(
        (
            fork.turn_count,
            fork.branched,
            fork.forked_from.as_deref(),
            fork.forked_at
        ),
        (0, true, Some("src"), Some(two.id))
    );
    assert_eq!(store.newest_turn(&key("fork")).await.unwrap(), Some(two.id));
    // Its first turn continues the fork's turn, on either backend's read.
    let (four, began) = ask(store, "fork", "four", None).await;
    assert_eq!(began.turn_number, 1);
    assert_eq!(
        history(store, &four, &began).await,
        ["one", "re: one", "two", "re: two"]
    );
    // The source goes on without it.
    let (five, began) = ask(store, "src", "five", None).await;
    let seen = history(store, &five, &began).await;
    assert!(!seen.contains(&"four".to_owned()), "{seen:?}");
    assert_eq!(seen.len(), 6, "{seen:?}");
    // The fork may go on from the turn it was forked at, not from another
    // of the source's.
    let mut again = new_turn("fork", None);
    again.request.follows = Some(one.id);
    assert!(matches!(
        store.begin_turn(&again).await,
        Err(BeginTurnError::ParentNotFound)
    ));
    let (sibling, began) = ask(store, "fork", "four b", Some(two.id)).await;
    assert_eq!(
        history(store, &sibling, &began).await,
        ["one", "re: one", "two", "re: two"]
    );

    // What a fork cannot be made of: nothing is written.
    for (source, at, made, found) in [
        ("src", two.id, "fork", Forked::Exists),
        ("src", four.id, "f2", Forked::TurnNotFound),
        ("nowhere", two.id, "f3", Forked::SourceNotFound),
    ] {
        let answer = store.fork_session(&key(source), at, &key(made), now).await;
        assert_eq!(answer.unwrap(), found, "{source} at {at}");
    }
    let running = new_turn("src", None);
    let began = store.begin_turn(&running).await.unwrap();
    assert_eq!(
        store
            .fork_session(&key("src"), running.id, &key("f4"), now)
            .await
            .unwrap(),
        Forked::TurnRunning
    );
    for made in ["f2", "f3", "f4"] {
        assert!(store.get_session(&key(made)).await.unwrap().is_none());
    }
    store
        .write_batch(&[], &[&completed(&running, began.first_seq + 1, "done")])
        .await
        .unwrap();

    // The source is held: not erased, not swept.
    let later = Utc::now() + Duration::days(1);
    let inactive = store.inactive_sessions(None, later, 100).await.unwrap();
    assert!(inactive.contains(&"fork".to_owned()), "{inactive:?}");
    assert!(!inactive.contains(&"src".to_owned()), "{inactive:?}");
    assert_eq!(
        store.erase_session(&key("src")).await.unwrap(),
        Erased::Forked(vec!["fork".to_owned()])
    );
    assert!(store.get_turn(&key("src"), two.id).await.unwrap().is_some());
    assert_eq!(
        store.erase_session(&key("fork")).await.unwrap(),
        Erased::Erased
    );
    assert_eq!(
        store.erase_session(&key("src")).await.unwrap(),
        Erased::Erased
    );
}

crate::on_both_backends!(
    a_turn_reads_its_own_branch_and_never_a_siblings,
    a_turn_continues_only_a_turn_of_its_own_session,
    a_fork_reads_through_its_source_which_it_holds,
);
