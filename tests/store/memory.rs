//! Memories, background jobs, judgements and observations on both backends.

use chrono::{Duration, SubsecRound, Utc};
use harness_base::events::TurnEvent;
use harness_store::store::{JobOutcome, JobUsage, JudgementRecord, MemoryQuery, NewJob, NewMemory};
use uuid::Uuid;

use super::{Backend, completed, key, new_turn, store};

fn memory(scope: &str, key: &str, content: &str) -> NewMemory {
    NewMemory {
        id: format!("mem_{}", Uuid::now_v7().simple()),
        scope: scope.into(),
        kind: if key.starts_with("prefers") {
            "preference"
        } else {
            "fact"
        }
        .into(),
        key: key.into(),
        content: content.into(),
        source_session_id: "s1".into(),
        source_turn_id: "t1".into(),
        embedding: None,
        embedding_model: None,
        at: Utc::now(),
    }
}

async fn memories_are_one_per_key_searchable_and_forgotten_per_scope(backend: Backend) {
    let (_db, store) = store(backend).await;
    store
        .upsert_memory(&memory("user:ann", "home_city", "Ann lives in Lyon."), None)
        .await
        .unwrap();
    store
        .upsert_memory(
            &memory("user:ann", "prefers_format", "Ann prefers bullet points."),
            None,
        )
        .await
        .unwrap();
    store
        .upsert_memory(&memory("user:bob", "home_city", "Bob lives in Oslo."), None)
        .await
        .unwrap();
    // The same key updates the memory in place.
    store
        .upsert_memory(
            &memory("user:ann", "home_city", "Ann moved to Nantes."),
            None,
        )
        .await
        .unwrap();
    let all = store.list_memories("user:ann", None, 10).await.unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].content, "Ann moved to Nantes.", "newest first");
    let preferences = store
        .list_memories("user:ann", Some("preference"), 10)
        .await
        .unwrap();
    assert_eq!(preferences.len(), 1);
    assert_eq!(preferences[0].kind, "preference");
    let terms = |w: &[&str]| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let found = store
        .search_memories("user:ann", &terms(&["nantes", "city"]), 5)
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].key, "home_city");
    assert!(
        store
            .search_memories("user:ann", &terms(&["lyon"]), 5)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .search_memories("user:ann", &terms(&["oslo"]), 5)
            .await
            .unwrap()
            .is_empty(),
        "other scopes stay out"
    );
    // Forget one, then all.
    let one = all[1].id.clone();
    assert_eq!(
        store.delete_memories("user:ann", Some(&one)).await.unwrap(),
        1
    );
    assert_eq!(
        store
            .delete_memories("user:bob", Some(&all[0].id))
            .await
            .unwrap(),
        0,
        "not its scope"
    );
    assert_eq!(store.delete_memories("user:ann", None).await.unwrap(), 1);
    assert!(
        store
            .list_memories("user:ann", None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .search_memories("user:ann", &terms(&["nantes"]), 5)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .list_memories("user:bob", None, 10)
            .await
            .unwrap()
            .len(),
        1
    );
}

/// The one read a turn makes answers what the search and the list of
/// preferences answer: same memories, same order, same limits.
async fn a_turns_memory_read_is_the_search_and_the_preferences(backend: Backend) {
    let (_db, store) = store(backend).await;
    for (key, content) in [
        ("home_city", "Ann lives in Nantes, a city on the Loire."),
        ("work_city", "Ann works in Rennes, a city in Brittany."),
        ("pet", "Ann has a cat called Loire."),
        ("prefers_format", "Ann prefers bullet points."),
        ("prefers_tone", "Ann prefers a formal tone."),
        ("prefers_units", "Ann prefers metric units."),
    ] {
        store
            .upsert_memory(&memory("user:ann", key, content), None)
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    store
        .upsert_memory(
            &memory("user:bob", "prefers_tone", "Bob prefers jokes."),
            None,
        )
        .await
        .unwrap();
    let terms = |w: &[&str]| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let ids = |m: &[harness_store::store::MemoryRecord]| {
        m.iter().map(|m| m.id.clone()).collect::<Vec<_>>()
    };
    for (words, limit, preferences) in [
        (terms(&["city", "loire"]), 5, 10),
        (terms(&["city", "loire"]), 2, 2),
        (terms(&["loire"]), 1, 1),
        (terms(&["oslo"]), 5, 10),
        (terms(&[]), 5, 10),
        (terms(&["bullet"]), 5, 0),
    ] {
        let (found, preferred) = store
            .memories_for_turn(&turn_read("user:ann", &words, limit, preferences))
            .await
            .unwrap();
        let searched = store
            .search_memories("user:ann", &words, limit)
            .await
            .unwrap();
        let listed = store
            .list_memories("user:ann", Some("preference"), preferences)
            .await
            .unwrap();
        assert_eq!(ids(&found), ids(&searched), "{words:?} {limit}");
        assert_eq!(ids(&preferred), ids(&listed), "{words:?} {preferences}");
        assert!(found.len() <= limit as usize);
        assert!(preferred.iter().all(|m| m.scope == "user:ann"));
    }
    let (found, preferred) = store
        .memories_for_turn(&turn_read("user:ann", &terms(&["city", "loire"]), 5, 10))
        .await
        .unwrap();
    assert_eq!(found.len(), 3, "{found:?}");
    assert_eq!(found[0].key, "home_city", "both words first: {found:?}");
    let keys: Vec<&str> = preferred.iter().map(|m| m.key.as_str()).collect();
    assert_eq!(keys, ["prefers_units", "prefers_tone", "prefers_format"]);
}

async fn jobs_are_claimed_once_retried_and_reclaimed_when_stale(backend: Backend) {
    let (_db, store) = store(backend).await;
    let now = Utc::now();
    for (id, at) in [
        ("job_a", now - Duration::seconds(2)),
        ("job_b", now - Duration::seconds(1)),
    ] {
        store
            .enqueue_job(
                &NewJob {
                    id: id.into(),
                    kind: "judge".into(),
                    session_id: "s1".into(),
                    turn_id: "t1".into(),
                    payload: "{}".into(),
                    at,
                },
                None,
            )
            .await
            .unwrap();
    }
    let stale_before = now - Duration::minutes(5);
    let first = store.claim_job(now, stale_before).await.unwrap().unwrap();
    assert_eq!((first.id.as_str(), first.attempts), ("job_a", 1));
    let second = store.claim_job(now, stale_before).await.unwrap().unwrap();
    assert_eq!(second.id, "job_b");
    assert!(
        store.claim_job(now, stale_before).await.unwrap().is_none(),
        "both are running"
    );
    // A retry comes back when it is due, not before.
    store
        .finish_job(
            "job_a",
            &JobOutcome::Retry {
                error: "busy".into(),
                after: now + Duration::seconds(30),
            },
            // The failed run was paid for: its usage counts.
            &JobUsage {
                input_tokens: 11,
                output_tokens: 7,
                cost_usd: Some(0.02),
            },
            now,
        )
        .await
        .unwrap();
    assert!(store.claim_job(now, stale_before).await.unwrap().is_none());
    let again = store
        .claim_job(now + Duration::seconds(31), stale_before)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((again.id.as_str(), again.attempts), ("job_a", 2));
    store
        .finish_job(
            "job_a",
            &JobOutcome::Done,
            &JobUsage {
                input_tokens: 10,
                output_tokens: 3,
                cost_usd: Some(0.01),
            },
            now,
        )
        .await
        .unwrap();
    // A job whose runner died is claimed again once its claim is stale.
    let later = now + Duration::minutes(10);
    let reclaimed = store
        .claim_job(later, later - Duration::minutes(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((reclaimed.id.as_str(), reclaimed.attempts), ("job_b", 2));
    store
        .finish_job(
            "job_b",
            &JobOutcome::Failed {
                error: "gave up".into(),
            },
            // A model without a price: tokens, and no cost.
            &JobUsage {
                input_tokens: 5,
                output_tokens: 2,
                cost_usd: None,
            },
            later,
        )
        .await
        .unwrap();
    let jobs = store.list_jobs(&key("s1"), 10).await.unwrap();
    let states: Vec<(&str, &str, i64, i64)> = jobs
        .iter()
        .map(|j| {
            (
                j.id.as_str(),
                j.status.as_str(),
                j.input_tokens,
                j.output_tokens,
            )
        })
        .collect();
    // Each job's totals are the sum of its runs', failed ones included.
    assert_eq!(
        states,
        [("job_a", "done", 21, 10), ("job_b", "failed", 5, 2)]
    );
    assert!(
        (jobs[0].cost_usd.unwrap() - 0.03).abs() < 1e-12,
        "{:?}",
        jobs[0].cost_usd
    );
    assert_eq!(jobs[1].cost_usd, None);
    assert_eq!(jobs[1].last_error.as_deref(), Some("gave up"));
}

fn judgement(session: &str, turn: Uuid) -> JudgementRecord {
    JudgementRecord {
        id: format!("jdg_{}", Uuid::now_v7().simple()),
        session_id: session.into(),
        turn_id: turn.to_string(),
        judge: "relevance".into(),
        prompt_id: "support".into(),
        prompt_version: "3".into(),
        score: 0.8,
        passed: true,
        rationale: "On topic.".into(),
        provider: "openai".into(),
        model: "gpt-4o-mini".into(),
        // The precision both databases keep.
        created_at: Utc::now().trunc_subsecs(6),
    }
}

async fn a_judgement_takes_the_sessions_next_seq_only_between_turns(backend: Backend) {
    let (_db, store) = store(backend).await;
    let turn = new_turn("s1", None);
    store.begin_turn(&turn).await.unwrap();
    let record = judgement("s1", turn.id);
    let event = TurnEvent::Judgement {
        judgement_id: record.id.clone(),
        judged_turn_id: turn.id.to_string(),
        judge: "relevance".into(),
        score: 0.8,
        passed: true,
        rationale: "On topic.".into(),
    };
    let event_turn = Uuid::now_v7();
    store.put_judgement(&record, None).await.unwrap();
    // While the turn runs, its events own the next seqs.
    let at = record.created_at;
    let between = harness_base::events::StoredEvent::new("s1", event_turn, 0, &event, at).unwrap();
    assert!(!store.append_session_event(&between).await.unwrap());
    assert_eq!(
        store
            .list_events(&key("s1"), None, 0, 100)
            .await
            .unwrap()
            .len(),
        1
    );
    store
        .write_batch(&[], &[&completed(&turn, 2, "done")])
        .await
        .unwrap();
    assert!(store.append_session_event(&between).await.unwrap());
    let events = store.list_events(&key("s1"), None, 0, 100).await.unwrap();
    let last = events.last().unwrap();
    assert_eq!(
        (last.seq, last.event_type.as_str(), last.turn_id),
        (3, "judgement", event_turn)
    );
    let judged = store.list_judgements(&key("s1"), turn.id).await.unwrap();
    assert_eq!(judged, [record]);
    // The next turn starts after it.
    let next = new_turn("s1", None);
    assert_eq!(store.begin_turn(&next).await.unwrap().first_seq, 4);
}

async fn observations_are_kept_per_session(backend: Backend) {
    let (_db, store) = store(backend).await;
    let turn = new_turn("s1", None);
    let seq = store.begin_turn(&turn).await.unwrap().first_seq + 1;
    // An observation is written with its turn's end.
    let finish = completed(&turn, seq, "a");
    let observation = finish.observation.clone().unwrap();
    store.write_batch(&[], &[&finish]).await.unwrap();
    let mut read = store.list_observations(&key("s1"), 10).await.unwrap();
    assert_eq!(read.len(), 1);
    // Timestamps come back at the stores' precision.
    read[0].created_at = observation.created_at;
    assert_eq!(read, [observation]);
    assert!(
        store
            .list_observations(&key("s2"), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// The backlog is the waiting jobs of every session; shedding gives up
/// the oldest waiting jobs of one kind only, down to the bound, and never
/// a job of another kind nor one that runs.
async fn a_backlog_is_counted_and_shed_oldest_first_by_kind(backend: Backend) {
    let (_db, store) = store(backend).await;
    let now = Utc::now();
    assert_eq!(store.job_backlog().await.unwrap().pending, 0);
    for (i, kind) in [
        "memory_extraction",
        "judge",
        "memory_extraction",
        "memory_extraction",
        "judge",
        "memory_extraction",
    ]
    .into_iter()
    .enumerate()
    {
        store
            .enqueue_job(
                &NewJob {
                    id: format!("job_{i}"),
                    kind: kind.into(),
                    session_id: format!("s{}", i % 2),
                    turn_id: "t1".into(),
                    payload: "{}".into(),
                    at: now - Duration::seconds(10 - i as i64),
                },
                None,
            )
            .await
            .unwrap();
    }
    // The oldest is running: it is not waiting, and it is not shed.
    let running = store
        .claim_job(now, now - Duration::minutes(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(running.id, "job_0");
    let backlog = store.job_backlog().await.unwrap();
    assert_eq!(backlog.pending, 5);
    let oldest = backlog.oldest.unwrap();
    assert!(
        (oldest - (now - Duration::seconds(9)))
            .num_milliseconds()
            .abs()
            < 5,
        "{oldest}"
    );
    // Down to 3 waiting: the two oldest waiting extractions go.
    let shed = store
        .shed_jobs("memory_extraction", 3, "over the backlog bound", now)
        .await
        .unwrap();
    assert_eq!(shed, 2);
    assert_eq!(store.job_backlog().await.unwrap().pending, 3);
    // Only judges and one extraction are left: shedding extractions down
    // to 1 takes the last extraction, and no judge.
    assert_eq!(
        store
            .shed_jobs("memory_extraction", 1, "over the backlog bound", now)
            .await
            .unwrap(),
        1
    );
    let jobs: Vec<(String, String)> = [
        store.list_jobs(&key("s0"), 10).await.unwrap(),
        store.list_jobs(&key("s1"), 10).await.unwrap(),
    ]
    .concat()
    .into_iter()
    .map(|j| (j.id, j.status))
    .collect();
    let status = |id: &str| jobs.iter().find(|(j, _)| j == id).unwrap().1.clone();
    assert_eq!(status("job_0"), "running");
    for shed in ["job_2", "job_3", "job_5"] {
        assert_eq!(status(shed), "failed", "{shed}");
    }
    for kept in ["job_1", "job_4"] {
        assert_eq!(status(kept), "pending", "{kept}");
    }
}

/// A begin answers the turn's first reads (history and memories) as the
/// separate reads would; SQLite answers them on its writer's connection,
/// Postgres leaves them to the turn.
async fn a_begin_answers_the_turns_first_reads_as_the_reads_would(backend: Backend) {
    let (_db, store) = store(backend).await;
    for (key, content) in [
        ("home_city", "Ann lives in Nantes, a city on the Loire."),
        ("prefers_format", "Ann prefers bullet points."),
    ] {
        store
            .upsert_memory(&memory("user:ann", key, content), None)
            .await
            .unwrap();
    }
    let query = |words: &[&str]| harness_store::store::MemoryQuery {
        scope: "user:ann".into(),
        terms: words.iter().map(|w| (*w).to_owned()).collect(),
        limit: 5,
        preferences: 5,
    };
    // The first turn: no history yet.
    let mut first = new_turn("s-reads", None);
    first.reads = harness_store::store::TurnReads {
        history: Some(10),
        memory: Some(query(&["Loire?", "city"])),
    };
    let began = store.begin_turn(&first).await.unwrap();
    let expected_memories = store
        .memories_for_turn(&turn_read(
            "user:ann",
            &["Loire?".into(), "city".into()],
            5,
            5,
        ))
        .await
        .unwrap();
    assert_eq!(expected_memories.0.len(), 1, "the search finds the fact");
    assert_eq!(expected_memories.1.len(), 1, "and the preference");
    match backend {
        Backend::Sqlite => {
            assert_eq!(began.context.history, Some(Vec::new()));
            assert_eq!(began.context.memories, Some(expected_memories));
        }
        Backend::Postgres => assert_eq!(began.context, Default::default()),
    }
    store
        .write_batch(&[], &[&completed(&first, began.first_seq + 1, "Nantes.")])
        .await
        .unwrap();
    // The second: the first's messages, oldest first; the memories of a
    // scope that has none.
    let mut second = new_turn("s-reads", None);
    second.reads.history = Some(10);
    second.reads.memory = Some(harness_store::store::MemoryQuery {
        scope: "user:nobody".into(),
        ..query(&["Loire"])
    });
    let began = store.begin_turn(&second).await.unwrap();
    let history = store.recent_messages(&key("s-reads"), 10).await.unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(history[0].role, "user");
    let none = store
        .memories_for_turn(&turn_read("user:nobody", &["Loire".into()], 5, 5))
        .await
        .unwrap();
    assert_eq!(none, (Vec::new(), Vec::new()));
    match backend {
        Backend::Sqlite => {
            assert_eq!(began.context.history, Some(history));
            assert_eq!(began.context.memories, Some(none));
        }
        Backend::Postgres => assert_eq!(began.context, Default::default()),
    }
}

crate::on_both_backends!(
    a_begin_answers_the_turns_first_reads_as_the_reads_would,
    memories_are_one_per_key_searchable_and_forgotten_per_scope,
    a_backlog_is_counted_and_shed_oldest_first_by_kind,
    a_turns_memory_read_is_the_search_and_the_preferences,
    jobs_are_claimed_once_retried_and_reclaimed_when_stale,
    a_judgement_takes_the_sessions_next_seq_only_between_turns,
    observations_are_kept_per_session,
);

/// A turn's first read that fails on the begin (here, a memory row the
/// store cannot read) is left to the turn: the begin itself stands, and
/// answers the reads that worked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_begin_whose_first_read_fails_still_begins_on_sqlite() {
    let (db, store) = store(Backend::Sqlite).await;
    store
        .upsert_memory(
            &memory("user:ann", "home_city", "Ann lives in Nantes."),
            None,
        )
        .await
        .unwrap();
    rusqlite::Connection::open(db.sqlite_path())
        .unwrap()
        .execute("UPDATE memories SET updated_at = 'not a time'", [])
        .unwrap();
    let mut turn = new_turn("s-broken", None);
    turn.reads = harness_store::store::TurnReads {
        history: Some(10),
        memory: Some(harness_store::store::MemoryQuery {
            scope: "user:ann".into(),
            terms: vec!["Nantes".into()],
            limit: 5,
            preferences: 5,
        }),
    };
    let began = store.begin_turn(&turn).await.unwrap();
    assert_eq!(began.turn_number, 1);
    assert_eq!(began.context.history, Some(Vec::new()));
    assert_eq!(began.context.memories, None, "left to the turn");
    let record = store
        .get_turn(&key("s-broken"), turn.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, harness_store::store::TurnStatus::Running);
}

/// A turn's memory read of `scope`.
fn turn_read(scope: &str, terms: &[String], limit: u32, preferences: u32) -> MemoryQuery {
    MemoryQuery {
        scope: scope.to_owned(),
        terms: terms.to_vec(),
        limit,
        preferences,
    }
}
