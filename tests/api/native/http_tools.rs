//! HTTP tools declared in the settings, against a fake API on loopback.

use axum::{
    Json, Router,
    extract::{Path, Query},
    http::{HeaderMap, StatusCode},
    routing::{get, post},
};
use serde_json::{Value, json};

use crate::{
    fake_provider::FakeProvider,
    helpers::{TestApp, spawn_app_with_tools, test_settings},
    support::{Backend, TestDb},
};

/// A fake API; returns its port.
async fn api() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = Router::new()
        .route(
            "/items/{id}",
            get(
                |Path(id): Path<String>, Query(query): Query<Value>, headers: HeaderMap| async move {
                    if headers["authorization"] != "Bearer s3cret" {
                        return (StatusCode::UNAUTHORIZED, Json(json!({"error": "no token"})));
                    }
                    (StatusCode::OK, Json(json!({"id": id, "query": query})))
                },
            ),
        )
        .route(
            "/tickets",
            post(|Json(body): Json<Value>| async move {
                (StatusCode::CREATED, Json(json!({"created": body})))
            }),
        )
        .route(
            "/fail",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom") }),
        )
        .route(
            "/raw/{id}",
            get(|uri: axum::http::Uri| async move { uri.to_string() }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

/// An app with the HTTP tools `declared` (a JSON list, as
/// `HARNESS_HTTP_TOOLS` holds it), their variables from `env`.
async fn app_with(declared: Value, env: fn(&str) -> Option<String>) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.tools.http = Some(declared.to_string().parse().unwrap());
    let tools = agent_harness::startup::declared_tools(&settings, env).unwrap();
    settings.tools.http = None;
    spawn_app_with_tools(
        TestDb::new(Backend::Sqlite).await,
        provider,
        settings,
        tools,
    )
    .await
}

#[tokio::test]
async fn declared_http_tools_call_their_api_with_arguments_and_secret_headers() {
    let port = api().await;
    let declared = json!([
        {
            "name": "get_item",
            "description": "Read an item.",
            "url": format!("http://127.0.0.1:{port}/items/{{id}}"),
            "headers": {"Authorization": "Bearer ${ITEMS_TOKEN}"},
            "effect": "READ_ONLY",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}, "verbose": {"type": "boolean"}}, "required": ["id"]}
        },
        {
            "name": "open_ticket",
            "description": "Open a ticket.",
            "method": "POST",
            "url": format!("http://127.0.0.1:{port}/tickets"),
            "parameters": {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
        },
        {"name": "broken", "description": "Fails.", "url": format!("http://127.0.0.1:{port}/fail"), "effect": "READ_ONLY"}
    ]);
    let app = app_with(declared, |name| {
        (name == "ITEMS_TOKEN").then(|| "s3cret".to_owned())
    })
    .await;

    let (_, listed) = app.get_json("/tools").await;
    let http: Vec<(&str, &str, &str)> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["source"] == "http")
        .map(|t| {
            (
                t["name"].as_str().unwrap(),
                t["effect"].as_str().unwrap(),
                t["source"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        http,
        [
            ("get_item", "READ_ONLY", "http"),
            ("open_ticket", "NETWORK", "http"),
            ("broken", "READ_ONLY", "http")
        ]
    );

    let (finished, message) = app
        .call_tool("get_item", json!({"id": "a 1", "verbose": true}))
        .await;
    assert_eq!(finished["status"], "completed", "{finished}");
    assert!(message.contains("HTTP 200 OK"), "{message}");
    assert!(message.contains(r#""id":"a 1""#), "{message}");
    assert!(message.contains(r#""verbose":"true""#), "{message}");

    let (finished, message) = app
        .call_tool("open_ticket", json!({"title": "Printer"}))
        .await;
    assert_eq!(finished["status"], "completed");
    assert!(
        message.contains(r#"{"created":{"title":"Printer"}}"#),
        "{message}"
    );

    let (finished, message) = app.call_tool("broken", json!({})).await;
    assert_eq!(finished["status"], "failed");
    assert!(
        finished["error"]
            .as_str()
            .unwrap()
            .contains("the API answered 500 Internal Server Error: boom"),
        "{finished}"
    );
    // The API's words reach the model inside the untrusted fence.
    assert!(message.contains("<<<UNTRUSTED_CONTEXT "), "{message}");
}

#[test]
fn a_declared_tool_needs_its_variables_and_its_own_name() {
    let provider_settings = |declared: Value| {
        let mut settings = harness_core::config::Settings::default();
        settings.tools.http = Some(declared.to_string().parse().unwrap());
        settings
    };
    let settings = provider_settings(json!([{
        "name": "get_item", "description": "d", "url": "https://api.example/",
        "headers": {"Authorization": "Bearer ${ITEMS_TOKEN}"}
    }]));
    let error = agent_harness::startup::declared_tools(&settings, |_| None)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("\"get_item\"") && error.contains("ITEMS_TOKEN is not set"),
        "{error}"
    );
    let settings = provider_settings(
        json!([{"name": "read_note", "description": "d", "url": "https://api.example/"}]),
    );
    let error = agent_harness::startup::declared_tools(&settings, |_| None)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("a built-in tool has this name"), "{error}");
    // `client__` names a client's own tools.
    let declared: Result<harness_core::tools::http_tool::HttpToolList, _> =
        json!([{"name": "client__get_location", "description": "d", "url": "https://api.example/"}])
            .to_string()
            .parse();
    assert!(
        declared.unwrap_err().contains("reserved for client tools"),
        "the setting is refused at start"
    );
    let servers: Result<harness_core::tools::mcp::McpServerList, _> =
        r#"[{"name": "client", "url": "https://mcp.example/"}]"#.parse();
    assert!(servers.unwrap_err().contains("reserved"));
}

/// A `GET` tool whose arguments all stand in its path sends no query
/// string at all: `/raw/T-42`, not `/raw/T-42?`. (Before, a bare `?`.)
#[tokio::test]
async fn a_get_without_query_arguments_has_no_question_mark() {
    let port = api().await;
    let declared = json!([{
        "name": "raw",
        "description": "The URI the API saw.",
        "url": format!("http://127.0.0.1:{port}/raw/{{id}}"),
        "effect": "READ_ONLY",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
    }]);
    let app = app_with(declared, |_| None).await;
    let (finished, message) = app.call_tool("raw", json!({"id": "T-42"})).await;
    assert_eq!(finished["status"], "completed", "{finished}");
    assert_eq!(finished["output"], "HTTP 200 OK\n/raw/T-42", "{message}");
    let (_, message) = app
        .call_tool("raw", json!({"id": "T-42", "verbose": true}))
        .await;
    assert!(message.contains("/raw/T-42?verbose=true"), "{message}");
}

/// An API whose every request is counted by its path (and method), with a
/// redirect to `elsewhere` and one within itself, and an error page that
/// quotes the request's `Authorization`; returns its port and the count.
async fn counting_api(elsewhere: u16) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use axum::{extract::Request, response::IntoResponse};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let app = Router::new().fallback(move |request: Request| {
        let log = log.clone();
        async move {
            let path = request.uri().path().to_owned();
            log.lock()
                .unwrap()
                .push(format!("{} {path}", request.method()));
            match path.as_str() {
                "/moved-away" => (
                    StatusCode::FOUND,
                    [("location", format!("http://127.0.0.1:{elsewhere}/raw/x"))],
                )
                    .into_response(),
                "/moved-here" => (
                    StatusCode::FOUND,
                    [("location", "/projects/p1/tickets/T-1".to_owned())],
                )
                    .into_response(),
                "/echo" => (
                    StatusCode::BAD_REQUEST,
                    format!("you sent {:?}", request.headers()["authorization"]),
                )
                    .into_response(),
                _ => (StatusCode::OK, path).into_response(),
            }
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (port, seen)
}

/// An HTTP tool keeps to its template: `..` cannot reach the template's
/// parent, redirects are followed only when declared and only to the same
/// origin, and the configured header values never show in its errors.
/// (Before, `DELETE …/tickets/{id}` with `id: ".."` deleted
/// `/projects/p1/`, every redirect was followed anywhere, and the token an
/// API quoted reached the model.)
#[tokio::test]
async fn an_http_tool_keeps_to_its_template_its_origin_and_its_secrets() {
    let other = api().await;
    let (port, seen) = counting_api(other).await;
    let root = format!("http://127.0.0.1:{port}");
    let declared = json!([
        {
            "name": "delete_ticket", "description": "Delete a ticket.", "method": "DELETE",
            "url": format!("{root}/projects/p1/tickets/{{id}}"), "effect": "READ_ONLY",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}
        },
        {
            "name": "get_file", "description": "Read a file.",
            "url": format!("{root}/files/{{path*}}"), "effect": "READ_ONLY",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}
        },
        {
            "name": "stay", "description": "Goes where it is sent.",
            "url": format!("{root}/{{to}}"), "effect": "READ_ONLY",
            "parameters": {"type": "object", "properties": {"to": {"type": "string"}}}
        },
        {
            "name": "follow", "description": "Follows redirects.", "follow_redirects": true,
            "url": format!("{root}/{{to}}"), "effect": "READ_ONLY",
            "headers": {"Authorization": "Bearer ${TOKEN}"},
            "parameters": {"type": "object", "properties": {"to": {"type": "string"}}}
        }
    ]);
    let app = app_with(declared, |name| {
        (name == "TOKEN").then(|| "tok-9f8e7d6c5b".to_owned())
    })
    .await;
    for id in ["..", ".", "", "a/b", "../../admin"] {
        let (finished, _) = app.call_tool("delete_ticket", json!({"id": id})).await;
        assert_eq!(finished["status"], "failed", "{id:?}: {finished}");
        assert!(
            finished["error"]
                .as_str()
                .unwrap()
                .starts_with("invalid_input"),
            "{id:?}: {finished}"
        );
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
    let (finished, _) = app.call_tool("delete_ticket", json!({"id": "T-1"})).await;
    assert_eq!(finished["output"], "HTTP 200 OK\n/projects/p1/tickets/T-1");
    let (finished, _) = app
        .call_tool("get_file", json!({"path": "docs/a.md"}))
        .await;
    assert_eq!(finished["output"], "HTTP 200 OK\n/files/docs/a.md");
    let (finished, _) = app
        .call_tool("get_file", json!({"path": "docs/../../x"}))
        .await;
    assert_eq!(finished["status"], "failed", "{finished}");

    // Not declared: the redirect is the answer.
    let (finished, _) = app.call_tool("stay", json!({"to": "moved-here"})).await;
    assert!(
        finished["error"].as_str().unwrap().contains("answered 302"),
        "{finished}"
    );
    // Declared: followed within the origin, refused out of it.
    let (finished, _) = app.call_tool("follow", json!({"to": "moved-here"})).await;
    assert_eq!(finished["output"], "HTTP 200 OK\n/projects/p1/tickets/T-1");
    let (finished, _) = app.call_tool("follow", json!({"to": "moved-away"})).await;
    assert_eq!(finished["status"], "failed", "{finished}");
    assert!(
        finished["error"]
            .as_str()
            .unwrap()
            .contains("another origin"),
        "{finished}"
    );
    // The token the API quotes back is masked.
    let (finished, message) = app.call_tool("follow", json!({"to": "echo"})).await;
    let error = finished["error"].as_str().unwrap();
    assert!(error.contains("[redacted]"), "{error}");
    assert!(!error.contains("tok-9f8e7d6c5b"), "{error}");
    assert!(!message.contains("tok-9f8e7d6c5b"), "{message}");
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        [
            "DELETE /projects/p1/tickets/T-1",
            "GET /files/docs/a.md",
            "GET /moved-here",
            "GET /moved-here",
            "GET /projects/p1/tickets/T-1",
            "GET /moved-away",
            "GET /echo",
        ]
    );
}
