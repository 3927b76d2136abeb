//! A2A 1.0 (JSON-RPC): the agent card and the task methods. The official
//! `a2a-sdk` client delegates to the service in `.ci/run`
//! (`scripts/a2a_sdk_check.py`, every answer parsed strictly by the SDK's
//! protobuf types); here each exchange and each error code is checked.

use crate::support::reply::JsonReply as _;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{SseStream, TestApp, spawn_app, spawn_app_with, test_settings, vault_of},
    on_both_backends,
    support::{Backend, TestDb},
};

fn request(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

async fn rpc(app: &TestApp, body: Value) -> Value {
    let response = app
        .client
        .post(app.url("/a2a"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let streams = response.headers()["content-type"] == "text/event-stream";
    let text = response.text().await.unwrap();
    // A streaming method's error: a stream of that one event.
    let json = match streams {
        true => text.strip_prefix("data: ").unwrap().trim_end(),
        false => &text,
    };
    serde_json::from_str(json).unwrap()
}

fn message(text: &str, extra: Value) -> Value {
    let mut message = json!({"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": text}]});
    if let (Some(fields), Some(more)) = (message.as_object_mut(), extra.as_object()) {
        fields.extend(more.clone());
    }
    message
}

/// The JSON-RPC results of an A2A stream.
async fn stream_results(app: &TestApp, body: Value) -> Vec<Value> {
    let response = app
        .client
        .post(app.url("/a2a"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut stream = SseStream::new(response).await;
    let mut results = Vec::new();
    while let Some(event) = stream.next().await {
        results.push(event.json()["result"].clone());
    }
    results
}

fn skill_ids(card: &Value) -> Vec<String> {
    card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect()
}

/// The public card is built from `HARNESS_PUBLIC_URL`, whatever `Host`
/// the request sends, and lists the skills the operator declares and no
/// tool; the extended card, behind the key, lists the tools. (Before, the
/// card echoed the `Host` and listed every tool to anyone.)
#[tokio::test]
async fn the_public_card_shows_the_declared_skills_and_no_inventory() {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.auth = harness_core::config::AuthMode::On;
    settings.server.public_url = Some("https://agents.example/".parse().unwrap());
    settings.server.agent_skills = Some(
        r#"[{"id": "travel", "name": "Travel", "description": "Plans trips.", "tags": ["travel"]}]"#
            .parse()
            .unwrap(),
    );
    let app = spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await;
    let card: Value = app
        .client
        .get(app.url("/.well-known/agent-card.json"))
        .header("host", "evil.example")
        .json_reply()
        .await;
    assert_eq!(
        card["supportedInterfaces"][0]["url"],
        "https://agents.example/a2a"
    );
    assert_eq!(skill_ids(&card), ["travel"]);
    assert_eq!(card["capabilities"]["extendedAgentCard"], true);
    assert!(!card.to_string().contains("write_note"), "{card}");
    // The extended card needs the key.
    let ask = request(1, "GetExtendedAgentCard", json!({}));
    let anonymous = app
        .client
        .post(app.url("/a2a"))
        .json(&ask)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    crate::edge::tenants::make_keys(&app, &[("key_card", "acme", "ah_card")]).await;
    let extended: Value = app
        .client
        .post(app.url("/a2a"))
        .bearer_auth("ah_card")
        .json(&ask)
        .json_reply()
        .await;
    let skills = skill_ids(&extended["result"]);
    assert_eq!(skills[0], "travel");
    assert!(skills.contains(&"write_note".to_owned()), "{skills:?}");
}

async fn a_task_is_a_turn_sent_streamed_read_and_listed(backend: Backend) {
    let app = spawn_app(backend).await;
    let card: Value = app
        .client
        .get(app.url("/.well-known/agent-card.json"))
        .json_reply()
        .await;
    assert_eq!(card["name"], "agent-harness");
    assert_eq!(card["capabilities"]["streaming"], true);
    let interface = &card["supportedInterfaces"][0];
    assert_eq!(
        (&interface["protocolBinding"], &interface["protocolVersion"]),
        (&json!("JSONRPC"), &json!("1.0"))
    );
    assert_eq!(interface["url"], app.url("/a2a"));
    assert!(card.get("securitySchemes").is_none(), "no keys, no scheme");
    assert_eq!(skill_ids(&card), ["chat"], "the public card names no tool");
    // No keys: no caller can be authenticated, so no extended card is
    // announced or served (issue 63: anyone got the tool inventory).
    assert_eq!(card["capabilities"]["extendedAgentCard"], false);
    let extended = rpc(&app, request(9, "GetExtendedAgentCard", json!({}))).await;
    assert_eq!(extended["error"]["code"], -32007, "{extended}");
    assert!(extended.get("result").is_none(), "{extended}");

    // Blocking: the task, completed, its answer the artifact.
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let sent = rpc(
        &app,
        request(
            1,
            "SendMessage",
            json!({"message": message("Say hello.", json!({"contextId": "ctx-1"}))}),
        ),
    )
    .await;
    let task = &sent["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
    assert_eq!(task["contextId"], "ctx-1");
    assert_eq!(
        task["artifacts"][0]["parts"][0]["text"],
        "Hello! How can I help you today?"
    );
    let first = task["id"].as_str().unwrap().to_owned();
    // The task is the turn of the context's session.
    let (status, turn) = app
        .get_json(&format!("/sessions/ctx-1/turns/{first}"))
        .await;
    assert_eq!((status, &turn["status"]), (200, &json!("completed")));

    // Streamed: the task, working; the text's chunks; the citations as a
    // last data chunk; completed.
    app.provider.enqueue([
        Reply::sse("openai/tool_call_local_search.sse"),
        Reply::sse("openai/after_local_search.sse"),
    ]);
    let results = stream_results(
        &app,
        request(
            2,
            "SendStreamingMessage",
            json!({"message": message("Plan a trip", json!({"contextId": "ctx-1"}))}),
        ),
    )
    .await;
    assert_eq!(results[0]["task"]["status"]["state"], "TASK_STATE_WORKING");
    let second = results[0]["task"]["id"].as_str().unwrap().to_owned();
    let tool = &results[1]["statusUpdate"]["status"];
    assert_eq!(tool["state"], "TASK_STATE_WORKING");
    assert_eq!(tool["message"]["parts"][1]["data"]["tool"], "local_search");
    let chunks: Vec<&Value> = results
        .iter()
        .filter_map(|r| r.get("artifactUpdate"))
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["artifact"]["parts"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "You asked about a Paris trip before.");
    assert_eq!(chunks[0]["append"], false);
    assert!(chunks[1..].iter().all(|c| c["append"] == true));
    let last_chunk = chunks.last().unwrap();
    assert_eq!(last_chunk["lastChunk"], true);
    assert!(last_chunk["artifact"]["parts"][0]["data"]["citations"].is_object());
    let end = &results.last().unwrap()["statusUpdate"]["status"];
    assert_eq!(end["state"], "TASK_STATE_COMPLETED");

    // Read back: the same task, its history cut to the newest message.
    let got = rpc(
        &app,
        request(3, "GetTask", json!({"id": second, "historyLength": 1})),
    )
    .await;
    let task = &got["result"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(task["history"].as_array().unwrap().len(), 1);
    assert_eq!(task["history"][0]["role"], "ROLE_AGENT");
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], text.as_str());

    // Listed by context, newest first, a page at a time.
    let page = rpc(
        &app,
        request(4, "ListTasks", json!({"contextId": "ctx-1", "pageSize": 1})),
    )
    .await;
    let page = &page["result"];
    assert_eq!(page["tasks"][0]["id"], second.as_str());
    assert!(
        page["tasks"][0].get("artifacts").is_none(),
        "asked without artifacts"
    );
    let token = page["nextPageToken"].as_str().unwrap();
    let rest = rpc(
        &app,
        request(5, "ListTasks", json!({"contextId": "ctx-1", "pageSize": 1, "pageToken": token, "includeArtifacts": true})),
    )
    .await;
    assert_eq!(rest["result"]["tasks"][0]["id"], first.as_str());
    assert!(rest["result"]["tasks"][0]["artifacts"].is_array());
    assert_eq!(rest["result"]["nextPageToken"], "");
}

async fn a_task_waits_for_input_and_is_answered_in_the_same_task(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.vault.dir = vault.path().to_owned();
    settings.harness.approval_required = Some("LOCAL_WRITE".parse().unwrap());
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    app.provider.enqueue([
        Reply::openai_tool_call(
            "call_a1",
            "write_note",
            &json!({"path": "notes/a.md", "content": "changed"}),
        ),
        Reply::sse("openai/text.sse"),
    ]);
    let sent = rpc(
        &app,
        request(
            1,
            "SendMessage",
            json!({"message": message("Change my note", json!({}))}),
        ),
    )
    .await;
    let task = &sent["result"]["task"];
    assert_eq!(
        task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{sent}"
    );
    let asks = &task["status"]["message"]["parts"];
    assert_eq!(asks[1]["data"]["tool"], "write_note");
    assert_eq!(asks[1]["data"]["call_id"], "call_a1");
    let id = task["id"].as_str().unwrap().to_owned();
    let context = task["contextId"].as_str().unwrap().to_owned();
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\n");

    // An answer that is neither word, whole: refused, nothing decided,
    // the task still waits. (Before, "nothing to add" denied the call
    // and "yesterday's plan is fine" approved it.)
    for said in ["maybe", "nothing to add", "yesterday's plan is fine"] {
        let unclear = rpc(
            &app,
            request(
                2,
                "SendMessage",
                json!({"message": message(said, json!({"taskId": id, "contextId": context}))}),
            ),
        )
        .await;
        assert_eq!(unclear["error"]["code"], -32602, "{said}: {unclear}");
        let task = rpc(&app, request(2, "GetTask", json!({"id": id}))).await;
        assert_eq!(
            task["result"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
            "{said}: {task}"
        );
    }
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\n");
    // Approved in the same task: the stream goes on from there.
    let results = stream_results(
        &app,
        request(
            3,
            "SendStreamingMessage",
            json!({"message": message("approve", json!({"taskId": id, "contextId": context}))}),
        ),
    )
    .await;
    assert_eq!(
        results[0]["task"]["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );
    assert_eq!(
        results[1]["statusUpdate"]["status"]["state"],
        "TASK_STATE_WORKING"
    );
    let end = &results.last().unwrap()["statusUpdate"]["status"];
    assert_eq!(end["state"], "TASK_STATE_COMPLETED", "{results:#?}");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "changed");
    // A message to a task that ended is refused.
    let late = rpc(
        &app,
        request(
            4,
            "SendMessage",
            json!({"message": message("approve", json!({"taskId": id}))}),
        ),
    )
    .await;
    assert_eq!(late["error"]["code"], -32004, "{late}");
}

async fn a_task_is_cancelled_and_subscribed_to(backend: Backend) {
    let app = spawn_app(backend).await;
    let gate = CancellationToken::new();
    app.provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(3, &gate)]);
    let sent = rpc(
        &app,
        request(1, "SendMessage", json!({"message": message("Hi", json!({})), "configuration": {"returnImmediately": true}})),
    )
    .await;
    let task = &sent["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_WORKING", "{sent}");
    let id = task["id"].as_str().unwrap().to_owned();
    let response = app
        .client
        .post(app.url("/a2a"))
        .json(&request(2, "SubscribeToTask", json!({"id": id})))
        .send()
        .await
        .unwrap();
    let mut subscribed = SseStream::new(response).await;
    let first = subscribed.next().await.unwrap().json();
    assert_eq!(
        first["result"]["task"]["id"],
        id.as_str(),
        "the task as it stands first"
    );
    let cancelled = rpc(&app, request(3, "CancelTask", json!({"id": id}))).await;
    assert_eq!(
        cancelled["result"]["status"]["state"], "TASK_STATE_CANCELED",
        "{cancelled}"
    );
    let mut rest = Vec::new();
    while let Some(event) = subscribed.next().await {
        rest.push(event.json());
    }
    let last = &rest.last().unwrap()["result"]["statusUpdate"]["status"];
    assert_eq!(last["state"], "TASK_STATE_CANCELED", "{rest:#?}");
    gate.cancel();
    // Ended: neither cancelled again nor subscribed to.
    let again = rpc(&app, request(4, "CancelTask", json!({"id": id}))).await;
    assert_eq!(again["error"]["code"], -32002, "{again}");
    let late = rpc(&app, request(5, "SubscribeToTask", json!({"id": id}))).await;
    assert_eq!(late["error"]["code"], -32004, "{late}");
}

/// `ListTasks` without a context lists every task of the caller, newest
/// first, and each filter narrows it: a context, a state, a status time;
/// a page at a time, with the count of all it matches. (Before, a list
/// without `contextId` was refused.)
async fn the_callers_tasks_are_listed_across_contexts_and_filtered(backend: Backend) {
    let app = spawn_app(backend).await;
    let send = |text: &'static str, context: &'static str| {
        let body = request(
            1,
            "SendMessage",
            json!({"message": message(text, json!({"contextId": context}))}),
        );
        let app = &app;
        async move {
            let sent = rpc(app, body).await;
            sent["result"]["task"]["id"].as_str().unwrap().to_owned()
        }
    };
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let first = send("one", "ctx-a").await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let after_first = chrono::Utc::now().to_rfc3339();
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let second = send("two", "ctx-b").await;
    app.provider.enqueue([Reply::body(
        401,
        "application/json",
        "openai/error_401.json",
    )]);
    let third = send("three", "ctx-a").await;
    let list = |params: Value| {
        let app = &app;
        async move { rpc(app, request(2, "ListTasks", params)).await["result"].clone() }
    };
    let ids = |page: &Value| -> Vec<String> {
        page["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap().to_owned())
            .collect()
    };

    let all = list(json!({})).await;
    assert_eq!(
        ids(&all),
        [third.as_str(), second.as_str(), first.as_str()],
        "{all}"
    );
    assert_eq!(all["totalSize"], 3);
    assert_eq!(all["pageSize"], 3);
    assert_eq!(all["nextPageToken"], "");
    assert!(all["tasks"][1].get("artifacts").is_none());
    assert_eq!(all["tasks"][0]["status"]["state"], "TASK_STATE_FAILED");

    let by_context = list(json!({"contextId": "ctx-a"})).await;
    assert_eq!(ids(&by_context), [third.as_str(), first.as_str()]);
    assert_eq!(by_context["totalSize"], 2);
    let failed = list(json!({"status": "TASK_STATE_FAILED"})).await;
    assert_eq!(ids(&failed), [third.as_str()]);
    assert_eq!(failed["totalSize"], 1);
    let both = list(json!({"status": "TASK_STATE_COMPLETED", "contextId": "ctx-a"})).await;
    assert_eq!(ids(&both), [first.as_str()]);
    let since = list(json!({"statusTimestampAfter": after_first})).await;
    assert_eq!(ids(&since), [third.as_str(), second.as_str()], "{since}");
    for never in ["TASK_STATE_REJECTED", "TASK_STATE_INPUT_REQUIRED"] {
        let none = list(json!({"status": never})).await;
        assert_eq!(none["tasks"], json!([]), "{never}");
    }

    let page = list(json!({"pageSize": 2, "historyLength": 0, "includeArtifacts": true})).await;
    assert_eq!(ids(&page), [third.as_str(), second.as_str()]);
    assert_eq!(page["totalSize"], 3);
    assert_eq!(page["pageSize"], 2);
    assert_eq!(page["tasks"][0]["history"], json!([]));
    assert!(page["tasks"][1]["artifacts"].is_array());
    let token = page["nextPageToken"].as_str().unwrap().to_owned();
    let rest = list(json!({"pageSize": 2, "pageToken": token})).await;
    assert_eq!(ids(&rest), [first.as_str()]);
    assert_eq!(rest["nextPageToken"], "");
}

async fn every_a2a_error_has_its_code(backend: Backend) {
    let app = spawn_app(backend).await;
    let raw = app
        .client
        .post(app.url("/a2a"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 200);
    let parse: Value = raw.json().await.unwrap();
    assert_eq!(parse["error"]["code"], -32700, "{parse}");
    let unknown_task = "0190a5c4-0000-7000-8000-000000000000";
    for (body, code) in [
        (json!({"id": 1, "method": "GetTask"}), -32600),
        (request(1, "tasks/get", json!({})), -32601),
        (request(1, "GetTask", json!({})), -32602),
        (request(1, "GetTask", json!({"id": unknown_task})), -32001),
        (request(1, "GetTask", json!({"id": "not-a-task"})), -32001),
        (
            request(1, "CancelTask", json!({"id": unknown_task})),
            -32001,
        ),
        (
            request(1, "SubscribeToTask", json!({"id": unknown_task})),
            -32001,
        ),
        (
            request(1, "ListTasks", json!({"contextId": "c", "pageSize": 0})),
            -32602,
        ),
        (request(1, "ListTasks", json!({"pageSize": 101})), -32602),
        (request(1, "ListTasks", json!({"status": "DONE"})), -32602),
        (
            request(1, "ListTasks", json!({"statusTimestampAfter": "yesterday"})),
            -32602,
        ),
        (
            request(1, "ListTasks", json!({"pageToken": "page-2"})),
            -32602,
        ),
        (
            request(1, "ListTasks", json!({"includeArtifacts": "yes"})),
            -32602,
        ),
        (request(1, "SendMessage", json!({})), -32602),
        (
            request(
                1,
                "SendMessage",
                json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"data": {"x": 1}}]}}),
            ),
            -32005,
        ),
        (
            request(
                1,
                "SendMessage",
                json!({"message": message("  ", json!({}))}),
            ),
            -32602,
        ),
        (
            request(
                1,
                "SendMessage",
                json!({"message": message("hi", json!({"taskId": unknown_task}))}),
            ),
            -32001,
        ),
        (
            request(1, "CreateTaskPushNotificationConfig", json!({})),
            -32602,
        ),
        (
            request(
                1,
                "GetTaskPushNotificationConfig",
                json!({"taskId": unknown_task, "id": "c1"}),
            ),
            -32001,
        ),
    ] {
        let answer = rpc(&app, body.clone()).await;
        assert_eq!(answer["error"]["code"], code, "{body}: {answer}");
    }
    // A streaming method's error is a stream of that one event.
    let response = app
        .client
        .post(app.url("/a2a"))
        .json(&request(7, "SubscribeToTask", json!({"id": unknown_task})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut stream = SseStream::new(response).await;
    let only = stream.next().await.unwrap().json();
    assert_eq!(
        (&only["id"], &only["error"]["code"]),
        (&json!(7), &json!(-32001))
    );
    assert!(stream.next().await.is_none());
    // An id that cannot be echoed on every frame is refused, with
    // `id: null`. (Before, a 900 KB id came back on each streamed frame.)
    for id in [
        json!("x".repeat(129)),
        json!({"a": 1}),
        json!([1]),
        json!(true),
    ] {
        let mut body = request(
            0,
            "SendStreamingMessage",
            json!({"message": message("hi", json!({}))}),
        );
        body["id"] = id.clone();
        let answer = rpc(&app, body).await;
        assert_eq!(answer["error"]["code"], -32600, "{id}: {answer}");
        assert_eq!(answer["id"], Value::Null, "{id}");
    }
    assert!(app.provider.requests().is_empty(), "no turn began");
}

/// A tool the client runs (`metadata.clientTools`): the task goes
/// `input-required` with the call as a data part; a message in the task
/// with the result as a data part lets it go on.
async fn a_task_waits_for_the_clients_own_tool(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([
        Reply::openai_tool_call("call_t1", "client__get_location", &json!({})),
        Reply::openai_text("You are in Lyon."),
    ]);
    let tools =
        json!({"clientTools": [{"name": "get_location", "description": "Where the user is"}]});
    let sent = rpc(
        &app,
        request(
            1,
            "SendMessage",
            json!({"message": message("Where am I?", json!({})), "metadata": tools}),
        ),
    )
    .await;
    let task = &sent["result"]["task"];
    assert_eq!(
        task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{sent}"
    );
    let call = &task["status"]["message"]["parts"][1]["data"];
    assert_eq!(
        (&call["call_id"], &call["tool"], &call["runs"]),
        (&json!("call_t1"), &json!("get_location"), &json!("client"))
    );
    let in_task = json!({"taskId": task["id"], "contextId": task["contextId"]});
    let answer = |call_id: &str| {
        let mut m = message("", in_task.clone());
        m["parts"] = json!([{"data": {"call_id": call_id, "output": "Lyon, France"}}]);
        m
    };
    let stray = rpc(
        &app,
        request(2, "SendMessage", json!({"message": answer("call_zz")})),
    )
    .await;
    assert_eq!(stray["error"]["code"], -32602, "{stray}");
    let done = rpc(
        &app,
        request(3, "SendMessage", json!({"message": answer("call_t1")})),
    )
    .await;
    let task = &done["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], "You are in Lyon.");
    let sent = app.provider.requests()[1].body["messages"].to_string();
    assert!(sent.contains("Lyon, France"), "{sent}");
}

on_both_backends!(
    a_task_is_a_turn_sent_streamed_read_and_listed,
    a_task_waits_for_input_and_is_answered_in_the_same_task,
    a_task_is_cancelled_and_subscribed_to,
    every_a2a_error_has_its_code,
    the_callers_tasks_are_listed_across_contexts_and_filtered,
    another_tenants_tasks_are_not_listed,
    a_task_waits_for_the_clients_own_tool,
);

/// Another tenant's tasks are neither listed nor counted, whatever the
/// filter names (its context id too).
async fn another_tenants_tasks_are_not_listed(backend: Backend) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.auth = harness_core::config::AuthMode::On;
    let mut app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    crate::edge::tenants::make_keys(
        &app,
        &[
            ("k-acme", "acme", "ah_acme"),
            ("k-globex", "globex", "ah_globex"),
        ],
    )
    .await;
    app.client = crate::edge::tenants::client_with_key("ah_acme");
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let sent = rpc(
        &app,
        request(
            1,
            "SendMessage",
            json!({"message": message("hi", json!({"contextId": "ctx-acme"}))}),
        ),
    )
    .await;
    let task = sent["result"]["task"]["id"].as_str().unwrap().to_owned();
    let mine = rpc(&app, request(2, "ListTasks", json!({}))).await;
    assert_eq!(mine["result"]["tasks"][0]["id"], task.as_str());

    app.client = crate::edge::tenants::client_with_key("ah_globex");
    for params in [
        json!({}),
        json!({"contextId": "ctx-acme"}),
        json!({"status": "TASK_STATE_COMPLETED"}),
    ] {
        let theirs = rpc(&app, request(3, "ListTasks", params.clone())).await;
        assert_eq!(theirs["result"]["tasks"], json!([]), "{params}: {theirs}");
        assert_eq!(theirs["result"]["totalSize"], 0, "{params}");
    }
}
