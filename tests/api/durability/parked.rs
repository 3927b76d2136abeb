//! Turns that wait for a person or a client longer than they keep their
//! worker are parked in the database (`HARNESS_PARK_AFTER`): no process
//! runs them, and none of their tenant's running places is theirs, until
//! the answer comes (then the process it came to goes on with the turn)
//! or the wait's own deadline passes (`HARNESS_APPROVAL_TIMEOUT`: the call
//! ends `timed_out`). A cancel ends a parked turn at once.

use std::{sync::Arc, time::Duration};

use serde_json::{Value, json};

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, first_event, spawn_app_with, test_settings, types, vault_of},
    on_both_backends,
    support::{Backend, TestDb},
};

/// A service whose waits park at once, approving writes, whose tenant may
/// run one turn; the model writes the note when asked to change it, and
/// answers anything else.
async fn app(backend: Backend, vault: &std::path::Path, approval_timeout: &str) -> TestApp {
    let provider = FakeProvider::start().await;
    provider.respond_with(Arc::new(|body: &Value| {
        let (asked, answered) = crate::helpers::asked_and_answered(body);
        if asked.contains("Change my note") && !answered {
            Reply::openai_tool_call(
                "call_p1",
                "write_note",
                &json!({"path": "notes/a.md", "content": "decided later"}),
            )
        } else if asked.contains("Where am I") && !answered {
            Reply::openai_tool_call("call_c1", "client__get_location", &json!({}))
        } else {
            Reply::openai_text("Done.")
        }
    }));
    let mut settings = test_settings(&provider);
    settings.vault.dir = vault.to_owned();
    settings.harness.approval_required = Some("LOCAL_WRITE".parse().unwrap());
    settings.harness.park_after = "0s".parse().unwrap();
    settings.harness.approval_timeout = approval_timeout.parse().unwrap();
    settings.harness.turn_timeout_s = 5;
    settings.server.tenant_max_running_turns = 1;
    settings.server.heartbeat_interval_s = 1;
    spawn_app_with(TestDb::new(backend).await, provider, settings).await
}

/// The client's tool the model calls when asked where the user is.
fn location() -> Value {
    json!({
        "name": "get_location",
        "description": "Where the user is",
        "parameters": {"type": "object", "properties": {}},
        "effect": "READ_ONLY",
    })
}

/// The turn's record once it is parked.
async fn parked(app: &TestApp, session: &str, turn: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, record) = app
            .get_json(&format!("/sessions/{session}/turns/{turn}"))
            .await;
        if record["parked_until"].is_string() {
            return record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never parked: {record}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A write waiting for a person parks: the process runs it no more, its
/// tenant's one running place is free for another session, and the
/// turn's compute deadline does not run. The decision (after that
/// deadline would have passed) wakes it, and the same stream carries the
/// rest: the write, once, and the turn's end. (Before, the waiting turn
/// held its place until its deadline ended the wait.)
async fn a_waiting_turn_parks_and_goes_on_when_the_decision_comes(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let app = app(backend, vault.path(), "24h").await;
    let mut stream = app
        .post_turn_sse("s-park", json!({"message": "Change my note."}))
        .await;
    let turn = stream.turn_id();
    let asked = stream.read_until("approval.requested").await;
    let asked = asked.last().unwrap().json();
    let record = parked(&app, "s-park", &turn).await;
    assert_eq!(record["status"], "running");
    assert_eq!(record["parked_until"], asked["expires_at"], "{record}");
    let expires: chrono::DateTime<chrono::Utc> =
        asked["expires_at"].as_str().unwrap().parse().unwrap();
    let ahead = expires - chrono::Utc::now();
    assert!(
        ahead > chrono::Duration::hours(23) && ahead <= chrono::Duration::hours(24),
        "{asked}"
    );
    // The process counts the park just after it is written.
    let parks = app
        .metric_settled("agent_harness_turns_parked_total", 1.0)
        .await;
    assert_eq!(parks, 1.0);
    let running = app.metric_settled("agent_harness_turns_running", 0.0).await;
    assert_eq!(running, 0.0);

    // The tenant's one running place is free.
    let other = app
        .post_turn("s-park-other", json!({"message": "Hello."}))
        .await;
    let status = other.status();
    let other: Value = other.json().await.unwrap();
    assert_eq!(
        (status.as_u16(), &other["status"]),
        (200, &json!("completed")),
        "{other}"
    );

    // Past the turn's 5 s compute deadline, had the wait counted.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\n");
    let url = format!("/sessions/s-park/turns/{turn}/approvals/call_p1");
    let (status, body) = app.post_body(&url, json!({"approve": true})).await;
    assert_eq!(status, 200, "{body}");
    let rest = stream.read_to_end().await;
    let kinds = types(&rest);
    assert_eq!(
        kinds[..3],
        ["turn.resumed", "approval.resolved", "tool.finished"],
        "{kinds:?}"
    );
    assert_eq!(
        first_event(&rest, "approval.resolved")["outcome"],
        "approved"
    );
    assert_eq!(first_event(&rest, "tool.finished")["status"], "completed");
    assert_eq!(kinds.last(), Some(&"turn.completed"));
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "decided later");
    let (_, record) = app
        .get_json(&format!("/sessions/s-park/turns/{turn}"))
        .await;
    assert_eq!(record["status"], "completed");
    assert!(record.get("parked_until").is_none(), "{record}");
    assert_eq!(app.metric("agent_harness_turns_unparked_total").await, 1.0);
    let (_, log) = app.get_json("/sessions/s-park/events?limit=1000").await;
    let logged = log["events"].as_array().unwrap();
    let count = |kind: &str| logged.iter().filter(|e| e["type"] == kind).count();
    assert_eq!(count("approval.requested"), 1, "asked once: {logged:?}");
    assert_eq!(count("tool.finished"), 1, "written once");
}

/// A wait that ends unanswered: the approval resolves `timed_out` (an
/// event the client sees, and the model is told), and so does a call of
/// the client's own tool; the turn then ends as usual.
async fn a_parked_wait_that_ends_unanswered_resolves_timed_out(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let app = app(backend, vault.path(), "2s").await;
    let mut stream = app
        .post_turn_sse("s-late", json!({"message": "Change my note."}))
        .await;
    let turn = stream.turn_id();
    stream.read_until("approval.requested").await;
    parked(&app, "s-late", &turn).await;
    let rest = stream.read_to_end().await;
    let resolved = first_event(&rest, "approval.resolved");
    assert_eq!(resolved["outcome"], "timed_out", "{rest:?}");
    let finished = first_event(&rest, "tool.finished");
    assert_eq!(
        (finished["status"].as_str(), finished["reason"].as_str()),
        (Some("denied"), Some("approval"))
    );
    assert_eq!(types(&rest).last(), Some(&"turn.completed"));
    assert_eq!(
        std::fs::read_to_string(vault.path().join("notes/a.md")).unwrap(),
        "# A\n"
    );
    let told = app.provider.requests().last().unwrap().body["messages"].to_string();
    assert!(told.contains("timed_out"), "{told}");

    let mut stream = app
        .post_turn_sse(
            "s-late-client",
            json!({"message": "Where am I?", "client_tools": [location()]}),
        )
        .await;
    let turn = stream.turn_id();
    let asked = stream.read_until("tool.requested").await;
    assert!(asked.last().unwrap().json()["expires_at"].is_string());
    parked(&app, "s-late-client", &turn).await;
    let rest = stream.read_to_end().await;
    assert_eq!(first_event(&rest, "tool.finished")["status"], "timed_out");
    assert_eq!(types(&rest).last(), Some(&"turn.completed"));
    // Too late now.
    let late = app
        .post_body(
            &format!("/sessions/s-late-client/turns/{turn}/tool-results/call_c1"),
            json!({"output": "Lyon"}),
        )
        .await;
    assert_eq!(late.0, 409, "{late:?}");
}

/// A client's tool call parks as a person's decision does; the result
/// wakes it.
async fn a_parked_client_call_goes_on_with_its_result(backend: Backend) {
    let vault = vault_of(&[]);
    let app = app(backend, vault.path(), "24h").await;
    let mut stream = app
        .post_turn_sse(
            "s-park-client",
            json!({"message": "Where am I?", "client_tools": [location()]}),
        )
        .await;
    let turn = stream.turn_id();
    stream.read_until("tool.requested").await;
    parked(&app, "s-park-client", &turn).await;
    let (status, body) = app
        .post_body(
            &format!("/sessions/s-park-client/turns/{turn}/tool-results/call_c1"),
            json!({"output": "Lyon, France"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let rest = stream.read_to_end().await;
    let finished = first_event(&rest, "tool.finished");
    assert_eq!(
        (&finished["status"], &finished["output"]),
        (&json!("completed"), &json!("Lyon, France"))
    );
    assert_eq!(types(&rest).last(), Some(&"turn.completed"));
    let (_, log) = app
        .get_json("/sessions/s-park-client/events?limit=1000")
        .await;
    let requested = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "tool.requested")
        .count();
    assert_eq!(requested, 1, "asked once");
}

/// A cancel of a parked turn ends it at once (no process ran it): its
/// waiting call resolves `cancelled` before the turn's end.
async fn a_parked_turn_is_cancelled_at_once(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let app = app(backend, vault.path(), "24h").await;
    let mut stream = app
        .post_turn_sse("s-park-cancel", json!({"message": "Change my note."}))
        .await;
    let turn = stream.turn_id();
    stream.read_until("approval.requested").await;
    parked(&app, "s-park-cancel", &turn).await;
    let (status, body) = app
        .post_json(&format!("/sessions/s-park-cancel/turns/{turn}/cancel"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "cancelled", "{body}");
    let rest = stream.read_to_end().await;
    assert_eq!(
        types(&rest),
        ["approval.resolved", "turn.cancelled"],
        "{rest:?}"
    );
    assert_eq!(
        first_event(&rest, "approval.resolved")["outcome"],
        "cancelled"
    );
    assert_eq!(
        std::fs::read_to_string(vault.path().join("notes/a.md")).unwrap(),
        "# A\n"
    );
}

/// A JSON caller (no event stream) is not kept for the length of a wait
/// (a day): it gets 202 with the call that waits and the route that
/// answers it, and the turn goes on once it is answered. (Before, the
/// caller waited for the turn's end.)
async fn a_json_caller_is_told_what_its_turn_waits_for(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let app = app(backend, vault.path(), "24h").await;
    let response = app
        .post_turn("s-json-wait", json!({"message": "Change my note."}))
        .await;
    assert_eq!(response.status(), 202);
    let body: Value = response.json().await.unwrap();
    let turn = body["turn_id"].as_str().unwrap().to_owned();
    assert_eq!(body["status"], "running", "{body}");
    let waiting = &body["waiting"];
    assert_eq!(
        (waiting["waiting_for"].as_str(), waiting["call_id"].as_str()),
        (Some("approval"), Some("call_p1")),
        "{body}"
    );
    assert_eq!(waiting["tool"], "write_note");
    assert!(waiting["expires_at"].is_string(), "{body}");
    let answer = waiting["answer"].as_str().unwrap();
    assert_eq!(
        answer,
        format!("/sessions/s-json-wait/turns/{turn}/approvals/call_p1")
    );
    let (status, _) = app.post_body(answer, json!({"approve": true})).await;
    assert_eq!(status, 200);
    let record = app.wait_turn_end("s-json-wait", &turn).await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(
        std::fs::read_to_string(vault.path().join("notes/a.md")).unwrap(),
        "decided later"
    );
}

/// While a turn is parked, its session's other turns follow the
/// multitask policy as for any running turn: refused by default (409),
/// and `interrupt` ends the parked turn (cancelled, at once) and runs the
/// new one.
async fn a_parked_turn_holds_its_session_under_the_multitask_policy(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let app = app(backend, vault.path(), "24h").await;
    let mut stream = app
        .post_turn_sse("s-park-multi", json!({"message": "Change my note."}))
        .await;
    let turn = stream.turn_id();
    stream.read_until("approval.requested").await;
    parked(&app, "s-park-multi", &turn).await;
    let refused = app
        .post_turn("s-park-multi", json!({"message": "Hello."}))
        .await;
    assert_eq!(refused.status(), 409);
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(problem["code"], "turn_already_running");
    assert_eq!(problem["turn_id"], turn.as_str());
    let next = app
        .post_turn(
            "s-park-multi",
            json!({"message": "Hello.", "multitask": "interrupt"}),
        )
        .await;
    assert_eq!(next.status(), 200);
    let next: Value = next.json().await.unwrap();
    assert_eq!(next["status"], "completed", "{next}");
    let rest = stream.read_to_end().await;
    assert_eq!(types(&rest).last(), Some(&"turn.cancelled"), "{rest:?}");
    assert_eq!(
        std::fs::read_to_string(vault.path().join("notes/a.md")).unwrap(),
        "# A\n"
    );
}

/// Issue 63: a parked turn is taken up only while its tenant has room.
/// With a cap of one running turn, three turns parked on a client's call
/// and answered together run one at a time: while the first one's model
/// call is under way, the others stay parked (due again a little later,
/// spread), and each goes on once there is room. (Before, waking took no
/// count: all three asked the model at once.)
async fn parked_turns_woken_together_keep_their_tenants_cap(backend: Backend) {
    let vault = vault_of(&[]);
    let app = app(backend, vault.path(), "24h").await;
    let gate = tokio_util::sync::CancellationToken::new();
    let held = gate.clone();
    app.provider.respond_with(Arc::new(move |body: &Value| {
        let (_, answered) = crate::helpers::asked_and_answered(body);
        if answered {
            Reply::openai_text("Done.").hold_head(&held)
        } else {
            Reply::openai_tool_call("call_c1", "client__get_location", &json!({}))
        }
    }));
    let mut turns = Vec::new();
    for n in 0..3 {
        let session = format!("s-cap-{n}");
        let mut stream = app
            .post_turn_sse(
                &session,
                json!({"message": "Where am I?", "client_tools": [location()]}),
            )
            .await;
        let turn = stream.turn_id();
        stream.read_until("tool.requested").await;
        parked(&app, &session, &turn).await;
        turns.push((session, turn, stream));
    }
    for (session, turn, _) in &turns {
        let (status, body) = app
            .post_body(
                &format!("/sessions/{session}/turns/{turn}/tool-results/call_c1"),
                json!({"output": "Lyon"}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    // The first one taken up asks the model; the others wait their turn.
    let answered = |app: &TestApp| {
        app.provider
            .requests()
            .iter()
            .filter(|r| crate::helpers::asked_and_answered(&r.body).1)
            .count()
    };
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(answered(&app), 1, "one model call at a time");
    gate.cancel();
    for (_, _, stream) in &mut turns {
        let rest = stream.read_to_end().await;
        assert_eq!(types(&rest).last(), Some(&"turn.completed"), "{rest:?}");
    }
    assert_eq!(answered(&app), 3);
}

on_both_backends!(
    parked_turns_woken_together_keep_their_tenants_cap,
    a_parked_turn_holds_its_session_under_the_multitask_policy,
    a_json_caller_is_told_what_its_turn_waits_for,
    a_waiting_turn_parks_and_goes_on_when_the_decision_comes,
    a_parked_wait_that_ends_unanswered_resolves_timed_out,
    a_parked_client_call_goes_on_with_its_result,
    a_parked_turn_is_cancelled_at_once,
);
