//! A conversation's tree through the protocols that carry it: a Responses
//! `previous_response_id` that names an older response, an AG-UI
//! `parentRunId`, the AI SDK's `regenerate-message`. Each time the model
//! is sent its own branch (checked on the fake provider's request log),
//! never a sibling's. The official clients run the same in `.ci/run`
//! (`scripts/openai_sdk_check.py`, `scripts/clients/check.mjs`).

use serde_json::{Value, json};

use crate::{
    fake_provider::Reply,
    helpers::{TestApp, sent_history, sibling_ids, spawn_app},
    on_both_backends,
    support::Backend,
};

/// Posts `body` to `path` with the answer `answer` queued: its status and
/// body as text.
async fn post(app: &TestApp, path: &str, body: &Value, answer: &str) -> (u16, String) {
    app.provider.enqueue([Reply::openai_text(answer)]);
    app.post_for_text(path, body).await
}

/// The JSON objects of an SSE body's `data:` lines.
fn data_lines(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str(data).ok())
        .collect()
}

async fn an_older_previous_response_id_branches_from_that_response(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut ids: Vec<String> = Vec::new();
    for (n, said) in ["alpha", "beta", "gamma", "delta"].iter().enumerate() {
        let mut body = json!({ "input": said });
        if let Some(previous) = ids.last() {
            body["previous_response_id"] = json!(previous);
        }
        let (status, text) = post(&app, "/v1/responses", &body, &format!("A{n}")).await;
        assert_eq!(status, 200, "{text}");
        let response: Value = serde_json::from_str(&text).unwrap();
        ids.push(response["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        sent_history(&app),
        ["alpha", "A0", "beta", "A1", "gamma", "A2", "delta"]
    );
    // Following the second: its chain, not the session's latest state.
    let body = json!({"input": "epsilon", "previous_response_id": ids[1]});
    let (status, text) = post(&app, "/v1/responses", &body, "A4").await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(sent_history(&app), ["alpha", "A0", "beta", "A1", "epsilon"]);
    let branched: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(branched["previous_response_id"], ids[1].as_str());
    let (_, items) = app
        .get_json(&format!(
            "/v1/responses/{}/input_items?order=asc",
            branched["id"].as_str().unwrap()
        ))
        .await;
    let listed: Vec<&str> = items["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["content"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["alpha", "A0", "beta", "A1", "epsilon"]);
    // The fourth still goes on from the third.
    let body = json!({"input": "zeta", "previous_response_id": ids[3]});
    let (status, _) = post(&app, "/v1/responses", &body, "A5").await;
    assert_eq!(status, 200);
    assert_eq!(
        sent_history(&app),
        [
            "alpha", "A0", "beta", "A1", "gamma", "A2", "delta", "A3", "zeta"
        ]
    );
}

async fn an_agui_parent_run_is_the_branch_the_model_is_sent(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut messages: Vec<Value> = Vec::new();
    for n in 1..=4 {
        messages.push(json!({"id": format!("u{n}"), "role": "user", "content": format!("q{n}")}));
        let body = json!({"threadId": "th", "runId": format!("run-{n}"), "messages": messages});
        let (status, text) = post(&app, "/v1/agui", &body, &format!("a{n}")).await;
        assert_eq!(status, 200, "{text}");
        // A run that names no parent says none.
        assert_eq!(data_lines(&text)[0].get("parentRunId"), None, "{text}");
        messages
            .push(json!({"id": format!("a{n}"), "role": "assistant", "content": format!("a{n}")}));
    }
    // The client sends every message it holds, and names the second run:
    // the model is sent runs 1-2 and their answers, as stored.
    messages.push(json!({"id": "u5", "role": "user", "content": "q5"}));
    let body = json!({"threadId": "th", "runId": "run-5", "parentRunId": "run-2",
                      "messages": messages});
    let (status, text) = post(&app, "/v1/agui", &body, "a5").await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(sent_history(&app), ["q1", "a1", "q2", "a2", "q5"]);
    let events = data_lines(&text);
    assert_eq!(events[0]["type"], "RUN_STARTED");
    assert_eq!(events[0]["runId"], "run-5");
    assert_eq!(events[0]["parentRunId"], "run-2");
    // A parent the thread never ran is not found (nothing runs).
    let requests = app.provider.requests().len();
    let body = json!({"threadId": "th", "runId": "run-6", "parentRunId": "run-x",
                      "messages": [{"id": "u6", "role": "user", "content": "q6"}]});
    let (status, text) = post(&app, "/v1/agui", &body, "a6").await;
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("turn_not_found"), "{text}");
    assert_eq!(app.provider.requests().len(), requests);
}

async fn the_ai_sdks_regenerate_is_a_sibling_with_no_sibling_text(backend: Backend) {
    let app = spawn_app(backend).await;
    let user = |id: &str, text: &str| json!({"id": id, "role": "user", "parts": [{"type": "text", "text": text}]});
    let answer_of = |body: &str| {
        data_lines(body)
            .iter()
            .find(|c| c["type"] == "start")
            .and_then(|c| c["messageId"].as_str())
            .unwrap()
            .to_owned()
    };
    let mut messages = vec![user("u1", "one")];
    let (status, text) = post(
        &app,
        "/v1/ui/chat",
        &json!({"id": "chat", "messages": messages}),
        "A1",
    )
    .await;
    assert_eq!(status, 200, "{text}");
    messages.push(json!({"id": answer_of(&text), "role": "assistant",
                         "parts": [{"type": "text", "text": "A1"}]}));
    messages.push(user("u2", "two"));
    let (_, text) = post(
        &app,
        "/v1/ui/chat",
        &json!({"id": "chat", "messages": messages}),
        "A2",
    )
    .await;
    let second = answer_of(&text);
    // regenerate(): the assistant message is taken off, the rest sent.
    let body = json!({"id": "chat", "trigger": "regenerate-message", "messageId": second,
                      "messages": messages});
    let (status, text) = post(&app, "/v1/ui/chat", &body, "A2b").await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(sent_history(&app), ["one", "A1", "two"]);
    let again = answer_of(&text);
    assert_ne!(again, second);
    assert_eq!(
        sibling_ids(&app, "chat", &second).await,
        [second.clone(), again]
    );
    // With no `messageId`, the last answer is the one replaced.
    let body = json!({"id": "chat", "trigger": "regenerate-message", "messages": messages});
    let (status, text) = post(&app, "/v1/ui/chat", &body, "A2c").await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(sent_history(&app), ["one", "A1", "two"]);
    assert_eq!(sibling_ids(&app, "chat", &second).await.len(), 3);
    // A trigger the AI SDK does not send is refused.
    let body = json!({"id": "chat", "trigger": "resume-everything", "messages": messages});
    let (status, text) = post(&app, "/v1/ui/chat", &body, "never").await;
    assert_eq!(status, 422, "{text}");
    assert!(text.contains("\"field\":\"trigger\""), "{text}");
    // A regenerate naming a turn the chat does not have is refused.
    let body = json!({"id": "chat", "trigger": "regenerate-message",
                      "messageId": uuid::Uuid::now_v7().to_string(), "messages": messages});
    let (status, text) = post(&app, "/v1/ui/chat", &body, "never").await;
    assert_eq!(status, 404, "{text}");
}

on_both_backends!(
    an_older_previous_response_id_branches_from_that_response,
    an_agui_parent_run_is_the_branch_the_model_is_sent,
    the_ai_sdks_regenerate_is_a_sibling_with_no_sibling_text,
);
