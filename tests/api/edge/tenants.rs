//! Tenants: everything a tenant's key makes is that tenant's, and session
//! ids are per tenant. Another tenant's key walks every operation of the
//! served OpenAPI document against it and finds nothing, changes nothing,
//! and cannot tell it from a session that never existed; a turn it posts
//! to the same id is a session of its own.

use crate::support::reply::JsonReply as _;
use std::time::Duration;

use reqwest::{Client, Method, header};
use serde_json::{Value, json};

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, spawn_app_with, test_settings, vault_of},
    on_both_backends,
    support::{Backend, TestDb},
};

const EXTRACTED: &str = r#"{"memories": [
  {"kind": "fact", "key": "home_city", "content": "The user lives in Lyon."}
]}"#;

/// A memory extraction that found nothing.
const NOTHING_EXTRACTED: &str = r#"{"memories": []}"#;

pub(crate) fn client_with_key(key: &str) -> Client {
    let mut headers = header::HeaderMap::new();
    headers.insert(
        header::AUTHORIZATION,
        header::HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
    );
    Client::builder().default_headers(headers).build().unwrap()
}

fn hash(key: &str) -> String {
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()))
}

/// Makes each (key id, tenant, key) in the app's store.
pub(crate) async fn make_keys(app: &TestApp, keys: &[(&str, &str, &str)]) {
    let store = app.db.open().await;
    for (id, tenant, key) in keys {
        store
            .create_api_key(id, tenant, &hash(key), false, chrono::Utc::now())
            .await
            .unwrap();
    }
}

/// What a request of the other tenant gets: a status and, for a problem,
/// its code.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// Not found, with this code.
    Missing(&'static str),
    /// Served: the route is not the tenant's data (probes, the contract,
    /// the page, the tool list, the shared vault).
    Open,
    /// Served, with nothing of the other tenant in it (memories: each
    /// tenant has its own scopes).
    Empty,
    /// Served: a turn of the other tenant's own session of that id.
    OwnSession,
    /// Nothing to serve (204): the running turn `useChat` resumes is not
    /// found, as for a chat that was never made.
    NoContent,
    /// The MCP server's tool answers "not found" (a tool error, as MCP
    /// says a tool's failure).
    McpNotFound,
    /// A2A's "task not found" (JSON-RPC error -32001).
    A2aNotFound,
    /// The agent card: open, and it names the keys' scheme.
    AgentCard,
    /// The caller's own tenant's usage and limits.
    OwnUsage,
    /// Made (201): the caller's own, nothing of the other's in it.
    Created,
    /// An admin route: a tenant's key is refused (403 `admin_required`).
    AdminOnly,
    /// The caller's own files: none of the other tenant's.
    OwnFiles,
}

/// One operation of the document, as the other tenant sends it.
struct Attempt {
    expect: Expect,
    body: Option<Value>,
    headers: Vec<(&'static str, String)>,
    /// Sent as an upload (a small text file) instead of `body`.
    upload: bool,
}

/// The attempt for each operation of the document; `None`: the test does
/// not know the operation (a new route must be added here).
fn attempt(method: &str, path: &str, session: &str, turn: &str, mcp: &str) -> Option<Attempt> {
    let simple = |expect| {
        Some(Attempt {
            expect,
            body: None,
            headers: Vec::new(),
            upload: false,
        })
    };
    let with_body = |expect, body: Value| {
        Some(Attempt {
            expect,
            body: Some(body),
            headers: Vec::new(),
            upload: false,
        })
    };
    let user_message = "What do you know about me?";
    match (method, path) {
        ("GET", "/" | "/healthz" | "/readyz" | "/metrics" | "/openapi.yaml" | "/tools") => {
            simple(Expect::Open)
        }
        ("POST", "/vault/reindex") => simple(Expect::Open),
        ("GET" | "DELETE", "/memories") => simple(Expect::Empty),
        ("DELETE", "/users/{user_id}") => simple(Expect::Missing("user_not_found")),
        ("DELETE", "/tenants/{tenant}") | ("GET", "/audit") | ("POST", "/sessions/import") => {
            simple(Expect::AdminOnly)
        }
        ("GET", "/sessions/{session_id}/export") | ("GET" | "DELETE", "/sessions/import") => {
            simple(Expect::Missing("session_not_found"))
        }
        ("GET", "/usage") => simple(Expect::OwnUsage),
        ("GET", "/webhooks") => simple(Expect::Empty),
        // Globex's own upload (the walk's) and nothing of Acme's.
        ("GET", "/files" | "/v1/files") => simple(Expect::OwnFiles),
        ("POST", "/files" | "/v1/files") => Some(Attempt {
            expect: Expect::Created,
            body: None,
            headers: Vec::new(),
            upload: true,
        }),
        (
            "GET" | "DELETE",
            "/files/{file_id}"
            | "/v1/files/{file_id}"
            | "/files/{file_id}/content"
            | "/v1/files/{file_id}/content",
        ) => simple(Expect::Missing("file_not_found")),
        ("POST", "/webhooks") => with_body(
            Expect::Created,
            json!({"url": "https://example.com/globex", "events": ["turn.completed"]}),
        ),
        ("GET" | "DELETE", "/webhooks/{webhook_id}")
        | ("GET", "/webhooks/{webhook_id}/deliveries") => {
            simple(Expect::Missing("webhook_not_found"))
        }
        ("POST", "/checkpoints/{checkpoint_id}/restore") => {
            simple(Expect::Missing("checkpoint_not_found"))
        }
        ("POST", "/sessions/{session_id}/turns") => {
            with_body(Expect::OwnSession, json!({"message": user_message}))
        }
        ("POST", "/sessions/{session_id}/turns/{turn_id}/regenerate") => {
            with_body(Expect::Missing("session_not_found"), json!({}))
        }
        ("POST", "/sessions/{session_id}/turns/{turn_id}/steer") => with_body(
            Expect::Missing("session_not_found"),
            json!({"message": "from another tenant"}),
        ),
        ("POST", "/sessions/{session_id}/fork") => with_body(
            Expect::Missing("session_not_found"),
            json!({"at_turn": turn}),
        ),
        ("POST", "/sessions/{session_id}/turns/{turn_id}/approvals/{call_id}") => with_body(
            Expect::Missing("session_not_found"),
            json!({"approve": true}),
        ),
        ("POST", "/sessions/{session_id}/turns/{turn_id}/tool-results/{call_id}") => with_body(
            Expect::Missing("session_not_found"),
            json!({"output": "from another tenant"}),
        ),
        (
            "GET",
            "/sessions/{session_id}"
            | "/sessions/{session_id}/artifacts/{artifact_id}"
            | "/sessions/{session_id}/checkpoints"
            | "/sessions/{session_id}/decisions"
            | "/sessions/{session_id}/events"
            | "/sessions/{session_id}/jobs"
            | "/sessions/{session_id}/messages"
            | "/sessions/{session_id}/observations"
            | "/sessions/{session_id}/turns/{turn_id}"
            | "/sessions/{session_id}/turns/{turn_id}/events"
            | "/sessions/{session_id}/turns/{turn_id}/judgements"
            | "/sessions/{session_id}/turns/{turn_id}/siblings",
        )
        | ("POST", "/sessions/{session_id}/turns/{turn_id}/cancel")
        | ("DELETE", "/sessions/{session_id}") => simple(Expect::Missing("session_not_found")),
        ("POST", "/v1/chat/completions") => Some(Attempt {
            expect: Expect::OwnSession,
            body: Some(json!({"messages": [{"role": "user", "content": user_message}]})),
            headers: vec![("x-session-id", session.to_owned())],
            upload: false,
        }),
        ("POST", "/v1/ui/chat") => with_body(
            Expect::OwnSession,
            json!({"id": session, "messages": [
                {"id": "m1", "role": "user", "parts": [{"type": "text", "text": user_message}]}
            ]}),
        ),
        ("GET", "/v1/ui/chat/{session_id}/stream") => simple(Expect::NoContent),
        (
            "GET" | "DELETE",
            "/v1/responses/{response_id}" | "/v1/responses/{response_id}/input_items",
        )
        | ("POST", "/v1/responses/{response_id}/cancel") => {
            simple(Expect::Missing("response_not_found"))
        }
        ("GET", "/.well-known/agent-card.json") => simple(Expect::AgentCard),
        ("GET", "/extendedAgentCard") => simple(Expect::Open),
        ("GET", "/tasks") => simple(Expect::Empty),
        // `POST` is sent as `/tasks/{id}:cancel` (see the walk).
        ("GET" | "POST", "/tasks/{id}") => simple(Expect::Missing("task_not_found")),
        (
            "GET" | "POST" | "DELETE",
            "/tasks/{id}/pushNotificationConfigs"
            | "/tasks/{id}/pushNotificationConfigs/{config_id}",
        ) => with_body(
            Expect::Missing("task_not_found"),
            json!({"url": "https://example.com/hook"}),
        ),
        ("POST", "/message:send" | "/message:stream") => with_body(
            Expect::OwnSession,
            json!({"message": {"messageId": "m1", "role": "ROLE_USER",
                   "parts": [{"text": user_message}], "contextId": session}}),
        ),
        ("GET", "/a2a/.well-known/agent-card.json") => simple(Expect::AgentCard),
        ("POST", "/a2a") => with_body(
            Expect::A2aNotFound,
            json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": turn}}),
        ),
        // Acme's MCP session (2025-11-25), which follows its note.
        ("GET", "/mcp") => Some(Attempt {
            expect: Expect::Missing("mcp_session_not_found"),
            body: None,
            headers: vec![("mcp-session-id", mcp.to_owned())],
            upload: false,
        }),
        ("POST", "/mcp") => with_body(
            Expect::McpNotFound,
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "get_session", "arguments": {"session_id": session}}}),
        ),
        ("POST", "/v1/responses") => with_body(
            Expect::OwnSession,
            json!({"input": user_message, "conversation": session}),
        ),
        ("POST", "/v1/agui") => with_body(
            Expect::OwnSession,
            json!({"threadId": session, "runId": "r1", "messages": [
                {"id": "m1", "role": "user", "content": user_message}
            ]}),
        ),
        _ => None,
    }
}

/// An MCP session (2025-11-25) of the app's client that follows a note.
async fn acme_mcp_session(app: &TestApp) -> String {
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}
    }});
    let response = app
        .client
        .post(app.url("/mcp"))
        .json(&initialize)
        .send()
        .await
        .unwrap();
    let mcp = response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let subscribe = json!({"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe",
                           "params": {"uri": "vault:///notes/a.md"}});
    let answer: Value = app
        .client
        .post(app.url("/mcp"))
        .header("mcp-session-id", &mcp)
        .json(&subscribe)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["result"], json!({}), "{answer}");
    mcp
}

/// Every (method, path template) of the served document.
fn operations() -> Vec<(String, String)> {
    let api = agent_harness::http::openapi();
    let mut operations = Vec::new();
    for (path, item) in &api.paths.paths {
        for (method, operation) in [
            ("GET", &item.get),
            ("POST", &item.post),
            ("PUT", &item.put),
            ("PATCH", &item.patch),
            ("DELETE", &item.delete),
        ] {
            if operation.is_some() {
                operations.push((method.to_owned(), path.clone()));
            }
        }
    }
    operations
}

struct Known {
    session: String,
    turn: String,
    call: String,
    artifact: String,
    checkpoint: String,
    response: String,
    webhook: String,
    file: String,
}

fn fill(template: &str, known: &Known) -> String {
    template
        .replace("{session_id}", &known.session)
        .replace("{turn_id}", &known.turn)
        .replace("{call_id}", &known.call)
        .replace("{artifact_id}", &known.artifact)
        .replace("{checkpoint_id}", &known.checkpoint)
        .replace("{response_id}", &known.response)
        .replace("{id}", &known.turn)
        .replace("{config_id}", "cfg-1")
        .replace("{webhook_id}", &known.webhook)
        .replace("{file_id}", &known.file)
        // Acme's user: Globex erasing them finds no one.
        .replace("{user_id}", "ann")
        // Acme itself: Globex's key may not erase it.
        .replace("{tenant}", "acme")
}

/// The path a walk sends for an operation: its template filled, with
/// what the template cannot say (a query, an action after the id).
fn concrete(method: &str, template: &str, known: &Known) -> String {
    let path = fill(template, known);
    match (method, template) {
        (_, "/memories") => "/memories?scope=user:ann".to_owned(),
        ("POST", "/tasks/{id}") => format!("{path}:cancel"),
        _ => path,
    }
}

async fn send(
    client: &Client,
    app: &TestApp,
    method: &str,
    path: &str,
    attempt: &Attempt,
) -> (u16, Value) {
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = client.request(method, app.url(path));
    for (name, value) in &attempt.headers {
        request = request.header(*name, value);
    }
    if let Some(body) = &attempt.body {
        request = request.json(body);
    }
    if attempt.upload {
        let (content_type, form) = crate::helpers::form(&[(
            "file",
            Some("globex.txt"),
            Some("text/plain"),
            b"globex's own",
        )]);
        request = request.header("content-type", content_type).body(form);
    }
    let response = tokio::time::timeout(Duration::from_secs(10), request.send())
        .await
        .unwrap_or_else(|_| panic!("{path} did not answer"))
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    // A stream of one event (an A2A streaming method's error) is read as
    // that event.
    let json = text
        .strip_prefix("data: ")
        .filter(|rest| rest.trim_end().lines().count() == 1)
        .unwrap_or(&text);
    (status, serde_json::from_str(json).unwrap_or(Value::Null))
}

async fn another_tenant_finds_nothing_on_any_route(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    // Acme writes in its own vault.
    let note = vault.path().join(".tenants/acme/notes/a.md");
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.auth = harness_core::config::AuthMode::On;
    settings.memory.extraction = true;
    settings.vault.dir = vault.path().to_owned();
    settings.harness.approval_required = Some("LOCAL_WRITE".parse().unwrap());
    let mut app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    let store = app.db.open().await;
    for (id, tenant, key) in [("key_a", "acme", "ah_a"), ("key_b", "globex", "ah_b")] {
        store
            .create_api_key(id, tenant, &hash(key), false, chrono::Utc::now())
            .await
            .unwrap();
    }
    app.client = client_with_key("ah_a");
    let other = client_with_key("ah_b");
    let session = "s-acme";

    // Acme's first turn writes a note (approved: a checkpoint), and a
    // memory of its user is extracted.
    app.provider.enqueue([
        Reply::openai_tool_call(
            "call_w1",
            "write_note",
            &json!({"path": "notes/a.md", "content": "acme wrote this"}),
        ),
        Reply::sse("openai/text.sse"),
        Reply::openai_text(EXTRACTED),
    ]);
    let mut stream = app
        .post_turn_sse(
            session,
            json!({"message": "I live in Lyon. Change my note.", "user_id": "ann"}),
        )
        .await;
    let first = stream.turn_id();
    stream.read_until("approval.requested").await;
    let url = format!("/sessions/{session}/turns/{first}/approvals/call_w1");
    let (status, _) = app.post_body(&url, json!({"approve": true})).await;
    assert_eq!(status, 200);
    stream.read_to_end().await;
    let memories = wait_for_memories(&app).await;
    assert_eq!(memories[0]["scope"], "user:ann", "{memories:?}");
    let (_, checkpoints) = app
        .get_json(&format!("/sessions/{session}/checkpoints"))
        .await;
    let checkpoint = checkpoints["checkpoints"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Its second turn waits for a person.
    app.provider.enqueue([
        Reply::openai_tool_call(
            "call_w2",
            "write_note",
            &json!({"path": "notes/a.md", "content": "acme again"}),
        ),
        Reply::sse("openai/text.sse"),
    ]);
    let mut stream = app
        .post_turn_sse(session, json!({"message": "Once more.", "user_id": "ann"}))
        .await;
    let second = stream.turn_id();
    stream.read_until("approval.requested").await;

    // It follows its note over MCP (2025-11-25), and has a webhook.
    let mcp = acme_mcp_session(&app).await;
    let (status, hook) = app
        .post_body(
            "/webhooks",
            json!({"url": "https://example.com/acme", "events": ["turn.completed"]}),
        )
        .await;
    assert_eq!(status, 201, "{hook}");
    let acme_file = b"acme's own".as_slice();
    let (status, file) = app.upload("acme.txt", "text/plain", acme_file).await;
    assert_eq!(status, 201, "{file}");
    let file_id = file["id"].as_str().unwrap().to_owned();

    let (_, before) = app.get_json(&format!("/sessions/{session}")).await;
    let (_, events_before) = app
        .get_json(&format!("/sessions/{session}/events?limit=1000"))
        .await;
    let requests_before = app.provider.requests().len();
    let known = Known {
        session: session.to_owned(),
        turn: second.clone(),
        call: "call_w2".to_owned(),
        artifact: "art_0".to_owned(),
        checkpoint: checkpoint.clone(),
        response: format!("resp_{}", second.replace('-', "")),
        webhook: hook["id"].as_str().unwrap().to_owned(),
        file: file_id.clone(),
    };
    let never = Known {
        session: "s-never-made".to_owned(),
        checkpoint: "ckpt_never_made".to_owned(),
        turn: "0190a5c4-0000-7000-8000-000000000000".to_owned(),
        webhook: "wh_never_made".to_owned(),
        file: "file-never-made".to_owned(),
        ..known_clone(&known)
    };

    // Globex walks every operation; those that begin a turn last (they
    // make Globex's own session of the id).
    let mut operations = operations();
    assert!(operations.len() >= 25, "{operations:?}");
    operations.sort_by_key(|(method, template)| {
        attempt(method, template, session, &second, &mcp).map(|a| a.expect == Expect::OwnSession)
    });
    for (method, template) in &operations {
        let attempt = attempt(method, template, session, &second, &mcp)
            .unwrap_or_else(|| panic!("{method} {template}: no attempt for this operation"));
        let path = concrete(method, template, &known);
        if attempt.expect == Expect::OwnSession {
            // Its turn and the memory extraction after it, in either
            // order: an answer that is also an extraction of nothing.
            app.provider.enqueue([
                Reply::openai_text(NOTHING_EXTRACTED),
                Reply::openai_text(NOTHING_EXTRACTED),
            ]);
        }
        let (status, body) = send(&other, &app, method, &path, &attempt).await;
        match attempt.expect {
            Expect::Missing(code) => {
                assert_eq!(
                    (status, body["code"].as_str()),
                    (404, Some(code)),
                    "{method} {path}: {body}"
                );
                // Exactly what a session (or checkpoint) that was never
                // made gets, except that posting a turn would make one.
                if template != "/sessions/{session_id}/turns" && !template.starts_with("/v1/") {
                    let never_path = concrete(method, template, &never);
                    let (never_status, never_body) =
                        send(&other, &app, method, &never_path, &attempt).await;
                    assert_eq!(
                        (never_status, &never_body["code"], &never_body["detail"]),
                        (status, &body["code"], &body["detail"]),
                        "{method} {template}"
                    );
                }
            }
            Expect::Open => assert_eq!(status, 200, "{method} {path}: {body}"),
            Expect::Empty => {
                assert_eq!(status, 200, "{method} {path}: {body}");
                let empty = body["memories"].as_array().is_some_and(Vec::is_empty)
                    || body["deleted"] == 0
                    || body["webhooks"].as_array().is_some_and(Vec::is_empty)
                    || body["tasks"].as_array().is_some_and(Vec::is_empty)
                        && body["totalSize"] == 0;
                assert!(empty, "{method} {path}: {body}");
            }
            Expect::OwnSession => assert_eq!(status, 200, "{method} {path}: {body}"),
            Expect::McpNotFound => {
                assert_eq!(status, 200, "{method} {path}: {body}");
                assert_eq!(body["result"]["isError"], true, "{body}");
                assert_eq!(
                    body["result"]["content"][0]["text"], "session not found",
                    "{body}"
                );
            }
            Expect::A2aNotFound => {
                assert_eq!(status, 200, "{method} {path}: {body}");
                assert_eq!(body["error"]["code"], -32001, "{body}");
            }
            Expect::AgentCard => {
                assert_eq!(status, 200, "{method} {path}: {body}");
                let scheme = &body["securitySchemes"]["bearer"]["httpAuthSecurityScheme"];
                assert_eq!(scheme["scheme"], "Bearer", "{body}");
            }
            Expect::Created => {
                // OpenAI's route answers 200, as OpenAI does.
                let made = if path.starts_with("/v1/") { 200 } else { 201 };
                assert_eq!(status, made, "{method} {path}: {body}");
                assert_ne!(body["id"], known.webhook.as_str(), "{body}");
                assert_ne!(body["id"], known.file.as_str(), "{body}");
                assert!(!body.to_string().contains("acme"), "{body}");
            }
            Expect::AdminOnly => assert_eq!(
                (status, body["code"].as_str()),
                (403, Some("admin_required")),
                "{method} {path}: {body}"
            ),
            Expect::OwnFiles => {
                assert_eq!(status, 200, "{method} {path}: {body}");
                let files = body["files"].as_array().or(body["data"].as_array());
                let files = files.unwrap_or_else(|| panic!("{path}: {body}"));
                assert!(
                    files.iter().all(|f| f["filename"] == "globex.txt"),
                    "{body}"
                );
                assert!(!body.to_string().contains(&known.file), "{body}");
            }
            Expect::OwnUsage => {
                assert_eq!(status, 200, "{method} {path}: {body}");
                assert_eq!(body["tenant"], "globex", "{body}");
                assert!(!body.to_string().contains("acme"), "{body}");
            }
            Expect::NoContent => assert_eq!(
                (status, &body),
                (204, &Value::Null),
                "{method} {path}: {body}"
            ),
        }
    }
    let own_sessions = operations
        .iter()
        .filter(|(m, t)| {
            attempt(m, t, session, &second, &mcp).is_some_and(|a| a.expect == Expect::OwnSession)
        })
        .count();
    assert_eq!(own_sessions, 7);
    let own = attempt("GET", "/sessions/{session_id}", session, &second, &mcp).unwrap();
    let (_, own) = send(&other, &app, "GET", &format!("/sessions/{session}"), &own).await;
    assert_eq!(own["turn_count"], 7, "{own}");
    assert_ne!(own["created_at"], before["created_at"]);

    // Nor can Globex continue Acme's response: it is not found, as one
    // that never was.
    let follow = Attempt {
        expect: Expect::Missing("response_not_found"),
        body: Some(json!({"input": "go on", "previous_response_id": known.response})),
        headers: Vec::new(),
        upload: false,
    };
    let (status, body) = send(&other, &app, "POST", "/v1/responses", &follow).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("response_not_found")),
        "{body}"
    );

    // Nor go on from, regenerate or read the branch of Acme's turn in a
    // session of its own of the same id: not a turn of that session.
    for (method, path, body) in [
        (
            "POST",
            format!("/sessions/{session}/turns"),
            Some(json!({"message": "go on", "parent_turn_id": known.turn})),
        ),
        (
            "GET",
            format!("/sessions/{session}/messages?turn_id={}", known.turn),
            None,
        ),
        (
            "POST",
            format!("/sessions/{session}/fork"),
            Some(json!({"at_turn": known.turn, "session_id": "globex-fork"})),
        ),
        // Acme's running turn, steered from Globex's session.
        (
            "POST",
            format!("/sessions/{session}/turns/{second}/steer"),
            Some(json!({"message": "from another tenant"})),
        ),
        (
            "POST",
            "/v1/ui/chat".to_owned(),
            Some(json!({"id": session, "trigger": "regenerate-message",
                   "messageId": known.turn, "messages": [
                {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "again"}]}
            ]})),
        ),
    ] {
        let attempt = Attempt {
            expect: Expect::Missing("turn_not_found"),
            body,
            headers: Vec::new(),
            upload: false,
        };
        let (status, body) = send(&other, &app, method, &path, &attempt).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (404, Some("turn_not_found")),
            "{method} {path}: {body}"
        );
    }

    // Nor cancel, answer or follow Acme's task over A2A.
    for (method, params) in [
        ("CancelTask", json!({"id": second})),
        ("SubscribeToTask", json!({"id": second})),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "role": "ROLE_USER",
                   "parts": [{"text": "approve"}], "taskId": second}}),
        ),
    ] {
        let attempt = Attempt {
            expect: Expect::A2aNotFound,
            body: Some(json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})),
            headers: Vec::new(),
            upload: false,
        };
        let (status, body) = send(&other, &app, "POST", "/a2a", &attempt).await;
        assert_eq!(
            (status, &body["error"]["code"]),
            (200, &json!(-32001)),
            "{method}: {body}"
        );
    }

    // Nothing of Acme's changed: no turn began, none was cancelled or
    // approved, no checkpoint restored, no memory forgotten, and no
    // provider call of Globex's heard anything of Acme's.
    let (_, after) = app.get_json(&format!("/sessions/{session}")).await;
    assert_eq!(after["turn_count"], before["turn_count"]);
    assert_eq!(after["running_turn_id"], second.as_str());
    let (_, events_after) = app
        .get_json(&format!("/sessions/{session}/events?limit=1000"))
        .await;
    assert_eq!(events_after["events"], events_before["events"]);
    let (status, _, bytes) = app.get_bytes(&format!("/files/{file_id}/content")).await;
    assert_eq!((status, bytes.as_slice()), (200, acme_file));
    let (_, files) = app.get_json("/files").await;
    assert_eq!(files["files"].as_array().unwrap().len(), 1, "{files}");
    let requests = app.provider.requests();
    assert!(requests.len() >= requests_before + own_sessions);
    for request in &requests[requests_before..] {
        let prompt = request.body.to_string();
        assert!(
            !prompt.contains("Lyon") && !prompt.contains("my note"),
            "{prompt}"
        );
    }
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "acme wrote this");
    assert_eq!(wait_for_memories(&app).await.len(), memories.len());
    let (_, checkpoints) = app
        .get_json(&format!("/sessions/{session}/checkpoints"))
        .await;
    assert!(checkpoints["checkpoints"][0]["restored_at"].is_null());

    // Acme sees its sessions by the ids it sent, everywhere: the key its
    // rows are stored under never shows.
    for (method, template) in &operations {
        // (The running turn's event stream is read below.)
        if method != "GET"
            || !template.contains("{session_id}")
            || template.ends_with("{turn_id}/events")
            || template.ends_with("/stream")
        {
            continue;
        }
        let response = app
            .client
            .get(app.url(&fill(template, &known)))
            .send()
            .await
            .unwrap();
        let text = response.text().await.unwrap();
        assert!(!text.contains("acme/"), "GET {template}: {text}");
        let body: Value = serde_json::from_str(&text).unwrap();
        assert!(session_ids_are(&body, session), "GET {template}: {text}");
    }

    // Acme's own key still decides its turn.
    let url = format!("/sessions/{session}/turns/{second}/approvals/call_w2");
    let (status, _) = app.post_body(&url, json!({"approve": true})).await;
    assert_eq!(status, 200);
    let events = stream.read_to_end().await;
    assert_eq!(events.last().unwrap().event, "turn.completed");
    assert!(events.iter().all(|e| e.json()["session_id"] == session));
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "acme again");
    app.stop().await;
}

/// Whether every `session_id` in `value` is `session`.
fn session_ids_are(value: &Value, session: &str) -> bool {
    match value {
        Value::Object(fields) => fields.iter().all(|(name, v)| {
            if name.ends_with("session_id") {
                v == session
            } else {
                session_ids_are(v, session)
            }
        }),
        Value::Array(items) => items.iter().all(|v| session_ids_are(v, session)),
        _ => true,
    }
}

fn known_clone(known: &Known) -> Known {
    Known {
        session: known.session.clone(),
        turn: known.turn.clone(),
        call: known.call.clone(),
        artifact: known.artifact.clone(),
        checkpoint: known.checkpoint.clone(),
        response: known.response.clone(),
        webhook: known.webhook.clone(),
        file: known.file.clone(),
    }
}

async fn wait_for_memories(app: &TestApp) -> Vec<Value> {
    for _ in 0..200 {
        let (status, body) = app.get_json("/memories?scope=user:ann").await;
        assert_eq!(status, 200, "{body}");
        let memories = body["memories"].as_array().cloned().unwrap_or_default();
        if !memories.is_empty() {
            return memories;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no memory was extracted");
}

on_both_backends!(another_tenant_finds_nothing_on_any_route);

async fn post_turn(
    client: &Client,
    app: &TestApp,
    session: &str,
    body: Value,
) -> reqwest::Response {
    client
        .post(app.url(&format!("/sessions/{session}/turns")))
        .header("idempotency-key", "k-1")
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn get(client: &Client, app: &TestApp, path: &str) -> (u16, Value) {
    let response = client.get(app.url(path)).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Session ids are per tenant: the same id in two tenants is two
/// sessions. Whatever one tenant does on an id (a running turn, a used
/// idempotency key, a session made first) neither stops nor hints
/// anything to the other, and each sees its own id, as it sent it,
/// everywhere: answers, events, headers and the model's prompt.
async fn the_same_session_id_in_two_tenants_is_two_sessions(backend: Backend) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.auth = harness_core::config::AuthMode::On;
    let mut app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    let store = app.db.open().await;
    for (id, tenant, key) in [("key_a", "acme", "ah_a"), ("key_b", "globex", "ah_b")] {
        store
            .create_api_key(id, tenant, &hash(key), false, chrono::Utc::now())
            .await
            .unwrap();
    }
    app.client = client_with_key("ah_a");
    let globex = client_with_key("ah_b");

    // Acme's turn on `shared` is running, with idempotency key `k-1`.
    let gate = tokio_util::sync::CancellationToken::new();
    app.provider
        .enqueue([Reply::openai_deltas(&["Acme ", "answer"]).hold_after(2, &gate)]);
    let response = app
        .client
        .post(app.url("/sessions/shared/turns"))
        .header("accept", "text/event-stream")
        .header("idempotency-key", "k-1")
        .json(&json!({"message": "acme secret plan"}))
        .send()
        .await
        .unwrap();
    let mut acme_stream = crate::helpers::SseStream::new(response).await;
    acme_stream.read_until("turn.started").await;
    // Its model call is made (and held) before Globex's: the replies are
    // taken in the order the calls arrive.
    for _ in 0..200 {
        if !app.provider.requests().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(app.provider.requests().len(), 1);

    // Globex cannot tell `shared` from an id never used.
    let (status, used) = get(&globex, &app, "/sessions/shared").await;
    let (_, never) = get(&globex, &app, "/sessions/never-used").await;
    assert_eq!(status, 404, "{used}");
    assert_eq!(used["code"], "session_not_found");
    assert_eq!(
        (&used["code"], &used["detail"]),
        (&never["code"], &never["detail"])
    );

    // Its own turn on `shared`, with the same key, is a new session: not
    // 409 (Acme's running turn), not a replay of Acme's turn.
    app.provider.enqueue([Reply::openai_text("Globex answer")]);
    let response = post_turn(
        &globex,
        &app,
        "shared",
        json!({"message": "globex question"}),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("idempotent-replayed").is_none());
    let turn_id = response.headers()["x-turn-id"].to_str().unwrap().to_owned();
    assert_eq!(
        response.headers()[header::CONTENT_LOCATION],
        format!("/sessions/shared/turns/{turn_id}").as_str()
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["session_id"], "shared");
    assert_eq!(body["text"], "Globex answer");
    // The model heard Globex's session alone, by the id Globex knows.
    let prompt = app.provider.requests().last().unwrap().body.to_string();
    assert!(prompt.contains("session_id: shared"), "{prompt}");
    assert!(
        !prompt.contains("acme secret") && !prompt.contains("globex/"),
        "{prompt}"
    );

    let (status, session) = get(&globex, &app, "/sessions/shared").await;
    assert_eq!(status, 200, "{session}");
    assert_eq!(
        (&session["session_id"], &session["turn_count"]),
        (&json!("shared"), &json!(1))
    );
    assert!(session["running_turn_id"].is_null(), "{session}");
    let (_, turn) = get(&globex, &app, &format!("/sessions/shared/turns/{turn_id}")).await;
    assert_eq!(turn["session_id"], "shared");
    let (_, events) = get(&globex, &app, "/sessions/shared/events").await;
    let events = events["events"].as_array().unwrap();
    assert!(
        events
            .iter()
            .all(|e| e["session_id"] == "shared" && e["turn_id"] == turn_id.as_str())
    );
    let (_, messages) = get(&globex, &app, "/sessions/shared/messages").await;
    let texts: Vec<_> = messages["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["globex question", "Globex answer"]);

    // Acme's turn goes on untouched, and its session is its own.
    gate.cancel();
    let events = acme_stream.read_to_end().await;
    assert_eq!(events.last().unwrap().event, "turn.completed");
    assert!(events.iter().all(|e| e.json()["session_id"] == "shared"));
    let (_, session) = app.get_json("/sessions/shared").await;
    assert_eq!(session["turn_count"], 1);
    let (_, messages) = app.get_json("/sessions/shared/messages").await;
    assert_eq!(messages["messages"][0]["content"], "acme secret plan");
    assert_eq!(messages["messages"].as_array().unwrap().len(), 2);

    // An id Globex used first is still Acme's to use: nothing to squat.
    app.provider.enqueue([
        Reply::openai_text("Globex first"),
        Reply::openai_text("Acme second"),
    ]);
    let first = post_turn(&globex, &app, "taken-first", json!({"message": "mine?"})).await;
    assert_eq!(first.status(), 200);
    first.text().await.unwrap();
    let second = post_turn(&app.client, &app, "taken-first", json!({"message": "mine"})).await;
    assert_eq!(second.status(), 200);
    let body: Value = second.json().await.unwrap();
    assert_eq!(
        (&body["session_id"], &body["text"]),
        (&json!("taken-first"), &json!("Acme second"))
    );
    for client in [&app.client, &globex] {
        let (_, session) = get(client, &app, "/sessions/taken-first").await;
        assert_eq!(session["turn_count"], 1, "{session}");
    }
    app.stop().await;
}

on_both_backends!(the_same_session_id_in_two_tenants_is_two_sessions);

/// Each tenant its own vault: a note one tenant writes is in its own
/// folder (`{vault}/.tenants/{tenant}/`), and another tenant can neither
/// read it, find it, overwrite it nor see the operator's notes; its own
/// write of the same path is its own note. (Before, every tenant read and
/// wrote the one folder.)
async fn each_tenant_has_its_own_vault(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n\nThe operator's plans for Lyon.\n")]);
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.auth = harness_core::config::AuthMode::On;
    settings.vault.dir = vault.path().to_owned();
    let mut app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    make_keys(
        &app,
        &[("key_a", "acme", "ah_a"), ("key_b", "globex", "ah_b")],
    )
    .await;
    let write = |content: &str| json!({"path": "notes/plan.md", "content": content});
    let status = |finished: &Value| finished["status"].as_str().unwrap().to_owned();

    app.client = client_with_key("ah_a");
    let (finished, _) = app
        .call_tool("write_note", write("# Plan\n\nAcme goes to Paris."))
        .await;
    assert_eq!(status(&finished), "completed", "{finished}");
    let acme_note = vault.path().join(".tenants/acme/notes/plan.md");
    assert!(acme_note.exists());
    assert!(!vault.path().join("notes/plan.md").exists());
    let (_, found) = app
        .call_tool("local_search", json!({"query": "Paris"}))
        .await;
    assert!(found.contains("notes/plan.md"), "{found}");

    app.client = client_with_key("ah_b");
    for (tool, arguments) in [
        ("read_note", json!({"path": "notes/plan.md"})),
        ("read_note", json!({"path": "notes/a.md"})),
        ("read_note", json!({"path": "../acme/notes/plan.md"})),
        ("read_note", json!({"path": ".tenants/acme/notes/plan.md"})),
    ] {
        let (finished, message) = app.call_tool(tool, arguments.clone()).await;
        assert!(
            ["failed", "denied"].contains(&status(&finished).as_str()),
            "{arguments}: {finished}"
        );
        assert!(
            !message.contains("Paris") && !message.contains("Lyon"),
            "{message}"
        );
    }
    for query in ["Paris", "Lyon"] {
        let (_, found) = app.call_tool("local_search", json!({"query": query})).await;
        assert!(found.contains("No results"), "{query}: {found}");
    }
    let (finished, _) = app
        .call_tool("write_note", write("# Plan\n\nGlobex stays home."))
        .await;
    assert_eq!(status(&finished), "completed");
    assert_eq!(
        std::fs::read_to_string(&acme_note).unwrap(),
        "# Plan\n\nAcme goes to Paris."
    );
    assert_eq!(
        std::fs::read_to_string(vault.path().join(".tenants/globex/notes/plan.md")).unwrap(),
        "# Plan\n\nGlobex stays home."
    );
    // Its context pack is made of its own notes only.
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    app.post_turn_sse(
        "s-pack",
        json!({"message": "What are the plans for Paris and Lyon?"}),
    )
    .await
    .read_to_end()
    .await;
    let sent = app.provider.requests().last().unwrap().body["messages"].to_string();
    assert!(
        !sent.contains("Acme goes") && !sent.contains("operator's plans"),
        "{sent}"
    );
    // Its reindex is of its own folder.
    let report: Value = app
        .client
        .post(app.url("/vault/reindex"))
        .json_reply()
        .await;
    assert_eq!(report["notes"], 1, "{report}");
}

/// `HARNESS_VAULT_SHARED=true`: one vault, which the other tenants read
/// and only the operator's tenant writes.
async fn a_shared_vault_is_read_only_for_the_tenants(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n\nThe operator's plans for Lyon.\n")]);
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.auth = harness_core::config::AuthMode::On;
    settings.vault.dir = vault.path().to_owned();
    settings.vault.shared = true;
    let mut app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    make_keys(&app, &[("key_b", "globex", "ah_b")]).await;
    app.client = client_with_key("ah_b");
    let (finished, message) = app
        .call_tool("read_note", json!({"path": "notes/a.md"}))
        .await;
    assert_eq!(finished["status"], "completed", "{finished}");
    assert!(message.contains("Lyon"), "{message}");
    let (finished, _) = app
        .call_tool(
            "write_note",
            json!({"path": "notes/a.md", "content": "mine now"}),
        )
        .await;
    assert_eq!(finished["status"], "failed", "{finished}");
    assert!(
        finished["error"].as_str().unwrap().contains("read-only"),
        "{finished}"
    );
    assert!(
        std::fs::read_to_string(vault.path().join("notes/a.md"))
            .unwrap()
            .contains("Lyon")
    );
}

on_both_backends!(
    each_tenant_has_its_own_vault,
    a_shared_vault_is_read_only_for_the_tenants
);
