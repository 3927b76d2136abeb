//! The web tools through the service, against a web server on loopback:
//! a SearXNG-compatible search, a page, redirects. Every address used is on
//! this machine; the refusals happen before any connection is made.

use axum::{
    Router,
    http::{StatusCode, header},
    response::{IntoResponse, Redirect},
    routing::get,
};
use serde_json::{Value, json};

use crate::{
    fake_provider::{FakeProvider, Reply, fixture},
    helpers::{TestApp, first_event, spawn_app_with, test_settings, types},
    support::{Backend, TestDb},
};

const PAGE: &str = "<html><head><title>Eurostar booking</title><script>track()</script></head>\
    <body><h1>Booking</h1><p>Tickets go on sale six months ahead.</p></body></html>";

/// A web server on loopback; returns its port.
async fn web_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app =
        Router::new()
            .route(
                "/search",
                get(|| async {
                    (
                        [(header::CONTENT_TYPE, "application/json")],
                        fixture("searxng/search.json"),
                    )
                }),
            )
            .route(
                "/page",
                get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE) }),
            )
            .route(
                "/big",
                get(|| async {
                    let body = format!("<p>{}</p>", "word ".repeat(100_000));
                    ([(header::CONTENT_TYPE, "text/html")], body)
                }),
            )
            .route(
                "/image",
                get(|| async {
                    (
                        [(header::CONTENT_TYPE, "image/png")],
                        vec![0x89u8, b'P', b'N', b'G'],
                    )
                }),
            )
            .route(
                "/to-loopback",
                get(move || async move {
                    Redirect::temporary(&format!("http://127.0.0.1:{port}/page"))
                }),
            )
            .route(
                "/to-localhost",
                get(move || async move {
                    Redirect::temporary(&format!("http://localhost:{port}/page"))
                }),
            )
            .route(
                "/gone",
                get(|| async { StatusCode::NOT_FOUND.into_response() }),
            );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

/// An app whose web tools use the server at `port`; `allow` names what
/// fetch_url may reach although internal.
async fn app_with_web(port: u16, allow: Option<&str>) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.web.search_url = Some(format!("http://127.0.0.1:{port}").parse().unwrap());
    settings.web.allow = allow.map(|a| a.parse().unwrap());
    settings.web.fetch_max_bytes = 64 * 1024;
    spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await
}

/// A turn with `web_mode` in which the model makes one call; returns the
/// events.
async fn web_turn(
    app: &TestApp,
    web_mode: &str,
    name: &str,
    arguments: Value,
) -> Vec<crate::helpers::SseEvent> {
    app.provider.enqueue([
        Reply::openai_tool_call("call_w1", name, &arguments),
        Reply::sse("openai/text.sse"),
    ]);
    let mut stream = app
        .post_turn_sse(
            "s-web",
            json!({"message": "Look it up.", "web_mode": web_mode, "show_citations": true}),
        )
        .await;
    let events = stream.read_to_end().await;
    assert_eq!(
        types(&events).last(),
        Some(&"turn.completed"),
        "{:?}",
        types(&events)
    );
    events
}

fn finished(events: &[crate::helpers::SseEvent]) -> Value {
    events
        .iter()
        .find(|e| e.event == "tool.finished")
        .map(|e| e.json())
        .expect("a tool.finished event")
}

/// The tool message the model got for the call.
fn tool_message(app: &TestApp) -> String {
    let requests = app.provider.requests();
    let messages = requests.last().unwrap().body["messages"]
        .as_array()
        .unwrap()
        .clone();
    messages
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .unwrap()
}

#[tokio::test]
async fn web_search_returns_results_as_web_citations_only_with_web_mode_on() {
    let port = web_server().await;
    let app = app_with_web(port, None).await;
    let events = web_turn(&app, "on", "web_search", json!({"query": "eurostar paris"})).await;
    assert_eq!(finished(&events)["status"], "completed");
    let message = tool_message(&app);
    assert!(
        message.contains("1. Booking your Eurostar trip\n   https://www.eurostar.com/uk-en/travel-info/travel-planning/book\n   Tickets go on sale"),
        "{message}"
    );
    assert!(!message.contains("magnet:"), "{message}");
    let result = &events.last().unwrap().json()["result"];
    assert_eq!(
        result["web_citations"],
        json!([
            {"title": "Booking your Eurostar trip", "url": "https://www.eurostar.com/uk-en/travel-info/travel-planning/book"},
            {"title": "Eurostar - Wikipedia", "url": "https://en.wikipedia.org/wiki/Eurostar"}
        ])
    );
    let decision = first_event(&events, "decision");
    assert_eq!(decision["strategy"], "web_augmented");

    // With web_mode off the web tools are neither offered nor run.
    let events = web_turn(&app, "off", "web_search", json!({"query": "eurostar"})).await;
    let denied = finished(&events);
    assert_eq!(
        (denied["status"].as_str(), denied["reason"].as_str()),
        (Some("denied"), Some("permission"))
    );
    let offered = app.provider.requests().last().unwrap().body["tools"].to_string();
    assert!(
        !offered.contains("web_search") && !offered.contains("fetch_url"),
        "{offered}"
    );
}

#[tokio::test]
async fn fetch_url_renders_a_page_and_keeps_the_whole_text() {
    let port = web_server().await;
    let app = app_with_web(port, Some("localhost")).await;
    let events = web_turn(
        &app,
        "on",
        "fetch_url",
        json!({"url": format!("http://localhost:{port}/page")}),
    )
    .await;
    assert_eq!(
        finished(&events)["status"],
        "completed",
        "{}",
        finished(&events)
    );
    let message = tool_message(&app);
    assert!(message.contains("Title: Eurostar booking"), "{message}");
    assert!(
        message.contains("Booking\nTickets go on sale six months ahead."),
        "{message}"
    );
    assert!(!message.contains("track()"), "{message}");
    let result = &events.last().unwrap().json()["result"];
    let rendered = result["rendered_content_paths"][0]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        rendered.starts_with("/sessions/s-web/artifacts/art_"),
        "{result}"
    );
    assert_eq!(
        result["web_citations"],
        json!([{"title": "Eurostar booking", "url": format!("http://localhost:{port}/page")}])
    );
    let (status, artifact) = app.get_json(&rendered).await;
    assert_eq!(status, 200);
    assert!(
        artifact["content"]
            .as_str()
            .unwrap()
            .contains("six months ahead"),
        "{artifact}"
    );

    // A long page is cut at the size cap; what is not text is refused.
    web_turn(
        &app,
        "on",
        "fetch_url",
        json!({"url": format!("http://localhost:{port}/big")}),
    )
    .await;
    assert!(
        tool_message(&app).contains("the page was cut at 65536 bytes"),
        "{}",
        tool_message(&app)
    );
    let events = web_turn(
        &app,
        "on",
        "fetch_url",
        json!({"url": format!("http://localhost:{port}/image")}),
    )
    .await;
    assert!(
        finished(&events)["error"]
            .as_str()
            .unwrap()
            .contains("is not a text page (image/png)")
    );
    let events = web_turn(
        &app,
        "on",
        "fetch_url",
        json!({"url": format!("http://localhost:{port}/gone")}),
    )
    .await;
    assert!(
        finished(&events)["error"]
            .as_str()
            .unwrap()
            .contains("answered 404")
    );
}

#[tokio::test]
async fn fetch_url_refuses_internal_addresses_even_after_a_redirect_or_a_lookup() {
    let port = web_server().await;
    // localhost is allowed by name; 127.0.0.1 written as an address is not.
    let app = app_with_web(port, Some("localhost")).await;
    for (url, says) in [
        (
            format!("http://localhost:{port}/to-loopback"),
            format!("a redirect to http://127.0.0.1:{port}/page"),
        ),
        (
            format!("http://127.0.0.1:{port}/page"),
            "127.0.0.1 is a loopback".to_owned(),
        ),
        (
            format!("http://[::1]:{port}/page"),
            "::1 is a loopback".to_owned(),
        ),
        (
            format!("http://0x7f000001:{port}/page"),
            "127.0.0.1 is a loopback".to_owned(),
        ),
        // 6to4 of the loopback address.
        (
            format!("http://[2002:7f00:1::1]:{port}/page"),
            "2002:7f00:1::1 is a loopback".to_owned(),
        ),
        (
            "file:///etc/passwd".to_owned(),
            "only http and https".to_owned(),
        ),
    ] {
        let events = web_turn(&app, "on", "fetch_url", json!({"url": url})).await;
        let failed = finished(&events);
        assert_eq!(failed["status"], "failed", "{url}: {failed}");
        let error = failed["error"].as_str().unwrap();
        assert!(
            error.starts_with("permission_denied: refused: "),
            "{url}: {error}"
        );
        assert!(error.contains(&says), "{url}: {error}");
    }
    // Without the exception, the name's lookup finds only loopback.
    let strict = app_with_web(port, None).await;
    let events = web_turn(
        &strict,
        "on",
        "fetch_url",
        json!({"url": format!("http://localhost:{port}/page")}),
    )
    .await;
    let error = finished(&events)["error"].as_str().unwrap().to_owned();
    assert!(
        error.contains("localhost resolves only to loopback"),
        "{error}"
    );
    // A redirect to a name is looked up the same way.
    let events = web_turn(
        &strict,
        "on",
        "fetch_url",
        json!({"url": format!("http://localhost:{port}/to-localhost")}),
    )
    .await;
    assert!(
        finished(&events)["error"]
            .as_str()
            .unwrap()
            .contains("refused")
    );
}

/// `web_mode: on` without a search service (`HARNESS_WEB_SEARCH_URL`)
/// says so at once, in `turn.started`: only `fetch_url` is offered. With
/// one, or with `web_mode: off`, there is no warning. (Before, nothing
/// said why the model never searched.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_mode_on_without_a_search_service_warns_in_turn_started() {
    let port = web_server().await;
    let searching = app_with_web(port, None).await;
    let plain = crate::helpers::spawn_app(crate::support::Backend::Sqlite).await;
    for (app, web_mode, warned) in [
        (&plain, "on", true),
        (&plain, "off", false),
        (&searching, "on", false),
    ] {
        app.provider.enqueue([Reply::sse("openai/text.sse")]);
        let mut stream = app
            .post_turn_sse("s-warn", json!({"message": "Hi", "web_mode": web_mode}))
            .await;
        let started = stream.read_until("turn.started").await;
        let started = started.last().unwrap().json();
        stream.read_to_end().await;
        let warnings = started["warnings"].as_array().cloned().unwrap_or_default();
        assert_eq!(!warnings.is_empty(), warned, "{web_mode}: {started}");
        if warned {
            let warning = warnings[0].as_str().unwrap();
            assert!(warning.contains("only fetch_url is offered"), "{warning}");
            let offered: Vec<String> = app.provider.requests().last().unwrap().body["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect();
            assert!(offered.contains(&"fetch_url".to_owned()), "{offered:?}");
            assert!(!offered.contains(&"web_search".to_owned()), "{offered:?}");
        }
    }
}
