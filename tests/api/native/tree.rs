//! A conversation as a tree over the native API: regenerate a turn (a
//! sibling), go on from an earlier turn (an edit), start a new root; the
//! model sees its own branch and never a sibling's; siblings and branches
//! read back; bad parents are refused.

use serde_json::{Value, json};

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{
        TestApp, png_of, sent_history, sibling_ids, spawn_app, spawn_app_with, test_settings,
    },
    on_both_backends,
    support::{Backend, TestDb},
};

/// An app whose caller (keys off) may import sessions.
pub(crate) async fn admin_app(backend: Backend) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.allow_local_admin = true;
    spawn_app_with(TestDb::new(backend).await, provider, settings).await
}

/// Imports `export` into `app`: the status and the answer.
pub(crate) async fn import(app: &TestApp, export: &str) -> (u16, Value) {
    let response = app
        .client
        .post(app.url("/sessions/import"))
        .header("content-type", "application/jsonl")
        .body(export.to_owned())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Posts `body` to `path` with the answer `answer` queued; its JSON.
pub(crate) async fn turn(app: &TestApp, path: &str, body: Value, answer: &str) -> (u16, Value) {
    app.provider.enqueue([Reply::openai_text(answer)]);
    app.post_body(path, body).await
}

/// The texts of a page of messages.
pub(crate) fn texts(page: &Value) -> Vec<&str> {
    page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect()
}

async fn a_regenerate_is_a_sibling_and_the_next_turn_goes_on_from_it(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut ids = Vec::new();
    for (message, answer) in [("one", "A1"), ("two", "A2"), ("three", "A3")] {
        let (status, body) = turn(
            &app,
            "/sessions/t/turns",
            json!({ "message": message }),
            answer,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        ids.push(body["turn_id"].as_str().unwrap().to_owned());
    }
    let (_, session) = app.get_json("/sessions/t").await;
    assert_eq!(session["branched"], false);
    let (_, second) = app.get_json(&format!("/sessions/t/turns/{}", ids[1])).await;
    assert_eq!(second["parent_turn_id"], ids[0].as_str());

    // A new answer to "two": the model sees "one" and its answer alone.
    let (status, again) = turn(
        &app,
        &format!("/sessions/t/turns/{}/regenerate", ids[1]),
        json!({}),
        "A2b",
    )
    .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["text"], "A2b");
    assert_eq!(sent_history(&app), ["one", "A1", "two"]);
    let again_id = again["turn_id"].as_str().unwrap().to_owned();
    let (_, record) = app.get_json(&format!("/sessions/t/turns/{again_id}")).await;
    assert_eq!(record["parent_turn_id"], ids[0].as_str());
    let (_, session) = app.get_json("/sessions/t").await;
    assert_eq!(session["branched"], true);

    // The two answers are siblings, oldest first, from either of them.
    for of in [&ids[1], &again_id] {
        assert_eq!(
            sibling_ids(&app, "t", of).await,
            [ids[1].as_str(), again_id.as_str()]
        );
    }
    // The session's messages are its current branch; the old one is read
    // by its last turn.
    let (_, current) = app.get_json("/sessions/t/messages").await;
    assert_eq!(texts(&current), ["one", "A1", "two", "A2b"]);
    let (_, old) = app
        .get_json(&format!("/sessions/t/messages?turn_id={}", ids[2]))
        .await;
    assert_eq!(texts(&old), ["one", "A1", "two", "A2", "three", "A3"]);
    // So is the session an MCP host reads (`get_session`).
    let (status, got) = app
        .post_body(
            "/mcp",
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "get_session", "arguments": {"session_id": "t"}}}),
        )
        .await;
    assert_eq!(status, 200, "{got}");
    let shown: Vec<&str> = got["result"]["structuredContent"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(shown, ["one", "A1", "two", "A2b"]);
    let (_, paged) = app
        .get_json(&format!("/sessions/t/messages?turn_id={}&limit=2", ids[2]))
        .await;
    assert_eq!(texts(&paged), ["one", "A1"]);

    // The next turn goes on from the newest: the regenerated answer.
    let (status, _) = turn(&app, "/sessions/t/turns", json!({"message": "four"}), "A4").await;
    assert_eq!(status, 200);
    assert_eq!(sent_history(&app), ["one", "A1", "two", "A2b", "four"]);
    // An edit of "three": on from the first turn, whatever is newest.
    let (status, edited) = turn(
        &app,
        "/sessions/t/turns",
        json!({"message": "deux", "parent_turn_id": ids[0]}),
        "D",
    )
    .await;
    assert_eq!(status, 200, "{edited}");
    assert_eq!(sent_history(&app), ["one", "A1", "deux"]);
    // An edit of the first message: a new root, nothing before it.
    let (status, _) = turn(
        &app,
        "/sessions/t/turns",
        json!({"message": "uno", "parent_turn_id": "root"}),
        "U",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(sent_history(&app), ["uno"]);
    let (_, roots) = app
        .get_json(&format!("/sessions/t/turns/{}/siblings", ids[0]))
        .await;
    assert_eq!(roots["turns"].as_array().unwrap().len(), 2);
    assert_eq!(roots["turns"][1]["parent_turn_id"], Value::Null);
}

async fn bad_parents_and_regenerates_are_refused_and_write_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, first) = turn(&app, "/sessions/b/turns", json!({"message": "one"}), "A1").await;
    let first_id = first["turn_id"].as_str().unwrap().to_owned();
    let (_, elsewhere) = turn(&app, "/sessions/c/turns", json!({"message": "x"}), "X").await;
    let elsewhere_id = elsewhere["turn_id"].as_str().unwrap().to_owned();
    let unknown = uuid::Uuid::now_v7().to_string();
    let cases = [
        (
            "/sessions/b/turns".to_owned(),
            json!({"message": "m", "parent_turn_id": elsewhere_id}),
            404,
            "turn_not_found",
        ),
        (
            "/sessions/b/turns".to_owned(),
            json!({"message": "m", "parent_turn_id": unknown}),
            404,
            "turn_not_found",
        ),
        (
            "/sessions/b/turns".to_owned(),
            json!({"message": "m", "parent_turn_id": "first"}),
            422,
            "invalid_field",
        ),
        (
            "/sessions/b/turns".to_owned(),
            json!({"message": "m", "parent_turn_id": first_id,
                   "history": [{"role": "user", "content": "h"}]}),
            422,
            "invalid_field",
        ),
        (
            format!("/sessions/b/turns/{first_id}/regenerate"),
            json!({"message": "other"}),
            422,
            "invalid_field",
        ),
        (
            format!("/sessions/b/turns/{first_id}/regenerate"),
            json!({"top_k": 2.5}),
            422,
            "invalid_body",
        ),
        (
            format!("/sessions/b/turns/{elsewhere_id}/regenerate"),
            json!({}),
            404,
            "turn_not_found",
        ),
        (
            format!("/sessions/nobody/turns/{first_id}/regenerate"),
            json!({}),
            404,
            "session_not_found",
        ),
    ];
    let requests = app.provider.requests().len();
    for (path, body, status, code) in cases {
        let (got, problem) = app.post_body(&path, body.clone()).await;
        assert_eq!(
            (got, problem["code"].as_str()),
            (status, Some(code)),
            "{path} {body}: {problem}"
        );
    }
    assert_eq!(app.provider.requests().len(), requests, "no turn ran");
    let (_, session) = app.get_json("/sessions/b").await;
    assert_eq!(
        (
            session["turn_count"].as_i64(),
            session["branched"].as_bool()
        ),
        (Some(1), Some(false))
    );
    for path in [
        format!("/sessions/b/turns/{elsewhere_id}/siblings"),
        format!("/sessions/b/messages?turn_id={elsewhere_id}"),
    ] {
        let (status, problem) = app.get_json(&path).await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (404, Some("turn_not_found")),
            "{path}"
        );
    }
    let (status, _) = app
        .get_json(&format!("/sessions/b/turns/{first_id}/siblings?limit=0"))
        .await;
    assert_eq!(status, 400);
}

/// A regenerate asks the same message with the same images; once a file
/// it carried is deleted it can no longer be asked (409), and nothing runs.
async fn a_regenerate_repeats_the_images_until_their_file_is_deleted(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, uploaded) = app.upload("shot.png", "image/png", &png_of(400)).await;
    let file_id = uploaded["id"].as_str().unwrap().to_owned();
    let (status, first) = turn(
        &app,
        "/sessions/img/turns",
        json!({"message": [{"type": "text", "text": "What is it?"},
                           {"type": "image", "file_id": file_id}]}),
        "A cat.",
    )
    .await;
    assert_eq!(status, 200, "{first}");
    let first_id = first["turn_id"].as_str().unwrap().to_owned();
    let images = |app: &TestApp| {
        let requests = app.provider.requests();
        let body = &requests.last().unwrap().body;
        body["messages"]
            .to_string()
            .matches(r#""type":"image_url""#)
            .count()
    };
    assert_eq!(images(&app), 1);
    let path = format!("/sessions/img/turns/{first_id}/regenerate");
    let (status, again) = turn(&app, &path, json!({}), "A dog.").await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(images(&app), 1, "the same image, once");
    assert_eq!(sent_history(&app), ["What is it?"]);

    let deleted = app
        .client
        .delete(app.url(&format!("/files/{file_id}")))
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success());
    let requests = app.provider.requests().len();
    let (status, problem) = app.post_body(&path, json!({})).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("turn_message_erased")),
        "{problem}"
    );
    assert_eq!(app.provider.requests().len(), requests);
}

/// A regenerate asks as its turn was asked: the options the body does
/// not give (here its output schema and user) are the earlier turn's.
async fn a_regenerate_asks_as_the_turn_was_asked(backend: Backend) {
    let app = spawn_app(backend).await;
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}},
                        "required": ["n"], "additionalProperties": false});
    let (status, first) = turn(
        &app,
        "/sessions/o/turns",
        json!({"message": "count", "user_id": "ann",
               "output_schema": {"name": "count", "schema": schema, "strict": true}}),
        "{\"n\": 1}",
    )
    .await;
    assert_eq!(status, 200, "{first}");
    let asked = |app: &TestApp| app.provider.requests().last().unwrap().body.clone();
    let format = asked(&app)["response_format"].clone();
    assert_eq!(format["json_schema"]["name"], "count", "{format}");
    let path = format!(
        "/sessions/o/turns/{}/regenerate",
        first["turn_id"].as_str().unwrap()
    );
    let (status, again) = turn(&app, &path, json!({}), "{\"n\": 2}").await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(asked(&app)["response_format"], format);
    assert_eq!(again["output"], json!({"n": 2}));
    let (_, record) = app
        .get_json(&format!(
            "/sessions/o/turns/{}",
            again["turn_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(record["parent_turn_id"], Value::Null);
    // An option the body gives wins.
    let other = json!({"name": "other", "schema": schema});
    // (A count may come as a whole float: JSON Schema's integer.)
    let body = json!({"output_schema": other, "top_k": 21.0});
    let (status, _) = turn(&app, &path, body, "{\"n\": 3}").await;
    assert_eq!(status, 200);
    assert_eq!(
        asked(&app)["response_format"]["json_schema"]["name"],
        "other"
    );
}

/// A branched session carried to another deployment: its tree comes
/// whole (the next turn there goes on from the newest, on its branch); an
/// export from before trees is one branch; a parent outside the export is
/// refused.
async fn a_tree_is_exported_and_imported_whole(backend: Backend) {
    let app = admin_app(backend).await;
    let mut ids = Vec::new();
    for (message, answer) in [("one", "A1"), ("two", "A2"), ("three", "A3")] {
        let (_, body) = turn(
            &app,
            "/sessions/x/turns",
            json!({ "message": message }),
            answer,
        )
        .await;
        ids.push(body["turn_id"].as_str().unwrap().to_owned());
    }
    let export = |app: &TestApp, session: &'static str| {
        let request = app
            .client
            .get(app.url(&format!("/sessions/{session}/export")));
        async move { request.send().await.unwrap().text().await.unwrap() }
    };
    let linear = export(&app, "x").await;
    let path = format!("/sessions/x/turns/{}/regenerate", ids[1]);
    let (status, _) = turn(&app, &path, json!({}), "A2b").await;
    assert_eq!(status, 200);
    let branched = export(&app, "x").await;
    assert!(branched.contains("\"parent_turn_id\""), "{branched}");

    let there = admin_app(backend).await;
    let (status, made) = import(&there, &branched).await;
    assert_eq!(status, 201, "{made}");
    let (_, session) = there.get_json("/sessions/x").await;
    assert_eq!(session["branched"], true);
    let (_, current) = there.get_json("/sessions/x/messages").await;
    assert_eq!(texts(&current), ["one", "A1", "two", "A2b"]);
    let (_, old) = there
        .get_json(&format!("/sessions/x/messages?turn_id={}", ids[2]))
        .await;
    assert_eq!(texts(&old), ["one", "A1", "two", "A2", "three", "A3"]);
    let (status, _) = turn(
        &there,
        "/sessions/x/turns",
        json!({"message": "four"}),
        "A4",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(sent_history(&there), ["one", "A1", "two", "A2b", "four"]);

    // An export from before trees: no parents; each turn continues the
    // one before, as the migration makes them.
    let older: Vec<String> = linear
        .lines()
        .map(|line| {
            let mut value: Value = serde_json::from_str(line).unwrap();
            if value["type"] == "turn" {
                let fields = value.as_object_mut().unwrap();
                fields.remove("parent_turn_id");
                fields.remove("run_id");
            }
            value.to_string()
        })
        .collect();
    let elsewhere = admin_app(backend).await;
    let (status, made) = import(&elsewhere, &older.join("\n")).await;
    assert_eq!(status, 201, "{made}");
    let (_, session) = elsewhere.get_json("/sessions/x").await;
    assert_eq!(session["branched"], false);
    let (_, third) = elsewhere
        .get_json(&format!("/sessions/x/turns/{}", ids[2]))
        .await;
    assert_eq!(third["parent_turn_id"], ids[1].as_str());
    let (_, branch) = elsewhere
        .get_json(&format!("/sessions/x/messages?turn_id={}", ids[2]))
        .await;
    assert_eq!(texts(&branch), ["one", "A1", "two", "A2", "three", "A3"]);

    // A parent that is no earlier turn of the export: refused, nothing made.
    let stranger = uuid::Uuid::now_v7().to_string();
    let forged = branched.replacen(
        &format!("\"parent_turn_id\":\"{}\"", ids[0]),
        &format!("\"parent_turn_id\":\"{stranger}\""),
        1,
    );
    assert_ne!(forged, branched);
    let fresh = admin_app(backend).await;
    let (status, problem) = import(&fresh, &forged).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (422, Some("invalid_import")),
        "{problem}"
    );
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("parent_turn_id"),
        "{problem}"
    );
    let (status, _) = fresh.get_json("/sessions/x").await;
    assert_eq!(status, 404);
}

on_both_backends!(
    a_regenerate_asks_as_the_turn_was_asked,
    a_tree_is_exported_and_imported_whole,
    a_regenerate_is_a_sibling_and_the_next_turn_goes_on_from_it,
    bad_parents_and_regenerates_are_refused_and_write_nothing,
    a_regenerate_repeats_the_images_until_their_file_is_deleted,
);
