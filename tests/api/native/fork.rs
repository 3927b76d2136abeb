//! A fork over the native API: a new session whose history is another's
//! branch up to a turn, read through it (nothing copied). Each goes on
//! without the other; the fork's turns may regenerate and edit from where
//! it was forked; its export is whole; bad forks are refused.

use serde_json::{Value, json};

use super::tree::{admin_app, import, texts, turn};
use crate::{helpers::sent_history, on_both_backends, support::Backend};

/// Three turns of the session `source`: their ids.
async fn three_turns(app: &crate::helpers::TestApp, source: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for (message, answer) in [("one", "A1"), ("two", "A2"), ("three", "A3")] {
        let path = format!("/sessions/{source}/turns");
        let (status, body) = turn(app, &path, json!({ "message": message }), answer).await;
        assert_eq!(status, 200, "{body}");
        ids.push(body["turn_id"].as_str().unwrap().to_owned());
    }
    ids
}

async fn a_fork_goes_on_from_its_sources_turn_and_neither_sees_the_other(backend: Backend) {
    let app = admin_app(backend).await;
    let ids = three_turns(&app, "src").await;
    let response = app
        .client
        .post(app.url("/sessions/src/fork"))
        .json(&json!({"at_turn": ids[1], "session_id": "f"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["location"], "/sessions/f");
    let made: Value = response.json().await.unwrap();
    assert_eq!(
        made,
        json!({"session_id": "f", "forked_from": "src", "forked_at": ids[1]})
    );
    let (_, fork) = app.get_json("/sessions/f").await;
    assert_eq!(
        (&fork["turn_count"], &fork["branched"], &fork["forked_from"]),
        (&json!(0), &json!(true), &json!("src")),
        "{fork}"
    );
    let (_, history) = app.get_json("/sessions/f/messages").await;
    assert_eq!(texts(&history), ["one", "A1", "two", "A2"]);
    // An MCP host lists it before it has a turn of its own.
    let (_, listed) = app
        .post_body(
            "/mcp",
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "list_sessions", "arguments": {}}}),
        )
        .await;
    let ids_listed: Vec<&str> = listed["result"]["structuredContent"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert!(ids_listed.contains(&"f"), "{listed}");

    // Its first turn sees the source's branch up to the fork.
    let (status, four) = turn(&app, "/sessions/f/turns", json!({"message": "four"}), "A4").await;
    assert_eq!(status, 200, "{four}");
    assert_eq!(sent_history(&app), ["one", "A1", "two", "A2", "four"]);
    let four_id = four["turn_id"].as_str().unwrap().to_owned();
    let (_, record) = app.get_json(&format!("/sessions/f/turns/{four_id}")).await;
    assert_eq!(record["parent_turn_id"], ids[1].as_str());
    // The source goes on without it.
    let (status, _) = turn(
        &app,
        "/sessions/src/turns",
        json!({"message": "five"}),
        "A5",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        sent_history(&app),
        ["one", "A1", "two", "A2", "three", "A3", "five"]
    );
    let (_, source) = app.get_json("/sessions/src/messages").await;
    assert!(!texts(&source).contains(&"four"), "{source}");

    // A regenerate of the fork's first turn is its sibling, on the fork.
    let path = format!("/sessions/f/turns/{four_id}/regenerate");
    let (status, again) = turn(&app, &path, json!({}), "A4b").await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(sent_history(&app), ["one", "A1", "two", "A2", "four"]);
    // An edit goes on from where it was forked; a turn of the source
    // before it is not the fork's to go on from (fork there instead).
    let (status, edited) = turn(
        &app,
        "/sessions/f/turns",
        json!({"message": "quatre", "parent_turn_id": ids[1]}),
        "Q",
    )
    .await;
    assert_eq!(status, 200, "{edited}");
    assert_eq!(sent_history(&app), ["one", "A1", "two", "A2", "quatre"]);
    let (status, refused) = app
        .post_body(
            "/sessions/f/turns",
            json!({"message": "un", "parent_turn_id": ids[0]}),
        )
        .await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (404, Some("turn_not_found"))
    );
    let (_, at_fork) = app
        .get_json(&format!("/sessions/f/messages?turn_id={}", ids[1]))
        .await;
    assert_eq!(texts(&at_fork), ["one", "A1", "two", "A2"]);

    // Without an id, the fork gets a new one.
    let (status, unnamed) = app
        .post_body("/sessions/src/fork", json!({"at_turn": ids[0]}))
        .await;
    assert_eq!(status, 201, "{unnamed}");
    let id = unnamed["session_id"].as_str().unwrap();
    let (_, history) = app.get_json(&format!("/sessions/{id}/messages")).await;
    assert_eq!(texts(&history), ["one", "A1"]);
}

/// An export of a fork holds the branch it reads through, so it imports
/// as a whole session elsewhere; bad forks are refused with nothing made.
async fn a_forks_export_is_whole_and_bad_forks_are_refused(backend: Backend) {
    let app = admin_app(backend).await;
    let ids = three_turns(&app, "src").await;
    let (status, _) = app
        .post_body(
            "/sessions/src/fork",
            json!({"at_turn": ids[1], "session_id": "f"}),
        )
        .await;
    assert_eq!(status, 201);
    let (status, _) = turn(&app, "/sessions/f/turns", json!({"message": "four"}), "A4").await;
    assert_eq!(status, 200);
    let response = app.client.get(app.url("/sessions/f/export")).send().await;
    let export = response.unwrap().text().await.unwrap();
    assert!(!export.contains("three"), "{export}");

    let there = admin_app(backend).await;
    let (status, made) = import(&there, &export).await;
    assert_eq!(status, 201, "{made}");
    let (_, history) = there.get_json("/sessions/f/messages").await;
    assert_eq!(texts(&history), ["one", "A1", "two", "A2", "four", "A4"]);
    let (status, _) = turn(
        &there,
        "/sessions/f/turns",
        json!({"message": "five"}),
        "A5",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        sent_history(&there),
        ["one", "A1", "two", "A2", "four", "A4", "five"]
    );
    let (_, events) = there.get_json("/sessions/f/events?limit=1000").await;
    let seqs: Vec<i64> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_i64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let started = events.to_string().matches("turn.started").count();
    assert_eq!(started, 4, "{events}");

    for (source, body, status, code) in [
        (
            "src",
            json!({"at_turn": ids[1], "session_id": "f"}),
            409,
            "session_exists",
        ),
        (
            "src",
            json!({"at_turn": uuid::Uuid::now_v7()}),
            404,
            "turn_not_found",
        ),
        (
            "nowhere",
            json!({"at_turn": ids[1]}),
            404,
            "session_not_found",
        ),
        (
            "src",
            json!({"at_turn": ids[1], "session_id": "a b"}),
            400,
            "invalid_session_id",
        ),
        ("src", json!({"at_turn": "not a turn"}), 422, "invalid_body"),
        ("src", json!({"session_id": "g"}), 422, "invalid_body"),
        (
            "src",
            json!({"at_turn": ids[1], "copy": true}),
            422,
            "invalid_body",
        ),
    ] {
        let (got, problem) = app
            .post_body(&format!("/sessions/{source}/fork"), body.clone())
            .await;
        assert_eq!(
            (got, problem["code"].as_str()),
            (status, Some(code)),
            "{body}: {problem}"
        );
    }
    let (status, _) = app.get_json("/sessions/g").await;
    assert_eq!(status, 404);
}

on_both_backends!(
    a_fork_goes_on_from_its_sources_turn_and_neither_sees_the_other,
    a_forks_export_is_whole_and_bad_forks_are_refused,
);
