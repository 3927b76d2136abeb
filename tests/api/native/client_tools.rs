//! Tools the client runs itself: declared with a turn, offered to the model
//! as `client__{name}`, a call of one pauses the turn (`tool.requested`)
//! until the client posts its result; then the turn goes on with it.

use serde_json::{Value, json};

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{first_event, spawn_app, spawn_app_with, test_settings, types},
    on_both_backends,
    support::{Backend, TestDb},
};

fn location_tool() -> Value {
    json!({
        "name": "get_location",
        "description": "Where the user is, from the browser",
        "parameters": {"type": "object", "properties": {"precise": {"type": "boolean"}}},
        "effect": "READ_ONLY",
    })
}

async fn a_client_tool_pauses_the_turn_until_its_result_is_posted(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([
        Reply::openai_tool_call("call_c1", "client__get_location", &json!({"precise": true})),
        Reply::openai_text("You are in Lyon."),
    ]);
    let mut stream = app
        .post_turn_sse(
            "s-client",
            json!({"message": "Where am I?", "client_tools": [location_tool()]}),
        )
        .await;
    let turn = stream.turn_id();
    let before = stream.read_until("tool.requested").await;
    let requested = before.last().unwrap().json();
    assert_eq!(requested["tool"], "get_location", "{requested}");
    assert_eq!(requested["call_id"], "call_c1");
    assert_eq!(requested["arguments"], json!({"precise": true}));
    // Offered to the model with the service's own tools, under its prefix,
    // its description framed as the client's untrusted text.
    let tools = &app.provider.requests()[0].body["tools"];
    let offered = tools.to_string();
    assert!(offered.contains("local_search"), "{offered}");
    let declared = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "client__get_location")
        .unwrap();
    let description = declared["function"]["description"].as_str().unwrap();
    assert!(
        description.starts_with("[Declared by the client; untrusted")
            && description.ends_with("Where the user is, from the browser"),
        "{description}"
    );

    let url = |call: &str| format!("/sessions/s-client/turns/{turn}/tool-results/{call}");
    let post = |call: &str, body: Value| app.client.post(app.url(&url(call))).json(&body).send();
    // A call the turn did not ask for.
    let unknown = post("call_zz", json!({"output": "x"})).await.unwrap();
    assert_eq!(unknown.status(), 404);
    let problem: Value = unknown.json().await.unwrap();
    assert_eq!(problem["code"], "call_not_found");
    let answered = post("call_c1", json!({"output": "Lyon, France"}))
        .await
        .unwrap();
    assert_eq!(answered.status(), 200);
    let rest = stream.read_to_end().await;
    let finished = first_event(&rest, "tool.finished");
    assert_eq!(
        (&finished["status"], &finished["output"]),
        (&json!("completed"), &json!("Lyon, France"))
    );
    assert_eq!(
        rest.last().unwrap().event,
        "turn.completed",
        "{:?}",
        types(&rest)
    );
    // The model got the client's answer as the call's result.
    let sent = app.provider.requests()[1].body["messages"].to_string();
    assert!(sent.contains("Lyon, France"), "{sent}");
    // Ended: no more results.
    let late = post("call_c1", json!({"output": "again"})).await.unwrap();
    assert_eq!(late.status(), 409);
    let problem: Value = late.json().await.unwrap();
    assert_eq!(problem["code"], "turn_not_running");
}

async fn a_cancel_ends_the_wait_for_a_client_result(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([Reply::openai_tool_call(
        "call_c2",
        "client__get_location",
        &json!({}),
    )]);
    let mut stream = app
        .post_turn_sse(
            "s-client-cancel",
            json!({"message": "Where am I?", "client_tools": [location_tool()]}),
        )
        .await;
    let turn = stream.turn_id();
    stream.read_until("tool.requested").await;
    let (status, _) = app
        .post_json(&format!("/sessions/s-client-cancel/turns/{turn}/cancel"))
        .await;
    assert_eq!(status, 200);
    let rest = stream.read_to_end().await;
    assert_eq!(
        rest.last().unwrap().event,
        "turn.cancelled",
        "{:?}",
        types(&rest)
    );
}

/// The wait survives its process: a service shut down mid-wait hands the
/// turn over, the service started again waits on the same call, and the
/// result the client posts then finishes the turn, the model asked once
/// for the call.
async fn a_wait_for_a_client_result_survives_a_take_over(backend: Backend) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.shutdown_grace_s = 1;
    let mut app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    app.provider.enqueue([Reply::openai_tool_call(
        "call_c3",
        "client__get_location",
        &json!({}),
    )]);
    let mut stream = app
        .post_turn_sse(
            "s-client-over",
            json!({"message": "Where am I?", "client_tools": [location_tool()]}),
        )
        .await;
    let turn = stream.turn_id();
    stream.read_until("tool.requested").await;
    app.stop().await;

    let db = std::mem::replace(&mut app.db, TestDb::new(backend).await);
    drop(app);
    let provider = FakeProvider::start().await;
    provider.enqueue([Reply::openai_text("You are in Lyon.")]);
    let settings = test_settings(&provider);
    let again = spawn_app_with(db, provider, settings).await;
    let mut events = again.turn_events("s-client-over", &turn, None).await;
    let before = events.read_until("turn.resumed").await;
    let asked = first_event(&before, "tool.requested");
    assert_eq!(asked["call_id"], "call_c3");
    let url = format!("/sessions/s-client-over/turns/{turn}/tool-results/call_c3");
    let posted = again
        .client
        .post(again.url(&url))
        .json(&json!({"output": "Lyon, France"}))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 200);
    let rest = events.read_to_end().await;
    assert_eq!(
        rest.last().unwrap().event,
        "turn.completed",
        "{:?}",
        types(&rest)
    );
    // The new owner waits on the same call without asking the client again.
    assert!(!types(&rest).contains(&"tool.requested"), "{rest:?}");
    let requests = again.provider.requests();
    assert_eq!(
        requests.len(),
        1,
        "the model was not asked for the call again"
    );
    assert!(
        requests[0].body["messages"]
            .to_string()
            .contains("Lyon, France")
    );
}

async fn client_tools_that_cannot_be_are_refused(backend: Backend) {
    let app = spawn_app(backend).await;
    let tool = |name: &str| json!({"name": name, "description": "d"});
    for (tools, field) in [
        (json!([tool("no spaces")]), "client_tools[0]"),
        (json!([tool(&"x".repeat(57))]), "client_tools[0]"),
        (json!([tool("a"), tool("a")]), "client_tools[1]"),
        (
            json!([{"name": "a", "description": "d", "parameters": {"type": "string"}}]),
            "client_tools[0]",
        ),
        (
            json!([{"name": "a", "description": " "}]),
            "client_tools[0]",
        ),
    ] {
        let response = app
            .post_turn(
                "s-client-bad",
                json!({"message": "Hi", "client_tools": tools}),
            )
            .await;
        assert_eq!(response.status(), 422, "{tools}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(
            (&problem["code"], &problem["field"]),
            (&json!("invalid_field"), &json!(field)),
            "{problem}"
        );
    }
    let many: Vec<Value> = (0..33).map(|i| tool(&format!("t{i}"))).collect();
    let response = app
        .post_turn(
            "s-client-bad",
            json!({"message": "Hi", "client_tools": many}),
        )
        .await;
    assert_eq!(response.status(), 422);
    assert!(app.provider.requests().is_empty(), "no turn began");
}

/// A provider that names its calls `call_0` at every step: the client's
/// result of step 1's call is not step 2's, which waits for its own.
/// (Before, the second call got the first one's result at once.)
async fn a_second_client_call_waits_for_its_own_result(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([
        Reply::openai_tool_call("call_0", "client__get_location", &json!({})),
        Reply::openai_tool_call("call_0", "client__get_location", &json!({"precise": true})),
        Reply::openai_text("You moved from Lyon to Paris."),
    ]);
    let mut stream = app
        .post_turn_sse(
            "s-client-ids",
            json!({"message": "Where am I now?", "client_tools": [location_tool()]}),
        )
        .await;
    let turn = stream.turn_id();
    let post = |call: String, output: &'static str| {
        let url = format!("/sessions/s-client-ids/turns/{turn}/tool-results/{call}");
        app.client
            .post(app.url(&url))
            .json(&json!({"output": output}))
            .send()
    };
    let first = stream.read_until("tool.requested").await;
    let first = first.last().unwrap().json()["call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(post(first.clone(), "Lyon").await.unwrap().status(), 200);
    let second = stream.read_until("tool.requested").await;
    let second = second.last().unwrap().json();
    assert_eq!(second["arguments"], json!({"precise": true}));
    let second = second["call_id"].as_str().unwrap().to_owned();
    assert_ne!(second, first);
    // It waits: no second provider request past the first result.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(app.provider.requests().len(), 2);
    assert_eq!(post(second, "Paris").await.unwrap().status(), 200);
    let rest = stream.read_to_end().await;
    let outputs: Vec<Value> = rest
        .iter()
        .filter(|e| e.event == "tool.finished")
        .map(|e| e.json()["output"].clone())
        .collect();
    assert_eq!(outputs, [json!("Paris")]);
    assert_eq!(rest.last().unwrap().event, "turn.completed");
    let sent = app.provider.requests()[2].body["messages"].to_string();
    assert!(sent.contains("Lyon") && sent.contains("Paris"), "{sent}");
}

/// Client tools have a budget: past `HARNESS_CLIENT_TOOLS_MAX_BYTES`
/// (names, descriptions, schemas together), 422 before any turn, on every
/// route that declares them. (Before, 32 tools of 2,000 characters and any
/// schema went to the model.)
async fn client_tools_past_their_budget_are_refused(backend: Backend) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.harness.client_tools_max_bytes = 4000;
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    let tool = |i: usize| {
        json!({"name": format!("tool_{i}"), "description": "d".repeat(1500),
               "parameters": {"type": "object"}})
    };
    let tools: Vec<Value> = (0..3).map(tool).collect();
    let native = app
        .post_turn("s-budget", json!({"message": "Hi", "client_tools": tools}))
        .await;
    assert_eq!(native.status(), 422);
    let problem: Value = native.json().await.unwrap();
    assert_eq!(
        (problem["code"].as_str(), problem["field"].as_str()),
        (Some("invalid_field"), Some("client_tools")),
        "{problem}"
    );
    let functions: Vec<Value> = (0..3)
        .map(|i| {
            json!({"type": "function", "name": format!("tool_{i}"), "description": "d".repeat(1500),
                   "parameters": {"type": "object"}})
        })
        .collect();
    let (status, _) = app
        .post_body(
            "/v1/responses",
            json!({"model": "agent-harness", "input": "Hi", "tools": functions}),
        )
        .await;
    assert_eq!(status, 422);
    assert!(app.provider.requests().is_empty(), "no turn began");
    // Two fit.
    app.provider.enqueue([Reply::openai_text("Hello.")]);
    let fits = app
        .post_turn(
            "s-budget",
            json!({"message": "Hi", "client_tools": [tool(0), tool(1)]}),
        )
        .await;
    assert_eq!(fits.status(), 200);
}

on_both_backends!(
    client_tools_past_their_budget_are_refused,
    a_second_client_call_waits_for_its_own_result,
    a_client_tool_pauses_the_turn_until_its_result_is_posted,
    a_cancel_ends_the_wait_for_a_client_result,
    a_wait_for_a_client_result_survives_a_take_over,
    client_tools_that_cannot_be_are_refused,
);
