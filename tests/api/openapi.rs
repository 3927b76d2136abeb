//! The checked-in `openapi.yaml` is the document the service serves.

use crate::{helpers::spawn_app, support::Backend};

#[tokio::test]
async fn the_checked_in_openapi_yaml_is_what_the_service_serves() {
    let generated = agent_harness::http::openapi_yaml();
    let path = format!("{}/openapi.yaml", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "openapi.yaml is out of date; refresh it with `UPDATE_OPENAPI=1 cargo test --test api openapi`"
    );
    let app = spawn_app(Backend::Sqlite).await;
    let response = app
        .client
        .get(app.url("/openapi.yaml"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/yaml");
    assert_eq!(response.text().await.unwrap(), checked_in);
    for path in [
        "/sessions/{session_id}/turns:",
        "/sessions/{session_id}/turns/{turn_id}:",
        "/sessions/{session_id}/turns/{turn_id}/events:",
        "/sessions/{session_id}/turns/{turn_id}/cancel:",
        "/sessions/{session_id}/messages:",
        "/sessions/{session_id}/events:",
        "/healthz:",
        "/readyz:",
        "/openapi.yaml:",
    ] {
        assert!(checked_in.contains(path), "{path} is documented");
    }
}
