//! `/v1/responses`: the OpenAI Responses API over turns. The official
//! `openai` SDK reads it in `.ci/run` (`scripts/openai_sdk_check.py`, with
//! its typed stream events); here each stream event and object is checked.

use crate::support::reply::JsonReply as _;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, spawn_app, spawn_app_with, spawn_app_with_vault, test_settings, vault_of},
    on_both_backends,
    support::{Backend, TestDb},
};

/// The stream events of a Responses SSE body, each checked against its
/// `event:` line.
fn stream_events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter(|frame| !frame.trim().is_empty() && !frame.starts_with(':'))
        .map(|frame| {
            let (event, data) = frame
                .split_once('\n')
                .unwrap_or_else(|| panic!("one event, two lines: {frame:?}"));
            let event = event.strip_prefix("event: ").unwrap();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["type"], event, "{data}");
            data
        })
        .collect()
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// The text of the output's messages, as the SDK's `output_text` reads it.
fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().unwrap().iter())
        .filter_map(|part| part["text"].as_str())
        .collect()
}

async fn post(app: &TestApp, body: Value) -> reqwest::Response {
    app.client
        .post(app.url("/v1/responses"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn a_streamed_response_is_the_turn_as_response_stream_events(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([
        Reply::sse("openai/tool_call_local_search.sse"),
        Reply::sse("openai/after_local_search.sse"),
    ]);
    let response = post(
        &app,
        json!({"model": "agent-harness", "input": "Plan a Paris trip", "stream": true,
               "metadata": {"ticket": "T-1"}, "temperature": 0.3}),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let session = response.headers()["x-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let turn = response.headers()["x-turn-id"].to_str().unwrap().to_owned();
    let events = stream_events(&response.text().await.unwrap());
    assert_eq!(
        types(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.mcp_call.in_progress",
            "response.mcp_call.completed",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    // Numbered from 0, one by one.
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], i, "{event}");
    }
    let id = format!("resp_{}", turn.replace('-', ""));
    let created = &events[0]["response"];
    assert_eq!(
        (&created["id"], &created["status"], &created["object"]),
        (&json!(id), &json!("in_progress"), &json!("response"))
    );
    assert_eq!(created["conversation"]["id"], session.as_str());
    assert_eq!(created["metadata"], json!({"ticket": "T-1"}));
    // The service's own tool, as an MCP call of its own server.
    let call = &events[5]["item"];
    assert_eq!(
        (&call["type"], &call["name"], &call["server_label"]),
        (
            &json!("mcp_call"),
            &json!("local_search"),
            &json!("agent-harness")
        )
    );
    assert_eq!(call["status"], "completed");
    assert_eq!(
        serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).unwrap(),
        json!({"query": "Paris trip"})
    );
    assert_eq!(events[3]["item_id"], call["id"]);
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, "You asked about a Paris trip before.");
    assert_eq!(events[16]["text"], deltas.as_str());
    let done = &events[19]["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(output_text(done), deltas);
    assert_eq!(done["output"][1]["status"], "completed");
    assert!(
        done["usage"]["total_tokens"].as_u64().unwrap() > 0,
        "{done}"
    );
    assert_eq!(
        done["usage"]["input_tokens"].as_u64().unwrap()
            + done["usage"]["output_tokens"].as_u64().unwrap(),
        done["usage"]["total_tokens"].as_u64().unwrap()
    );

    // The object read back is the one the stream ended with.
    let (status, read) = app.get_json(&format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(read["output"], done["output"]);
    assert_eq!(
        (&read["status"], &read["usage"]),
        (&done["status"], &done["usage"])
    );
    assert_eq!(read["created_at"], done["created_at"]);
    // A resume after any event gives exactly the rest, from the log.
    for after in [0, 7, 18] {
        let body = app
            .get_text(&format!(
                "/v1/responses/{id}?stream=true&starting_after={after}"
            ))
            .await;
        assert_eq!(stream_events(&body), events[after + 1..], "after {after}");
    }
    // A sequence number past int64 is refused (it was taken, and ignored).
    let (status, refused) = app
        .get_json(&format!(
            "/v1/responses/{id}?starting_after=9223372036854775808"
        ))
        .await;
    assert_eq!(
        (status, &refused["code"]),
        (400, &json!("invalid_query")),
        "{refused}"
    );
    // The turn is the session's, as any other.
    let (_, turn) = app
        .get_json(&format!("/sessions/{session}/turns/{turn}"))
        .await;
    assert_eq!(turn["result"]["text"], deltas.as_str());
}

async fn responses_chain_by_previous_response_id_and_conversation(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([
        Reply::openai_text("Paris is lovely in May."),
        Reply::openai_text("Book the Louvre early."),
        Reply::openai_text("Third answer."),
    ]);
    let first: Value = post(
        &app,
        json!({"input": "When should I visit Paris?", "reasoning": {"effort": "high"},
               "max_output_tokens": 64, "user": "ann"}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(first["status"], "completed", "{first}");
    // The turn's effort and cap reach the model (under the catalogue's
    // 16,384 for the model); the next turn has neither.
    let asked = &app.provider.requests()[0].body;
    assert_eq!(
        (&asked["reasoning_effort"], &asked["max_completion_tokens"]),
        (&json!("high"), &json!(64))
    );
    assert_eq!(
        (&first["reasoning"]["effort"], &first["max_output_tokens"]),
        (&json!("high"), &json!(64))
    );
    assert_eq!(first["user"], "ann");
    assert_eq!(output_text(&first), "Paris is lovely in May.");
    assert_eq!(first["output"][0]["type"], "message");
    assert_eq!(first["output"][0]["role"], "assistant");
    let response = post(
        &app,
        json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "And what to see?"}]}],
               "previous_response_id": first["id"], "instructions": "Answer in one line."}),
    )
    .await;
    assert_eq!(response.status(), 200);
    let second: Value = response.json().await.unwrap();
    assert_eq!(second["previous_response_id"], first["id"]);
    assert_eq!(second["conversation"], first["conversation"]);
    assert_eq!(second["instructions"], "Answer in one line.");
    assert_eq!(output_text(&second), "Book the Louvre early.");
    // The model saw the first exchange (the session's history) and the
    // instructions, as the client's.
    // (The catalogue's cap for the model, and no effort, the settings'.)
    let asked = &app.provider.requests()[1].body;
    assert_eq!(
        (
            asked.get("reasoning_effort"),
            &asked["max_completion_tokens"]
        ),
        (None, &json!(16384))
    );
    let sent = asked["messages"].to_string();
    assert!(
        sent.contains("When should I visit Paris?")
            && sent.contains("Paris is lovely in May.")
            && sent.contains("Answer in one line."),
        "{sent}"
    );
    // `conversation` names the same session.
    let conversation = first["conversation"]["id"].as_str().unwrap();
    let third: Value = post(
        &app,
        json!({"input": "Thanks", "conversation": {"id": conversation}}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(third["conversation"]["id"], conversation);
    let (_, session) = app.get_json(&format!("/sessions/{conversation}")).await;
    assert_eq!(session["turn_count"], 3);
    // The input items of a response: what its turn was asked.
    let id = second["id"].as_str().unwrap();
    let (status, items) = app
        .get_json(&format!("/v1/responses/{id}/input_items"))
        .await;
    assert_eq!(status, 200, "{items}");
    assert_eq!(items["object"], "list");
    assert_eq!(items["data"][0]["role"], "user");
    assert_eq!(items["data"][0]["content"][0]["text"], "And what to see?");
    assert_eq!(items["has_more"], false);
    // A conversation's earlier messages, given whole, are its history.
    let (_, listed) = app
        .get_json(&format!(
            "/v1/responses/{}/input_items?order=asc&limit=1",
            first["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
    assert_eq!(
        listed["data"][0]["content"][0]["text"],
        "When should I visit Paris?"
    );
}

async fn a_background_response_is_read_resumed_and_cancelled(backend: Backend) {
    let app = spawn_app(backend).await;
    let gate = CancellationToken::new();
    app.provider
        .enqueue([Reply::sse("openai/text.sse").hold_after(3, &gate)]);
    let started: Value = post(&app, json!({"input": "Hi", "background": true}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (&started["status"], &started["background"]),
        (&json!("in_progress"), &json!(true))
    );
    let id = started["id"].as_str().unwrap().to_owned();
    // While it runs: its stream from the start, live.
    let live = app
        .client
        .get(app.url(&format!("/v1/responses/{id}?stream=true")))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    let (_, running) = app.get_json(&format!("/v1/responses/{id}")).await;
    assert_eq!(running["status"], "in_progress");
    // A running response cannot be deleted.
    let refused = app
        .client
        .delete(app.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 409);
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(problem["code"], "response_in_progress");

    let (status, cancelled) = app.post_json(&format!("/v1/responses/{id}/cancel")).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled");
    let events = stream_events(&live.text().await.unwrap());
    let last = events.last().unwrap();
    assert_eq!(
        (&last["type"], &last["response"]["status"]),
        (&json!("response.failed"), &json!("cancelled"))
    );
    let (status, again) = app.post_json(&format!("/v1/responses/{id}/cancel")).await;
    assert_eq!(
        (status, again["code"].as_str()),
        (409, Some("turn_not_running"))
    );
    gate.cancel();

    // Deleted: gone from these routes, and from `previous_response_id`.
    let deleted: Value = app
        .client
        .delete(app.url(&format!("/v1/responses/{id}")))
        .json_reply()
        .await;
    assert_eq!(
        deleted,
        json!({"id": id, "object": "response", "deleted": true})
    );
    let (status, gone) = app.get_json(&format!("/v1/responses/{id}")).await;
    assert_eq!(
        (status, gone["code"].as_str()),
        (404, Some("response_not_found"))
    );
    let response = post(&app, json!({"input": "more", "previous_response_id": id})).await;
    assert_eq!(response.status(), 404);
}

/// A request sent again with its `Idempotency-Key` answers the same
/// response, whose turn ran once; the key with another request is refused.
async fn a_response_asked_again_with_its_key_runs_once(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider
        .enqueue([Reply::openai_text("Once."), Reply::openai_text("Later.")]);
    let ask = |key: &'static str, body: Value| {
        app.client
            .post(app.url("/v1/responses"))
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };
    let first: Value = ask("k-1", json!({"input": "Hi"}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(output_text(&first), "Once.");
    let again: Value = ask("k-1", json!({"input": "Hi"}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again["id"], first["id"]);
    assert_eq!(again["output"], first["output"]);
    // Streamed this time: the same response's events, from the log.
    let streamed = ask("k-1", json!({"input": "Hi", "stream": true}))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events = stream_events(&streamed);
    assert_eq!(events.last().unwrap()["response"]["id"], first["id"]);
    // In the background: the same response, as the log has it.
    let later: Value = ask("k-2", json!({"input": "Hi", "background": true}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let again: Value = ask("k-2", json!({"input": "Hi", "background": true}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again["id"], later["id"]);
    assert_ne!(later["id"], first["id"]);
    // Its turn ran to its end (its stream read through) before the count:
    // a background turn may not have asked the provider yet when the
    // second answer comes.
    let id = later["id"].as_str().unwrap();
    let streamed = app
        .get_text(&format!("/v1/responses/{id}?stream=true"))
        .await;
    let events = stream_events(&streamed);
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    assert_eq!(app.provider.requests().len(), 2, "each turn ran once");
    // The key with another request is refused, and begins nothing.
    let other = ask("k-1", json!({"input": "Something else"}))
        .await
        .unwrap();
    assert_eq!(other.status(), 422);
    let problem: Value = other.json().await.unwrap();
    assert_eq!(problem["code"], "idempotency_key_reused");
    assert_eq!(app.provider.requests().len(), 2);
}

/// `model` runs the turn when the service is configured with it (its
/// chain's, `HARNESS_MODEL`, `[providers.models]`); any other name is
/// refused (`model_not_allowed`: before, it quietly ran the chain).
async fn a_responses_model_is_used_when_the_service_knows_it(backend: Backend) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.providers.models = r#"{"gpt-4.1-mini": {"context_window": 1000000}}"#.parse().unwrap();
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    app.provider
        .enqueue([Reply::openai_text("One."), Reply::openai_text("Two.")]);
    let known: Value = post(&app, json!({"input": "Hi", "model": "gpt-4.1-mini"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(app.provider.requests()[0].body["model"], "gpt-4.1-mini");
    assert_eq!(known["model"], "gpt-4.1-mini");
    let unknown = post(&app, json!({"input": "Hi", "model": "o9-ultra"})).await;
    assert_eq!(unknown.status(), 422);
    let problem: Value = unknown.json().await.unwrap();
    assert_eq!(problem["code"], "model_not_allowed");
    assert_eq!(app.provider.requests().len(), 1);
}

async fn what_the_responses_api_cannot_take_is_refused(backend: Backend) {
    let app = spawn_app(backend).await;
    for (body, status, code, field) in [
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            422,
            "unsupported_parameter",
            "tools[0]",
        ),
        (
            json!({"input": "x", "tools": [
                {"type": "function", "name": "f"}, {"type": "function", "name": "f"}]}),
            422,
            "invalid_field",
            "tools",
        ),
        (
            json!({"input": "x", "tools": [{"type": "function", "name": "f g"}]}),
            422,
            "invalid_field",
            "tools",
        ),
        (
            json!({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}),
            422,
            "invalid_field",
            "previous_response_id",
        ),
        (
            json!({"previous_response_id": "resp_0", "input": [
                {"type": "function_call_output", "call_id": "c", "output": "x"},
                {"role": "user", "content": "and"}]}),
            422,
            "unsupported_parameter",
            "input",
        ),
        (
            json!({"previous_response_id": "resp_0", "input": [
                {"type": "function_call_output", "call_id": "c", "output": 7}]}),
            422,
            "invalid_field",
            "input[0].output",
        ),
        (
            json!({"input": "x", "previous_response_id": "resp_0", "conversation": "c"}),
            422,
            "invalid_field",
            "conversation",
        ),
        (json!({"input": 7}), 422, "invalid_field", "input"),
        (
            json!({"input": [{"type": "reasoning", "summary": []}]}),
            422,
            "unsupported_parameter",
            "input[0]",
        ),
        (
            json!({"input": [{"role": "assistant", "content": "x"}]}),
            422,
            "invalid_field",
            "input",
        ),
        (
            json!({"input": "x", "conversation": "c", "previous_response_id": null,
                   "reasoning": {"effort": "extreme"}}),
            422,
            "invalid_field",
            "reasoning.effort",
        ),
        (json!({"input": "a\u{0}b"}), 422, "invalid_field", "input"),
        (
            json!({"input": "x", "user": "a b"}),
            422,
            "invalid_field",
            "user",
        ),
        (
            json!({"input": "x", "previous_response_id": "resp_nope"}),
            404,
            "response_not_found",
            "",
        ),
        (
            json!({"input": "x", "conversation": "bad id!"}),
            400,
            "invalid_session_id",
            "",
        ),
    ] {
        let response = post(&app, body.clone()).await;
        assert_eq!(response.status(), status, "{body}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["code"], code, "{body}: {problem}");
        if !field.is_empty() {
            assert_eq!(problem["field"], field, "{body}: {problem}");
        }
    }
    // Nothing was begun by any of them.
    assert!(app.provider.requests().is_empty());
    for path in [
        "/v1/responses/resp_0123",
        "/v1/responses/resp_0123456789abcdef0123456789abcdef/input_items",
        "/v1/responses/resp_0123456789abcdef0123456789abcdef_0",
        "/v1/responses/resp_0123456789abcdef0123456789abcdef_x",
    ] {
        let (status, problem) = app.get_json(path).await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (404, Some("response_not_found")),
            "{path}"
        );
    }
    let (status, problem) = app
        .get_json("/v1/responses/resp_0123456789abcdef0123456789abcdef?stream=maybe")
        .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (400, Some("invalid_query"))
    );
}

/// The sources a turn cites are annotations of its message, at the end of
/// its text: in the stream and in the object read back.
async fn a_responses_citations_are_annotations_of_its_message(backend: Backend) {
    let vault = vault_of(&[(
        "notes/paris.md",
        "# Paris trip\n\n## Open loops\n\n- Book the train to Paris (Eurostar) early.\n",
    )]);
    let app = spawn_app_with_vault(backend, vault.path()).await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let body = post(
        &app,
        json!({"input": "When should I book the train to Paris?", "stream": true}),
    )
    .await
    .text()
    .await
    .unwrap();
    let events = stream_events(&body);
    let added: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.annotation.added")
        .collect();
    assert!(!added.is_empty(), "{:?}", types(&events));
    let annotation = &added[0]["annotation"];
    assert_eq!(annotation["type"], "file_citation");
    assert_eq!(annotation["file_id"], "notes/paris.md#Open loops");
    let text = "Hello! How can I help you today?";
    assert_eq!(annotation["index"], text.chars().count());
    assert_eq!(added[0]["annotation_index"], 0);
    // Before the message's text is done; its part and item carry them.
    let at = |kind: &str| events.iter().position(|e| e["type"] == kind).unwrap();
    assert!(at("response.output_text.annotation.added") < at("response.output_text.done"));
    let done = &events.last().unwrap()["response"];
    let part = &done["output"][0]["content"][0];
    assert_eq!(part["text"], text);
    assert_eq!(part["annotations"][0], *annotation);
    let id = done["id"].as_str().unwrap();
    let (_, read) = app.get_json(&format!("/v1/responses/{id}")).await;
    assert_eq!(read["output"], done["output"]);
}

/// A `function` tool is the client's: a call of it ends the response with
/// its `function_call` item while the turn waits; the next request answers
/// it (`function_call_output` and `previous_response_id`), and its response
/// is the same turn after the call.
async fn a_function_call_is_answered_by_the_next_request(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([
        Reply::openai_tool_call("call_r1", "client__get_location", &json!({"precise": true})),
        Reply::openai_text("You are in Lyon."),
    ]);
    let location = json!({"type": "function", "name": "get_location",
        "description": "Where the user is", "parameters": {"type": "object"}});
    let asked: Value = post(&app, json!({"input": "Where am I?", "tools": [location]}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(asked["status"], "completed", "{asked}");
    let call = asked["output"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (
            &call["type"],
            &call["call_id"],
            &call["name"],
            &call["arguments"]
        ),
        (
            &json!("function_call"),
            &json!("call_r1"),
            &json!("get_location"),
            &json!(r#"{"precise":true}"#)
        ),
        "{call}"
    );
    assert_eq!(asked["tools"][0]["name"], "get_location");
    let offered = app.provider.requests()[0].body["tools"].to_string();
    assert!(offered.contains("client__get_location"), "{offered}");
    let first_id = asked["id"].as_str().unwrap();

    let answer = |call_id: &str, stream: bool| {
        json!({"previous_response_id": first_id, "stream": stream, "input": [
            {"type": "function_call_output", "call_id": call_id, "output": "Lyon, France"}]})
    };
    let unknown = post(&app, answer("call_zz", false)).await;
    assert_eq!(unknown.status(), 404);
    let problem: Value = unknown.json().await.unwrap();
    assert_eq!(problem["code"], "call_not_found");

    let body = post(&app, answer("call_r1", true))
        .await
        .text()
        .await
        .unwrap();
    let events = stream_events(&body);
    assert_eq!(
        events[0]["type"],
        "response.created",
        "{:?}",
        types(&events)
    );
    assert_eq!(events[0]["sequence_number"], 0);
    let done = events.last().unwrap()["response"].clone();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["previous_response_id"], first_id);
    let second_id = done["id"].as_str().unwrap();
    assert!(
        second_id.starts_with(&format!("{first_id}_")),
        "{second_id} goes on from {first_id}"
    );
    assert_eq!(output_text(&done), "You are in Lyon.");
    assert!(done["usage"]["total_tokens"].as_u64().unwrap() > 0);
    assert!(
        !types(&events).contains(&"response.mcp_call.in_progress"),
        "the client's call is not the service's: {:?}",
        types(&events)
    );
    let sent = app.provider.requests()[1].body["messages"].to_string();
    assert!(sent.contains("Lyon, France"), "{sent}");

    // Each response reads back as it was streamed.
    let (_, first) = app.get_json(&format!("/v1/responses/{first_id}")).await;
    assert_eq!(first["output"], asked["output"]);
    let (_, second) = app.get_json(&format!("/v1/responses/{second_id}")).await;
    assert_eq!(output_text(&second), "You are in Lyon.");
    assert_eq!(second["previous_response_id"], first_id);
    // The turn is over: nothing waits for an answer.
    let late = post(&app, answer("call_r1", false)).await;
    assert_eq!(late.status(), 409);
    let problem: Value = late.json().await.unwrap();
    assert_eq!(problem["code"], "turn_not_running");
}

async fn rpc(app: &TestApp, path: &str, body: Value) -> Value {
    let response = app
        .client
        .post(app.url(path))
        .json(&body)
        .send()
        .await
        .unwrap();
    response.json().await.unwrap()
}

/// A2A `ListTasks` of `session`, the error of `GetTask` of `task`, and MCP
/// `list_sessions`.
async fn lists(app: &TestApp, session: &str, task: &str) -> (Vec<String>, Value, Vec<String>) {
    let ids = |list: &Value, key: &str| -> Vec<String> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|item| item[key].as_str().unwrap().to_owned())
            .collect()
    };
    let tasks = rpc(
        app,
        "/a2a",
        json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"contextId": session}}),
    )
    .await;
    let got = rpc(
        app,
        "/a2a",
        json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": task}}),
    )
    .await;
    let sessions = rpc(
        app,
        "/mcp",
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list_sessions", "arguments": {}}}),
    )
    .await;
    (
        ids(&tasks["result"]["tasks"], "id"),
        got["error"]["code"].clone(),
        ids(
            &sessions["result"]["structuredContent"]["sessions"],
            "session_id",
        ),
    )
}

/// A deleted response is gone from every list: A2A `ListTasks` and
/// `GetTask`, and MCP `list_sessions` when it was its session's only turn.
/// (Before, it was hidden from the Responses routes alone.)
async fn a_deleted_response_is_gone_from_every_list(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([Reply::openai_text("Noted.")]);
    let response = post(&app, json!({"input": "Remember this"})).await;
    assert_eq!(response.status(), 200);
    let session = response.headers()["x-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let id = response.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let task = uuid::Uuid::parse_str(id.trim_start_matches("resp_"))
        .unwrap()
        .to_string();
    let (tasks, error, sessions) = lists(&app, &session, &task).await;
    assert_eq!(tasks, std::slice::from_ref(&task));
    assert_eq!(error, Value::Null);
    assert_eq!(sessions, std::slice::from_ref(&session));
    let deleted = app
        .client
        .delete(app.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    let (tasks, error, sessions) = lists(&app, &session, &task).await;
    assert!(tasks.is_empty(), "{tasks:?}");
    assert_eq!(error, -32001, "task not found");
    assert!(sessions.is_empty(), "{sessions:?}");
}

on_both_backends!(
    a_deleted_response_is_gone_from_every_list,
    a_responses_citations_are_annotations_of_its_message,
    a_response_asked_again_with_its_key_runs_once,
    a_responses_model_is_used_when_the_service_knows_it,
    a_streamed_response_is_the_turn_as_response_stream_events,
    responses_chain_by_previous_response_id_and_conversation,
    a_background_response_is_read_resumed_and_cancelled,
    what_the_responses_api_cannot_take_is_refused,
    a_function_call_is_answered_by_the_next_request,
);
