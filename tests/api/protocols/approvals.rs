//! A write that waits for a person, decided in each protocol's own
//! shape: AG-UI's interrupt and `resume`, the AI SDK's
//! `tool-approval-request` and `approval-responded` tool part, Responses'
//! `mcp_approval_request` and `mcp_approval_response`. Each answer ends at
//! the request while the turn waits; the next request decides, and its
//! answer is the same turn after the decision. The turn parks as soon as
//! it waits (`HARNESS_PARK_AFTER=0s`), as it does when a person takes
//! their time: the decision wakes it. (The official clients of each run
//! the same round trips in `.ci/run`, with the default hold.)

use serde_json::{Value, json};

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, spawn_app_with, test_settings, vault_of},
    on_both_backends,
    support::{Backend, TestDb},
};

async fn app(backend: Backend, vault: &std::path::Path) -> TestApp {
    app_waiting(backend, vault, "24h").await
}

/// [`app`], its waits ending after `approval_timeout`.
async fn app_waiting(backend: Backend, vault: &std::path::Path, approval_timeout: &str) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.vault.dir = vault.to_owned();
    settings.harness.approval_required = Some("LOCAL_WRITE".parse().unwrap());
    settings.harness.park_after = "0s".parse().unwrap();
    settings.harness.approval_timeout = approval_timeout.parse().unwrap();
    spawn_app_with(TestDb::new(backend).await, provider, settings).await
}

fn script(app: &TestApp, call: &str) {
    app.provider.enqueue([
        Reply::openai_tool_call(
            call,
            "write_note",
            &json!({"path": "notes/a.md", "content": "changed"}),
        ),
        Reply::sse("openai/text.sse"),
    ]);
}

/// The `data:` events of an SSE body.
fn data_events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|frame| frame.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

async fn post(app: &TestApp, path: &str, body: &Value) -> (u16, String) {
    app.post_for_text(path, body).await
}

/// The session's running turn, once it is parked: the decision that
/// follows wakes it.
async fn running_turn(app: &TestApp, session: &str) -> Value {
    let (status, body) = app.get_json(&format!("/sessions/{session}")).await;
    assert_eq!(status, 200, "{body}");
    let turn = body["running_turn_id"].clone();
    let id = turn.as_str().unwrap_or_else(|| panic!("{body}"));
    for _ in 0..500 {
        let (_, record) = app
            .get_json(&format!("/sessions/{session}/turns/{id}"))
            .await;
        if record["parked_until"].is_string() {
            return turn;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("turn {id} never parked");
}

async fn agui_waits_with_an_interrupt_and_resume_decides(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let app = app(backend, vault.path()).await;
    script(&app, "call_g1");
    let input = json!({
        "threadId": "agui-approve", "runId": "r1",
        "messages": [{"id": "u1", "role": "user", "content": "Change my note."}],
    });
    let (status, body) = post(&app, "/v1/agui", &input).await;
    assert_eq!(status, 200, "{body}");
    let events = data_events(&body);
    let finished = events.last().unwrap();
    assert_eq!(finished["type"], "RUN_FINISHED", "{body}");
    let interrupt = &finished["outcome"]["interrupts"][0];
    assert_eq!(finished["outcome"]["type"], "interrupt", "{finished}");
    assert_eq!(interrupt["id"], "call_g1");
    assert_eq!(interrupt["toolCallId"], "call_g1");
    assert_eq!(interrupt["reason"], "tool_approval");
    assert_eq!(interrupt["metadata"]["tool"], "write_note");
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "TOOL_CALL_START" && e["toolCallId"] == "call_g1"),
        "{body}"
    );
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\n");
    let turn = running_turn(&app, "agui-approve").await;
    assert!(turn.is_string(), "the turn waits");

    // A payload that is no decision is refused; nothing is decided.
    let mut next = input.clone();
    next["runId"] = "r2".into();
    next["resume"] =
        json!([{"interruptId": "call_g1", "status": "resolved", "payload": {"ok": 1}}]);
    let (status, body) = post(&app, "/v1/agui", &next).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("resume[0].payload"), "{body}");
    // More answers than a run may carry.
    next["resume"] = serde_json::Value::Array(
        (0..101)
            .map(|i| json!({"interruptId": format!("c{i}"), "status": "cancelled"}))
            .collect(),
    );
    let (status, body) = post(&app, "/v1/agui", &next).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("\"field\":\"resume\""), "{body}");
    // An interrupt the turn does not wait on is not found.
    next["resume"] = json!([{"interruptId": "call_other", "status": "resolved",
                             "payload": {"approved": true}}]);
    let (status, body) = post(&app, "/v1/agui", &next).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("call_not_found"), "{body}");

    next["resume"] = json!([{"interruptId": "call_g1", "status": "resolved",
                             "payload": {"approved": true}}]);
    let (status, body) = post(&app, "/v1/agui", &next).await;
    assert_eq!(status, 200, "{body}");
    let events = data_events(&body);
    assert_eq!(events[0]["type"], "RUN_STARTED");
    assert_eq!(events[0]["runId"], "r2");
    let result = events
        .iter()
        .find(|e| e["type"] == "TOOL_CALL_RESULT")
        .expect("the approved call's result");
    assert_eq!(result["toolCallId"], "call_g1");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "RUN_FINISHED", "{body}");
    assert!(last["outcome"].is_null(), "a completed run: {last}");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "changed");

    // Cancelled is a denial: the write does not run.
    std::fs::write(&note, "# A\n").unwrap();
    script(&app, "call_g2");
    let mut again = input.clone();
    again["runId"] = "r3".into();
    again["messages"] = json!([{"id": "u2", "role": "user", "content": "Once more."}]);
    let (_, body) = post(&app, "/v1/agui", &again).await;
    assert_eq!(
        data_events(&body).last().unwrap()["outcome"]["interrupts"][0]["id"],
        "call_g2"
    );
    again["runId"] = "r4".into();
    again["resume"] = json!([{"interruptId": "call_g2", "status": "cancelled"}]);
    let (status, body) = post(&app, "/v1/agui", &again).await;
    assert_eq!(status, 200, "{body}");
    let result = data_events(&body)
        .into_iter()
        .find(|e| e["type"] == "TOOL_CALL_RESULT")
        .expect("the denied call's result");
    assert!(
        result["content"].as_str().unwrap().contains("denied"),
        "{result}"
    );
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\n");
}

/// Approving with edits in each protocol's shape: AG-UI's `editedArgs`,
/// the AI SDK's tool part `input` (what `addToolApprovalResponse` sends
/// back, edited by the page), MCP's form field `arguments`. An edit that
/// fails the tool's schema is refused in the protocol's shape and the
/// call waits on.
async fn each_protocol_approves_with_edits(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let app = app(backend, vault.path()).await;

    // AG-UI.
    script(&app, "call_e1");
    let input = json!({
        "threadId": "agui-edit", "runId": "r1",
        "messages": [{"id": "u1", "role": "user", "content": "Change my note."}],
    });
    let (status, body) = post(&app, "/v1/agui", &input).await;
    assert_eq!(status, 200, "{body}");
    running_turn(&app, "agui-edit").await;
    let mut next = input.clone();
    next["runId"] = "r2".into();
    next["resume"] = json!([{"interruptId": "call_e1", "status": "resolved",
        "payload": {"approved": true, "editedArgs": {"path": "notes/a.md", "content": ["no"]}}}]);
    let (status, body) = post(&app, "/v1/agui", &next).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("resume[0].payload.editedArgs"), "{body}");
    assert!(running_turn(&app, "agui-edit").await.is_string());
    next["resume"] = json!([{"interruptId": "call_e1", "status": "resolved",
        "payload": {"approved": true, "editedArgs": {"path": "notes/a.md", "content": "from AG-UI"}}}]);
    let (status, body) = post(&app, "/v1/agui", &next).await;
    assert_eq!(status, 200, "{body}");
    let starts = data_events(&body)
        .iter()
        .filter(|e| e["type"] == "TOOL_CALL_START" && e["toolCallId"] == "call_e1")
        .count();
    assert!(starts <= 1, "the edited start is not a second call: {body}");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "from AG-UI");

    // The AI SDK: the part's input, edited.
    script(&app, "call_e2");
    let user = json!({"id": "u1", "role": "user",
                      "parts": [{"type": "text", "text": "Change my note."}]});
    let (status, body) = post(
        &app,
        "/v1/ui/chat",
        &json!({"id": "chat-edit", "messages": [user]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let approval_id = data_events(&body)
        .into_iter()
        .find(|c| c["type"] == "tool-approval-request")
        .unwrap_or_else(|| panic!("{body}"))["approvalId"]
        .clone();
    running_turn(&app, "chat-edit").await;
    let assistant = json!({"id": "a1", "role": "assistant", "parts": [
        {"type": "step-start"},
        {"type": "tool-write_note", "toolCallId": "call_e2", "state": "approval-responded",
         "input": {"path": "notes/a.md", "content": "from useChat"},
         "approval": {"id": approval_id, "approved": true}},
    ]});
    let (status, body) = post(
        &app,
        "/v1/ui/chat",
        &json!({"id": "chat-edit", "messages": [user, assistant]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        data_events(&body)
            .iter()
            .any(|c| c["type"] == "tool-output-available" && c["toolCallId"] == "call_e2"),
        "{body}"
    );
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "from useChat");
}

async fn use_chat_asks_for_approval_and_the_next_request_decides(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let app = app(backend, vault.path()).await;
    script(&app, "call_u1");
    let user = json!({"id": "m1", "role": "user",
                      "parts": [{"type": "text", "text": "Change my note."}]});
    let (status, body) = post(
        &app,
        "/v1/ui/chat",
        &json!({"id": "chat-approve", "messages": [user]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let chunks = data_events(&body);
    let types: Vec<&str> = chunks.iter().map(|c| c["type"].as_str().unwrap()).collect();
    let at = types
        .iter()
        .position(|t| *t == "tool-approval-request")
        .unwrap_or_else(|| panic!("{types:?}"));
    assert_eq!(types[at + 1..], ["finish-step", "finish"], "{types:?}");
    let request = &chunks[at];
    assert_eq!(request["toolCallId"], "call_u1");
    let approval_id = request["approvalId"].as_str().unwrap().to_owned();
    assert!(
        chunks
            .iter()
            .any(|c| c["type"] == "tool-input-available" && c["toolCallId"] == "call_u1"),
        "{types:?}"
    );
    assert!(running_turn(&app, "chat-approve").await.is_string());

    // useChat's resume while it waits starts from the turn's start: the
    // request again.
    let resumed = app.get_text("/v1/ui/chat/chat-approve/stream").await;
    assert!(resumed.contains("tool-approval-request"), "{resumed}");

    // addToolApprovalResponse leaves the tool part `approval-responded`.
    let assistant = json!({"id": "a1", "role": "assistant", "parts": [
        {"type": "step-start"},
        {"type": "tool-write_note", "toolCallId": "call_u1", "state": "approval-responded",
         "input": {"path": "notes/a.md", "content": "changed"},
         "approval": {"id": approval_id, "approved": false, "reason": "not today"}},
    ]});
    let (status, body) = post(
        &app,
        "/v1/ui/chat",
        &json!({"id": "chat-approve", "messages": [user, assistant]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let chunks = data_events(&body);
    let error = chunks
        .iter()
        .find(|c| c["type"] == "tool-output-error")
        .unwrap_or_else(|| panic!("{body}"));
    assert_eq!(error["toolCallId"], "call_u1");
    assert!(
        error["errorText"].as_str().unwrap().contains("not today"),
        "{error}"
    );
    assert!(
        !chunks.iter().any(|c| c["type"] == "tool-approval-request"),
        "after the decision: {body}"
    );
    assert_eq!(chunks.last().unwrap()["type"], "finish", "{body}");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\n");

    // The same message sent again decides nothing more: nothing waits.
    let (status, body) = post(
        &app,
        "/v1/ui/chat",
        &json!({"id": "chat-approve", "messages": [user, assistant]}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
}

async fn responses_end_at_an_approval_request_and_the_next_response_decides(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let app = app(backend, vault.path()).await;
    script(&app, "call_r1");
    let (status, body) = post(&app, "/v1/responses", &json!({"input": "Change my note."})).await;
    assert_eq!(status, 200, "{body}");
    let first: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(first["status"], "completed", "{first}");
    let asked = first["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["type"] == "mcp_approval_request")
        .unwrap_or_else(|| panic!("{first}"));
    assert_eq!(asked["id"], "mcpr_call_r1");
    assert_eq!(asked["name"], "write_note");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\n");

    // A reply without the response it answers, or naming no request.
    let answer = |id: &str| json!([{"type": "mcp_approval_response", "approval_request_id": id, "approve": true}]);
    let (status, body) = post(
        &app,
        "/v1/responses",
        &json!({"input": answer("mcpr_call_r1")}),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = post(
        &app,
        "/v1/responses",
        &json!({"previous_response_id": first["id"], "input": answer("call_r1")}),
    )
    .await;
    assert_eq!(status, 422, "{body}");

    let (status, body) = post(
        &app,
        "/v1/responses",
        &json!({"previous_response_id": first["id"], "input": answer("mcpr_call_r1")}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let second: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(second["status"], "completed", "{second}");
    assert_eq!(second["previous_response_id"], first["id"], "{second}");
    let call = second["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["type"] == "mcp_call")
        .unwrap_or_else(|| panic!("{second}"));
    assert_eq!(call["status"], "completed", "{call}");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "changed");

    // Decided: the same answer again is refused.
    let (status, body) = post(
        &app,
        "/v1/responses",
        &json!({"previous_response_id": first["id"], "input": answer("mcpr_call_r1")}),
    )
    .await;
    assert!(status == 409 || status == 404, "{status} {body}");
}

/// `useChat`'s resume of a turn that went on after a decision starts
/// after the decided approval: the call's result and what follows, not
/// the request again.
async fn use_chat_resumes_after_the_decided_approval(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let app = app(backend, vault.path()).await;
    let gate = tokio_util::sync::CancellationToken::new();
    app.provider.enqueue([
        Reply::openai_tool_call(
            "call_v1",
            "write_note",
            &json!({"path": "notes/a.md", "content": "changed"}),
        ),
        Reply::sse("openai/text.sse").hold_head(&gate),
    ]);
    let user = json!({"id": "m1", "role": "user",
                      "parts": [{"type": "text", "text": "Change my note."}]});
    let (_, body) = post(
        &app,
        "/v1/ui/chat",
        &json!({"id": "chat-resume", "messages": [user]}),
    )
    .await;
    let chunks = data_events(&body);
    let approval_id = chunks
        .iter()
        .find(|c| c["type"] == "tool-approval-request")
        .unwrap_or_else(|| panic!("{body}"))["approvalId"]
        .clone();
    let assistant = json!({"id": "a1", "role": "assistant", "parts": [
        {"type": "tool-write_note", "toolCallId": "call_v1", "state": "approval-responded",
         "input": {"path": "notes/a.md", "content": "changed"},
         "approval": {"id": approval_id, "approved": true}},
    ]});
    // The decision's answer streams while the model is held.
    let going_on = app
        .client
        .post(app.url("/v1/ui/chat"))
        .json(&json!({"id": "chat-resume", "messages": [user, assistant]}))
        .send()
        .await
        .unwrap();
    assert_eq!(going_on.status(), 200);
    let resumed = app
        .client
        .get(app.url("/v1/ui/chat/chat-resume/stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    let mut resumed = crate::helpers::SseStream::new(resumed).await;
    let mut seen = Vec::new();
    while let Some(event) = resumed.next().await {
        if event.data == "[DONE]" {
            break;
        }
        let chunk = event.json();
        let output = chunk["type"] == "tool-output-available";
        seen.push(chunk);
        if output {
            gate.cancel();
        }
    }
    let types: Vec<&str> = seen.iter().map(|c| c["type"].as_str().unwrap()).collect();
    assert!(types.contains(&"tool-output-available"), "{types:?}");
    assert!(!types.contains(&"tool-approval-request"), "{types:?}");
    assert_eq!(types.last(), Some(&"finish"), "{types:?}");
    going_on.text().await.unwrap();
}

/// Nobody decides: the wait ends (`HARNESS_APPROVAL_TIMEOUT`) while the
/// turn is parked, and the turn goes on; `useChat`'s resume then starts
/// with the call ending `timed_out` (a `tool-output-error`), then the rest
/// of the turn.
async fn use_chat_sees_a_wait_end_unanswered(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let app = app_waiting(backend, vault.path(), "2s").await;
    let gate = tokio_util::sync::CancellationToken::new();
    app.provider.enqueue([
        Reply::openai_tool_call(
            "call_x1",
            "write_note",
            &json!({"path": "notes/a.md", "content": "changed"}),
        ),
        Reply::sse("openai/text.sse").hold_head(&gate),
    ]);
    let user = json!({"id": "m1", "role": "user",
                      "parts": [{"type": "text", "text": "Change my note."}]});
    let (_, body) = post(
        &app,
        "/v1/ui/chat",
        &json!({"id": "chat-late", "messages": [user]}),
    )
    .await;
    assert!(body.contains("tool-approval-request"), "{body}");
    assert!(running_turn(&app, "chat-late").await.is_string());
    // The wait ends; the model is held while the resume attaches.
    let mut resolved = false;
    for _ in 0..300 {
        let (_, log) = app.get_json("/sessions/chat-late/events").await;
        resolved = log["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "approval.resolved");
        if resolved {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(resolved, "the wait never ended");
    let resumed = app
        .client
        .get(app.url("/v1/ui/chat/chat-late/stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    let mut resumed = crate::helpers::SseStream::new(resumed).await;
    let mut seen = Vec::new();
    while let Some(event) = resumed.next().await {
        if event.data == "[DONE]" {
            break;
        }
        let chunk = event.json();
        if chunk["type"] == "tool-output-error" {
            gate.cancel();
        }
        seen.push(chunk);
    }
    let ended = seen
        .iter()
        .find(|c| c["type"] == "tool-output-error" && c["toolCallId"] == "call_x1")
        .unwrap_or_else(|| panic!("{seen:?}"));
    let why = ended["errorText"].as_str().unwrap();
    assert!(why.contains("timed_out"), "{why}");
    assert!(
        !seen.iter().any(|c| c["type"] == "tool-approval-request"),
        "{seen:?}"
    );
    assert_eq!(seen.last().unwrap()["type"], "finish", "{seen:?}");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\n");
}

on_both_backends!(
    each_protocol_approves_with_edits,
    use_chat_sees_a_wait_end_unanswered,
    use_chat_resumes_after_the_decided_approval,
    agui_waits_with_an_interrupt_and_resume_decides,
    use_chat_asks_for_approval_and_the_next_request_decides,
    responses_end_at_an_approval_request_and_the_next_response_decides,
);
