//! `/mcp` as MCP 2026-07-28 speaks it: no handshake, `_meta` and the
//! `Mcp-Method`/`Mcp-Name` headers on every request, `server/discover`,
//! and `ask` as a task (the turn) for a client that declares the tasks
//! extension. The official conformance suite checks the wire in
//! `.ci/run` (`scripts/mcp_conformance_check.py`); here the behaviour.

use std::time::Duration;

use serde_json::{Value, json};

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, spawn_app, spawn_app_with, test_settings},
    on_both_backends,
    support::{Backend, TestDb},
};

const VERSION: &str = "2026-07-28";

/// The `_meta` of a request; `tasks` declares the tasks extension.
fn meta(tasks: bool) -> Value {
    let capabilities = if tasks {
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
    } else {
        json!({})
    };
    json!({
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    })
}

/// A request with the headers 2026-07-28 asks for; `name` is `Mcp-Name`.
pub(crate) async fn request(
    app: &TestApp,
    key: Option<&str>,
    method: &str,
    name: Option<&str>,
    mut params: Value,
    tasks: bool,
) -> (u16, Value) {
    params["_meta"] = meta(tasks);
    let mut request = app
        .client
        .post(app.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", VERSION)
        .header("mcp-method", method)
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}));
    if let Some(name) = name {
        request = request.header("mcp-name", name);
    }
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// A request of the handshake versions (no `_meta`, no version header),
/// by the caller of `key`, and its JSON answer.
async fn legacy(app: &TestApp, key: Option<&str>, method: &str, params: Value) -> Value {
    let mut request = app
        .client
        .post(app.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.unwrap().json().await.unwrap()
}

/// `ask` of "Hi" in `session`, by the caller of `key`.
async fn ask(app: &TestApp, key: Option<&str>, session: &str, tasks: bool) -> (u16, Value) {
    let params = json!({"name": "ask", "arguments": {"message": "Hi", "session_id": session}});
    request(app, key, "tools/call", Some("ask"), params, tasks).await
}

/// `tasks/get` or `tasks/cancel` of `task_id`, by the caller of `key`.
async fn on_task(app: &TestApp, key: Option<&str>, method: &str, task_id: &str) -> (u16, Value) {
    let params = json!({"taskId": task_id});
    request(app, key, method, Some(task_id), params, true).await
}

async fn a_2026_client_discovers_lists_and_asks(backend: Backend) {
    let app = spawn_app(backend).await;
    let (status, discovered) = request(&app, None, "server/discover", None, json!({}), false).await;
    assert_eq!(status, 200, "{discovered}");
    let result = &discovered["result"];
    assert!(
        result["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!(VERSION)),
        "{result}"
    );
    assert!(result["capabilities"]["tools"].is_object(), "{result}");
    assert!(
        result["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"].is_object(),
        "{result}"
    );
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "agent-harness"
    );

    let (_, listed) = request(&app, None, "tools/list", None, json!({}), false).await;
    let result = &listed["result"];
    assert_eq!(result["resultType"], "complete");
    assert!(
        result["ttlMs"].is_u64() && result["cacheScope"].is_string(),
        "{result}"
    );
    let names: Vec<&str> = result["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["list_sessions", "get_session", "ask"]);

    // Without the tasks extension, `ask` answers when its turn ends.
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let (status, asked) = ask(&app, None, "s-2026", false).await;
    assert_eq!(status, 200, "{asked}");
    let result = &asked["result"];
    assert_eq!(result["resultType"], "complete", "{asked}");
    assert_eq!(
        result["content"][0]["text"],
        "Hello! How can I help you today?"
    );
    assert_eq!(result["structuredContent"]["session_id"], "s-2026");
    // ... and holds every field `ask`'s output schema requires, of its type.
    let schema = &listed["result"]["tools"][2]["outputSchema"];
    for field in schema["required"].as_array().unwrap() {
        let field = field.as_str().unwrap();
        let value = &result["structuredContent"][field];
        let kind = match value {
            Value::String(_) => "string",
            Value::Array(_) => "array",
            other => panic!("{field}: {other}"),
        };
        assert_eq!(schema["properties"][field]["type"], kind, "{field}");
    }
    let (status, session) = app.get_json("/sessions/s-2026").await;
    assert_eq!((status, &session["turn_count"]), (200, &json!(1)));
}

async fn headers_and_meta_that_disagree_are_refused(backend: Backend) {
    let app = spawn_app(backend).await;
    // Mcp-Name names another tool than the body.
    let (status, refused) = request(
        &app,
        None,
        "tools/call",
        Some("get_session"),
        json!({"name": "list_sessions", "arguments": {}}),
        false,
    )
    .await;
    assert_eq!((status, &refused["error"]["code"]), (400, &json!(-32020)));
    // No `_meta`: invalid params, 400.
    let response = app
        .client
        .post(app.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", VERSION)
        .header("mcp-method", "tools/list")
        .json(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let refused: Value = response.json().await.unwrap();
    assert_eq!(
        (&refused["error"]["code"], &refused["id"]),
        (&json!(-32602), &json!(3))
    );
    // A progress token is bounded as an id is (issue 63: a 100 KB token
    // came back on every progress frame).
    let long = "t".repeat(100_000);
    let params = json!({"name": "ask", "arguments": {"message": "Hi"},
                        "_meta": {"progressToken": long}});
    let mut params_with_meta = params.clone();
    for (key, value) in meta(false).as_object().unwrap() {
        params_with_meta["_meta"][key] = value.clone();
    }
    let response = app
        .client
        .post(app.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", VERSION)
        .header("mcp-method", "tools/call")
        .header("mcp-name", "ask")
        .json(
            &json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": params_with_meta}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let refused: Value = response.json().await.unwrap();
    assert_eq!(
        (&refused["error"]["code"], &refused["id"]),
        (&json!(-32600), &Value::Null)
    );
    // The handshake is gone in 2026-07-28: 404, method not found.
    let (status, refused) = request(&app, None, "initialize", None, json!({}), false).await;
    assert_eq!((status, &refused["error"]["code"]), (404, &json!(-32601)));
    assert!(app.provider.requests().is_empty(), "no turn began");
}

/// Polls `tasks/get` until the task leaves `working`.
async fn settled(app: &TestApp, key: Option<&str>, task_id: &str) -> Value {
    for _ in 0..200 {
        let (status, got) = on_task(app, key, "tasks/get", task_id).await;
        assert_eq!(status, 200, "{got}");
        if got["result"]["status"] != "working" {
            return got["result"].clone();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("task {task_id} still working");
}

async fn ask_is_a_task_that_is_the_turn(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider
        .enqueue([Reply::sse("openai/text.sse").pace(Duration::from_millis(20))]);
    let (status, created) = ask(&app, None, "s-task", true).await;
    assert_eq!(status, 200, "{created}");
    let result = &created["result"];
    assert_eq!(result["resultType"], "task", "{created}");
    assert_eq!(result["status"], "working");
    let task_id = result["taskId"].as_str().unwrap().to_owned();
    // The task is the session's turn.
    let (status, turn) = app
        .get_json(&format!("/sessions/s-task/turns/{task_id}"))
        .await;
    assert_eq!(status, 200, "{turn}");

    let done = settled(&app, None, &task_id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["content"][0]["text"],
        "Hello! How can I help you today?"
    );
    assert_eq!(done["result"]["isError"], false);

    // An unknown task, or one that is not a uuid: invalid params.
    for unknown in [uuid::Uuid::now_v7().to_string(), "nope".to_owned()] {
        let (_, refused) = on_task(&app, None, "tasks/get", &unknown).await;
        assert_eq!(refused["error"]["code"], -32602, "{refused}");
    }
    // Cancelling a task that ended is an empty ack.
    let (status, ack) = on_task(&app, None, "tasks/cancel", &task_id).await;
    assert_eq!(
        (status, &ack["result"]["resultType"]),
        (200, &json!("complete"))
    );
}

async fn a_task_cancelled_ends_its_turn_cancelled(backend: Backend) {
    let app = spawn_app(backend).await;
    let gate = tokio_util::sync::CancellationToken::new();
    app.provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(2, &gate)]);
    let (_, created) = ask(&app, None, "s-cancel", true).await;
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let (status, ack) = on_task(&app, None, "tasks/cancel", &task_id).await;
    assert_eq!(
        (status, &ack["result"]["resultType"]),
        (200, &json!("complete"))
    );
    let done = settled(&app, None, &task_id).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    let (_, turn) = app
        .get_json(&format!("/sessions/s-cancel/turns/{task_id}"))
        .await;
    assert_eq!(turn["status"], "cancelled");
}

async fn another_tenants_task_does_not_exist(backend: Backend) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.auth = harness_core::config::AuthMode::On;
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    crate::edge::tenants::make_keys(
        &app,
        &[
            ("k-acme", "acme", "ah_acme"),
            ("k-globex", "globex", "ah_globex"),
        ],
    )
    .await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let (_, created) = ask(&app, Some("ah_acme"), "s-mine", true).await;
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let done = settled(&app, Some("ah_acme"), &task_id).await;
    assert_eq!(done["status"], "completed");
    for method in ["tasks/get", "tasks/cancel"] {
        let (_, refused) = on_task(&app, Some("ah_globex"), method, &task_id).await;
        assert_eq!(refused["error"]["code"], -32602, "{method}: {refused}");
        assert_eq!(refused["error"]["message"], "task not found");
    }
    let (_, theirs) = request(
        &app,
        Some("ah_globex"),
        "tools/call",
        Some("list_sessions"),
        json!({"name": "list_sessions", "arguments": {}}),
        false,
    )
    .await;
    assert_eq!(theirs["result"]["structuredContent"]["sessions"], json!([]));
}

/// The caller's notes are resources in both versions: listed, read, and
/// their paths completed; a note that is not there is not found.
async fn vault_notes_are_resources_in_both_versions(backend: Backend) {
    let vault = crate::helpers::vault_of(&[
        ("notes/paris.md", "# Paris\n\nThe Louvre.\n"),
        ("notes/rome.md", "# Rome\n"),
    ]);
    let app = crate::helpers::spawn_app_with_vault(backend, vault.path()).await;
    // 2025-11-25 (no `_meta`, no version header: the handshake versions).
    let listed: Value = legacy(&app, None, "resources/list", json!({})).await;
    let uris: Vec<&str> = listed["result"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    assert_eq!(uris, ["vault:///notes/paris.md", "vault:///notes/rome.md"]);
    let read: Value = legacy(
        &app,
        None,
        "resources/read",
        json!({"uri": "vault:///notes/paris.md"}),
    )
    .await;
    assert_eq!(
        read["result"]["contents"][0]["text"],
        "# Paris\n\nThe Louvre.\n"
    );
    let missing: Value = legacy(
        &app,
        None,
        "resources/read",
        json!({"uri": "vault:///notes/oslo.md"}),
    )
    .await;
    assert_eq!(missing["error"]["code"], -32002, "{missing}");
    assert_eq!(missing["error"]["data"]["uri"], "vault:///notes/oslo.md");

    // 2026-07-28: the same, with caching hints; not found is invalid params.
    let (_, listed) = request(&app, None, "resources/list", None, json!({}), false).await;
    assert_eq!(
        listed["result"]["resources"][1]["uri"],
        "vault:///notes/rome.md"
    );
    assert!(listed["result"]["ttlMs"].is_u64(), "{listed}");
    let escape = "vault:///../outside.md";
    let (_, refused) = request(
        &app,
        None,
        "resources/read",
        Some(escape),
        json!({"uri": escape}),
        false,
    )
    .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let (_, completed) = request(
        &app,
        None,
        "completion/complete",
        None,
        json!({
            "ref": {"type": "ref/resource", "uri": "vault:///{+path}"},
            "argument": {"name": "path", "value": "notes/p"},
        }),
        false,
    )
    .await;
    assert_eq!(
        completed["result"]["completion"]["values"],
        json!(["notes/paris.md"]),
        "{completed}"
    );
}

/// Resources are the caller's own: another tenant's note and transcript
/// are not listed, not read and not completed, in either version, and
/// the answer is the one for a note that was never written.
async fn another_tenants_notes_and_transcripts_are_not_resources(backend: Backend) {
    let vault = crate::helpers::vault_of(&[("notes/a.md", "# A\n\nThe operator's plans.\n")]);
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.auth = harness_core::config::AuthMode::On;
    settings.vault.dir = vault.path().to_owned();
    let mut app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    crate::edge::tenants::make_keys(
        &app,
        &[
            ("k-acme", "acme", "ah_acme"),
            ("k-globex", "globex", "ah_globex"),
        ],
    )
    .await;
    app.client = crate::edge::tenants::client_with_key("ah_acme");
    let plan = json!({"path": "notes/plan.md", "content": "# Plan\n\nAcme goes to Paris."});
    let (finished, _) = app.call_tool("write_note", plan).await;
    assert_eq!(finished["status"], "completed", "{finished}");
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let (_, created) = ask(&app, Some("ah_acme"), "s-acme", false).await;
    assert!(created["result"]["content"].is_array(), "{created}");
    let (_, mine) = request(
        &app,
        Some("ah_acme"),
        "resources/list",
        None,
        json!({}),
        false,
    )
    .await;
    assert_eq!(
        mine["result"]["resources"][0]["uri"], "vault:///notes/plan.md",
        "{mine}"
    );

    app.client = reqwest::Client::new();
    let listed: Value = legacy(&app, Some("ah_globex"), "resources/list", json!({})).await;
    assert_eq!(listed["result"]["resources"], json!([]), "{listed}");
    let (_, listed) = request(
        &app,
        Some("ah_globex"),
        "resources/list",
        None,
        json!({}),
        false,
    )
    .await;
    assert_eq!(listed["result"]["resources"], json!([]), "{listed}");
    for uri in [
        "vault:///notes/plan.md",
        "vault:///notes/a.md",
        "vault:///.tenants/acme/notes/plan.md",
        "session:///s-acme",
    ] {
        let read: Value = legacy(
            &app,
            Some("ah_globex"),
            "resources/read",
            json!({"uri": uri}),
        )
        .await;
        assert!(read["error"]["code"].is_i64(), "{uri}: {read}");
        assert!(!read.to_string().contains("Paris"), "{read}");
        let (_, read) = request(
            &app,
            Some("ah_globex"),
            "resources/read",
            Some(uri),
            json!({"uri": uri}),
            false,
        )
        .await;
        assert_eq!(read["error"]["code"], -32602, "{uri}: {read}");
        assert!(!read.to_string().contains("Paris"), "{read}");
    }
    let never: Value = legacy(
        &app,
        Some("ah_globex"),
        "resources/read",
        json!({"uri": "session:///s-never"}),
    )
    .await;
    let theirs: Value = legacy(
        &app,
        Some("ah_globex"),
        "resources/read",
        json!({"uri": "session:///s-acme"}),
    )
    .await;
    assert_eq!(
        never["error"]["message"],
        theirs["error"]["message"]
            .as_str()
            .unwrap()
            .replace("s-acme", "s-never"),
        "{theirs}"
    );
    let complete = json!({
        "ref": {"type": "ref/resource", "uri": "vault:///{+path}"},
        "argument": {"name": "path", "value": "notes/"},
    });
    let completed: Value = legacy(
        &app,
        Some("ah_globex"),
        "completion/complete",
        complete.clone(),
    )
    .await;
    assert_eq!(
        completed["result"]["completion"]["values"],
        json!([]),
        "{completed}"
    );
    let (_, completed) = request(
        &app,
        Some("ah_globex"),
        "completion/complete",
        None,
        complete,
        false,
    )
    .await;
    assert_eq!(
        completed["result"]["completion"]["values"],
        json!([]),
        "{completed}"
    );
    // A listen of Globex's on the path of Acme's note follows Globex's own
    // (none): Acme's writes say nothing to it.
    let mut params =
        json!({"notifications": {"resourceSubscriptions": ["vault:///notes/plan.md"]}});
    params["_meta"] = meta(false);
    let response = app
        .client
        .post(app.url("/mcp"))
        .bearer_auth("ah_globex")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", VERSION)
        .header("mcp-method", "subscriptions/listen")
        .json(
            &json!({"jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen", "params": params}),
        )
        .send()
        .await
        .unwrap();
    let mut stream = crate::helpers::SseStream::new(response).await;
    let acknowledged = stream.next().await.unwrap().json();
    assert_eq!(
        acknowledged["method"],
        "notifications/subscriptions/acknowledged"
    );
    let acme_note = vault.path().join(".tenants/acme/notes/plan.md");
    for n in 0..3 {
        std::fs::write(&acme_note, format!("# Plan\n\nAcme goes to Rome, {n}.")).unwrap();
        let said = tokio::time::timeout(Duration::from_millis(1200), stream.next()).await;
        assert!(said.is_err(), "{:?}", said.map(|e| e.map(|e| e.json())));
    }
}

/// The operator's agent profiles are prompts in both versions: listed
/// with their arguments, got with the caller's values in their text, an
/// argument completed from the values the operator lists; a missing
/// required argument, an unknown one and an unknown prompt are invalid
/// params. Without profiles, the one `research` profile is offered.
async fn agent_profiles_are_prompts_in_both_versions(backend: Backend) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.agent_profiles = Some(
        r#"[{"name": "trip", "title": "Plan a trip", "text": "Plan {{days}} days in {{city}}.",
             "arguments": [{"name": "city", "required": true, "values": ["Paris", "Prague", "Rome"]},
                           {"name": "days", "description": "How long"}]}]"#
            .parse()
            .unwrap(),
    );
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    let listed: Value = legacy(&app, None, "prompts/list", json!({})).await;
    let prompt = &listed["result"]["prompts"][0];
    assert_eq!(prompt["name"], "trip", "{listed}");
    assert_eq!(
        prompt["arguments"][0],
        json!({"name": "city", "required": true})
    );
    assert_eq!(prompt["arguments"][1]["description"], "How long");
    let got: Value = legacy(
        &app,
        None,
        "prompts/get",
        json!({"name": "trip", "arguments": {"city": "Lyon", "days": "3"}}),
    )
    .await;
    assert_eq!(
        got["result"]["messages"][0],
        json!({"role": "user", "content": {"type": "text", "text": "Plan 3 days in Lyon."}})
    );
    for params in [
        json!({"name": "trip", "arguments": {"days": "3"}}),
        json!({"name": "trip", "arguments": {"city": "Lyon", "budget": "low"}}),
        json!({"name": "trip", "arguments": {"city": 3}}),
        json!({"name": "nowhere"}),
    ] {
        let refused: Value = legacy(&app, None, "prompts/get", params.clone()).await;
        assert_eq!(refused["error"]["code"], -32602, "{params}: {refused}");
    }

    let (_, listed) = request(&app, None, "prompts/list", None, json!({}), false).await;
    assert_eq!(
        listed["result"]["prompts"][0]["title"], "Plan a trip",
        "{listed}"
    );
    assert!(listed["result"]["ttlMs"].is_u64(), "{listed}");
    let (_, got) = request(
        &app,
        None,
        "prompts/get",
        Some("trip"),
        json!({"name": "trip", "arguments": {"city": "Rome"}}),
        false,
    )
    .await;
    assert_eq!(
        got["result"]["messages"][0]["content"]["text"],
        "Plan  days in Rome."
    );
    let (_, refused) = request(
        &app,
        None,
        "prompts/get",
        Some("trip"),
        json!({"name": "trip", "arguments": {}}),
        false,
    )
    .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let (_, completed) = request(
        &app,
        None,
        "completion/complete",
        None,
        json!({"ref": {"type": "ref/prompt", "name": "trip"},
               "argument": {"name": "city", "value": "p"}}),
        false,
    )
    .await;
    assert_eq!(
        completed["result"]["completion"]["values"],
        json!(["Paris", "Prague"]),
        "{completed}"
    );
    let (_, discovered) = request(&app, None, "server/discover", None, json!({}), false).await;
    assert!(
        discovered["result"]["capabilities"]["prompts"].is_object(),
        "{discovered}"
    );

    let plain = spawn_app(backend).await;
    let (_, listed) = request(&plain, None, "prompts/list", None, json!({}), false).await;
    let names: Vec<&str> = listed["result"]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["research"]);
}

/// The task is the turn, so it outlives its replica: a task begun on one
/// service that stops mid-answer is taken over when the service starts
/// again on the same database, and `tasks/get` there reads it to its end.
async fn a_task_outlives_the_replica_it_began_on(backend: Backend) {
    let provider = FakeProvider::start().await;
    let settings = test_settings(&provider);
    let mut first = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    let never = tokio_util::sync::CancellationToken::new();
    first
        .provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(3, &never)]);
    let (_, created) = ask(&first, None, "s-durable", true).await;
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let (_, working) = on_task(&first, None, "tasks/get", &task_id).await;
    assert_eq!(working["result"]["status"], "working", "{working}");
    first.stop().await;

    let db = std::mem::replace(&mut first.db, TestDb::new(backend).await);
    drop(first);
    let provider = FakeProvider::start().await;
    provider.enqueue([Reply::sse("openai/text.sse")]);
    let settings = test_settings(&provider);
    let second = spawn_app_with(db, provider, settings).await;
    let done = settled(&second, None, &task_id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["content"][0]["text"], "Hello! How can I help you today?",
        "{done}"
    );
    never.cancel();
}

/// An app whose note writes wait for a person, its vault in `vault`, its
/// model asking to write a note and then answering.
async fn app_asking_approval(backend: Backend, vault: &std::path::Path) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.harness.approval_required = Some("LOCAL_WRITE".parse().unwrap());
    settings.vault.dir = vault.to_owned();
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    app.provider.enqueue([
        Reply::openai_tool_call(
            "call_w1",
            "write_note",
            &json!({"path": "notes/plan.md", "content": "# Plan"}),
        ),
        Reply::sse("openai/text.sse"),
    ]);
    app
}

/// `ask` again with an input-required result's `requestState` and the
/// responses to its requests.
async fn answer(app: &TestApp, state: &Value, responses: Value) -> Value {
    let params = json!({
        "name": "ask",
        "arguments": {"message": "Hi", "session_id": "s-approve"},
        "inputResponses": responses,
        "requestState": state,
    });
    request(app, None, "tools/call", Some("ask"), params, false)
        .await
        .1
}

/// A turn that waits for a person's approval answers `ask` with an
/// input-required result (an elicitation per waiting call, keyed by its
/// id); `ask` again with its `requestState` and an accepting response
/// decides the call and answers the turn's end. A `requestState` that is
/// not the caller's turn is refused; a response missing or cancelled asks
/// again. (Before, the call waited until the turn's deadline.)
async fn a_call_waiting_for_approval_is_an_input_required_result(backend: Backend) {
    let vault = crate::helpers::vault_of(&[]);
    let app = app_asking_approval(backend, vault.path()).await;
    let (status, asked) = ask(&app, None, "s-approve", false).await;
    assert_eq!(status, 200, "{asked}");
    let result = &asked["result"];
    assert_eq!(result["resultType"], "input_required", "{asked}");
    let request = &result["inputRequests"]["call_w1"];
    assert_eq!(request["method"], "elicitation/create", "{asked}");
    assert_eq!(
        request["params"]["requestedSchema"]["required"],
        json!(["approve"])
    );
    let state = result["requestState"].clone();
    let (_, session) = app.get_json("/sessions/s-approve").await;
    assert_eq!(state, session["running_turn_id"], "the state is the turn");

    for forged in [
        json!("not-a-turn"),
        json!("0190a5c4-0000-7000-8000-000000000000"),
    ] {
        let refused = answer(&app, &forged, json!({})).await;
        assert_eq!(refused["error"]["code"], -32602, "{forged}: {refused}");
    }
    for undecided in [json!({}), json!({"call_w1": {"action": "cancel"}})] {
        let again = answer(&app, &state, undecided.clone()).await;
        assert_eq!(
            again["result"]["resultType"], "input_required",
            "{undecided}: {again}"
        );
        assert!(again["result"]["inputRequests"]["call_w1"].is_object());
    }
    assert!(
        !vault.path().join("notes/plan.md").exists(),
        "nothing ran yet"
    );
    // The form's `arguments` edits the call: text that is not JSON, or
    // arguments the tool's schema refuses, are invalid params, and the
    // call waits on.
    assert!(
        request["params"]["requestedSchema"]["properties"]["arguments"].is_object(),
        "{request}"
    );
    for bad in [json!("{not json"), json!(r#"{"path": "notes/plan.md"}"#)] {
        let refused = answer(
            &app,
            &state,
            json!({"call_w1": {"action": "accept",
                               "content": {"approve": true, "arguments": bad}}}),
        )
        .await;
        assert_eq!(refused["error"]["code"], -32602, "{bad}: {refused}");
    }
    let done = answer(
        &app,
        &state,
        json!({"call_w1": {"action": "accept", "content": {"approve": true,
            "arguments": r##"{"path": "notes/plan.md", "content": "# Edited"}"##}}}),
    )
    .await;
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    assert_eq!(
        done["result"]["content"][0]["text"],
        "Hello! How can I help you today?"
    );
    assert_eq!(
        std::fs::read_to_string(vault.path().join("notes/plan.md")).unwrap(),
        "# Edited"
    );
}

/// As a task: `tasks/get` says `input_required` with the requests, and
/// `tasks/update` answers them; a declined call is not run. A key that is
/// not an outstanding request is refused.
async fn a_task_waiting_for_approval_is_answered_with_tasks_update(backend: Backend) {
    let vault = crate::helpers::vault_of(&[]);
    let app = app_asking_approval(backend, vault.path()).await;
    let (_, created) = ask(&app, None, "s-approve", true).await;
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let mut got = Value::Null;
    for _ in 0..200 {
        got = on_task(&app, None, "tasks/get", &task_id).await.1;
        if got["result"]["status"] == "input_required" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(got["result"]["status"], "input_required", "{got}");
    assert!(
        got["result"]["inputRequests"]["call_w1"].is_object(),
        "{got}"
    );
    let update = |responses: Value| {
        let params = json!({"taskId": task_id, "inputResponses": responses});
        let app = &app;
        let task_id = task_id.clone();
        async move {
            request(app, None, "tasks/update", Some(&task_id), params, true)
                .await
                .1
        }
    };
    let stray = update(json!({"call_zz": {"action": "decline"}})).await;
    assert_eq!(stray["error"]["code"], -32602, "{stray}");
    let updated = update(json!({"call_w1": {"action": "decline"}})).await;
    assert!(updated.get("error").is_none(), "{updated}");
    // Decided: it asks no more, even before the turn takes the decision
    // up (and the same answer again is refused, as not outstanding).
    let (_, after) = on_task(&app, None, "tasks/get", &task_id).await;
    assert_ne!(after["result"]["status"], "input_required", "{after}");
    let again =
        update(json!({"call_w1": {"action": "accept", "content": {"approve": true}}})).await;
    assert_eq!(again["error"]["code"], -32602, "{again}");
    let done = settled(&app, None, &task_id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(
        !vault.path().join("notes/plan.md").exists(),
        "declined: not run"
    );
}

/// `subscriptions/listen`: the stream acknowledges the resources of this
/// server it follows (not another server's URI), then says when a
/// followed note changes and when the list of notes does; it stops with
/// the client.
async fn a_listen_says_when_a_followed_note_changes(backend: Backend) {
    let vault = crate::helpers::vault_of(&[("notes/a.md", "# A\n")]);
    let app = crate::helpers::spawn_app_with_vault(backend, vault.path()).await;
    let mut params = json!({"notifications": {
        "resourceSubscriptions": ["vault:///notes/a.md", "https://elsewhere.example/x"],
        "resourcesListChanged": true,
    }});
    params["_meta"] = meta(false);
    let response = app
        .client
        .post(app.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", VERSION)
        .header("mcp-method", "subscriptions/listen")
        .json(
            &json!({"jsonrpc": "2.0", "id": 5, "method": "subscriptions/listen", "params": params}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = crate::helpers::SseStream::new(response).await;
    let acknowledged = stream.next().await.unwrap().json();
    assert_eq!(
        acknowledged["method"], "notifications/subscriptions/acknowledged",
        "{acknowledged}"
    );
    assert_eq!(
        acknowledged["params"]["notifications"]["resourceSubscriptions"],
        json!(["vault:///notes/a.md"]),
        "{acknowledged}"
    );

    crate::helpers::note_changes_said(vault.path(), &mut stream).await;

    std::fs::write(vault.path().join("notes/b.md"), "# B\n").unwrap();
    let (status, _) = app.post_json("/vault/reindex").await;
    assert_eq!(status, 200);
    // The list was seen without b.md: this change is said (after, maybe,
    // more updates of a.md, whose write a look may have seen half done).
    let mut changed = Value::Null;
    for _ in 0..10 {
        let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(5), stream.next()).await
        else {
            break;
        };
        changed = event.json();
        if changed["method"] != "notifications/resources/updated" {
            break;
        }
    }
    assert_eq!(
        changed["method"], "notifications/resources/list_changed",
        "{changed}"
    );
}

/// Issue 63: a tenant holds at most 16 listens in a process (each looks
/// at its resources every second): the 17th is refused. (A listen looks
/// at each URI once, however often the client names it.)
async fn listens_are_bounded_per_tenant_and_uris_taken_once(backend: Backend) {
    let vault = crate::helpers::vault_of(&[("notes/a.md", "# A\n")]);
    let app = crate::helpers::spawn_app_with_vault(backend, vault.path()).await;
    let listen = || {
        let mut params = json!({"notifications": {
            "resourceSubscriptions": ["vault:///notes/a.md", "vault:///notes/a.md", "session:///s-x"],
        }});
        params["_meta"] = meta(false);
        app.client
            .post(app.url("/mcp"))
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", VERSION)
            .header("mcp-method", "subscriptions/listen")
            .json(&json!({"jsonrpc": "2.0", "id": 5, "method": "subscriptions/listen", "params": params}))
            .send()
    };
    let mut open = Vec::new();
    for n in 0..16 {
        let response = listen().await.unwrap();
        assert_eq!(response.status(), 200, "listen {n}");
        let mut stream = crate::helpers::SseStream::new(response).await;
        let acknowledged = stream.next().await.unwrap().json();
        assert_eq!(
            acknowledged["method"], "notifications/subscriptions/acknowledged",
            "{acknowledged}"
        );
        open.push(stream);
    }
    // Each listen has taken its place once its first look began.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let response = listen().await.unwrap();
    let text = tokio::time::timeout(Duration::from_secs(10), response.text())
        .await
        .expect("the 17th listen ends")
        .unwrap();
    assert!(text.contains("as many as it may"), "{text}");
    drop(open);
}

/// `get_session`'s `session_id` is mirrored into `Mcp-Param-Session-Id`
/// (SEP-2243): a header that matches the body is taken (an id that
/// names no session is "session not found", a tool error); one that
/// differs, or is missing while the body has the value, is refused.
async fn a_session_id_header_must_match_the_body(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, listed) = request(&app, None, "tools/list", None, json!({}), false).await;
    let get_session = &listed["result"]["tools"][1];
    assert_eq!(
        get_session["inputSchema"]["properties"]["session_id"]["x-mcp-header"], "Session-Id",
        "{get_session}"
    );
    let call = |header: Option<&'static str>, session: &'static str| {
        let mut params = json!({"name": "get_session", "arguments": {"session_id": session}});
        params["_meta"] = meta(false);
        let mut request = app
            .client
            .post(app.url("/mcp"))
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", VERSION)
            .header("mcp-method", "tools/call")
            .header("mcp-name", "get_session")
            .json(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params}));
        if let Some(header) = header {
            request = request.header("mcp-param-session-id", header);
        }
        async move {
            let response = request.send().await.unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        }
    };
    let (status, taken) = call(Some("s-none"), "s-none").await;
    assert_eq!(status, 200, "{taken}");
    assert_eq!(taken["result"]["isError"], true);
    assert_eq!(taken["result"]["content"][0]["text"], "session not found");
    let (status, odd) = call(Some("SGVsbG8="), "SGVsbG8=").await;
    assert_eq!(
        (status, &odd["result"]["isError"]),
        (200, &json!(true)),
        "{odd}"
    );
    for (header, body) in [(Some("s-other"), "s-none"), (None, "s-none")] {
        let (status, refused) = call(header, body).await;
        assert_eq!(status, 400, "{header:?}: {refused}");
        assert!(refused["error"]["code"].is_i64(), "{refused}");
    }
}

on_both_backends!(
    vault_notes_are_resources_in_both_versions,
    a_2026_client_discovers_lists_and_asks,
    headers_and_meta_that_disagree_are_refused,
    ask_is_a_task_that_is_the_turn,
    a_task_cancelled_ends_its_turn_cancelled,
    another_tenants_task_does_not_exist,
    another_tenants_notes_and_transcripts_are_not_resources,
    agent_profiles_are_prompts_in_both_versions,
    a_task_outlives_the_replica_it_began_on,
    a_call_waiting_for_approval_is_an_input_required_result,
    a_task_waiting_for_approval_is_answered_with_tasks_update,
    a_listen_says_when_a_followed_note_changes,
    listens_are_bounded_per_tenant_and_uris_taken_once,
    a_session_id_header_must_match_the_body,
);
