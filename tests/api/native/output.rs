//! Structured output: a turn that asks for JSON (an output schema) gets
//! the provider's JSON mode, its answer checked and repaired within the
//! bounded repair, and `output` the parsed value; an answer that never
//! fits ends `output_invalid`, never as prose that claims to be JSON.

use serde_json::{Value, json};

use crate::{
    fake_provider::Reply,
    helpers::{TestApp, spawn_app},
    on_both_backends,
    support::Backend,
};

on_both_backends!(an_answer_is_checked_against_its_schema_and_repaired);

fn city_schema() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string"}},
           "required": ["city"], "additionalProperties": false})
}

async fn turn(app: &TestApp, session: &str, body: Value) -> (u16, Value) {
    let response = app.post_turn(session, body).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn an_answer_is_checked_against_its_schema_and_repaired(backend: Backend) {
    let app = spawn_app(backend).await;
    let asked = json!({"name": "city", "schema": city_schema(), "strict": true});

    // Prose first, then JSON that fits: one repair.
    app.provider.enqueue([
        Reply::openai_text("It is Paris."),
        Reply::openai_text("```json\n{\"city\": \"Paris\"}\n```"),
    ]);
    let (status, result) = turn(
        &app,
        "s-json",
        json!({"message": "Where is the Louvre?", "output_schema": asked}),
    )
    .await;
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["stop_reason"], "answer", "{result}");
    assert_eq!(result["output"], json!({"city": "Paris"}), "{result}");
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0].body["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "city", "schema": city_schema(), "strict": true}})
    );
    let repair = requests[1].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(repair["role"], "user");
    assert!(
        repair["content"]
            .as_str()
            .unwrap()
            .contains("not the JSON asked for"),
        "{repair}"
    );
    // The answer asked again was never shown: the text is the JSON alone.
    let (_, events) = app.get_json("/sessions/s-json/events?limit=1000").await;
    let shown: String = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "message.delta")
        .map(|e| e["text"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(shown, "```json\n{\"city\": \"Paris\"}\n```", "{events}");

    // Never JSON: the first answer and two repairs, then `output_invalid`
    // with the last text kept and no `output`.
    app.provider.enqueue([
        Reply::openai_text("Paris."),
        Reply::openai_text("{\"town\": \"Paris\"}"),
        Reply::openai_text("Still Paris."),
    ]);
    let (status, result) = turn(
        &app,
        "s-json-never",
        json!({"message": "Where is the Louvre?", "output_schema": asked}),
    )
    .await;
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["stop_reason"], "output_invalid", "{result}");
    assert_eq!(result["text"], "Still Paris.");
    assert!(result.get("output").is_none(), "{result}");
    assert_eq!(app.provider.requests().len(), 5);

    // Any JSON object, and no schema: `json_object`.
    app.provider
        .enqueue([Reply::openai_text("{\"any\": [1, 2]}")]);
    let (_, result) = turn(
        &app,
        "s-json-any",
        json!({"message": "Anything.", "output_schema": {"name": "free"}}),
    )
    .await;
    assert_eq!(result["output"], json!({"any": [1, 2]}), "{result}");
    let last = app.provider.requests().last().unwrap().body.clone();
    assert_eq!(last["response_format"], json!({"type": "json_object"}));

    // A schema that is none is refused before the turn: no call, no turn.
    let calls = app.provider.requests().len();
    for (schema, why) in [
        (json!({"type": "no such type"}), "not a JSON Schema"),
        (json!({"description": "x".repeat(70 * 1024)}), "bytes"),
        (json!([1, 2]), "object"),
    ] {
        let (status, problem) = turn(
            &app,
            "s-json-bad",
            json!({"message": "Hi", "output_schema": {"name": "x", "schema": schema}}),
        )
        .await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (422, Some("invalid_field")),
            "{problem}"
        );
        assert_eq!(problem["field"], "output_schema", "{problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(why),
            "{problem}"
        );
    }
    assert_eq!(app.provider.requests().len(), calls);
}

#[tokio::test]
async fn responses_and_chat_completions_ask_for_json_in_their_own_shape() {
    let app = spawn_app(Backend::Sqlite).await;
    // Responses' `text.format`: an answer that never fits is `incomplete`.
    app.provider.enqueue([
        Reply::openai_text("no"),
        Reply::openai_text("no"),
        Reply::openai_text("no"),
    ]);
    let response = app
        .client
        .post(app.url("/v1/responses"))
        .json(&json!({"input": "Where is the Louvre?",
                      "text": {"format": {"type": "json_schema", "name": "city",
                                          "schema": city_schema(), "strict": true}}}))
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "incomplete", "{body}");
    assert_eq!(
        body["incomplete_details"]["reason"], "output_invalid",
        "{body}"
    );
    assert_eq!(
        app.provider.requests()[0].body["response_format"]["json_schema"]["name"],
        "city"
    );
    // Chat completions' `response_format`.
    app.provider
        .enqueue([Reply::openai_text("{\"city\": \"Paris\"}")]);
    let response = app
        .client
        .post(app.url("/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "Where?"}],
                      "response_format": {"type": "json_schema", "json_schema": {
                          "name": "city", "schema": city_schema(), "strict": true}}}))
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"], "{\"city\": \"Paris\"}",
        "{body}"
    );
    let sent = app.provider.requests().last().unwrap().body.clone();
    assert_eq!(sent["response_format"]["type"], "json_schema");
}

#[tokio::test]
async fn a2a_and_mcp_ask_for_json_in_their_own_shape() {
    let app = spawn_app(Backend::Sqlite).await;
    // A2A: a client that takes `application/json` alone gets a data part.
    app.provider
        .enqueue([Reply::openai_text("{\"city\": \"Paris\"}")]);
    let response = app
        .client
        .post(app.url("/a2a"))
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
            "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "Where?"}]},
            "configuration": {"acceptedOutputModes": ["application/json"]}}}),
        )
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap();
    let task = &body["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{body}");
    let parts = task["status"]["message"]["parts"].as_array().unwrap();
    assert_eq!(parts[0]["data"], json!({"city": "Paris"}), "{body}");
    assert_eq!(
        app.provider.requests()[0].body["response_format"],
        json!({"type": "json_object"})
    );
    // MCP `ask` with `output_schema`: `structuredContent.output`.
    app.provider
        .enqueue([Reply::openai_text("{\"city\": \"Lyon\"}")]);
    let params =
        json!({"name": "ask", "arguments": {"message": "Where?", "output_schema": city_schema()}});
    let (status, answer) = crate::protocols::mcp_current::request(
        &app,
        None,
        "tools/call",
        Some("ask"),
        params,
        false,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["output"],
        json!({"city": "Lyon"}),
        "{answer}"
    );
    let params =
        json!({"name": "ask", "arguments": {"message": "Where?", "output_schema": {"type": 7}}});
    let (_, answer) = crate::protocols::mcp_current::request(
        &app,
        None,
        "tools/call",
        Some("ask"),
        params,
        false,
    )
    .await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
}

/// Anthropic holds the answer to a strict schema itself (its structured
/// output, `output_config.format`, on Claude 4.5 and later); a schema
/// that is not strict is asked for in the prompt alone. The service
/// checks the answer either way.
#[tokio::test]
async fn anthropic_is_given_a_strict_schema_as_its_output_format() {
    let provider = crate::fake_provider::FakeProvider::start().await;
    let mut settings = crate::helpers::test_settings(&provider);
    settings.providers.chain = Some("anthropic:claude-sonnet-4-6".parse().unwrap());
    settings.providers.anthropic_base_url = provider.root.parse().unwrap();
    settings.providers.anthropic_api_key = Some("sk-ant-test".into());
    let app = crate::helpers::spawn_app_with(
        crate::support::TestDb::new(Backend::Sqlite).await,
        provider,
        settings,
    )
    .await;
    for strict in [true, false] {
        app.provider
            .enqueue([Reply::anthropic_text(r#"{"city": "Paris"}"#)]);
        let asked = json!({"name": "city", "schema": city_schema(), "strict": strict});
        let (status, result) = turn(
            &app,
            &format!("s-claude-{strict}"),
            json!({"message": "Where is the Louvre?", "output_schema": asked}),
        )
        .await;
        assert_eq!(status, 200, "{result}");
        assert_eq!(result["output"], json!({"city": "Paris"}), "{result}");
        let sent = app.provider.requests().last().unwrap().body.clone();
        if strict {
            assert_eq!(
                sent["output_config"],
                json!({"format": {"type": "json_schema", "schema": city_schema()}}),
                "{sent}"
            );
        } else {
            assert!(sent.get("output_config").is_none(), "{sent}");
        }
        // The prompt says so either way.
        assert!(sent.to_string().contains("must be JSON"), "{sent}");
    }
}
