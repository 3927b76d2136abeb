//! Steers, the store's half, on both backends: kept only for a running
//! turn of the session, bounded; applied once for a step, claimed again
//! by a turn that goes on from an earlier step's record; what was never
//! applied claimed once to become the next turn; erased with the session.

use super::*;
use harness_store::store::{NewSteer, SteerAdded};

fn steer(session: &str, turn: Uuid, message: &str) -> NewSteer {
    NewSteer {
        id: Uuid::now_v7(),
        session_id: key(session),
        turn_id: turn,
        message: message.into(),
        at: Utc::now(),
    }
}

async fn a_steer_is_applied_once_and_the_rest_become_the_next_turn(backend: Backend) {
    let (_db, store) = store(backend).await;
    let store = store.as_ref();
    let turn = new_turn("s1", None);
    let began = store.begin_turn(&turn).await.unwrap();
    // Only the session's own running turn takes a steer.
    assert_eq!(
        store
            .add_steer(&steer("other", turn.id, "x"))
            .await
            .unwrap(),
        SteerAdded::TurnNotFound
    );
    assert!(!store.steers_pending(turn.id, 2).await.unwrap());
    let (one, two) = (steer("s1", turn.id, "one"), steer("s1", turn.id, "two"));
    for s in [&one, &two] {
        assert_eq!(store.add_steer(s).await.unwrap(), SteerAdded::Added);
    }
    assert!(store.steers_pending(turn.id, 2).await.unwrap());

    // Step 2 takes them, oldest first; step 3 finds none.
    let applied = store.apply_steers(turn.id, 2, 1).await.unwrap();
    assert_eq!(
        applied
            .iter()
            .map(|s| s.message.as_str())
            .collect::<Vec<_>>(),
        ["one"]
    );
    let applied = store.apply_steers(turn.id, 2, 10).await.unwrap();
    let texts: Vec<&str> = applied.iter().map(|s| s.message.as_str()).collect();
    // A claim for step 2 again (a take-over from step 1's record) takes
    // both again: neither reached a record.
    assert_eq!(texts, ["one", "two"]);
    assert!(store.apply_steers(turn.id, 3, 10).await.unwrap().is_empty());
    assert!(!store.steers_pending(turn.id, 3).await.unwrap());

    // One that came after: never applied, so it becomes the next turn,
    // claimed once. A claim given back (its turn could not start) is
    // claimed again. A running turn's are no sweep's.
    let late = steer("s1", turn.id, "three");
    assert_eq!(store.add_steer(&late).await.unwrap(), SteerAdded::Added);
    let (first, second) = (Uuid::now_v7(), Uuid::now_v7());
    let three = [harness_store::store::Steer {
        id: late.id,
        message: "three".into(),
    }];
    assert_eq!(store.defer_steers(turn.id, first, 10).await.unwrap(), three);
    assert!(
        store
            .defer_steers(turn.id, second, 10)
            .await
            .unwrap()
            .is_empty()
    );
    store.release_steers(first).await.unwrap();
    assert!(store.steers_left(10).await.unwrap().is_empty());

    // Its turn ended with it waiting: a sweep finds the turn, once it
    // is claimed no more.
    store
        .write_batch(&[], &[&completed(&turn, began.first_seq + 1, "done")])
        .await
        .unwrap();
    assert_eq!(store.steers_left(10).await.unwrap(), [(key("s1"), turn.id)]);
    assert_eq!(
        store.defer_steers(turn.id, second, 10).await.unwrap(),
        three
    );
    assert!(
        store
            .defer_steers(turn.id, first, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.steers_left(10).await.unwrap().is_empty());
    assert!(store.apply_steers(turn.id, 4, 10).await.unwrap().is_empty());

    // An ended turn takes none.
    assert_eq!(
        store
            .add_steer(&steer("s1", turn.id, "too late"))
            .await
            .unwrap(),
        SteerAdded::NotRunning
    );
    // Erased with the session.
    store.erase_session(&key("s1")).await.unwrap();
    assert!(!store.steers_pending(turn.id, 0).await.unwrap());
    assert!(
        store
            .defer_steers(turn.id, second, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

crate::on_both_backends!(a_steer_is_applied_once_and_the_rest_become_the_next_turn);
