//! API keys: with `HARNESS_AUTH` on, every route but the probes, metrics,
//! the contract and the page needs a valid, unrevoked key.

use serde_json::json;

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{spawn_app_with, test_settings},
    on_both_backends,
    support::{Backend, TestDb},
};

fn hash(key: &str) -> String {
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()))
}

async fn requests_need_a_valid_key_when_auth_is_on(backend: Backend) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.auth = agent_harness::config::AuthMode::On;
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    let store = app.db.open().await;
    store
        .create_api_key("key_1", "acme", &hash("ah_secret"), chrono::Utc::now())
        .await
        .unwrap();

    let post = |key: Option<&'static str>| {
        let mut request = app
            .client
            .post(app.url("/sessions/s-auth/turns"))
            .json(&json!({"message": "Hi"}));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request.send()
    };
    for key in [None, Some("ah_wrong"), Some("")] {
        let response = post(key).await.unwrap();
        assert_eq!(response.status(), 401, "{key:?}");
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        let problem: serde_json::Value = response.json().await.unwrap();
        assert_eq!(problem["code"], "unauthorized");
    }
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    assert_eq!(post(Some("ah_secret")).await.unwrap().status(), 200);
    // Probes, metrics, the contract and the page stay open.
    for open in ["/healthz", "/readyz", "/metrics", "/openapi.yaml", "/"] {
        let response = app.client.get(app.url(open)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{open}");
    }
    // A revoked key is refused.
    assert!(
        store
            .revoke_api_key("key_1", chrono::Utc::now())
            .await
            .unwrap()
    );
    assert_eq!(post(Some("ah_secret")).await.unwrap().status(), 401);
    assert!(
        !store
            .revoke_api_key("key_1", chrono::Utc::now())
            .await
            .unwrap()
    );
}

on_both_backends!(requests_need_a_valid_key_when_auth_is_on);

async fn a_key_past_its_rate_gets_429_with_retry_after(backend: Backend) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.auth = agent_harness::config::AuthMode::On;
    settings.server.rate_limit_per_minute = 3;
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    let store = app.db.open().await;
    for (id, key) in [("key_a", "ah_a"), ("key_b", "ah_b")] {
        store
            .create_api_key(id, "acme", &hash(key), chrono::Utc::now())
            .await
            .unwrap();
    }
    let get = |key: &'static str| app.client.get(app.url("/tools")).bearer_auth(key).send();
    for _ in 0..3 {
        assert_eq!(get("ah_a").await.unwrap().status(), 200);
    }
    let limited = get("ah_a").await.unwrap();
    assert_eq!(limited.status(), 429);
    let wait: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=20).contains(&wait), "{wait}");
    let problem: serde_json::Value = limited.json().await.unwrap();
    assert_eq!(problem["code"], "rate_limited");
    // Another key has its own budget.
    assert_eq!(get("ah_b").await.unwrap().status(), 200);
}

on_both_backends!(a_key_past_its_rate_gets_429_with_retry_after);
