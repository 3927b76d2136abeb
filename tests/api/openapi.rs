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

/// The document states the constraints the server enforces, and describes
/// event streams as streams.
#[test]
fn the_document_states_the_servers_constraints() {
    let doc = serde_json::to_value(agent_harness::http::openapi()).unwrap();
    let mut session_params = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let at = format!("{method} {path}");
            for param in operation["parameters"].as_array().into_iter().flatten() {
                let schema = &param["schema"];
                match (
                    param["name"].as_str().unwrap(),
                    param["in"].as_str().unwrap(),
                ) {
                    ("session_id", "path") => {
                        session_params += 1;
                        assert_eq!(schema["pattern"], "^[A-Za-z0-9._:-]{1,128}$", "{at}");
                        assert_eq!(
                            (&schema["minLength"], &schema["maxLength"]),
                            (&1.into(), &128.into()),
                            "{at}"
                        );
                    }
                    // Decisions page by their id (a UUID v7).
                    ("after", "query") if at.contains("/decisions") => {
                        assert_eq!(schema["format"], "uuid", "{at}: {param}");
                    }
                    ("after", "query") | ("Last-Event-ID", "header") => {
                        assert_eq!(schema["minimum"], 0, "{at}: {param}");
                        // A header is absent or a number, never `null`.
                        assert_eq!(schema["type"], "integer", "{at}: {param}");
                    }
                    ("limit", "query") => {
                        assert_eq!(
                            (&schema["minimum"], &schema["maximum"]),
                            (&1.into(), &1000.into()),
                            "{at}"
                        );
                    }
                    _ => {}
                }
            }
            for content in operation["responses"]
                .as_object()
                .into_iter()
                .flat_map(|r| r.values())
                .filter_map(|r| r["content"]["text/event-stream"].as_object())
            {
                assert_eq!(
                    content["schema"]["$ref"], "#/components/schemas/EventStream",
                    "{at}"
                );
            }
        }
    }
    // Every route under /sessions/{session_id}.
    assert_eq!(session_params, 14);
    let schemas = &doc["components"]["schemas"];
    assert_eq!(schemas["EventStream"]["type"], "string");
    let body = &schemas["TurnBody"];
    assert!(
        body["required"]
            .as_array()
            .unwrap()
            .contains(&"message".into()),
        "{body}"
    );
    assert_eq!(body["properties"]["message"]["type"], "string");
    assert_eq!(body["properties"]["message"]["minLength"], 1);
    let top_k = &body["properties"]["top_k"];
    assert_eq!(
        (&top_k["minimum"], &top_k["maximum"]),
        (&1.into(), &100.into())
    );
    assert_eq!(body["properties"]["history"]["maxItems"], 1000);
    for name in ["runtime_provider", "runtime_model"] {
        assert_eq!(body["properties"][name]["maxLength"], 200, "{name}");
        assert!(body["properties"][name]["pattern"].is_string(), "{name}");
    }
}
