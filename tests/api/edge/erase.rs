//! `DELETE /sessions/{id}`: the session and everything it owns, erased.
//! The proof reads the database's catalogue, so a table a migration adds
//! is scanned too: no row of any table names the session or its turns
//! after the erase.

use std::sync::Arc;

use harness_base::ids::DEFAULT_TENANT;
use harness_store::store::{JudgementRecord, NewArtifact, NewJob, NewMemory};
use serde_json::{Value, json};

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, spawn_app_with, test_settings, types, vault_of},
    on_both_backends,
    support::{Backend, TestDb},
};

pub(crate) async fn app(backend: Backend, vault: &std::path::Path) -> TestApp {
    app_with(backend, vault, |_| {}).await
}

/// The erase tests' app, with `tweak`'s settings.
pub(crate) async fn app_with(
    backend: Backend,
    vault: &std::path::Path,
    tweak: impl FnOnce(&mut harness_core::config::Settings),
) -> TestApp {
    let provider = FakeProvider::start().await;
    provider.respond_with(Arc::new(|body: &Value| {
        let (asked, answered) = crate::helpers::asked_and_answered(body);
        if asked.contains("Change my note") && !answered {
            Reply::openai_tool_call(
                "call_e1",
                "write_note",
                &json!({"path": "notes/a.md", "content": "changed"}),
            )
        } else if asked.contains("Where am I") && !answered {
            Reply::openai_tool_call("call_e2", "client__get_location", &json!({}))
        } else {
            Reply::openai_text("Done.")
        }
    }));
    let mut settings = test_settings(&provider);
    settings.vault.dir = vault.to_owned();
    settings.harness.approval_required = Some("LOCAL_WRITE".parse().unwrap());
    settings.server.outbound_allow_private = true;
    tweak(&mut settings);
    spawn_app_with(TestDb::new(backend).await, provider, settings).await
}

/// A session with a row of every kind a turn leaves: a write approved (its
/// approval, checkpoint, step records), a client tool's result, the
/// events, messages and decisions, a webhook delivery; and, as the
/// background work leaves them, an artifact, a job, a judgement and
/// memories (one extracted from it into its user's scope, one in its own);
/// the research learner leaves its observations.
/// Returns the session's key and its turns' ids.
pub(crate) async fn a_full_session(app: &TestApp, tenant: &str, session: &str) -> Vec<String> {
    let (status, _) = app
        .post_body(
            "/webhooks",
            json!({"url": "http://127.0.0.1:9/hook", "events": ["turn.completed"]}),
        )
        .await;
    assert_eq!(status, 201);
    let mut turns = Vec::new();
    let mut stream = app
        .post_turn_sse(session, json!({"message": "Change my note."}))
        .await;
    let turn = stream.turn_id();
    stream.read_until("approval.requested").await;
    let url = format!("/sessions/{session}/turns/{turn}/approvals/call_e1");
    assert_eq!(app.post_body(&url, json!({"approve": true})).await.0, 200);
    assert_eq!(
        types(&stream.read_to_end().await).last(),
        Some(&"turn.completed")
    );
    turns.push(turn);

    let location = json!({"name": "get_location", "description": "Where",
                          "parameters": {"type": "object"}, "effect": "READ_ONLY"});
    let mut stream = app
        .post_turn_sse(
            session,
            json!({"message": "Where am I?", "client_tools": [location]}),
        )
        .await;
    let turn = stream.turn_id();
    stream.read_until("tool.requested").await;
    let url = format!("/sessions/{session}/turns/{turn}/tool-results/call_e2");
    assert_eq!(app.post_body(&url, json!({"output": "Lyon"})).await.0, 200);
    assert_eq!(
        types(&stream.read_to_end().await).last(),
        Some(&"turn.completed")
    );
    turns.push(turn.clone());

    let store = app.db.open().await;
    let key = harness_base::ids::tenant_scope(tenant, session);
    let key = harness_base::ids::SessionKey::from_stored(&key);
    let now = chrono::Utc::now();
    store
        .put_artifact(&NewArtifact {
            id: format!("art_{}", uuid::Uuid::now_v7().simple()),
            session_id: key.clone(),
            turn_id: turn.clone(),
            call_id: "call_e2".into(),
            tool: "get_location".into(),
            content: "a long output".into(),
            created_at: now,
        })
        .await
        .unwrap();
    store
        .enqueue_job(
            &NewJob {
                id: uuid::Uuid::now_v7().to_string(),
                kind: "judge".into(),
                session_id: key.as_str().to_owned(),
                turn_id: turn.clone(),
                payload: "{}".into(),
                at: now,
            },
            None,
        )
        .await
        .unwrap();
    store
        .put_judgement(
            &JudgementRecord {
                id: uuid::Uuid::now_v7().to_string(),
                session_id: key.as_str().to_owned(),
                turn_id: turn.clone(),
                judge: "helpfulness".into(),
                prompt_id: "p".into(),
                prompt_version: "1".into(),
                score: 0.9,
                passed: true,
                rationale: "fine".into(),
                provider: "openai".into(),
                model: "m".into(),
                created_at: now,
            },
            None,
        )
        .await
        .unwrap();
    let own_scope = harness_base::ids::tenant_scope(tenant, &format!("session:{session}"));
    let user_scope = harness_base::ids::tenant_scope(tenant, "user:u1");
    for (scope, memory_key) in [(own_scope, "city"), (user_scope, "home")] {
        store
            .upsert_memory(
                &NewMemory {
                    id: uuid::Uuid::now_v7().to_string(),
                    scope,
                    kind: "fact".into(),
                    key: memory_key.into(),
                    content: "Lives in Lyon".into(),
                    source_session_id: key.as_str().to_owned(),
                    source_turn_id: turn.clone(),
                    embedding: None,
                    embedding_model: None,
                    at: now,
                },
                None,
            )
            .await
            .unwrap();
    }
    turns
}

/// Every kind of row a session owns is erased, on either backend: after
/// the erase no table of the schema holds the session's key or one of its
/// turns' ids. Another session is left whole; a second erase is 404.
async fn an_erased_session_leaves_no_row_in_any_table(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let app = app(backend, vault.path()).await;
    let session = format!("s-erase-{}", uuid::Uuid::now_v7().simple());
    let turns = a_full_session(&app, DEFAULT_TENANT, &session).await;
    let kept = format!("s-kept-{}", uuid::Uuid::now_v7().simple());
    let kept_turns = a_full_session(&app, DEFAULT_TENANT, &kept).await;

    let mut needles = vec![session.clone()];
    needles.extend(turns.iter().cloned());
    let before = app.db.rows_naming(&needles).await;
    let holding: Vec<&str> = before
        .iter()
        .filter(|(_, count)| **count > 0)
        .map(|(table, _)| table.as_str())
        .collect();
    for table in [
        "sessions",
        "turns",
        "events",
        "messages",
        "decisions",
        "approvals",
        "checkpoints",
        "client_tool_results",
        "artifacts",
        "background_jobs",
        "judgements",
        "research_observations",
        "memories",
        "webhook_deliveries",
    ] {
        assert!(holding.contains(&table), "{table}: {before:?}");
    }

    let response = app
        .client
        .delete(app.url(&format!("/sessions/{session}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    let after = app.db.rows_naming(&needles).await;
    let left: Vec<(&String, &i64)> = after.iter().filter(|(_, count)| **count > 0).collect();
    assert!(left.is_empty(), "rows left: {left:?}");

    // The other session is whole.
    let mut others = vec![kept.clone()];
    others.extend(kept_turns);
    let other = app.db.rows_naming(&others).await;
    for table in ["sessions", "turns", "events", "approvals", "memories"] {
        assert!(other[table] > 0, "{table}: {other:?}");
    }
    let (status, body) = app.get_json(&format!("/sessions/{session}")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("session_not_found"))
    );
    let again = app
        .client
        .delete(app.url(&format!("/sessions/{session}")))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404);
    let problem: Value = again.json().await.unwrap();
    assert_eq!(problem["code"], "session_not_found");
}

/// A session whose turn runs (here: waiting for a person) is erased once
/// the turn is cancelled: the DELETE ends it first. (The step records a
/// running turn keeps, which its end deletes, are erased with it.)
async fn a_running_turn_is_cancelled_before_its_session_is_erased(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let app = app(backend, vault.path()).await;
    let mut stream = app
        .post_turn_sse("s-erase-running", json!({"message": "Change my note."}))
        .await;
    let turn = stream.turn_id();
    stream.read_until("approval.requested").await;
    let held = app
        .db
        .rows_naming(&["s-erase-running".to_owned(), turn.clone()])
        .await;
    assert!(held["turn_steps"] > 0, "{held:?}");
    let response = app
        .client
        .delete(app.url("/sessions/s-erase-running"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    let rest = stream.read_to_end().await;
    assert_eq!(types(&rest).last(), Some(&"turn.cancelled"), "{rest:?}");
    let left = app
        .db
        .rows_naming(&["s-erase-running".to_owned(), turn])
        .await;
    assert!(left.values().all(|count| *count == 0), "{left:?}");
    assert_eq!(
        std::fs::read_to_string(vault.path().join("notes/a.md")).unwrap(),
        "# A\n",
        "the write never ran"
    );
}

/// `HARNESS_RETENTION`: a session inactive for longer is erased whole by
/// the sweep (every `HARNESS_RETENTION_SWEEP_INTERVAL`), and counted; a
/// session whose turn still waits (for a client's result, here) is kept,
/// however old.
async fn the_retention_sweep_erases_inactive_sessions_and_keeps_waiting_ones(backend: Backend) {
    let provider = FakeProvider::start().await;
    provider.respond_with(Arc::new(|body: &Value| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if body["tools"].to_string().contains("client__get_location")
            && !messages.iter().any(|m| m["role"] == "tool")
        {
            Reply::openai_tool_call("call_r1", "client__get_location", &json!({}))
        } else {
            Reply::openai_text("Done.")
        }
    }));
    let mut settings = test_settings(&provider);
    settings.server.retention = Some("2s".parse().unwrap());
    settings.server.retention_sweep_interval = "1s".parse().unwrap();
    settings.server.audit_retention = Some("1h".parse().unwrap());
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    // An audit row older than the trail's retention.
    let store = app.db.open().await;
    let old = harness_store::store::AuditEntry::new("default", "webhook.created").subject("wh_old");
    let two_hours_ago = chrono::Utc::now() - chrono::Duration::hours(2);
    store.audit(&old, two_hours_ago).await.unwrap();
    let response = app
        .post_turn("s-ret-old", json!({"message": "Hello."}))
        .await;
    assert_eq!(response.status(), 200);
    let turn: Value = response.json().await.unwrap();
    let turn = turn["turn_id"].as_str().unwrap().to_owned();
    let location = json!({"name": "get_location", "description": "Where",
                          "parameters": {"type": "object"}, "effect": "READ_ONLY"});
    let mut waiting = app
        .post_turn_sse(
            "s-ret-waiting",
            json!({"message": "Where am I?", "client_tools": [location]}),
        )
        .await;
    waiting.read_until("tool.requested").await;

    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (status, _) = app.get_json("/sessions/s-ret-old").await;
        if status == 404 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never erased");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let left = app.db.rows_naming(&["s-ret-old".to_owned(), turn]).await;
    assert!(left.values().all(|count| *count == 0), "{left:?}");
    assert!(app.metric("agent_harness_retention_erased_total").await >= 1.0);
    // The trail says the sweep erased it (its row of the sweep comes after
    // the erase), and no longer holds the old row.
    let filter = harness_store::store::AuditFilter {
        limit: 100,
        ..Default::default()
    };
    let rows = loop {
        let rows = store.audit_rows(&filter).await.unwrap();
        if rows.iter().any(|r| r.kind == "retention.swept") {
            break rows;
        }
        assert!(tokio::time::Instant::now() < deadline, "{rows:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let seen: Vec<(&str, &str, Option<&str>)> = rows
        .iter()
        .map(|r| (r.kind.as_str(), r.actor.as_str(), r.subject.as_deref()))
        .collect();
    assert!(
        seen.contains(&("session.erased", "retention", Some("s-ret-old"))),
        "{seen:?}"
    );
    assert!(
        seen.contains(&("retention.swept", "retention", None)),
        "{seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|(_, _, subject)| *subject == Some("wh_old")),
        "{seen:?}"
    );
    // Older than the retention by now, but its turn waits.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let (status, session) = app.get_json("/sessions/s-ret-waiting").await;
    assert_eq!(status, 200, "{session}");
    assert!(session["running_turn_id"].is_string(), "{session}");
}

/// `DELETE /users/{id}`: every session in which the user asked a turn is
/// erased whole, with the memories of their scope; another user's
/// session and memories stay. A user with nothing left is 404.
async fn a_user_is_erased_with_their_sessions_and_memories(backend: Backend) {
    let vault = vault_of(&[]);
    let app = app(backend, vault.path()).await;
    let mut turns = Vec::new();
    for (session, user) in [("s-u1-a", "u1"), ("s-u1-b", "u1"), ("s-u2", "u2")] {
        let response = app
            .post_turn(session, json!({"message": "Hello.", "user_id": user}))
            .await;
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        turns.push(body["turn_id"].as_str().unwrap().to_owned());
    }
    let store = app.db.open().await;
    for user in ["u1", "u2"] {
        store
            .upsert_memory(
                &NewMemory {
                    id: uuid::Uuid::now_v7().to_string(),
                    scope: harness_base::ids::tenant_scope(
                        harness_base::ids::DEFAULT_TENANT,
                        &format!("user:{user}"),
                    ),
                    kind: "fact".into(),
                    key: "home".into(),
                    content: "Lives in Lyon".into(),
                    source_session_id: format!("s-{user}-x"),
                    source_turn_id: uuid::Uuid::now_v7().to_string(),
                    embedding: None,
                    embedding_model: None,
                    at: chrono::Utc::now(),
                },
                None,
            )
            .await
            .unwrap();
    }
    let erase = || app.client.delete(app.url("/users/u1")).send();
    assert_eq!(erase().await.unwrap().status(), 204);
    let gone = [
        "s-u1-a".to_owned(),
        "s-u1-b".to_owned(),
        turns[0].clone(),
        turns[1].clone(),
    ];
    let left = app.db.rows_naming(&gone).await;
    assert!(left.values().all(|count| *count == 0), "{left:?}");
    let (_, memories) = app.get_json("/memories?scope=user:u1").await;
    assert_eq!(memories["memories"], json!([]), "{memories}");
    let (status, _) = app.get_json("/sessions/s-u2").await;
    assert_eq!(status, 200);
    let (_, memories) = app.get_json("/memories?scope=user:u2").await;
    assert_eq!(memories["memories"].as_array().map(Vec::len), Some(1));
    let again = erase().await.unwrap();
    assert_eq!(again.status(), 404);
    let problem: Value = again.json().await.unwrap();
    assert_eq!(problem["code"], "user_not_found");
    let bad = app
        .client
        .delete(app.url("/users/no%20spaces"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let problem: Value = bad.json().await.unwrap();
    assert_eq!(problem["code"], "invalid_user_id");
}

/// Forks `source` at its turn `at` into the session `id`.
async fn fork(app: &TestApp, source: &str, at: &str, id: &str) -> (u16, Value) {
    let body = json!({"at_turn": at, "session_id": id});
    app.post_body(&format!("/sessions/{source}/fork"), body)
        .await
}

/// A session that forks read through is not erased (409 naming them,
/// nothing written) until they are; then nothing of either is left in any
/// table. A user's erase takes the forks of the user's sessions with them
/// (their history is the user's conversation).
async fn a_forked_session_is_erased_after_its_forks(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let app = app(backend, vault.path()).await;
    let turns = a_full_session(&app, DEFAULT_TENANT, "s-src").await;
    let at = turns.last().unwrap();
    let (status, made) = fork(&app, "s-src", at, "s-fork").await;
    assert_eq!(status, 201, "{made}");
    let response = app
        .post_turn("s-fork", json!({"message": "Hello.", "user_id": "someone"}))
        .await;
    assert_eq!(response.status(), 200);
    let own: Value = response.json().await.unwrap();
    let own_turn = own["turn_id"].as_str().unwrap().to_owned();

    let refused = app
        .client
        .delete(app.url("/sessions/s-src"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 409);
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(problem["code"], "session_forked", "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("s-fork"),
        "{problem}"
    );
    let mut source = vec!["s-src".to_owned()];
    source.extend(turns.iter().cloned());
    let whole = app.db.rows_naming(&source).await;
    for table in ["sessions", "turns", "events", "messages", "approvals"] {
        assert!(whole[table] > 0, "{table}: {whole:?}");
    }

    let delete = |id: &str| {
        app.client
            .delete(app.url(&format!("/sessions/{id}")))
            .send()
    };
    assert_eq!(delete("s-fork").await.unwrap().status(), 204);
    let left = app
        .db
        .rows_naming(&["s-fork".to_owned(), own_turn.clone()])
        .await;
    assert!(left.values().all(|count| *count == 0), "{left:?}");
    assert_eq!(delete("s-src").await.unwrap().status(), 204);
    let left = app.db.rows_naming(&source).await;
    let left: Vec<_> = left.iter().filter(|(_, count)| **count > 0).collect();
    assert!(left.is_empty(), "rows left: {left:?}");

    // A user's erase: their session and a fork of it (made by another
    // user of the tenant), and the fork's fork.
    let response = app
        .post_turn(
            "s-mine",
            json!({"message": "Hello.", "user_id": "u-forked"}),
        )
        .await;
    let mine: Value = response.json().await.unwrap();
    let mine_turn = mine["turn_id"].as_str().unwrap().to_owned();
    assert_eq!(fork(&app, "s-mine", &mine_turn, "s-theirs").await.0, 201);
    let response = app
        .post_turn(
            "s-theirs",
            json!({"message": "More.", "user_id": "u-other"}),
        )
        .await;
    let theirs: Value = response.json().await.unwrap();
    let theirs_turn = theirs["turn_id"].as_str().unwrap().to_owned();
    assert_eq!(
        fork(&app, "s-theirs", &theirs_turn, "s-deeper").await.0,
        201
    );
    let erased = app.client.delete(app.url("/users/u-forked")).send().await;
    assert_eq!(erased.unwrap().status(), 204);
    let gone = [
        "s-mine".to_owned(),
        "s-theirs".to_owned(),
        "s-deeper".to_owned(),
        mine_turn,
        theirs_turn,
    ];
    let left = app.db.rows_naming(&gone).await;
    let left: Vec<_> = left.iter().filter(|(_, count)| **count > 0).collect();
    assert!(left.is_empty(), "rows left: {left:?}");
}

/// Issue 63: U+0000 in any free JSON value of a request (a client tool's
/// schema here) is refused, 422 naming the field, with nothing written.
/// And a request stored by an older version with `\u0000` in its JSON
/// fails no statement: another tenant's `DELETE /users/{id}` is answered
/// (it was 500 on Postgres: the request was cast to `jsonb`), and a turn
/// of it can end with a `response.*` endpoint declared (the webhook
/// trigger cast it too, and the end could not be committed).
async fn a_nul_in_a_request_is_refused_and_an_old_one_breaks_nothing(backend: Backend) {
    let vault = vault_of(&[]);
    let app = app(backend, vault.path()).await;
    let poisoned = json!({
        "message": "Hello.",
        "client_tools": [{"name": "pick", "description": "Pick one.",
                          "parameters": {"type": "object", "description": "a\u{0}b"}}],
    });
    let response = app.post_turn("s-nul", poisoned).await;
    assert_eq!(response.status(), 422);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(
        (problem["code"].as_str(), problem["field"].as_str()),
        (Some("invalid_field"), Some("client_tools")),
        "{problem}"
    );
    let (status, _) = app.get_json("/sessions/s-nul").await;
    assert_eq!(status, 404, "nothing written");

    // As an older version stored it: a turn of another tenant whose
    // request holds `\u0000`, and a `response.*` endpoint.
    let (status, _) = app
        .post_body(
            "/webhooks",
            json!({"url": "http://127.0.0.1:9/hook", "events": ["response.completed"]}),
        )
        .await;
    assert_eq!(status, 201);
    for (session, user) in [("s-old", "ub"), ("s-u1", "u1")] {
        let response = app
            .post_turn(session, json!({"message": "Hello.", "user_id": user}))
            .await;
        assert_eq!(response.status(), 200);
    }
    let poison = r#"UPDATE turns SET request = '{"message":"a\u0000b","user_id":"ub","background":true}', tenant = 'b', status = 'running' WHERE session_id = 's-old'"#;
    let ended = "INSERT INTO events (session_id, seq, turn_id, type, payload, created_at) \
         SELECT session_id, 1000, id, 'turn.completed', '{\"type\":\"turn.completed\"}', created_at \
         FROM turns WHERE session_id = 's-old'";
    let sessions_tenant = "UPDATE sessions SET tenant = 'b' WHERE id = 's-old'";
    match backend {
        Backend::Postgres => {
            for sql in [poison, sessions_tenant, ended] {
                app.db.execute_postgres(sql).await;
            }
        }
        Backend::Sqlite => {
            for sql in [poison, sessions_tenant, ended] {
                app.db.execute_sqlite(sql).await;
            }
        }
    }
    let erased = app
        .client
        .delete(app.url("/users/u1"))
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), 204);
    let (status, _) = app.get_json("/sessions/s-u1").await;
    assert_eq!(status, 404);
}

/// Issue 63: on SQLite an erased session's text is not left in the
/// file's free pages: the erase overwrites what it deletes with zeros
/// (`secure_delete` for its transaction, FTS5's secure-delete for the
/// memories' index). After the erase and a checkpoint, the database file
/// and its WAL hold no copy of a word only that session said. (Before,
/// six copies were found.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erased_sessions_text_is_not_left_in_the_sqlite_file() {
    let vault = vault_of(&[]);
    let app = app(Backend::Sqlite, vault.path()).await;
    let word = "Zanzibarquokka";
    for n in 0..3 {
        let response = app
            .post_turn(
                "s-scrub",
                json!({"message": format!("{word} {n}: remember {word}."), "user_id": "scrub"}),
            )
            .await;
        assert_eq!(response.status(), 200);
    }
    let count = |path: &std::path::Path| {
        let bytes = std::fs::read(path).unwrap_or_default();
        bytes
            .windows(word.len())
            .filter(|w| *w == word.as_bytes())
            .count()
    };
    let db = app.db.sqlite_path();
    let wal = db.with_extension("db-wal");
    app.db
        .execute_sqlite("PRAGMA wal_checkpoint(TRUNCATE)")
        .await;
    assert!(
        count(&db) + count(&wal) > 0,
        "the word is in the file first"
    );
    let erased = app
        .client
        .delete(app.url("/sessions/s-scrub"))
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), 204);
    app.db
        .execute_sqlite("PRAGMA wal_checkpoint(TRUNCATE)")
        .await;
    assert_eq!(
        (count(&db), count(&wal)),
        (0, 0),
        "copies of the erased word in the file and its WAL"
    );
}

on_both_backends!(
    a_forked_session_is_erased_after_its_forks,
    a_nul_in_a_request_is_refused_and_an_old_one_breaks_nothing,
    a_user_is_erased_with_their_sessions_and_memories,
    the_retention_sweep_erases_inactive_sessions_and_keeps_waiting_ones,
    an_erased_session_leaves_no_row_in_any_table,
    a_running_turn_is_cancelled_before_its_session_is_erased,
);
