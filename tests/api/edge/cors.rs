//! Browsers on other origins: preflights and the headers a script may read.

use reqwest::Method;
use serde_json::json;

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, spawn_app, spawn_app_with, test_settings},
    support::{Backend, TestDb},
};

async fn app_allowing(origins: &str) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.cors_origins = Some(origins.parse().unwrap());
    spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn a_listed_origin_gets_preflights_and_readable_headers() {
    let app = app_allowing("https://app.example, https://admin.example:8443").await;
    let preflight = app
        .client
        .request(Method::OPTIONS, app.url("/sessions/s-cors/turns"))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type,last-event-id,idempotency-key",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status(), 200);
    assert_eq!(
        header(&preflight, "access-control-allow-origin"),
        Some("https://app.example")
    );
    let methods = header(&preflight, "access-control-allow-methods")
        .unwrap()
        .to_owned();
    assert!(
        methods.contains("POST") && methods.contains("GET"),
        "{methods}"
    );
    let allowed = header(&preflight, "access-control-allow-headers")
        .unwrap()
        .to_ascii_lowercase();
    for name in ["content-type", "last-event-id", "idempotency-key"] {
        assert!(allowed.contains(name), "{allowed}");
    }

    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let response = app
        .client
        .post(app.url("/sessions/s-cors/turns"))
        .header("origin", "https://admin.example:8443")
        .json(&json!({"message": "Hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(&response, "access-control-allow-origin"),
        Some("https://admin.example:8443")
    );
    let exposed = header(&response, "access-control-expose-headers")
        .unwrap()
        .to_ascii_lowercase();
    for name in ["x-turn-id", "retry-after", "idempotent-replayed"] {
        assert!(exposed.contains(name), "{exposed}");
    }
    // Errors carry the headers too, or the browser hides them from the page.
    let error = app
        .client
        .post(app.url("/sessions/s-cors/turns"))
        .header("origin", "https://app.example")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(error.status(), 422);
    assert_eq!(
        header(&error, "access-control-allow-origin"),
        Some("https://app.example")
    );

    let stranger = app
        .client
        .get(app.url("/healthz"))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(header(&stranger, "access-control-allow-origin"), None);
}

#[tokio::test]
async fn a_star_allows_any_origin_and_no_setting_allows_none() {
    let app = app_allowing("*").await;
    let response = app
        .client
        .get(app.url("/healthz"))
        .header("origin", "https://anywhere.example")
        .send()
        .await
        .unwrap();
    assert_eq!(header(&response, "access-control-allow-origin"), Some("*"));

    let closed = spawn_app(Backend::Sqlite).await;
    let response = closed
        .client
        .get(closed.url("/healthz"))
        .header("origin", "https://anywhere.example")
        .send()
        .await
        .unwrap();
    assert_eq!(header(&response, "access-control-allow-origin"), None);
}

#[test]
fn an_origin_with_a_path_is_refused_at_start() {
    for bad in [
        "https://app.example/",
        "app.example",
        "https://a.example/x",
        "*,https://b.example",
    ] {
        let error = harness_core::config::Settings::load_from(["agent-harness"], |name| {
            (name == "HARNESS_CORS_ORIGINS").then(|| bad.to_owned())
        })
        .unwrap_err()
        .to_string();
        assert!(error.starts_with("HARNESS_CORS_ORIGINS:"), "{bad}: {error}");
    }
}
