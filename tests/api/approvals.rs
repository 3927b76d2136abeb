//! Human approval: a write waits for a person; approve, deny, cancel and
//! the deadline each end the wait.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, spawn_app_with, test_settings, types, vault_of},
    on_both_backends,
    support::{Backend, TestDb},
};

async fn app(backend: Backend, vault: &std::path::Path, timeout_s: u64) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.vault.dir = vault.to_owned();
    settings.harness.approval_required = Some("LOCAL_WRITE".parse().unwrap());
    settings.harness.turn_timeout_s = timeout_s;
    spawn_app_with(TestDb::new(backend).await, provider, settings).await
}

fn script(app: &TestApp) {
    app.provider.enqueue([
        Reply::openai_tool_call(
            "call_a1",
            "write_note",
            &json!({"path": "notes/a.md", "content": "changed"}),
        ),
        Reply::sse("openai/text.sse"),
    ]);
}

async fn writes_wait_for_a_person_who_approves_or_denies(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let app = app(backend, vault.path(), 60).await;

    // Approved: the write runs after the decision.
    script(&app);
    let mut stream = app
        .post_turn_sse("s-appr", json!({"message": "Change my note."}))
        .await;
    let turn = stream.headers["x-turn-id"].to_str().unwrap().to_owned();
    let asked = stream.read_until("approval.requested").await;
    assert_eq!(asked.last().unwrap().json()["tool"], "write_note");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        std::fs::read_to_string(&note).unwrap(),
        "# A\n",
        "nothing ran yet"
    );
    let url = format!("/sessions/s-appr/turns/{turn}/approvals/call_a1");
    let response = app
        .client
        .post(app.url(&url))
        .json(&json!({"approve": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let events = stream.read_to_end().await;
    let resolved = events
        .iter()
        .find(|e| e.event == "approval.resolved")
        .unwrap()
        .json();
    assert_eq!(resolved["outcome"], "approved");
    let finished = events
        .iter()
        .find(|e| e.event == "tool.finished")
        .unwrap()
        .json();
    assert_eq!(finished["status"], "completed");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "changed");
    assert_eq!(types(&events).last(), Some(&"turn.completed"));
    // The turn is over: nothing more to decide.
    let response = app
        .client
        .post(app.url(&url))
        .json(&json!({"approve": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 409);

    // Denied: the call never runs; the model hears why.
    std::fs::write(&note, "# A\n").unwrap();
    script(&app);
    let mut stream = app
        .post_turn_sse("s-appr", json!({"message": "Change it again."}))
        .await;
    let turn = stream.headers["x-turn-id"].to_str().unwrap().to_owned();
    stream.read_until("approval.requested").await;
    let url = format!("/sessions/s-appr/turns/{turn}/approvals/call_a1");
    let response = app
        .client
        .post(app.url(&url))
        .json(&json!({"approve": false, "reason": "not today"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let again = app
        .client
        .post(app.url(&url))
        .json(&json!({"approve": true}))
        .send()
        .await
        .unwrap();
    assert!(
        matches!(again.status().as_u16(), 409),
        "the first decision stands"
    );
    let events = stream.read_to_end().await;
    let finished = events
        .iter()
        .find(|e| e.event == "tool.finished")
        .unwrap()
        .json();
    assert_eq!(
        (finished["status"].as_str(), finished["reason"].as_str()),
        (Some("denied"), Some("approval"))
    );
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\n");
    let sent = app.provider.requests().last().unwrap().body["messages"].to_string();
    assert!(sent.contains("not today"), "{sent}");
}

async fn a_cancel_or_the_deadline_ends_a_pending_approval(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    // Cancel: the turn ends at once, the approval with it.
    let app = app(backend, vault.path(), 60).await;
    script(&app);
    let mut stream = app
        .post_turn_sse("s-appr-c", json!({"message": "Change my note."}))
        .await;
    let turn = stream.headers["x-turn-id"].to_str().unwrap().to_owned();
    stream.read_until("approval.requested").await;
    let started = Instant::now();
    let (status, _) = app
        .post_json(&format!("/sessions/s-appr-c/turns/{turn}/cancel"))
        .await;
    assert!(matches!(status, 200 | 202), "{status}");
    let events = stream.read_to_end().await;
    assert!(started.elapsed() < Duration::from_secs(5), "no deadlock");
    // The waiting call is resolved before the end, live and in the log.
    // (Before, the stream went from `approval.requested` to the end.)
    assert_eq!(
        types(&events)[types(&events).len() - 2..],
        ["approval.resolved", "turn.cancelled"],
        "{events:?}"
    );
    let resolved = events[events.len() - 2].json();
    assert_eq!(
        (resolved["call_id"].as_str(), resolved["outcome"].as_str()),
        (Some("call_a1"), Some("cancelled"))
    );
    let (_, log) = app.get_json("/sessions/s-appr-c/events").await;
    let logged: Vec<&str> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        logged[logged.len() - 3..],
        ["approval.requested", "approval.resolved", "turn.cancelled"]
    );
    assert_eq!(
        std::fs::read_to_string(vault.path().join("notes/a.md")).unwrap(),
        "# A\n"
    );

    // The deadline: nobody decides, the call is not run, the turn ends.
    let app = crate::approvals::app(backend, vault.path(), 1).await;
    script(&app);
    let started = Instant::now();
    let mut stream = app
        .post_turn_sse("s-appr-d", json!({"message": "Change my note."}))
        .await;
    let events = stream.read_to_end().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let resolved = events
        .iter()
        .find(|e| e.event == "approval.resolved")
        .unwrap()
        .json();
    assert_eq!(resolved["outcome"], "timed_out");
    assert!(events.last().unwrap().is_terminal());
    assert_eq!(
        std::fs::read_to_string(vault.path().join("notes/a.md")).unwrap(),
        "# A\n"
    );
}

on_both_backends!(
    writes_wait_for_a_person_who_approves_or_denies,
    a_cancel_or_the_deadline_ends_a_pending_approval,
);
