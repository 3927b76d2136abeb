//! `/mcp`: the service as an MCP server (streamable HTTP). The official
//! MCP Python SDK uses it in `.ci/run` (`scripts/mcp_sdk_check.py`); here
//! each JSON-RPC exchange is checked.

use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    fake_provider::Reply,
    helpers::{SseStream, TestApp, spawn_app},
    on_both_backends,
    support::Backend,
};

async fn rpc(app: &TestApp, session: Option<&str>, message: Value) -> reqwest::Response {
    let mut request = app
        .client
        .post(app.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .json(&message);
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    request.send().await.unwrap()
}

async fn call(app: &TestApp, id: u64, method: &str, params: Value) -> Value {
    let response = rpc(
        app,
        None,
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    response.json().await.unwrap()
}

async fn an_mcp_host_asks_the_agent_and_reads_its_sessions(backend: Backend) {
    let app = spawn_app(backend).await;
    let response = rpc(
        &app,
        None,
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}
        }}),
    )
    .await;
    assert_eq!(response.status(), 200);
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let init: Value = response.json().await.unwrap();
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(init["result"]["serverInfo"]["name"], "agent-harness");
    // A version it does not speak: it answers its newest.
    let newer = call(
        &app,
        1,
        "initialize",
        json!({"protocolVersion": "2099-01-01"}),
    )
    .await;
    assert_eq!(newer["result"]["protocolVersion"], "2025-11-25");
    let taken = rpc(
        &app,
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    assert_eq!(taken.status(), 202);

    let tools = call(&app, 2, "tools/list", json!({})).await;
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["list_sessions", "get_session", "ask"]);
    // The test app's tools include the vault's writes.
    assert_eq!(
        tools["result"]["tools"][2]["annotations"]["readOnlyHint"],
        false
    );

    // `ask`, streamed: a progress notification per delta, then the answer.
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let response = rpc(
        &app,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "ask", "arguments": {"message": "Say hello.", "session_id": "s-mcp"},
            "_meta": {"progressToken": "p-1"}
        }}),
    )
    .await;
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut stream = SseStream::new(response).await;
    let mut messages = Vec::new();
    while let Some(event) = stream.next().await {
        assert_eq!(event.event, "message");
        messages.push(event.json());
    }
    let (answer, notes) = messages.split_last().unwrap();
    let said: String = notes
        .iter()
        .map(|n| {
            assert_eq!(n["method"], "notifications/progress");
            assert_eq!(n["params"]["progressToken"], "p-1");
            n["params"]["message"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(said, "Hello! How can I help you today?");
    let progress: Vec<u64> = notes
        .iter()
        .map(|n| n["params"]["progress"].as_u64().unwrap())
        .collect();
    assert_eq!(progress, (1..=notes.len() as u64).collect::<Vec<_>>());
    assert_eq!(answer["id"], 3);
    let result = &answer["result"];
    assert_eq!(result["isError"], false);
    assert_eq!(result["content"][0]["text"], said.as_str());
    assert_eq!(result["structuredContent"]["session_id"], "s-mcp");

    // Without a progress token, and as JSON: the answer alone.
    app.provider.enqueue([Reply::openai_text("Second answer.")]);
    let response = app
        .client
        .post(app.url("/mcp"))
        .header("accept", "application/json")
        .json(
            &json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
                "name": "ask", "arguments": {"message": "Again", "session_id": "s-mcp"}
            }}),
        )
        .send()
        .await
        .unwrap();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["result"]["content"][0]["text"], "Second answer.");
    // The model saw the first exchange: one session.
    let sent = app.provider.requests()[1].body["messages"].to_string();
    assert!(sent.contains("Say hello."), "{sent}");

    let listed = call(
        &app,
        5,
        "tools/call",
        json!({"name": "list_sessions", "arguments": {}}),
    )
    .await;
    let sessions = &listed["result"]["structuredContent"]["sessions"];
    assert_eq!(sessions[0]["session_id"], "s-mcp");
    assert_eq!(sessions[0]["turn_count"], 2);
    let got = call(
        &app,
        6,
        "tools/call",
        json!({"name": "get_session", "arguments": {"session_id": "s-mcp"}}),
    )
    .await;
    let view = &got["result"]["structuredContent"];
    assert_eq!(view["messages"].as_array().unwrap().len(), 4);
    assert_eq!(view["messages"][3]["content"], "Second answer.");
    let missing = call(
        &app,
        7,
        "tools/call",
        json!({"name": "get_session", "arguments": {"session_id": "s-never"}}),
    )
    .await;
    assert_eq!(missing["result"]["isError"], true);
}

async fn a_cancel_notification_cancels_the_turn_of_its_call(backend: Backend) {
    let app = spawn_app(backend).await;
    let gate = CancellationToken::new();
    app.provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(3, &gate)]);
    let ask = json!({"jsonrpc": "2.0", "id": "call-9", "method": "tools/call", "params": {
        "name": "ask", "arguments": {"message": "Hi", "session_id": "s-mcp-cancel"},
        "_meta": {"progressToken": 9}
    }});
    let response = rpc(&app, Some("mcp-a"), ask).await;
    let mut stream = SseStream::new(response).await;
    let first = stream.next().await.unwrap().json();
    assert_eq!(first["method"], "notifications/progress");
    // The same request id of another MCP session names nothing.
    let cancel = |session: &'static str| {
        rpc(
            &app,
            Some(session),
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                   "params": {"requestId": "call-9", "reason": "user"}}),
        )
    };
    assert_eq!(cancel("mcp-b").await.status(), 202);
    let (_, session) = app.get_json("/sessions/s-mcp-cancel").await;
    assert!(session["running_turn_id"].is_string(), "{session}");
    assert_eq!(cancel("mcp-a").await.status(), 202);
    let mut rest = Vec::new();
    while let Some(event) = stream.next().await {
        rest.push(event.json());
    }
    let answer = rest.last().unwrap();
    assert_eq!(answer["id"], "call-9");
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let (_, session) = app.get_json("/sessions/s-mcp-cancel").await;
    assert!(session["running_turn_id"].is_null(), "{session}");
    let (_, log) = app.get_json("/sessions/s-mcp-cancel/events").await;
    let last = log["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["type"], "turn.cancelled", "{log}");
    gate.cancel();
}

async fn what_is_not_mcp_is_refused_as_json_rpc_says(backend: Backend) {
    let app = spawn_app(backend).await;
    let response = rpc(&app, None, json!({"id": 1, "method": "tools/list"})).await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["code"], -32600);
    for (method, params, code) in [
        ("sampling/createMessage", json!({}), -32601),
        (
            "tools/call",
            json!({"name": "nope", "arguments": {}}),
            -32602,
        ),
        (
            "tools/call",
            json!({"name": "ask", "arguments": {}}),
            -32602,
        ),
        (
            "tools/call",
            json!({"name": "ask", "arguments": {"message": "  "}}),
            -32602,
        ),
        (
            "tools/call",
            json!({"name": "ask", "arguments": {"message": "x", "session_id": "bad id!"}}),
            -32602,
        ),
        (
            "tools/call",
            json!({"name": "list_sessions", "arguments": {"limit": 0}}),
            -32602,
        ),
        (
            "tools/call",
            json!({"name": "get_session", "arguments": {}}),
            -32602,
        ),
    ] {
        let answer = call(&app, 1, method, params.clone()).await;
        assert_eq!(answer["error"]["code"], code, "{method} {params}: {answer}");
        assert_eq!(answer["id"], 1);
    }
    // An id or progress token that cannot be echoed on every frame is
    // refused, with `id: null`. (Before, a 900 KB id came back on each
    // streamed frame.)
    let ask = |id: Value, token: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "ask", "arguments": {"message": "hi"}, "_meta": {"progressToken": token},
        }})
    };
    for (id, token) in [
        (json!("x".repeat(129)), json!(1)),
        (json!({"a": 1}), json!(1)),
        (json!(1), json!("t".repeat(129))),
        (json!(1), json!([1])),
    ] {
        let response = rpc(&app, None, ask(id.clone(), token.clone())).await;
        assert_eq!(response.status(), 400, "{id} {token}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        assert_eq!(answer["id"], Value::Null);
    }
    assert!(app.provider.requests().is_empty(), "no turn began");
    let (status, _) = app.get_json("/sessions/x").await;
    assert_eq!(status, 404);
    // A server-initiated stream is a session's: none without one.
    let get = app.client.get(app.url("/mcp")).send().await.unwrap();
    assert_eq!(get.status(), 400);
    let delete = app.client.delete(app.url("/mcp")).send().await.unwrap();
    assert_eq!(delete.status(), 405, "a session is not ended by DELETE");
}

/// The messages of a streamed `ask`, read to its answer.
async fn streamed_ask(app: &TestApp, session: &str, id: u64) -> Vec<Value> {
    let response = rpc(
        app,
        Some(session),
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "ask", "arguments": {"message": "Search my notes.", "session_id": "s-logs"},
        }}),
    )
    .await;
    let mut stream = SseStream::new(response).await;
    let mut messages = Vec::new();
    while let Some(event) = stream.next().await {
        messages.push(event.json());
    }
    messages
}

/// A session that set a level with `logging/setLevel` gets the turn's log
/// messages at or above it in its `ask` streams (a tool's start and end);
/// one that set none, or a higher level, gets none.
async fn a_session_gets_the_turns_log_messages_at_its_level(backend: Backend) {
    let app = spawn_app(backend).await;
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}
    }});
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let response = rpc(&app, None, initialize.clone()).await;
        sessions.push(
            response.headers()["mcp-session-id"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    let (info, quiet) = (&sessions[0], &sessions[1]);
    let set = |session: &str, level: &str| {
        let message = json!({"jsonrpc": "2.0", "id": 1, "method": "logging/setLevel",
                             "params": {"level": level}});
        let session = session.to_owned();
        let app = &app;
        async move {
            rpc(app, Some(&session), message)
                .await
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    assert_eq!(set(info, "info").await["result"], json!({}));
    assert_eq!(set(quiet, "error").await["result"], json!({}));
    let search = || {
        [
            Reply::openai_tool_call("call_s1", "local_search", &json!({"query": "Paris"})),
            Reply::sse("openai/text.sse"),
        ]
    };
    app.provider.enqueue(search());
    let messages = streamed_ask(&app, info, 2).await;
    let logs: Vec<&Value> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .collect();
    let events: Vec<(&str, &str)> = logs
        .iter()
        .map(|m| {
            (
                m["params"]["level"].as_str().unwrap(),
                m["params"]["data"]["event"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        events,
        [("info", "tool.started"), ("info", "tool.finished")],
        "{messages:?}"
    );
    assert_eq!(logs[0]["params"]["data"]["tool"], "local_search");
    assert_eq!(logs[1]["params"]["data"]["status"], "completed");
    assert_eq!(messages.last().unwrap()["id"], 2);

    app.provider.enqueue(search());
    let messages = streamed_ask(&app, quiet, 3).await;
    assert!(
        messages
            .iter()
            .all(|m| m["method"] != "notifications/message"),
        "{messages:?}"
    );
}

/// `resources/subscribe` (up to 2025-11-25): a session follows a note of
/// the caller's, and its `GET /mcp` stream says when the note changes;
/// after `resources/unsubscribe` it says nothing more. Another server's
/// URI is refused; a stream needs a session this process began, and a
/// second `GET` of the session ends the first.
async fn a_subscribed_note_says_when_it_changes(backend: Backend) {
    let vault = crate::helpers::vault_of(&[("notes/a.md", "# A\n")]);
    let app = crate::helpers::spawn_app_with_vault(backend, vault.path()).await;
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}
    }});
    let response = rpc(&app, None, initialize).await;
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let begun: Value = response.json().await.unwrap();
    assert_eq!(
        begun["result"]["capabilities"]["resources"]["subscribe"], true,
        "{begun}"
    );
    let ask = |id: u64, method: &'static str, uri: &'static str| {
        let session = session.clone();
        let app = &app;
        async move {
            let message = json!({"jsonrpc": "2.0", "id": id, "method": method,
                                 "params": {"uri": uri}});
            let answer: Value = rpc(app, Some(&session), message)
                .await
                .json()
                .await
                .unwrap();
            answer
        }
    };
    let elsewhere = ask(1, "resources/subscribe", "test://watched-resource").await;
    assert_eq!(elsewhere["error"]["code"], -32602, "{elsewhere}");
    assert_eq!(elsewhere["error"]["data"]["uri"], "test://watched-resource");
    let taken = ask(2, "resources/subscribe", "vault:///notes/a.md").await;
    assert_eq!(taken["result"], json!({}), "{taken}");

    let open = |session: Option<String>| {
        let mut request = app
            .client
            .get(app.url("/mcp"))
            .header("accept", "text/event-stream");
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.send()
    };
    let none = open(None).await.unwrap();
    assert_eq!(none.status(), 400);
    let problem: Value = none.json().await.unwrap();
    assert_eq!(problem["code"], "invalid_header", "{problem}");
    let unknown = open(Some("0190a5c4-0000-7000-8000-000000000000".into()))
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let problem: Value = unknown.json().await.unwrap();
    assert_eq!(problem["code"], "mcp_session_not_found", "{problem}");

    let response = open(Some(session.clone())).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut stream = SseStream::new(response).await;
    crate::helpers::note_changes_said(vault.path(), &mut stream).await;

    let gone = ask(3, "resources/unsubscribe", "vault:///notes/a.md").await;
    assert_eq!(gone["result"], json!({}), "{gone}");
    // A look may have caught the last write half done: what it said
    // before the unsubscribe is read first.
    while let Ok(event) = tokio::time::timeout(Duration::from_millis(1500), stream.next()).await {
        assert_eq!(
            event.unwrap().json()["method"],
            "notifications/resources/updated"
        );
    }
    std::fs::write(vault.path().join("notes/a.md"), "# A\n\nUnfollowed.\n").unwrap();
    let silent = tokio::time::timeout(Duration::from_secs(3), stream.next()).await;
    assert!(silent.is_err(), "nothing after the unsubscribe");

    // A second stream of the session takes over: the first ends.
    let second = open(Some(session.clone())).await.unwrap();
    assert_eq!(second.status(), 200);
    let ended = tokio::time::timeout(Duration::from_secs(5), stream.next()).await;
    assert!(matches!(ended, Ok(None)), "the first stream ends");
}

/// A streamed `ask` whose write waits for approval asks the client with
/// `elicitation/create` when its `initialize` took elicitation; the
/// client's answer (a JSON-RPC response) decides, and the same stream
/// goes on to the call's result. A client that took none is not asked.
async fn an_elicitation_asks_the_client_to_approve_a_write(backend: Backend) {
    let vault = crate::helpers::vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let provider = crate::fake_provider::FakeProvider::start().await;
    let mut settings = crate::helpers::test_settings(&provider);
    settings.vault.dir = vault.path().to_owned();
    settings.harness.approval_required = Some("LOCAL_WRITE".parse().unwrap());
    let app = crate::helpers::spawn_app_with(
        crate::support::TestDb::new(backend).await,
        provider,
        settings,
    )
    .await;
    let begin = |capabilities: Value| {
        let app = &app;
        async move {
            let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": capabilities,
                "clientInfo": {"name": "test", "version": "1"}
            }});
            let response = rpc(app, None, initialize).await;
            response.headers()["mcp-session-id"]
                .to_str()
                .unwrap()
                .to_owned()
        }
    };
    let ask = |session: String, id: u64, chat: &'static str| {
        let app = &app;
        async move {
            let message = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                "name": "ask", "arguments": {"message": "Change my note.", "session_id": chat},
            }});
            SseStream::new(rpc(app, Some(&session), message).await).await
        }
    };
    let script = |call: &str| {
        app.provider.enqueue([
            Reply::openai_tool_call(
                call,
                "write_note",
                &json!({"path": "notes/a.md", "content": "changed"}),
            ),
            Reply::sse("openai/text.sse"),
        ]);
    };

    let session = begin(json!({"elicitation": {}})).await;
    script("call_e1");
    let mut stream = ask(session.clone(), 7, "s-elicit").await;
    let request = loop {
        let message = stream.next().await.expect("an elicitation").json();
        if message["method"] == "elicitation/create" {
            break message;
        }
    };
    assert!(request["id"].is_string(), "{request}");
    let schema = &request["params"]["requestedSchema"];
    assert_eq!(
        schema["properties"]["approve"]["type"], "boolean",
        "{request}"
    );
    assert!(
        request["params"]["message"]
            .as_str()
            .unwrap()
            .contains("write_note"),
        "{request}"
    );
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\n");
    // Another MCP session's answer does not decide it.
    let other = begin(json!({"elicitation": {}})).await;
    let answer = json!({"jsonrpc": "2.0", "id": request["id"],
                        "result": {"action": "accept", "content": {"approve": true}}});
    assert_eq!(rpc(&app, Some(&other), answer.clone()).await.status(), 202);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\n");
    assert_eq!(rpc(&app, Some(&session), answer).await.status(), 202);
    let mut result = Value::Null;
    while let Some(event) = stream.next().await {
        let message = event.json();
        if message["id"] == 7 {
            result = message;
        }
    }
    assert_eq!(result["result"]["isError"], false, "{result}");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "changed");

    // A client that takes no elicitation is not asked: the call waits for
    // a decision from elsewhere.
    let quiet = begin(json!({})).await;
    script("call_e2");
    let mut stream = ask(quiet, 8, "s-quiet").await;
    let mut seen = Vec::new();
    while let Ok(Some(event)) =
        tokio::time::timeout(Duration::from_millis(1500), stream.next()).await
    {
        seen.push(event.json()["method"].clone());
    }
    assert!(!seen.contains(&json!("elicitation/create")), "{seen:?}");
}

on_both_backends!(
    an_elicitation_asks_the_client_to_approve_a_write,
    an_mcp_host_asks_the_agent_and_reads_its_sessions,
    a_subscribed_note_says_when_it_changes,
    a_cancel_notification_cancels_the_turn_of_its_call,
    what_is_not_mcp_is_refused_as_json_rpc_says,
    a_session_gets_the_turns_log_messages_at_its_level,
);
