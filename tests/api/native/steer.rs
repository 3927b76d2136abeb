//! Steering a running turn: a message added while it runs is kept before
//! the answer, applied once at the turn's next step boundary (the next
//! provider request carries it after the last tool results), and, when
//! the turn ends first, becomes the session's next turn.

use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::tree::texts;
use crate::{
    fake_provider::Reply,
    helpers::{TestApp, spawn_app, types},
    on_both_backends,
    support::Backend,
};

async fn steer(app: &TestApp, session: &str, turn: &str, message: &str) -> (u16, Value) {
    app.post_body(
        &format!("/sessions/{session}/turns/{turn}/steer"),
        json!({ "message": message }),
    )
    .await
}

/// The user messages of a provider request, in order.
fn user_texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The session's log, every event, page by page.
async fn log(app: &TestApp, session: &str) -> Vec<Value> {
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let (status, page) = app
            .get_json(&format!(
                "/sessions/{session}/events?limit=1000&after={after}"
            ))
            .await;
        assert_eq!(status, 200, "{page}");
        events.extend(page["events"].as_array().unwrap().iter().cloned());
        match page["next_after"].as_i64() {
            Some(next) => after = next,
            None => return events,
        }
    }
}

async fn a_steer_is_applied_once_at_the_next_step(backend: Backend) {
    let app = spawn_app(backend).await;
    let gate = CancellationToken::new();
    app.provider.enqueue([
        // The first step asks for a tool, held before its end.
        Reply::sse("openai/tool_call_local_search.sse").hold_after(2, &gate),
        Reply::sse("openai/after_local_search.sse"),
        Reply::openai_text("Next."),
    ]);
    let mut stream = app
        .post_turn_sse("s-steer", json!({"message": "Plan a Paris trip"}))
        .await;
    let turn = stream.turn_id();
    stream.read_until("turn.started").await;

    // Through its route, and as `multitask: "steer"` on the turn route.
    let (status, first) = steer(&app, "s-steer", &turn, "Also Rome").await;
    assert_eq!(status, 202, "{first}");
    assert_eq!(
        (&first["turn_id"], &first["status"], &first["session_id"]),
        (&json!(turn), &json!("accepted"), &json!("s-steer"))
    );
    let (status, second) = app
        .post_body(
            "/sessions/s-steer/turns",
            json!({"message": "And Lisbon", "multitask": "steer"}),
        )
        .await;
    assert_eq!(status, 202, "{second}");
    assert_eq!(second["turn_id"], json!(turn));
    // Refused, with nothing kept: blank, an unknown turn, an image.
    let (status, problem) = steer(&app, "s-steer", &turn, "  ").await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (422, Some("message_required"))
    );
    let unknown = uuid::Uuid::now_v7().to_string();
    let (status, problem) = steer(&app, "s-steer", &unknown, "x").await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (404, Some("turn_not_found"))
    );
    let (status, problem) = steer(&app, "s-nobody", &turn, "x").await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (404, Some("session_not_found"))
    );
    let (status, problem) = app
        .post_body(
            "/sessions/s-steer/turns",
            json!({"message": "see", "multitask": "steer", "parts": [
                {"type": "image", "url": "data:image/png;base64,iVBORw0KGgo="}]}),
        )
        .await;
    assert_eq!(status, 422, "{problem}");

    gate.cancel();
    let events = stream.read_to_end().await;
    let seen = types(&events);
    assert_eq!(seen.last(), Some(&"turn.completed"), "{seen:?}");
    // Accepted before the answer, applied at step 2, in the order sent.
    let accepted = events
        .iter()
        .filter(|e| e.event == "steer.accepted")
        .count();
    let applied: Vec<Value> = events
        .iter()
        .filter(|e| e.event == "steer.applied")
        .map(|e| e.json())
        .collect();
    assert_eq!(accepted, 2, "{seen:?}");
    assert_eq!(
        applied
            .iter()
            .map(|e| (e["steer_id"].clone(), e["step"].clone()))
            .collect::<Vec<_>>(),
        [
            (first["steer_id"].clone(), json!(2)),
            (second["steer_id"].clone(), json!(2))
        ]
    );
    let started = seen.iter().position(|t| *t == "tool.finished").unwrap();
    let applied_at = seen.iter().position(|t| *t == "steer.applied").unwrap();
    assert!(started < applied_at, "{seen:?}");

    // The second request carries them after the tool's result, once.
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1].body["messages"].as_array().unwrap();
    let tail: Vec<(&str, &str)> = messages[messages.len() - 3..]
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap(),
                m["content"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(tail[0].0, "tool");
    assert_eq!(&tail[1..], [("user", "Also Rome"), ("user", "And Lisbon")]);
    assert_eq!(
        user_texts(&requests[0].body).last().unwrap(),
        "Plan a Paris trip"
    );

    // The history keeps them after the question; no next turn was made.
    let (_, current) = app.get_json("/sessions/s-steer/messages").await;
    assert_eq!(
        texts(&current)[..3],
        ["Plan a Paris trip", "Also Rome", "And Lisbon"]
    );
    let (_, session) = app.get_json("/sessions/s-steer").await;
    assert_eq!(session["turn_count"], 1);
    // A steer into an ended turn is refused.
    let (status, problem) = steer(&app, "s-steer", &turn, "late").await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("turn_not_running"))
    );
    // The next turn is sent them once, as history.
    let next = app.post_turn("s-steer", json!({"message": "Go on"})).await;
    assert_eq!(next.status(), 200);
    let sent = user_texts(&app.provider.requests()[2].body);
    assert_eq!(
        sent.iter().filter(|t| t.as_str() == "Also Rome").count(),
        1,
        "{sent:?}"
    );
}

/// Waits until the session has `count` turns, none running.
async fn turns_ended(app: &TestApp, session: &str, count: i64) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, view) = app.get_json(&format!("/sessions/{session}")).await;
        if view["turn_count"] == count && view["running_turn_id"].is_null() {
            return view;
        }
        assert!(tokio::time::Instant::now() < deadline, "{view}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_steer_the_turn_did_not_take_becomes_the_next_turn(backend: Backend) {
    let app = spawn_app(backend).await;
    let gate = CancellationToken::new();
    app.provider.enqueue([
        Reply::openai_deltas(&["An ", "answer"]).hold_after(2, &gate),
        Reply::openai_text("About Rome."),
    ]);
    let mut stream = app
        .post_turn_sse("s-defer", json!({"message": "Tell me of Paris"}))
        .await;
    let turn = stream.turn_id();
    stream.read_until("message.delta").await;
    let (status, steered) = steer(&app, "s-defer", &turn, "And Rome?").await;
    assert_eq!(status, 202, "{steered}");
    gate.cancel();
    let events = stream.read_to_end().await;
    assert_eq!(events.last().unwrap().event, "turn.completed");
    assert!(!types(&events).contains(&"steer.applied"));

    // It became the next turn, which says so first.
    turns_ended(&app, "s-defer", 2).await;
    let log = log(&app, "s-defer").await;
    let deferred: Vec<&Value> = log
        .iter()
        .filter(|e| e["type"] == "steer.deferred")
        .collect();
    assert_eq!(deferred.len(), 1, "{log:?}");
    assert_eq!(deferred[0]["steer_id"], steered["steer_id"]);
    assert_eq!(deferred[0]["steered_turn_id"], json!(turn));
    let next = deferred[0]["turn_id"].as_str().unwrap();
    assert_ne!(next, turn);
    let of_next: Vec<&str> = log
        .iter()
        .filter(|e| e["turn_id"] == next)
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(&of_next[..2], ["turn.started", "steer.deferred"]);
    let (_, record) = app
        .get_json(&format!("/sessions/s-defer/turns/{next}"))
        .await;
    assert_eq!(record["status"], "completed", "{record}");
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        user_texts(&requests[1].body),
        ["Tell me of Paris", "And Rome?"]
    );
    let (_, current) = app.get_json("/sessions/s-defer/messages").await;
    assert_eq!(
        texts(&current),
        ["Tell me of Paris", "An answer", "And Rome?", "About Rome."]
    );

    // A turn cancelled with a steer waiting: the steer is answered.
    let hold = CancellationToken::new();
    app.provider.enqueue([
        Reply::openai_deltas(&["Long ", "answer"]).hold_after(2, &hold),
        Reply::openai_text("Short."),
    ]);
    let mut stream = app
        .post_turn_sse("s-defer", json!({"message": "A long one"}))
        .await;
    let turn = stream.turn_id();
    stream.read_until("message.delta").await;
    let (status, _) = steer(&app, "s-defer", &turn, "Keep it short").await;
    assert_eq!(status, 202);
    let (status, _) = app
        .post_json(&format!("/sessions/s-defer/turns/{turn}/cancel"))
        .await;
    assert_eq!(status, 200);
    hold.cancel();
    turns_ended(&app, "s-defer", 4).await;
    let sent = user_texts(&app.provider.requests().last().unwrap().body);
    assert_eq!(sent.last().unwrap(), "Keep it short");
}

/// A turn waiting for a person keeps what was steered into it for the
/// step after the decision.
async fn a_turn_waiting_for_a_person_keeps_a_steer_for_its_next_step(backend: Backend) {
    let vault = crate::helpers::vault_of(&[("notes/a.md", "# A\n")]);
    let app = super::approvals::app(backend, vault.path(), 60).await;
    super::approvals::script(&app);
    let mut stream = app
        .post_turn_sse("s-wait", json!({"message": "Change my note."}))
        .await;
    let turn = stream.turn_id();
    stream.read_until("approval.requested").await;
    let (status, _) = steer(&app, "s-wait", &turn, "Then say done").await;
    assert_eq!(status, 202);
    let (status, _) = app
        .post_body(
            &format!("/sessions/s-wait/turns/{turn}/approvals/call_a1"),
            json!({"approve": true}),
        )
        .await;
    assert_eq!(status, 200);
    let events = stream.read_to_end().await;
    assert_eq!(events.last().unwrap().event, "turn.completed");
    let applied: Vec<Value> = events
        .iter()
        .filter(|e| e.event == "steer.applied")
        .map(|e| e.json())
        .collect();
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0]["step"], 2);
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        user_texts(&requests[1].body).last().unwrap(),
        "Then say done"
    );
}

/// A thousand steers into one turn, sent 32 at a time: each kept and
/// answered once, in order (their ids'): a step takes 16, the next turn
/// the rest. One more than a turn keeps waiting is refused, and so is one
/// too long.
async fn a_thousand_steers_are_each_answered_once_in_order(backend: Backend) {
    use futures::StreamExt as _;
    let app = spawn_app(backend).await;
    let gate = CancellationToken::new();
    app.provider.enqueue([
        Reply::sse("openai/tool_call_local_search.sse").hold_after(2, &gate),
        Reply::sse("openai/after_local_search.sse"),
        Reply::openai_text("All heard."),
    ]);
    let mut stream = app
        .post_turn_sse("s-many", json!({"message": "Plan Paris"}))
        .await;
    let turn = stream.turn_id();
    stream.read_until("turn.started").await;
    let sent: Vec<(String, u16, Value)> = futures::stream::iter(0..1000)
        .map(|n| {
            let (app, turn) = (&app, &turn);
            async move {
                let message = format!("m{n:04}");
                let (status, body) = steer(app, "s-many", turn, &message).await;
                (message, status, body)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    assert!(sent.iter().all(|(_, status, _)| *status == 202));
    let (status, problem) = steer(&app, "s-many", &turn, "one too many").await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("steer_limit_reached"))
    );
    let (status, problem) = steer(&app, "s-many", &turn, &"x".repeat(32_001)).await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("message")));
    gate.cancel();
    assert_eq!(
        stream.read_to_end().await.last().unwrap().event,
        "turn.completed"
    );
    turns_ended(&app, "s-many", 2).await;

    // In the order of their ids.
    let mut by_id: Vec<(String, String)> = sent
        .into_iter()
        .map(|(message, _, body)| (body["steer_id"].as_str().unwrap().to_owned(), message))
        .collect();
    by_id.sort();
    let log = log(&app, "s-many").await;
    let ids = |kind: &str| -> Vec<&str> {
        log.iter()
            .filter(|e| e["type"] == kind)
            .map(|e| e["steer_id"].as_str().unwrap())
            .collect()
    };
    let ordered: Vec<&str> = by_id.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids("steer.accepted").len(), 1000);
    assert_eq!(ids("steer.applied"), ordered[..16]);
    assert_eq!(ids("steer.deferred"), ordered[16..]);
    // The model was sent 16 after the tool's result, and the next turn's
    // message is the rest: each once, in order.
    let messages: Vec<&str> = by_id.iter().map(|(_, m)| m.as_str()).collect();
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 3);
    let step_two = user_texts(&requests[1].body);
    assert_eq!(step_two[step_two.len() - 16..], messages[..16]);
    let next = user_texts(&requests[2].body);
    assert_eq!(next.last().unwrap(), &messages[16..].join("\n\n"));
}

on_both_backends!(
    a_thousand_steers_are_each_answered_once_in_order,
    a_steer_is_applied_once_at_the_next_step,
    a_steer_the_turn_did_not_take_becomes_the_next_turn,
    a_turn_waiting_for_a_person_keeps_a_steer_for_its_next_step
);
