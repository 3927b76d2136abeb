//! `GET /sessions/{id}/export` and `POST /sessions/import`: a session
//! carried to another deployment, SQLite to Postgres and back, whole; an
//! export of the import is the same bytes but the fields the format marks
//! local.

use serde_json::{Value, json};

use crate::{
    edge::erase::{a_full_session, app_with},
    edge::tenants::client_with_key,
    helpers::{TestApp, vault_of},
    on_both_backends,
    support::{Backend, postgres_or_skip},
};

/// An app whose caller (keys off) may use the admin routes.
async fn local_admin(backend: Backend, vault: &std::path::Path) -> TestApp {
    app_with(backend, vault, |settings| {
        settings.server.allow_local_admin = true;
    })
    .await
}

async fn export(client: &reqwest::Client, app: &TestApp, session: &str) -> (u16, String) {
    let response = client
        .get(app.url(&format!("/sessions/{session}/export")))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    if status == 200 {
        assert_eq!(response.headers()["content-type"], "application/jsonl");
    }
    (status, response.text().await.unwrap())
}

async fn import(client: &reqwest::Client, app: &TestApp, query: &str, body: &str) -> (u16, Value) {
    let response = client
        .post(app.url(&format!("/sessions/import{query}")))
        .header("content-type", "application/jsonl")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The lines of an export without its local fields (the format names
/// them on its first line).
fn without_local(text: &str) -> Vec<String> {
    let mut lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let local: Vec<String> = lines[0]["local"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| name.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        local,
        ["header.exported_at", "header.backend", "session.tenant"]
    );
    for name in &local {
        let (line, field) = name.split_once('.').unwrap();
        let at = usize::from(line == "session");
        lines[at].as_object_mut().unwrap().remove(field);
    }
    // Each line as the export wrote it, but the two with local fields.
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            if i < 2 {
                lines[i].to_string()
            } else {
                line.to_owned()
            }
        })
        .collect()
}

/// A session with every kind of row, exported from SQLite, imported into
/// Postgres and exported again: the same bytes but the local fields; and
/// back into SQLite: the same again. The imported session reads as the
/// first did, and its next turn sees its history.
async fn an_export_carried_between_backends_exports_the_same_bytes() {
    if !postgres_or_skip().await {
        return;
    }
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let first = local_admin(Backend::Sqlite, vault.path()).await;
    let turns = a_full_session(&first, "default", "s-carried").await;
    // A turn whose message carried an image and a text file, inline: the
    // session's own files, exported with their bytes.
    let png = crate::helpers::png_of(300 * 1024);
    let b64 = |bytes: &[u8]| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(bytes)
    };
    let message = json!([
        {"type": "text", "text": "Look at these."},
        {"type": "image", "data": b64(&png), "media_type": "image/png"},
        {"type": "file", "data": b64(b"notes\n"), "media_type": "text/plain", "filename": "n.txt"}
    ]);
    let response = first
        .client
        .post(first.url("/sessions/s-carried/turns"))
        .json(&json!({"message": message}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let (status, exported) = export(&first.client, &first, "s-carried").await;
    assert_eq!(status, 200, "{exported}");
    let types: Vec<String> = exported
        .lines()
        .map(|line| {
            let line: Value = serde_json::from_str(line).unwrap();
            line["type"].as_str().unwrap_or("header").to_owned()
        })
        .collect();
    for kind in [
        "header",
        "session",
        "turn",
        "event",
        "message",
        "decision",
        "approval",
        "tool_result",
        "artifact",
        "checkpoint",
        "judgement",
        "observation",
        "file",
        "file_chunk",
        "end",
    ] {
        assert!(types.contains(&kind.to_owned()), "{kind}: {types:?}");
    }
    // Two chunks of the image, one of the text.
    assert_eq!(types.iter().filter(|t| *t == "file_chunk").count(), 3);
    let header: Value = serde_json::from_str(exported.lines().next().unwrap()).unwrap();
    assert_eq!(header["format"], "agent-harness/session");
    assert_eq!(header["version"], 1);
    assert_eq!(header["backend"], "sqlite");
    let end: Value = serde_json::from_str(exported.lines().last().unwrap()).unwrap();
    assert_eq!(end["lines"], exported.lines().count() - 1);
    assert!(exported.contains(&turns[0]) && exported.contains("call_e1"));

    let second = local_admin(Backend::Postgres, vault.path()).await;
    let (status, made) = import(&second.client, &second, "", &exported).await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["session_id"], "s-carried");
    assert_eq!(made["tenant"], "default");
    let (_, again) = export(&second.client, &second, "s-carried").await;
    assert_ne!(again, exported, "the local fields differ");
    assert_eq!(without_local(&again), without_local(&exported));

    let third = local_admin(Backend::Sqlite, vault.path()).await;
    // Bytes that are not the file's are refused: an import may not pass
    // them off as a stored file's.
    let tampered: Vec<String> = again
        .lines()
        .map(|line| {
            let mut row: Value = serde_json::from_str(line).unwrap();
            if row["type"] == "file_chunk" && row["idx"] == 0 {
                row["data"] = json!(b64(b"other bytes"));
            }
            row.to_string()
        })
        .collect();
    let (status, refused) = import(&third.client, &third, "", &tampered.join("\n")).await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["code"], "invalid_import", "{refused}");
    let (status, made) = import(&third.client, &third, "", &again).await;
    assert_eq!(status, 201, "{made}");
    let (_, back) = export(&third.client, &third, "s-carried").await;
    assert_eq!(without_local(&back), without_local(&exported));

    // The imported session reads as the first: its history and its log.
    for path in ["/messages", "/events", "/decisions"] {
        let (_, before) = first.get_json(&format!("/sessions/s-carried{path}")).await;
        let (status, after) = second.get_json(&format!("/sessions/s-carried{path}")).await;
        assert_eq!(status, 200);
        assert_eq!(after, before, "{path}");
    }
    let (_, session) = second.get_json("/sessions/s-carried").await;
    assert_eq!(session["turn_count"], 3, "{session}");
    // Its files came with it, whole, and are its tenant's.
    let (_, files) = second.get_json("/files").await;
    let files = files["files"].as_array().unwrap().clone();
    assert_eq!(files.len(), 2, "{files:?}");
    let image = files
        .iter()
        .find(|f| f["media_type"] == "image/png")
        .unwrap();
    let (_, _, bytes) = second
        .get_bytes(&format!("/files/{}/content", image["id"].as_str().unwrap()))
        .await;
    assert!(bytes == png);
    let (_, usage) = second.get_json("/usage").await;
    assert_eq!(usage["files"]["bytes"], 300 * 1024 + 6);
    // Its next turn goes on from its history.
    let response = second
        .post_turn("s-carried", json!({"message": "And now?"}))
        .await;
    assert_eq!(response.status(), 200);
    let asked = second.provider.requests().last().unwrap().body.to_string();
    assert!(
        asked.contains("Change my note") && asked.contains("Where am I"),
        "{asked}"
    );
    // The audit trail of each side has what was done.
    let (_, rows) = first.get_json("/audit?kind=session.exported").await;
    assert_eq!(rows["audit"][0]["subject"], "s-carried", "{rows}");
    let (_, rows) = second.get_json("/audit?kind=session.imported").await;
    assert_eq!(rows["audit"][0]["actor"], "local", "{rows}");
}

/// An import is whole or nothing: every way an export can be wrong is
/// 422 `invalid_import` naming its line, with nothing written; a session
/// the tenant has is 409 `session_exists`; the same export for another
/// tenant of the same deployment (its ids taken) is 409
/// `import_conflict`, with nothing written.
async fn a_bad_import_writes_nothing(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let app = local_admin(backend, vault.path()).await;
    a_full_session(&app, "default", "s-bad").await;
    let (_, exported) = export(&app.client, &app, "s-bad").await;
    let lines: Vec<&str> = exported.lines().collect();
    let renamed = exported.replacen("\"id\":\"s-bad\"", "\"id\":\"s-new\"", 1);
    let cut = lines[..lines.len() - 1].join("\n");
    let turn: Value = serde_json::from_str(lines[2]).unwrap();
    let running = exported.replacen("\"status\":\"completed\"", "\"status\":\"running\"", 1);
    let unknown = exported.replacen("\"type\":\"approval\"", "\"type\":\"approval\",\"x\":1", 1);
    let stranger = exported.replacen(
        &format!("\"turn_id\":\"{}\"", turn["id"].as_str().unwrap()),
        "\"turn_id\":\"018f0000-0000-7000-8000-000000000000\"",
        1,
    );
    let version = exported.replacen("\"version\":1", "\"version\":2", 1);
    // An export whose rows say what the service would never write (issue
    // 63): the first line of `kind` changed by `change`, under a new id.
    let edited = |kind: &str, nth: usize, change: &dyn Fn(&mut Value)| -> (String, usize) {
        let mut at = 0;
        let mut seen = 0;
        let body: Vec<String> = lines
            .iter()
            .enumerate()
            .map(|(i, line)| {
                let mut value: Value = serde_json::from_str(line).unwrap();
                if i == 1 {
                    value["id"] = json!("s-new");
                }
                if value["type"] == kind {
                    if seen == nth {
                        change(&mut value);
                        at = i + 1;
                    }
                    seen += 1;
                }
                value.to_string()
            })
            .collect();
        assert!(at > 0, "no {kind} line {nth}");
        (body.join("\n"), at)
    };
    let meanings = [
        (
            "a system message",
            edited("message", 0, &|m| m["role"] = json!("system")),
        ),
        (
            "a last_seq before the events",
            edited("session", 0, &|s| s["last_seq"] = json!(1)),
        ),
        (
            "a negative last_seq",
            edited("session", 0, &|s| s["last_seq"] = json!(-1)),
        ),
        (
            "a request not JSON",
            edited("turn", 0, &|t| t["request"] = json!("not json")),
        ),
        (
            "a payload with U+0000",
            edited("event", 0, &|e| {
                e["payload"] = json!("{\"type\":\"turn.started\",\"x\":\"\\u0000\"}")
            }),
        ),
        (
            "U+0000 in a text",
            edited("message", 0, &|m| m["content"] = json!("a\u{0}b")),
        ),
        (
            "a time to come",
            edited("turn", 0, &|t| {
                t["created_at"] = json!("2999-01-01T00:00:00.000000Z")
            }),
        ),
        (
            "events out of order",
            edited("event", 1, &|e| e["seq"] = json!(1)),
        ),
    ];
    // The same export, edited to change nothing, passes every check (its
    // ids are taken here: 409): the edits above are what is refused.
    let (same, _) = edited("message", 0, &|_| {});
    let (status, problem) = import(&app.client, &app, "", &same).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("import_conflict")),
        "{problem}"
    );
    // A `last_seq` is found wrong at the first row past it.
    let meanings = meanings
        .map(|(name, (body, line))| (name, body, if name.contains("before") { 0 } else { line }));
    for (name, body, line) in meanings.into_iter().chain([
        ("cut short", cut.clone(), lines.len()),
        ("a running turn", running.replacen("s-bad", "s-new", 1), 3),
        ("an unknown field", unknown, 0),
        ("a stranger's turn", stranger, 0),
        ("another version", version, 1),
        ("not JSON", "{".to_owned(), 1),
        ("empty", String::new(), 1),
    ]) {
        let (status, problem) = import(&app.client, &app, "", &body).await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (422, Some("invalid_import")),
            "{name}: {problem}"
        );
        let detail = problem["detail"].as_str().unwrap_or_default();
        if line > 0 {
            assert!(
                detail.starts_with(&format!("line {line}:")),
                "{name}: {detail}"
            );
        }
    }
    let left = app.db.rows_naming(&["s-new".to_owned()]).await;
    assert!(left.values().all(|count| *count == 0), "{left:?}");
    let (status, problem) = import(&app.client, &app, "", &exported).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("session_exists"))
    );
    // The same rows under another id: its turns' ids are taken here.
    let (status, problem) = import(&app.client, &app, "", &renamed).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("import_conflict")),
        "{problem}"
    );
    let left = app.db.rows_naming(&["s-new".to_owned()]).await;
    assert!(left.values().all(|count| *count == 0), "{left:?}");
    let response = app
        .client
        .post(app.url("/sessions/import"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 415);
    // A session named `import` is still a session.
    assert_eq!(
        app.post_turn("import", json!({"message": "Hi."}))
            .await
            .status(),
        200
    );
    let (status, session) = app.get_json("/sessions/import").await;
    assert_eq!((status, &session["session_id"]), (200, &json!("import")));
    let erased = app
        .client
        .delete(app.url("/sessions/import"))
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), 204);
}

/// With keys: a tenant exports its own session only (another's is the
/// never-made 404, in the audit trail); a running one is 409; only an
/// admin key imports, for the tenant it names.
async fn a_tenant_exports_its_own_and_an_admin_imports(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let mut app = crate::edge::admin::keyed_app(backend, vault.path()).await;
    let (acme, globex, ops) = (
        client_with_key("ah_acme"),
        client_with_key("ah_globex"),
        client_with_key("ah_ops"),
    );
    app.client = acme.clone();
    a_full_session(&app, "acme", "s-acme").await;
    let (status, exported) = export(&acme, &app, "s-acme").await;
    assert_eq!(status, 200);
    assert!(!exported.contains("acme/"), "no stored key: {exported}");

    let (status, body) = export(&globex, &app, "s-acme").await;
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (status, problem["code"].as_str()),
        (404, Some("session_not_found"))
    );
    let (_, rows) = {
        let response = ops
            .get(app.url("/audit?kind=refused.other_tenant"))
            .send()
            .await
            .unwrap();
        (response.status(), response.json::<Value>().await.unwrap())
    };
    assert_eq!(rows["audit"][0]["tenant"], "acme", "{rows}");
    assert_eq!(
        rows["audit"][0]["outcome"], "GET by tenant globex",
        "{rows}"
    );

    let (status, problem) = import(&acme, &app, "?tenant=globex", &exported).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (403, Some("admin_required"))
    );
    // Erased here, the session comes back for Globex, whole; an import is
    // no new activity: Globex's endpoint is sent none of its events.
    let erased = acme
        .delete(app.url("/sessions/s-acme"))
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), 204);
    let hook = globex
        .post(app.url("/webhooks"))
        .json(&json!({"url": "http://127.0.0.1:9/g", "events": ["turn.completed"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(hook.status(), 201);
    let hook: Value = hook.json().await.unwrap();
    let (status, made) = import(&ops, &app, "?tenant=globex", &exported).await;
    assert_eq!(status, 201, "{made}");
    let deliveries = format!("/webhooks/{}/deliveries", hook["id"].as_str().unwrap());
    let listed = globex.get(app.url(&deliveries)).send().await.unwrap();
    let listed: Value = listed.json().await.unwrap();
    assert_eq!(listed["deliveries"], json!([]), "{listed}");
    let (status, again) = export(&globex, &app, "s-acme").await;
    assert_eq!(status, 200);
    assert_eq!(without_local(&again), without_local(&exported));
    let (status, _) = export(&acme, &app, "s-acme").await;
    assert_eq!(status, 404);

    // A running turn: not exported.
    app.client = globex.clone();
    let mut stream = app
        .post_turn_sse("s-acme", json!({"message": "Change my note."}))
        .await;
    stream.read_until("approval.requested").await;
    let (status, body) = export(&globex, &app, "s-acme").await;
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("turn_running"))
    );
}

on_both_backends!(
    a_bad_import_writes_nothing,
    a_tenant_exports_its_own_and_an_admin_imports,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_carried_between_backends() {
    an_export_carried_between_backends_exports_the_same_bytes().await;
}

/// An app whose turns are judged (two judges), their memories extracted
/// and observed by the research learner: every side call answered by the
/// fake provider, told apart by its system prompt.
async fn judged_app(backend: Backend) -> TestApp {
    let provider = crate::fake_provider::FakeProvider::start().await;
    provider.respond_with(std::sync::Arc::new(|body: &Value| {
        let system = body["messages"][0]["content"].to_string();
        if system.contains("You are an evaluator") {
            crate::fake_provider::Reply::openai_text(r#"{"score": 0.8, "rationale": "Fine."}"#)
        } else if system.contains("You keep a memory") {
            crate::fake_provider::Reply::openai_text(
                r#"{"memories": [{"kind": "fact", "key": "home", "content": "Lives in Lyon."}]}"#,
            )
        } else {
            crate::fake_provider::Reply::openai_text("Noted.")
        }
    }));
    let mut settings = crate::helpers::test_settings(&provider);
    settings.server.allow_local_admin = true;
    settings.memory.extraction = true;
    settings.memory.research_learner = true;
    settings.harness.prompt_id = Some("support".into());
    settings.harness.prompt_version = Some("3".into());
    settings.judges.list = Some(
        json!([
            {"name": "relevance", "criteria": "On topic.", "threshold": 0.5},
            {"name": "tone", "criteria": "Polite.", "threshold": 0.5}
        ])
        .to_string()
        .parse()
        .unwrap(),
    );
    crate::helpers::spawn_app_with(
        crate::support::TestDb::new(backend).await,
        provider,
        settings,
    )
    .await
}

/// Two turns of `session`, each judged twice, its memories extracted and
/// observed; returns once every job ended and the four judgements are on
/// the session's log.
async fn a_judged_session(app: &TestApp, session: &str) {
    for message in ["I live in Lyon.", "What is the weather like?"] {
        let response = app
            .post_turn(session, json!({"message": message, "user_id": "ann"}))
            .await;
        assert_eq!(response.status(), 200);
    }
    let mut last = (Vec::new(), 0);
    for _ in 0..400 {
        let (_, jobs) = app.get_json(&format!("/sessions/{session}/jobs")).await;
        let jobs = jobs["jobs"].as_array().cloned().unwrap_or_default();
        let (_, log) = app.get_json(&format!("/sessions/{session}/events")).await;
        let judged = log["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "judgement")
            .count();
        if jobs.iter().all(|j| j["status"] == "done") && jobs.len() >= 6 && judged == 4 {
            return;
        }
        last = (jobs, judged);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the session's jobs did not end: {last:?}");
}

/// A judged session (issue 63): its judgements' events are the session's
/// (the nil UUID), so its export imports. SQLite to Postgres and back,
/// the same bytes but the local fields; an export as older versions wrote
/// it (a judgement's event under a UUID that names no turn) imports too,
/// and reads as the session's. Before, every import of it was 422.
async fn a_judged_session_carried_between_backends(from: Backend, to: Backend) {
    let first = judged_app(from).await;
    a_judged_session(&first, "s-judged").await;
    let (status, exported) = export(&first.client, &first, "s-judged").await;
    assert_eq!(status, 200, "{exported}");
    let events: Vec<Value> = exported
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|line| line["type"] == "event" && line["event"] == "judgement")
        .collect();
    assert_eq!(events.len(), 4, "{exported}");
    for event in &events {
        assert_eq!(event["turn_id"], "00000000-0000-0000-0000-000000000000");
    }
    for kind in ["\"type\":\"judgement\"", "\"type\":\"observation\""] {
        assert!(exported.contains(kind), "{kind}: {exported}");
    }
    // The session's log says the same: no judgement is a turn's.
    let (_, log) = first.get_json("/sessions/s-judged/events").await;
    for event in log["events"].as_array().unwrap() {
        let session_own = event["turn_id"] == "00000000-0000-0000-0000-000000000000";
        assert_eq!(session_own, event["type"] == "judgement", "{event}");
    }

    let second = judged_app(to).await;
    let (status, made) = import(&second.client, &second, "", &exported).await;
    assert_eq!(status, 201, "{made}");
    let (_, again) = export(&second.client, &second, "s-judged").await;
    assert_eq!(without_local(&again), without_local(&exported));

    // As an older version wrote it: each judgement's event under a fresh
    // UUID. It imports, as the session's.
    let mut older = exported.clone();
    for _ in &events {
        older = older.replacen(
            "\"turn_id\":\"00000000-0000-0000-0000-000000000000\"",
            &format!("\"turn_id\":\"{}\"", uuid::Uuid::now_v7()),
            1,
        );
    }
    assert!(!older.contains("00000000-0000-0000-0000-000000000000"));
    let third = judged_app(from).await;
    let (status, made) = import(&third.client, &third, "", &older).await;
    assert_eq!(status, 201, "{made}");
    let (_, back) = export(&third.client, &third, "s-judged").await;
    assert_eq!(without_local(&back), without_local(&exported));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_judged_session_from_sqlite_to_postgres_and_back() {
    if !postgres_or_skip().await {
        return;
    }
    a_judged_session_carried_between_backends(Backend::Sqlite, Backend::Postgres).await;
    a_judged_session_carried_between_backends(Backend::Postgres, Backend::Sqlite).await;
}
