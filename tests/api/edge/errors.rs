//! Every bad input gets a problem+json with a stable code and leaves nothing
//! behind; every provider failure ends the turn with `turn.failed`.

use serde_json::{Value, json};

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{ServiceProcess, TestApp, spawn_app, spawn_app_with, test_settings, types},
    on_both_backends,
    support::{Backend, TestDb},
};

async fn send_raw(
    app: &TestApp,
    path: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> (u16, String, Value) {
    let mut request = app.client.post(app.url(path)).body(body);
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    (
        status,
        content_type,
        response.json().await.unwrap_or(Value::Null),
    )
}

/// Asserts the problem document and that the session was not created.
async fn assert_problem(
    app: &TestApp,
    session: &str,
    got: (u16, String, Value),
    status: u16,
    code: &str,
) {
    let (got_status, content_type, body) = got;
    assert_eq!(
        (got_status, body["code"].as_str()),
        (status, Some(code)),
        "{body}"
    );
    assert_eq!(content_type, "application/problem+json");
    assert_eq!(body["status"], status);
    assert_eq!(body["type"], format!("urn:agent-harness:problem:{code}"));
    assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()));
    if !session.is_empty() {
        let (status, _) = app.get_json(&format!("/sessions/{session}")).await;
        assert_eq!(
            status, 404,
            "a refused request must not create session {session}"
        );
    }
    assert!(
        app.provider.requests().is_empty(),
        "the provider must not be called"
    );
}

#[tokio::test]
async fn bad_bodies_get_their_own_codes_and_write_nothing() {
    let app = spawn_app(Backend::Sqlite).await;
    let json = Some("application/json");
    let path = "/sessions/s-bad/turns";
    let cases: Vec<(Option<&str>, &[u8], u16, &str)> = vec![
        (json, b"{\"message\": ", 400, "invalid_json"),
        (json, b"not json", 400, "invalid_json"),
        (json, b"", 400, "invalid_json"),
        (json, b"{}", 422, "message_required"),
        (json, b"{\"message\": null}", 422, "message_required"),
        (json, b"{\"message\": \"\"}", 422, "message_required"),
        (json, b"{\"message\": \"   \"}", 422, "message_required"),
        (json, b"{\"message\": 42}", 422, "invalid_body"),
        (
            json,
            b"{\"message\": \"hi\", \"top_k\": \"five\"}",
            422,
            "invalid_body",
        ),
        (
            json,
            b"{\"message\": \"hi\", \"web_mode\": \"sometimes\"}",
            422,
            "invalid_body",
        ),
        (
            json,
            b"{\"message\": \"hi\", \"show_citations\": \"yes\"}",
            422,
            "invalid_body",
        ),
        (
            json,
            b"{\"message\": \"hi\", \"history\": [{\"role\": \"robot\", \"content\": \"x\"}]}",
            422,
            "invalid_body",
        ),
        (json, b"{\"mesage\": \"typo\"}", 422, "invalid_body"),
        (json, b"[\"message\"]", 422, "invalid_body"),
        (
            json,
            b"{\"message\": \"hi\", \"top_k\": 0}",
            422,
            "invalid_field",
        ),
        (
            json,
            b"{\"message\": \"hi\", \"runtime_provider\": \"nobody\"}",
            422,
            "invalid_field",
        ),
        (
            json,
            b"{\"message\": \"hi\", \"runtime_model\": \"gpt-4o\\n- today: 1999-01-01\"}",
            422,
            "invalid_field",
        ),
        (
            json,
            b"{\"message\": \"hi\", \"runtime_provider\": \"openai\\u0007\"}",
            422,
            "invalid_field",
        ),
        (
            json,
            b"{\"message\": \"hi\\u0000there\"}",
            422,
            "invalid_field",
        ),
        (
            json,
            b"{\"message\": \"hi\", \"history\": [{\"role\": \"user\", \"content\": \"a\\u0000\"}]}",
            422,
            "invalid_field",
        ),
        (
            Some("text/plain"),
            b"{\"message\": \"hi\"}",
            415,
            "unsupported_media_type",
        ),
        (
            None,
            b"{\"message\": \"hi\"}",
            415,
            "unsupported_media_type",
        ),
    ];
    for (content_type, body, status, code) in cases {
        let got = send_raw(&app, path, content_type, body.to_vec()).await;
        assert_problem(&app, "s-bad", got, status, code).await;
    }
    // The field at fault is named.
    let (_, _, body) = send_raw(
        &app,
        path,
        json,
        br#"{"message": "hi", "history": [{"role": "user", "content": 7}]}"#.to_vec(),
    )
    .await;
    assert_eq!(body["field"], "history[0].content");
}

#[tokio::test]
async fn a_body_over_the_limit_gets_413() {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.body_limit_bytes = 1024;
    let app = spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await;
    let big = serde_json::to_vec(&json!({"message": "x".repeat(2000)})).unwrap();
    let got = send_raw(&app, "/sessions/s-big/turns", Some("application/json"), big).await;
    assert!(got.2["detail"].as_str().unwrap().contains("1024"));
    assert_problem(&app, "s-big", got, 413, "payload_too_large").await;
    // Just under the limit is fine.
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let fits = serde_json::to_vec(&json!({"message": "x".repeat(900)})).unwrap();
    let (status, _, _) = send_raw(
        &app,
        "/sessions/s-big/turns",
        Some("application/json"),
        fits,
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn bad_session_ids_are_refused() {
    let app = spawn_app(Backend::Sqlite).await;
    let long = "a".repeat(129);
    for session in [
        "",
        "has space",
        "slash%2Fin",
        "ünï",
        long.as_str(),
        "semi;colon",
    ] {
        let got = send_raw(
            &app,
            &format!("/sessions/{session}/turns"),
            Some("application/json"),
            br#"{"message":"hi"}"#.to_vec(),
        )
        .await;
        assert_problem(&app, "", got, 400, "invalid_session_id").await;
    }
    let (status, body) = app.get_json(&format!("/sessions/{long}/messages")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_session_id"))
    );
    // A parameter that is not UTF-8 once decoded is that parameter's 400
    // (it was a 500 while the session's extractor read every parameter).
    for (path, code) in [
        ("/sessions/%FF/messages", "invalid_session_id"),
        ("/sessions/s-1/turns/%FF", "invalid_turn_id"),
        ("/sessions/s-1/artifacts/%FF", "invalid_query"),
    ] {
        let (status, body) = app.get_json(path).await;
        assert_eq!((status, body["code"].as_str()), (400, Some(code)), "{path}");
    }
    // Every route that names a turn refuses an id that is not one before
    // its handler runs (the path's extractors parse it), body or not.
    for (post, path) in [
        (false, "/sessions/s-1/turns/not-a-uuid/events"),
        (false, "/sessions/s-1/turns/not-a-uuid/judgements"),
        (true, "/sessions/s-1/turns/not-a-uuid/cancel"),
        (true, "/sessions/s-1/turns/not-a-uuid/approvals/call_1"),
        (true, "/sessions/s-1/turns/not-a-uuid/tool-results/call_1"),
    ] {
        let (status, body) = if post {
            app.post_body(path, serde_json::json!({"approve": true, "output": "x"}))
                .await
        } else {
            app.get_json(path).await
        };
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("invalid_turn_id")),
            "{path}: {body}"
        );
    }
    // 128 characters of the alphabet are fine.
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let ok = format!("{}.:_-", "a".repeat(123));
    let (status, _, _) = send_raw(
        &app,
        &format!("/sessions/{ok}/turns"),
        Some("application/json"),
        br#"{"message":"hi"}"#.to_vec(),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn unknown_sessions_turns_routes_and_bad_queries_are_named() {
    let app = spawn_app(Backend::Sqlite).await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let response = app.post_turn("s-known", json!({"message": "hi"})).await;
    let turn_id = response.headers()["x-turn-id"].to_str().unwrap().to_owned();
    let unknown_turn = uuid::Uuid::now_v7();
    let cases = [
        ("/sessions/nobody".to_owned(), 404, "session_not_found"),
        (
            "/sessions/nobody/messages".to_owned(),
            404,
            "session_not_found",
        ),
        (
            "/sessions/nobody/events".to_owned(),
            404,
            "session_not_found",
        ),
        (
            format!("/sessions/s-known/turns/{unknown_turn}"),
            404,
            "turn_not_found",
        ),
        (
            format!("/sessions/s-known/turns/{unknown_turn}/events"),
            404,
            "turn_not_found",
        ),
        // A turn asked for under a session that does not exist: the
        // session is what is missing.
        (
            format!("/sessions/other/turns/{turn_id}"),
            404,
            "session_not_found",
        ),
        (
            "/sessions/s-known/turns/not-a-uuid".to_owned(),
            400,
            "invalid_turn_id",
        ),
        (
            "/sessions/s-known/events?limit=0".to_owned(),
            400,
            "invalid_query",
        ),
        (
            "/sessions/s-known/events?limit=abc".to_owned(),
            400,
            "invalid_query",
        ),
        (
            "/sessions/s-known/events?after=-1".to_owned(),
            400,
            "invalid_query",
        ),
        (
            "/sessions/s-known/messages?bogus=1".to_owned(),
            400,
            "invalid_query",
        ),
        ("/nowhere".to_owned(), 404, "not_found"),
    ];
    for (path, status, code) in cases {
        let (got, body) = app.get_json(&path).await;
        assert_eq!(
            (got, body["code"].as_str()),
            (status, Some(code)),
            "{path}: {body}"
        );
    }
    let response = app
        .client
        .get(app.url(&format!("/sessions/s-known/turns/{turn_id}/events")))
        .header("last-event-id", "yesterday")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(
        response.json::<Value>().await.unwrap()["code"],
        "invalid_header"
    );
    // A bad `after` is refused even beside a good header (before, the
    // header hid it: schemathesis found it).
    let response = app
        .client
        .get(app.url(&format!(
            "/sessions/s-known/turns/{turn_id}/events?after=-1"
        )))
        .header("last-event-id", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(
        response.json::<Value>().await.unwrap()["code"],
        "invalid_query"
    );
    let (status, body) = app
        .post_json(&format!("/sessions/s-known/turns/{unknown_turn}/cancel"))
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("turn_not_found"))
    );
    let response = app.client.delete(app.url("/healthz")).send().await.unwrap();
    assert_eq!(response.status(), 405);
    let response = app
        .client
        .post(app.url("/sessions/s-known/turns"))
        .header("idempotency-key", "has space")
        .json(&json!({"message": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(
        response.json::<Value>().await.unwrap()["code"],
        "invalid_header"
    );
}

/// A provider failure ends the turn with `turn.failed` (SSE) or a 502
/// problem (JSON), the turn is `failed`, and no history is written.
async fn assert_provider_failure(app: &TestApp, session: &str, code: &str) {
    let mut stream = app.post_turn_sse(session, json!({"message": "Hi"})).await;
    assert_eq!(stream.status, 200);
    let turn_id = stream.turn_id();
    let events = stream.read_to_end().await;
    let last = events.last().unwrap();
    assert_eq!(last.event, "turn.failed", "{:?}", types(&events));
    assert_eq!(last.json()["code"], code);
    assert!(
        !last.json()["message"]
            .as_str()
            .unwrap()
            .contains("sk-test-key")
    );
    let turn = app.wait_turn_end(session, &turn_id).await;
    assert_eq!(turn["status"], "failed");
    assert_eq!(turn["error"]["code"], code);
    let (_, messages) = app.get_json(&format!("/sessions/{session}/messages")).await;
    assert_eq!(messages["messages"], json!([]));
}

async fn provider_failures_fail_the_turn_with_a_clear_code(backend: Backend) {
    let app = spawn_app(backend).await;
    let cases = [
        (
            Reply::body(401, "application/json", "openai/error_401.json"),
            "provider_auth_failed",
        ),
        (
            Reply::body(429, "application/json", "openai/error_429.json")
                .header("retry-after", "1"),
            "provider_rate_limited",
        ),
        (
            Reply::body(400, "application/json", "openai/error_context_length.json"),
            "provider_context_length_exceeded",
        ),
        (
            Reply::body(502, "text/html", "openai/gateway_502.html"),
            "provider_server_error",
        ),
        (
            Reply::body(200, "text/html", "openai/gateway_502.html"),
            "provider_protocol_error",
        ),
        (
            Reply::sse("openai/invalid_chunk.sse"),
            "provider_protocol_error",
        ),
        (
            Reply::sse("openai/truncated.sse"),
            "provider_stream_interrupted",
        ),
    ];
    for (i, (reply, code)) in cases.into_iter().enumerate() {
        app.provider.enqueue([reply]);
        assert_provider_failure(&app, &format!("s-fail-{i}"), code).await;
    }
    // The JSON mode answers 502 with the turn's code.
    app.provider.enqueue([Reply::body(
        401,
        "application/json",
        "openai/error_401.json",
    )]);
    let response = app.post_turn("s-fail-json", json!({"message": "Hi"})).await;
    assert_eq!(response.status(), 502);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "provider_auth_failed");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("Incorrect API key")
    );
    assert!(problem["turn_id"].is_string());
}

async fn an_unreachable_provider_fails_the_turn(backend: Backend) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    // A port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    settings.providers.openai_base_url = format!("http://{}/v1", closed.local_addr().unwrap())
        .parse()
        .unwrap();
    drop(closed);
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    assert_provider_failure(&app, "s-down", "provider_unreachable").await;
    let response = app.post_turn("s-down-json", json!({"message": "Hi"})).await;
    assert_eq!(response.status(), 502);
    assert_eq!(
        response.json::<Value>().await.unwrap()["code"],
        "provider_unreachable"
    );
}

async fn a_stalled_provider_times_out_cleanly(backend: Backend) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.providers.idle_timeout_s = 1;
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    let gate = tokio_util::sync::CancellationToken::new();
    app.provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(2, &gate)]);
    assert_provider_failure(&app, "s-stall", "provider_timeout").await;
}

on_both_backends!(
    provider_failures_fail_the_turn_with_a_clear_code,
    an_unreachable_provider_fails_the_turn,
    a_stalled_provider_times_out_cleanly,
);

/// An answer with U+0000 is kept on both databases alike, as U+FFFD: in
/// the live stream, the history and the JSON answer, and the session
/// takes its next turn (Postgres text cannot hold U+0000: it used to
/// refuse the turn's end and lose the answer).
async fn an_answer_with_nul_is_kept_as_the_replacement_character(backend: Backend) {
    let app = spawn_app(backend).await;
    let body = crate::fake_provider::fixture("openai/text.sse")
        .replace(r#""content":"Hello""#, r#""content":"Hel\u0000lo""#);
    app.provider
        .enqueue([Reply::raw_sse(&body), Reply::raw_sse(&body)]);
    let mut stream = app.post_turn_sse("s-nul", json!({"message": "Hi"})).await;
    let events = stream.read_to_end().await;
    let answer = "Hel\u{FFFD}lo! How can I help you today?";
    assert_eq!(events.last().unwrap().event, "turn.completed");
    assert_eq!(crate::helpers::streamed_text(&events), answer);
    // The same in JSON mode, in the same session.
    let json_turn = app.post_turn("s-nul", json!({"message": "again"})).await;
    assert_eq!(json_turn.status(), 200);
    let json_turn: Value = json_turn.json().await.unwrap();
    assert_eq!(json_turn["text"], answer, "{json_turn}");
    let (_, history) = app.get_json("/sessions/s-nul/messages").await;
    let contents: Vec<&str> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, ["Hi", answer, "again", answer]);
    // A replay gives what was streamed.
    let (_, log) = app.get_json("/sessions/s-nul/events").await;
    assert!(log.to_string().contains("Hel\u{FFFD}lo"), "{log}");
    assert!(!log.to_string().contains("\\u0000"), "{log}");
}

on_both_backends!(an_answer_with_nul_is_kept_as_the_replacement_character);

/// An answer Postgres refuses to store (here: a trigger of the test's
/// schema rejects it) still ends the turn at once, `failed` with
/// `event_log_unavailable`; the answer is kept on the turn row, the
/// session is free, and no job is left for an answer never stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_the_database_refuses_still_ends_the_turn() {
    if crate::support::postgres_or_skip().await {
        answer_refused(None).await;
    }
}

/// The same, with every write in a batch of its own (as a busy writer may
/// batch them): the turn's end, alone in its batch, is refused once and
/// not tried again as if the database were down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_end_alone_in_its_batch_is_tried_once() {
    if crate::support::postgres_or_skip().await {
        answer_refused(Some(1)).await;
    }
}

async fn answer_refused(event_batch_max: Option<usize>) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    // The turn queues a memory extraction job and a judge's: they are kept
    // only with an end that is stored.
    settings.memory.extraction = true;
    settings.harness.prompt_id = Some("support".into());
    settings.judges.list = Some(
        json!([{"name": "relevance", "criteria": "The answer addresses the question."}])
            .to_string()
            .parse()
            .unwrap(),
    );
    if let Some(max) = event_batch_max {
        settings.database.event_batch_max = max;
    }
    let app = spawn_app_with(TestDb::new(Backend::Postgres).await, provider, settings).await;
    app.db
        .execute_postgres(
            "CREATE FUNCTION refuse_marked() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF NEW.content LIKE '%refused-by-the-test%' THEN \
             RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$; \
             CREATE TRIGGER refuse_marked BEFORE INSERT ON messages \
             FOR EACH ROW EXECUTE FUNCTION refuse_marked();",
        )
        .await;
    let body = crate::fake_provider::fixture("openai/text.sse").replace(
        r#""content":"Hello""#,
        r#""content":"Hello refused-by-the-test""#,
    );
    app.provider
        .enqueue([Reply::raw_sse(&body), Reply::sse("openai/text.sse")]);
    // Text for whoever asks next (the next turn, or the turn's jobs).
    app.provider
        .enqueue([Reply::sse("openai/text.sse"), Reply::sse("openai/text.sse")]);
    let mut stream = app
        .post_turn_sse("s-refused", json!({"message": "Hi"}))
        .await;
    let turn_id = stream.turn_id();
    let events = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_to_end())
        .await
        .expect("the turn ends within seconds");
    let answer = "Hello refused-by-the-test! How can I help you today?";
    let last = events.last().unwrap().json();
    let turn = app.wait_turn_end("s-refused", &turn_id).await;
    let (_, history) = app.get_json("/sessions/s-refused/messages").await;
    let (_, jobs) = app.get_json("/sessions/s-refused/jobs").await;
    let jobs_of_turn = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["turn_id"] == turn_id.as_str())
        .count();
    assert_eq!(last["type"], "turn.failed", "{last}");
    assert_eq!(last["code"], "event_log_unavailable");
    assert_eq!(turn["status"], "failed");
    assert_eq!(turn["error"]["code"], "event_log_unavailable", "{turn}");
    // The answer is kept on the turn row.
    assert_eq!(turn["result"]["text"], answer);
    assert_eq!(history["messages"], json!([]));
    // Nor a job to extract memories from an answer not stored.
    assert_eq!(jobs_of_turn, 0, "{jobs}");
    // The database refuses the data itself: the end is tried once, not
    // retried as if the database were down.
    assert_eq!(
        app.metric("agent_harness_event_batch_failures_total").await,
        1.0
    );
    // The session is free for its next turn.
    let next = app
        .post_turn("s-refused", json!({"message": "again"}))
        .await;
    assert_eq!(next.status(), 200);
}

/// Everything the service logs, captured (for one current-thread test).
#[derive(Clone, Default)]
pub(crate) struct Logs(pub(crate) std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

/// A provider that quotes the key it was sent (and a URL with a key in its
/// query) back in its errors: no client, event, row or log line sees them.
#[tokio::test]
async fn keys_a_provider_quotes_back_reach_no_client_event_row_or_log() {
    const KEY: &str = "sk-canary-7f3a9c2e5b1d";
    const QUERY_KEY: &str = "qk-canary-4e8d";
    let logs = Logs::default();
    let _capture = crate::support::capture::capture(
        tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_max_level(tracing::Level::DEBUG)
            .finish(),
    );
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.providers.openai_api_key = Some(KEY.into());
    settings.providers.openai_base_url = format!("{}?key={QUERY_KEY}", provider.base_url)
        .parse()
        .unwrap();
    let app = spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await;
    let quoted = format!("key {KEY} for /v1/chat/completions?key={QUERY_KEY}");
    app.provider.enqueue([
        Reply::text(
            401,
            "application/json",
            &json!({"error": {"message": format!("Incorrect API key provided: {quoted}"), "type": "invalid_request_error", "code": "invalid_api_key"}}).to_string(),
        ),
        Reply::text(200, "text/html", &format!("<html><body>Denied: {quoted}</body></html>")),
        Reply::raw_sse(&format!(
            "data: {}\n\n",
            json!({"error": {"message": format!("upstream refused {quoted}"), "type": "server_error", "code": "server_error"}})
        )),
    ]);
    let leaks = |text: &str| text.contains(KEY) || text.contains(QUERY_KEY);
    for (n, code) in [
        "provider_auth_failed",
        "provider_protocol_error",
        "provider_server_error",
    ]
    .into_iter()
    .enumerate()
    {
        let session = format!("s-canary-{n}");
        let response = app.post_turn(&session, json!({"message": "Hi"})).await;
        assert_eq!(response.status(), 502);
        let body = response.text().await.unwrap();
        assert!(!leaks(&body), "{body}");
        assert!(body.contains(code), "{body}");
        assert!(body.contains("[redacted]"), "{body}");
        let (_, log) = app.get_json(&format!("/sessions/{session}/events")).await;
        assert!(!leaks(&log.to_string()), "{log}");
        let turn_id = log["events"][0]["turn_id"].as_str().unwrap().to_owned();
        let (_, turn) = app
            .get_json(&format!("/sessions/{session}/turns/{turn_id}"))
            .await;
        assert!(!leaks(&turn.to_string()), "{turn}");
        assert_eq!(turn["error"]["code"], code);
    }
    // A transport error names the URL, query and all.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/v1?key={QUERY_KEY}", closed.local_addr().unwrap());
    drop(closed);
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.providers.openai_base_url = dead.parse().unwrap();
    let unreachable = spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await;
    let response = unreachable
        .post_turn("s-canary-net", json!({"message": "Hi"}))
        .await;
    assert_eq!(response.status(), 502);
    let body = response.text().await.unwrap();
    assert!(body.contains("provider_unreachable"), "{body}");
    assert!(!leaks(&body), "{body}");

    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        logged.contains("provider"),
        "the logs were captured: {logged}"
    );
    assert!(!leaks(&logged), "{logged}");
}

/// The wire formats that send the whole conversation refuse the same bad
/// conversations the same way, and none of them starts a turn.
#[tokio::test]
async fn every_whole_conversation_format_refuses_a_bad_conversation_alike() {
    let app = spawn_app(Backend::Sqlite).await;
    type Messages<'a> = &'a [(&'a str, &'a str)];
    type Body = fn(Messages<'_>) -> Value;
    // (role, text) as each format carries a message.
    let openai = |m: &[(&str, &str)]| json!({"messages": m.iter().map(|(r, t)| json!({"role": r, "content": t})).collect::<Vec<_>>()});
    let agui = |m: &[(&str, &str)]| json!({"threadId": "t-bad", "messages": m.iter().map(|(r, t)| json!({"id": "m", "role": r, "content": t})).collect::<Vec<_>>()});
    let ui = |m: &[(&str, &str)]| json!({"id": "c-bad", "messages": m.iter().map(|(r, t)| json!({"role": r, "parts": [{"type": "text", "text": t}]})).collect::<Vec<_>>()});
    let responses = |m: &[(&str, &str)]| json!({"input": m.iter().map(|(r, t)| json!({"role": r, "content": [{"type": "input_text", "text": t}]})).collect::<Vec<_>>()});
    let formats: [(&str, Body); 4] = [
        ("/v1/chat/completions", openai),
        ("/v1/agui", agui),
        ("/v1/ui/chat", ui),
        ("/v1/responses", responses),
    ];
    let too_many: Vec<(&str, &str)> = std::iter::repeat_n(("user", "hi"), 1001).collect();
    let cases: [(Messages, &str, &str); 5] = [
        (&[], "invalid_field", "must not be empty"),
        (&[("assistant", "x")], "invalid_field", "the user's"),
        (
            &[("system", "a\u{0}b"), ("user", "hi")],
            "invalid_field",
            "U+0000",
        ),
        (&[("user", "  ")], "message_required", ""),
        (&too_many, "invalid_field", "more than 1000"),
    ];
    for (path, body) in formats {
        for (messages, code, says) in &cases {
            let response = app
                .client
                .post(app.url(path))
                .json(&body(messages))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 422, "{path} {messages:?}");
            let problem: Value = response.json().await.unwrap();
            assert_eq!(problem["code"], *code, "{path}: {problem}");
            assert!(
                problem["detail"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(says),
                "{path}: {problem}"
            );
        }
    }
    assert!(app.provider.requests().is_empty(), "no turn started");
}

/// A password in a provider's URL (`http://user:password@host`) shows
/// nowhere: not in the start-up settings line or any log, not in the
/// failed turn's event or answer.
#[tokio::test]
async fn a_password_in_a_provider_url_never_shows() {
    let db = TestDb::new(Backend::Sqlite).await;
    let provider = FakeProvider::start().await;
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("service.log");
    let password = "Pw-0f-the-proxy";
    let unreachable = format!("http://gateway-user:{password}@127.0.0.1:9/v1");
    let ollama = format!("http://gateway-user:{password}@127.0.0.1:9");
    let service = ServiceProcess::start_logging(
        &db.sqlite_url(),
        &provider,
        &[
            ("OPENAI_BASE_URL", &unreachable),
            ("ANTHROPIC_BASE_URL", &unreachable),
            ("OLLAMA_HOST", &ollama),
            ("RUST_LOG", "debug"),
        ],
        None,
        Some(&logs),
    )
    .await;
    let client = reqwest::Client::new();
    let answer = client
        .post(service.url("/sessions/s-secret/turns"))
        .json(&json!({"message": "Hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 502);
    let answer = answer.text().await.unwrap();
    let events = service.get_text("/sessions/s-secret/events").await;
    assert!(events.contains("provider_unreachable"), "{events}");
    drop(service);
    let logs = std::fs::read_to_string(&logs).unwrap();
    assert!(logs.contains("gateway-user:[redacted]@"), "{logs}");
    for (what, text) in [("answer", &answer), ("events", &events), ("logs", &logs)] {
        assert!(!text.contains(password), "{what}: {text}");
    }
}

/// Some of a turn's events cannot be written (here: a trigger of the
/// test's schema refuses one delta, so its batch is lost): the turn stops
/// and ends `failed` with `event_log_unavailable`, and its terminal event
/// names the seqs the log does not hold (`lost_seqs`). The live stream
/// showed nothing the log lacks, and a replay gives exactly the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_lost_events_names_the_missing_range_in_its_end() {
    if !crate::support::postgres_or_skip().await {
        return;
    }
    let app = spawn_app(Backend::Postgres).await;
    app.db
        .execute_postgres(
            "CREATE FUNCTION refuse_event() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN RAISE EXCEPTION 'refused by the test'; END $$; \
             CREATE TRIGGER refuse_event BEFORE INSERT ON events FOR EACH ROW \
             WHEN (NEW.payload LIKE '%lose-me%') EXECUTE FUNCTION refuse_event();",
        )
        .await;
    app.provider.enqueue([Reply::openai_deltas(&[
        "one ", "two ", "lose-me ", "four ", "five",
    ])]);
    let mut stream = app.post_turn_sse("s-lost", json!({"message": "Hi"})).await;
    let turn_id = stream.turn_id();
    let live = stream.read_to_end().await;
    let end = live.last().unwrap().json();
    assert_eq!(end["type"], "turn.failed", "{end}");
    assert_eq!(end["code"], "event_log_unavailable", "{end}");
    let terminal = end["seq"].as_i64().unwrap();
    let lost = end["lost_seqs"].as_array().expect("lost_seqs").clone();
    let (from, to) = (lost[0].as_i64().unwrap(), lost[1].as_i64().unwrap());
    assert!(from >= 2 && from <= to && to == terminal - 1, "{end}");
    // The log: everything before the range, nothing in it, the end after.
    let (_, log) = app.get_json("/sessions/s-lost/events").await;
    let logged: Vec<&Value> = log["events"].as_array().unwrap().iter().collect();
    let seqs: Vec<i64> = logged.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    let mut expected: Vec<i64> = (1..from).collect();
    expected.push(terminal);
    assert_eq!(seqs, expected, "{log}");
    assert_eq!(logged.last().unwrap()["lost_seqs"], json!([from, to]));
    // What was streamed live is exactly what the log holds.
    let live_seqs: Vec<i64> = live.iter().map(|e| e.seq()).collect();
    assert_eq!(live_seqs, seqs);
    assert!(!crate::helpers::streamed_text(&live).contains("lose-me"));
    let turn = app.wait_turn_end("s-lost", &turn_id).await;
    assert_eq!(turn["status"], "failed", "{turn}");
    // A resume from the start gives the same, marker included.
    let resumed = app
        .turn_events("s-lost", &turn_id, None)
        .await
        .read_to_end()
        .await;
    let resumed_seqs: Vec<i64> = resumed.iter().map(|e| e.seq()).collect();
    assert_eq!(resumed_seqs, seqs);
    assert_eq!(
        resumed.last().unwrap().json()["lost_seqs"],
        json!([from, to])
    );
    // The session is free.
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let next = app.post_turn("s-lost", json!({"message": "again"})).await;
    assert_eq!(next.status(), 200);
}
