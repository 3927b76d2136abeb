//! Turns that outlive their process on both backends: heartbeats,
//! orphans taken over, parked turns, retention, readiness.

use super::*;

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

crate::on_both_backends!(
    heartbeats_and_begins_never_deadlock_with_turn_ends,
    heartbeat_reports_requested_cancellations,
    orphans_are_interrupted_once_with_a_final_event,
    an_orphan_is_taken_over_and_its_lost_owner_writes_nothing,
    a_parked_turn_is_taken_only_when_due_and_not_as_a_takeover,
    retention_finds_the_inactive_sessions_of_each_tenant_and_one_sweeper,
    readiness_reports_pending_migrations,
);
