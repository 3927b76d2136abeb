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
                    // Input items page as OpenAI's do: by item id, 100 at most.
                    ("after", "query") if at.contains("/input_items") => {
                        assert_eq!(schema["type"], "string", "{at}: {param}");
                    }
                    ("limit", "query") if at.contains("/input_items") => {
                        assert_eq!(
                            (&schema["minimum"], &schema["maximum"]),
                            (&1.into(), &100.into()),
                            "{at}"
                        );
                    }
                    // Files page by their id, as OpenAI's do.
                    ("after", "query") if at.contains("/files") => {
                        assert_eq!(schema["type"], "string", "{at}: {param}");
                        assert_eq!(schema["maxLength"], 64, "{at}: {param}");
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
    // Every route under /sessions/{session_id}, and useChat's resume.
    assert_eq!(session_params, 22);
    let schemas = &doc["components"]["schemas"];
    // The schema of each event (what an SSE client, and schemathesis,
    // checks), with its `data`.
    assert_eq!(schemas["EventStream"]["type"], "object");
    assert_eq!(
        schemas["EventStream"]["required"],
        serde_json::json!(["data"])
    );
    let body = &schemas["TurnBody"];
    assert!(
        body["required"]
            .as_array()
            .unwrap()
            .contains(&"message".into()),
        "{body}"
    );
    // Text, or parts (see docs/files.md).
    assert_eq!(
        body["properties"]["message"]["$ref"],
        "#/components/schemas/TurnMessage"
    );
    let message = &schemas["TurnMessage"]["oneOf"];
    assert_eq!(message[0]["type"], "string");
    assert_eq!(message[0]["minLength"], 1);
    assert_eq!(message[1]["type"], "array");
    assert_eq!(message[1]["maxItems"], 64);
    let kinds: Vec<&serde_json::Value> = message[1]["items"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|part| &part["properties"]["type"]["enum"][0])
        .collect();
    assert_eq!(kinds, ["text", "image", "file"]);
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

/// The edge's answers, provoked on every documented operation, are
/// documented for that operation: a long query (414), large headers
/// (431), and on operations with a body a wrong content type (415), a
/// body announced over the limit (413) and a body with an unknown field
/// (422).
#[tokio::test]
async fn every_status_the_edge_answers_is_documented_where_it_is_answered() {
    let app = spawn_app(Backend::Sqlite).await;
    let doc = serde_json::to_value(agent_harness::http::openapi()).unwrap();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let concrete = path
            .replace("{session_id}", "s-doc")
            .replace("{turn_id}", "0190a5c4-0000-7000-8000-000000000000")
            .replace("{checkpoint_id}", "ck-doc")
            .replace("{artifact_id}", "art-doc")
            .replace("{call_id}", "call-doc")
            .replace("{response_id}", "resp_0190a5c4000070008000000000000000");
        for (method, operation) in item.as_object().unwrap() {
            let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let documented = |status: u16| {
                operation["responses"]
                    .as_object()
                    .unwrap()
                    .contains_key(&status.to_string())
            };
            let request = || app.client.request(method.clone(), app.url(&concrete));
            let long_query = format!("{concrete}?pad={}", "q".repeat(9 * 1024));
            let mut answers = vec![
                app.client
                    .request(method.clone(), app.url(&long_query))
                    .send()
                    .await
                    .unwrap()
                    .status(),
                request()
                    .header("x-pad", "h".repeat(40 * 1024))
                    .send()
                    .await
                    .unwrap()
                    .status(),
            ];
            if operation.get("requestBody").is_some() {
                answers.push(
                    request()
                        .header("content-type", "text/plain")
                        .body("hello")
                        .send()
                        .await
                        .unwrap()
                        .status(),
                );
                answers.push(
                    request()
                        .header("content-type", "application/json")
                        .body(r#"{"x-unknown-field": 1}"#)
                        .send()
                        .await
                        .unwrap()
                        .status(),
                );
                // Announced, not sent: the answer comes before the body.
                let head = format!(
                    "{method} {concrete} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    2 * 1024 * 1024
                );
                answers.push(raw_status(&app.address, head.as_bytes()).await);
            }
            for status in answers {
                assert!(
                    documented(status.as_u16()),
                    "{method} {path} answers {status}, which its document does not list"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 50, "{checked}");
}

/// The status of the answer to raw `request` bytes.
async fn raw_status(address: &str, request: &[u8]) -> reqwest::StatusCode {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(address.trim_start_matches("http://"))
        .await
        .unwrap();
    tcp.write_all(request).await.unwrap();
    let mut head = [0u8; 12];
    tokio::time::timeout(crate::helpers::PATIENCE, tcp.read_exact(&mut head))
        .await
        .unwrap()
        .unwrap();
    let status = std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap();
    reqwest::StatusCode::from_u16(status).unwrap()
}

/// Every decision strategy the document (and the API's page) names is one the
/// service gives, and each one it gives is named. (Before, the document
/// said `tool_augmented` where the service says `tool_assisted`.)
#[test]
fn the_strategies_documented_are_the_ones_given() {
    use harness_core::harness::finalizer::STRATEGIES;
    let documents = [
        (
            "openapi.yaml",
            agent_harness::http::openapi_yaml().to_string(),
        ),
        (
            "docs/api.md",
            std::fs::read_to_string(format!("{}/docs/api.md", env!("CARGO_MANIFEST_DIR"))).unwrap(),
        ),
    ];
    for (name, text) in documents {
        let named: std::collections::BTreeSet<&str> = text
            .split(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .filter(|w| {
                w.ends_with("_augmented") || w.ends_with("_assisted") || *w == "direct_answer"
            })
            .collect();
        let given: std::collections::BTreeSet<&str> = STRATEGIES.into_iter().collect();
        assert_eq!(named, given, "{name}");
    }
}

/// The document's `webhooks` name every message an endpoint may be sent,
/// each with its signature headers and the message's schema.
#[test]
fn the_document_lists_every_webhook_message() {
    let api = serde_json::to_value(agent_harness::http::openapi()).unwrap();
    let webhooks = api["webhooks"].as_object().expect("a webhooks section");
    let listed: Vec<&str> = webhooks.keys().map(String::as_str).collect();
    let mut types = agent_harness::http::webhooks::EVENT_TYPES.to_vec();
    types.sort_unstable();
    assert_eq!(listed, types);
    for (name, item) in webhooks {
        let post = &item["post"];
        let headers: Vec<&str> = post["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            headers,
            ["webhook-id", "webhook-timestamp", "webhook-signature"],
            "{name}"
        );
        assert_eq!(
            post["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/WebhookMessage"
        );
    }
    let message = &api["components"]["schemas"]["WebhookMessage"];
    assert_eq!(
        message["properties"]["type"]["enum"]
            .as_array()
            .unwrap()
            .len(),
        8
    );
    assert!(api["components"]["schemas"]["WebhookData"].is_object());
}
