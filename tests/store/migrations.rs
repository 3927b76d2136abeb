//! What older stores become on both backends: session ids per tenant,
//! the turn's tenant column; SQLite's WAL kept bounded.

use super::*;

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
                include_str!("../../migrations/sqlite/0038_message_attachments.sql"),
                include_str!("../../migrations/sqlite/0040_turn_tree.sql"),
                include_str!("../../migrations/sqlite/0041_forks.sql"),
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
                include_str!("../../migrations/postgres/0039_message_attachments.sql"),
                include_str!("../../migrations/postgres/0041_turn_tree.sql"),
                include_str!("../../migrations/postgres/0042_forks.sql"),
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
                 DROP TABLE webhooks; DROP TABLE push_configs; \
                 ALTER TABLE messages DROP COLUMN attachments; DROP INDEX messages_turn; \
                 ALTER TABLE turns DROP COLUMN parent_turn_id; \
                 ALTER TABLE turns DROP COLUMN run_id; ALTER TABLE sessions DROP COLUMN branched; \
                 DROP INDEX sessions_forked_from; ALTER TABLE sessions DROP COLUMN forked_from; \
                 ALTER TABLE sessions DROP COLUMN forked_at;",
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
                 DROP TABLE webhooks; DROP TABLE push_configs; \
                 ALTER TABLE messages DROP COLUMN attachments; DROP INDEX messages_turn; \
                 ALTER TABLE turns DROP COLUMN parent_turn_id, DROP COLUMN run_id; \
                 ALTER TABLE sessions DROP COLUMN branched; DROP INDEX sessions_forked_from; \
                 ALTER TABLE sessions DROP COLUMN forked_from, DROP COLUMN forked_at;",
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

/// Turns became a tree: a session made before is one straight branch,
/// each turn continuing the one before it, and reads as it did.
async fn turns_made_before_the_tree_each_continue_the_one_before(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.migrate_to(match backend {
        Backend::Sqlite => 39,
        Backend::Postgres => 40,
    })
    .await;
    let ids: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
    let mut sql = String::from(
        "INSERT INTO sessions (id, created_at, updated_at, turn_count, last_seq, tenant) \
         VALUES ('s1', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', 3, 6, 'default');",
    );
    for (n, id) in ids.iter().enumerate() {
        let request = serde_json::to_string(&TurnRequest::new(format!("q{n}"))).unwrap();
        let at = format!("2026-01-01T00:00:0{n}Z");
        sql.push_str(&format!(
            "INSERT INTO turns (id, session_id, status, request, owner_instance, owner_process, \
             heartbeat_at, first_seq, created_at, tenant) VALUES ('{id}', 's1', 'completed', \
             '{request}', 'i', 'p', '{at}', {seq}, '{at}', 'default'); \
             INSERT INTO messages (session_id, turn_id, role, content, created_at) VALUES \
             ('s1', '{id}', 'user', 'q{n}', '{at}'), ('s1', '{id}', 'assistant', 'a{n}', '{at}');",
            seq = 2 * n + 1
        ));
    }
    match backend {
        Backend::Sqlite => db.execute_sqlite(&sql).await,
        Backend::Postgres => db.execute_postgres(&sql).await,
    }
    let store = db.open().await;
    let session = store.get_session(&key("s1")).await.unwrap().unwrap();
    assert!(!session.branched);
    let mut parents = Vec::new();
    for id in &ids {
        let turn = store.get_turn(&key("s1"), *id).await.unwrap().unwrap();
        parents.push(turn.parent_turn_id);
    }
    assert_eq!(parents, [None, Some(ids[0]), Some(ids[1])]);
    // Read along its links, the last turn's branch is the whole session.
    let branch: Vec<String> = store
        .history(&key("s1"), ids[2], true, 50)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.content)
        .collect();
    assert_eq!(branch, ["q0", "a0", "q1", "a1", "q2", "a2"]);
}

crate::on_both_backends!(
    turns_made_before_the_tree_each_continue_the_one_before,
    sessions_of_every_tenant_survive_the_move_to_per_tenant_ids,
    a_turn_running_across_the_tenant_column_migration_still_counts,
);
