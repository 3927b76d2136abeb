//! Tenants: everything a tenant's key makes is that tenant's. Another
//! tenant's key walks every operation of the served OpenAPI document
//! against it and finds nothing, changes nothing, and cannot tell it from
//! a session that never existed.

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

fn client_with_key(key: &str) -> Client {
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
}

/// One operation of the document, as the other tenant sends it.
struct Attempt {
    expect: Expect,
    body: Option<Value>,
    headers: Vec<(&'static str, String)>,
}

/// The attempt for each operation of the document; `None`: the test does
/// not know the operation (a new route must be added here).
fn attempt(method: &str, path: &str, session: &str) -> Option<Attempt> {
    let simple = |expect| {
        Some(Attempt {
            expect,
            body: None,
            headers: Vec::new(),
        })
    };
    let with_body = |expect, body: Value| {
        Some(Attempt {
            expect,
            body: Some(body),
            headers: Vec::new(),
        })
    };
    let user_message = "What do you know about me?";
    match (method, path) {
        ("GET", "/" | "/healthz" | "/readyz" | "/metrics" | "/openapi.yaml" | "/tools") => {
            simple(Expect::Open)
        }
        ("POST", "/vault/reindex") => simple(Expect::Open),
        ("GET" | "DELETE", "/memories") => simple(Expect::Empty),
        ("POST", "/checkpoints/{checkpoint_id}/restore") => {
            simple(Expect::Missing("checkpoint_not_found"))
        }
        ("POST", "/sessions/{session_id}/turns") => with_body(
            Expect::Missing("session_not_found"),
            json!({"message": user_message}),
        ),
        ("POST", "/sessions/{session_id}/turns/{turn_id}/approvals/{call_id}") => with_body(
            Expect::Missing("session_not_found"),
            json!({"approve": true}),
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
            | "/sessions/{session_id}/turns/{turn_id}/judgements",
        )
        | ("POST", "/sessions/{session_id}/turns/{turn_id}/cancel") => {
            simple(Expect::Missing("session_not_found"))
        }
        ("POST", "/v1/chat/completions") => Some(Attempt {
            expect: Expect::Missing("session_not_found"),
            body: Some(json!({"messages": [{"role": "user", "content": user_message}]})),
            headers: vec![("x-session-id", session.to_owned())],
        }),
        ("POST", "/v1/ui/chat") => with_body(
            Expect::Missing("session_not_found"),
            json!({"id": session, "messages": [
                {"id": "m1", "role": "user", "parts": [{"type": "text", "text": user_message}]}
            ]}),
        ),
        ("POST", "/v1/agui") => with_body(
            Expect::Missing("session_not_found"),
            json!({"threadId": session, "runId": "r1", "messages": [
                {"id": "m1", "role": "user", "content": user_message}
            ]}),
        ),
        _ => None,
    }
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
}

fn fill(template: &str, known: &Known) -> String {
    template
        .replace("{session_id}", &known.session)
        .replace("{turn_id}", &known.turn)
        .replace("{call_id}", &known.call)
        .replace("{artifact_id}", &known.artifact)
        .replace("{checkpoint_id}", &known.checkpoint)
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
    let response = tokio::time::timeout(Duration::from_secs(10), request.send())
        .await
        .unwrap_or_else(|_| panic!("{path} did not answer"))
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn another_tenant_finds_nothing_on_any_route(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.auth = agent_harness::config::AuthMode::On;
    settings.memory.extraction = true;
    settings.vault.dir = vault.path().to_owned();
    settings.harness.approval_required = Some("LOCAL_WRITE".parse().unwrap());
    let mut app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    let store = app.db.open().await;
    for (id, tenant, key) in [("key_a", "acme", "ah_a"), ("key_b", "globex", "ah_b")] {
        store
            .create_api_key(id, tenant, &hash(key), chrono::Utc::now())
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
    let first = stream.headers["x-turn-id"].to_str().unwrap().to_owned();
    stream.read_until("approval.requested").await;
    let url = format!("/sessions/{session}/turns/{first}/approvals/call_w1");
    let response = app
        .client
        .post(app.url(&url))
        .json(&json!({"approve": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
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
    let second = stream.headers["x-turn-id"].to_str().unwrap().to_owned();
    stream.read_until("approval.requested").await;

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
    };
    let never = Known {
        session: "s-never-made".to_owned(),
        checkpoint: "ckpt_never_made".to_owned(),
        ..known_clone(&known)
    };

    // Globex walks every operation.
    let operations = operations();
    assert!(operations.len() >= 25, "{operations:?}");
    for (method, template) in &operations {
        let attempt = attempt(method, template, session)
            .unwrap_or_else(|| panic!("{method} {template}: no attempt for this operation"));
        let path = fill(template, &known);
        let path = match template.as_str() {
            "/memories" => "/memories?scope=user:ann".to_owned(),
            _ => path,
        };
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
                    let never_path = fill(template, &never);
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
                let empty =
                    body["memories"].as_array().is_some_and(Vec::is_empty) || body["deleted"] == 0;
                assert!(empty, "{method} {path}: {body}");
            }
        }
    }

    // Nothing of Acme's changed: no turn began, none was cancelled or
    // approved, no checkpoint restored, no memory forgotten, no provider
    // call made.
    let (_, after) = app.get_json(&format!("/sessions/{session}")).await;
    assert_eq!(after["turn_count"], before["turn_count"]);
    assert_eq!(after["running_turn_id"], second.as_str());
    let (_, events_after) = app
        .get_json(&format!("/sessions/{session}/events?limit=1000"))
        .await;
    assert_eq!(events_after["events"], events_before["events"]);
    assert_eq!(app.provider.requests().len(), requests_before);
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "acme wrote this");
    assert_eq!(wait_for_memories(&app).await.len(), memories.len());
    let (_, checkpoints) = app
        .get_json(&format!("/sessions/{session}/checkpoints"))
        .await;
    assert!(checkpoints["checkpoints"][0]["restored_at"].is_null());

    // Acme's own key still decides its turn.
    let url = format!("/sessions/{session}/turns/{second}/approvals/call_w2");
    let response = app
        .client
        .post(app.url(&url))
        .json(&json!({"approve": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let events = stream.read_to_end().await;
    assert_eq!(events.last().unwrap().event, "turn.completed");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "acme again");
    app.stop().await;
}

fn known_clone(known: &Known) -> Known {
    Known {
        session: known.session.clone(),
        turn: known.turn.clone(),
        call: known.call.clone(),
        artifact: known.artifact.clone(),
        checkpoint: known.checkpoint.clone(),
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

/// The same user id in two tenants is two users: neither hears the
/// other's memories, and a tenant's sessions are its own from the first
/// turn (a turn of another tenant on the same id is refused, not merged).
async fn a_session_id_taken_by_one_tenant_is_not_found_by_another(backend: Backend) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.auth = agent_harness::config::AuthMode::On;
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    let store = app.db.open().await;
    for (id, tenant, key) in [("key_a", "acme", "ah_a"), ("key_b", "globex", "ah_b")] {
        store
            .create_api_key(id, tenant, &hash(key), chrono::Utc::now())
            .await
            .unwrap();
    }
    let (acme, globex) = (client_with_key("ah_a"), client_with_key("ah_b"));
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let response = acme
        .post(app.url("/sessions/shared-name/turns"))
        .json(&json!({"message": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap();
    let response = globex
        .post(app.url("/sessions/shared-name/turns"))
        .json(&json!({"message": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "session_not_found");
    // Globex makes its own sessions freely.
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let response = globex
        .post(app.url("/sessions/globex-own/turns"))
        .json(&json!({"message": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap();
    let response = acme
        .get(app.url("/sessions/globex-own"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(app.provider.requests().len(), 2);
}

on_both_backends!(a_session_id_taken_by_one_tenant_is_not_found_by_another);
