//! `/webhooks`: a tenant's endpoints get its turns' events, signed as
//! Standard Webhooks say, at least once, retried when the receiver fails;
//! another tenant's endpoint gets none of them. (`.ci/run` checks the
//! signatures with the `openai` SDK and `standardwebhooks` too.)

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use axum::{extract::State, http::HeaderMap, routing::post};
use serde_json::{Value, json};

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, spawn_app_with, test_settings, vault_of},
    on_both_backends,
    support::{Backend, TestDb},
};

/// What a receiver was sent: each request's headers and body.
#[derive(Clone, Default)]
pub(crate) struct Receiver {
    pub(crate) seen: Arc<Mutex<Vec<(HeaderMap, String)>>>,
    /// Requests still to answer 503.
    pub(crate) failing: Arc<AtomicU32>,
}

impl Receiver {
    pub(crate) async fn start() -> (Self, String) {
        let receiver = Self::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let router = axum::Router::new()
            .route(
                "/hook",
                post(
                    |State(r): State<Receiver>, headers: HeaderMap, body: String| async move {
                        r.seen.lock().unwrap().push((headers, body));
                        let failing = r.failing.load(Ordering::SeqCst);
                        if failing > 0 {
                            r.failing.store(failing - 1, Ordering::SeqCst);
                            return axum::http::StatusCode::SERVICE_UNAVAILABLE;
                        }
                        axum::http::StatusCode::NO_CONTENT
                    },
                ),
            )
            .with_state(receiver.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        (receiver, url)
    }

    fn bodies(&self) -> Vec<Value> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, body)| serde_json::from_str(body).unwrap())
            .collect()
    }

    /// Waits for a message of `kind` (of the turn `turn`, when given).
    pub(crate) async fn wait_for(&self, kind: &str, turn: Option<&str>) -> (HeaderMap, Value) {
        for _ in 0..300 {
            let found = self
                .seen
                .lock()
                .unwrap()
                .iter()
                .find_map(|(headers, body)| {
                    let body: Value = serde_json::from_str(body).unwrap();
                    let of_turn = turn.is_none_or(|t| body["data"]["turn_id"] == t);
                    (body["type"] == kind && of_turn).then(|| (headers.clone(), body))
                });
            if let Some(found) = found {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no {kind} came: {:?}", self.bodies());
    }
}

async fn app(backend: Backend, vault: &std::path::Path) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.auth = harness_core::config::AuthMode::On;
    settings.server.outbound_allow_private = true;
    settings.vault.dir = vault.to_owned();
    settings.harness.approval_required = Some("LOCAL_WRITE".parse().unwrap());
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    crate::edge::tenants::make_keys(
        &app,
        &[
            ("k-acme", "acme", "ah_acme"),
            ("k-globex", "globex", "ah_globex"),
        ],
    )
    .await;
    app
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> &'h str {
    headers[name].to_str().unwrap()
}

async fn a_tenants_endpoint_gets_its_turns_events_signed(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let mut app = app(backend, vault.path()).await;
    let (acme_hook, acme_url) = Receiver::start().await;
    let (globex_hook, globex_url) = Receiver::start().await;
    let acme = crate::edge::tenants::client_with_key("ah_acme");
    let globex = crate::edge::tenants::client_with_key("ah_globex");

    app.client = globex.clone();
    let (status, theirs) = app
        .post_body(
            "/webhooks",
            json!({"url": globex_url, "events": ["turn.completed", "turn.waiting", "turn.failed"]}),
        )
        .await;
    assert_eq!(status, 201, "{theirs}");

    app.client = acme.clone();
    for (body, field) in [
        (
            json!({"url": "ftp://example.com/x", "events": ["turn.completed"]}),
            "url",
        ),
        (
            json!({"url": acme_url, "events": ["turn.started"]}),
            "events[0]",
        ),
        (json!({"url": acme_url, "events": []}), "events"),
    ] {
        let (status, problem) = app.post_body("/webhooks", body).await;
        assert_eq!(status, 422, "{problem}");
        assert_eq!(problem["field"], field, "{problem}");
    }
    let (status, made) = app
        .post_body(
            "/webhooks",
            json!({"url": acme_url, "events": ["turn.completed", "turn.waiting", "response.completed"]}),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    let secret = made["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{made}");
    let id = made["id"].as_str().unwrap().to_owned();
    let (_, listed) = app.get_json("/webhooks").await;
    assert_eq!(listed["webhooks"][0]["id"], id.as_str(), "{listed}");
    assert!(listed["webhooks"][0].get("secret").is_none(), "shown once");
    // Globex's endpoint is not Acme's to see.
    let (status, _) = app
        .get_json(&format!("/webhooks/{}", theirs["id"].as_str().unwrap()))
        .await;
    assert_eq!(status, 404);

    // A turn's end, to the first try that fails and the retry that
    // does not: the same message, the same id.
    acme_hook.failing.store(1, Ordering::SeqCst);
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let response = app.post_turn("s-hooks", json!({"message": "Hello."})).await;
    assert_eq!(response.status(), 200);
    let turn: Value = response.json().await.unwrap();
    let turn_id = turn["turn_id"].as_str().unwrap().to_owned();
    let (headers, completed) = acme_hook.wait_for("turn.completed", Some(&turn_id)).await;
    let (webhook_id, timestamp) = (
        header(&headers, "webhook-id"),
        header(&headers, "webhook-timestamp"),
    );
    let body = serde_json::to_string(&completed).unwrap();
    let raw = acme_hook
        .seen
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|(h, _)| header(h, "webhook-id") == webhook_id)
        .map(|(_, body)| body.clone())
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&raw).unwrap(),
        completed,
        "{body}"
    );
    let expected = harness_base::signing::sign(
        &secret,
        webhook_id,
        timestamp.parse().unwrap(),
        raw.as_bytes(),
    )
    .unwrap();
    assert_eq!(header(&headers, "webhook-signature"), expected);
    assert_eq!(completed["id"], webhook_id);
    assert_eq!(completed["data"]["session_id"], "s-hooks");
    assert_eq!(completed["data"]["status"], "completed");
    let mut delivered = Value::Null;
    for _ in 0..100 {
        let (_, deliveries) = app.get_json(&format!("/webhooks/{id}/deliveries")).await;
        delivered = deliveries["deliveries"][0].clone();
        if delivered["status"] == "delivered" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(delivered["status"], "delivered", "{delivered}");
    assert_eq!(delivered["attempts"], 2, "{delivered}");
    assert_eq!(delivered["id"], webhook_id);
    let tries: Vec<String> = acme_hook
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|(h, _)| header(h, "webhook-id").to_owned())
        .collect();
    assert_eq!(tries, [webhook_id, webhook_id], "a 503, then the retry");

    // A turn that waits for a person says how to answer; the answer
    // given that way ends the turn, which is said too.
    app.provider.enqueue([
        Reply::openai_tool_call(
            "call_h1",
            "write_note",
            &json!({"path": "notes/a.md", "content": "changed"}),
        ),
        Reply::sse("openai/text.sse"),
    ]);
    let stream = app
        .post_turn_sse("s-hooks", json!({"message": "Change my note."}))
        .await;
    let turn_id = stream.turn_id();
    let (_, waiting) = acme_hook.wait_for("turn.waiting", Some(&turn_id)).await;
    assert_eq!(waiting["data"]["waiting_for"], "approval", "{waiting}");
    assert_eq!(waiting["data"]["tool"], "write_note");
    let answer = &waiting["data"]["answer"];
    let (status, _) = app
        .post_body(answer["path"].as_str().unwrap(), answer["body"].clone())
        .await;
    assert_eq!(status, 200, "{answer}");
    acme_hook.wait_for("turn.completed", Some(&turn_id)).await;

    // A background response's end, as OpenAI says it.
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let (status, background) = app
        .post_body(
            "/v1/responses",
            json!({"input": "Hello.", "background": true}),
        )
        .await;
    assert_eq!(status, 200, "{background}");
    let (_, ended) = acme_hook.wait_for("response.completed", None).await;
    assert_eq!(ended["data"]["id"], background["id"], "{ended}");

    // Nothing of Acme's reached Globex's endpoint.
    assert!(
        globex_hook.bodies().is_empty(),
        "{:?}",
        globex_hook.bodies()
    );

    // Deleted: its deliveries with it.
    let deleted = app
        .client
        .delete(app.url(&format!("/webhooks/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let (status, problem) = app.get_json(&format!("/webhooks/{id}/deliveries")).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (404, Some("webhook_not_found"))
    );
}

on_both_backends!(a_tenants_endpoint_gets_its_turns_events_signed);
