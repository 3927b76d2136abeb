//! Human approval: a write waits for a person; approve, deny, cancel and
//! the deadline each end the wait.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, first_event, spawn_app_with, test_settings, types, vault_of},
    on_both_backends,
    support::{Backend, TestDb},
};

pub(crate) async fn app(backend: Backend, vault: &std::path::Path, timeout_s: u64) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.vault.dir = vault.to_owned();
    settings.harness.approval_required = Some("LOCAL_WRITE".parse().unwrap());
    settings.harness.turn_timeout_s = timeout_s;
    spawn_app_with(TestDb::new(backend).await, provider, settings).await
}

pub(crate) fn script(app: &TestApp) {
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
    let turn = stream.turn_id();
    let asked = stream.read_until("approval.requested").await;
    assert_eq!(asked.last().unwrap().json()["tool"], "write_note");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        std::fs::read_to_string(&note).unwrap(),
        "# A\n",
        "nothing ran yet"
    );
    let url = format!("/sessions/s-appr/turns/{turn}/approvals/call_a1");
    let (status, _) = app.post_body(&url, json!({"approve": true})).await;
    assert_eq!(status, 200);
    let events = stream.read_to_end().await;
    let resolved = first_event(&events, "approval.resolved");
    assert_eq!(resolved["outcome"], "approved");
    let finished = first_event(&events, "tool.finished");
    assert_eq!(finished["status"], "completed");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "changed");
    assert_eq!(types(&events).last(), Some(&"turn.completed"));
    // The turn is over: nothing more to decide.
    let (status, _) = app.post_body(&url, json!({"approve": true})).await;
    assert_eq!(status, 409);

    // Denied: the call never runs; the model hears why.
    std::fs::write(&note, "# A\n").unwrap();
    script(&app);
    let mut stream = app
        .post_turn_sse("s-appr", json!({"message": "Change it again."}))
        .await;
    let turn = stream.turn_id();
    stream.read_until("approval.requested").await;
    let url = format!("/sessions/s-appr/turns/{turn}/approvals/call_a1");
    let (status, _) = app
        .post_body(&url, json!({"approve": false, "reason": "not today"}))
        .await;
    assert_eq!(status, 200);
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
    let finished = first_event(&events, "tool.finished");
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
    let turn = stream.turn_id();
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

    // The wait's own deadline (`HARNESS_APPROVAL_TIMEOUT`), not the
    // turn's: nobody decides, the call is not run, the turn ends.
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.vault.dir = vault.path().to_owned();
    settings.harness.approval_required = Some("LOCAL_WRITE".parse().unwrap());
    settings.harness.approval_timeout = "1s".parse().unwrap();
    let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
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
    let asked = first_event(&events, "approval.requested");
    let expires: chrono::DateTime<chrono::Utc> =
        asked["expires_at"].as_str().unwrap().parse().unwrap();
    let left = expires - chrono::Utc::now();
    assert!(left < chrono::Duration::seconds(1), "{asked}");
    let resolved = first_event(&events, "approval.resolved");
    assert_eq!(resolved["outcome"], "timed_out");
    assert_eq!(types(&events).last(), Some(&"turn.completed"));
    assert_eq!(
        std::fs::read_to_string(vault.path().join("notes/a.md")).unwrap(),
        "# A\n"
    );

    // The turn's compute deadline stands still while a person thinks: a
    // decision after it would have passed still runs the write.
    let app = crate::native::approvals::app(backend, vault.path(), 1).await;
    script(&app);
    let mut stream = app
        .post_turn_sse("s-appr-t", json!({"message": "Change my note."}))
        .await;
    let turn = stream.turn_id();
    stream.read_until("approval.requested").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(decide(&app, "s-appr-t", &turn, "call_a1", true).await, 200);
    let events = stream.read_to_end().await;
    assert_eq!(first_event(&events, "tool.finished")["status"], "completed");
    assert_eq!(types(&events).last(), Some(&"turn.completed"));
}

/// Posts a decision on `call` of `turn` in `session`.
async fn decide(app: &TestApp, session: &str, turn: &str, call: &str, approve: bool) -> u16 {
    let url = format!("/sessions/{session}/turns/{turn}/approvals/{call}");
    let response = app
        .client
        .post(app.url(&url))
        .json(&json!({"approve": approve}))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    if status != 200 {
        let problem: serde_json::Value = response.json().await.unwrap();
        assert_eq!(problem["code"], "call_not_found", "{problem}");
    }
    status
}

/// A provider that sends its calls without ids (older Ollama), or with
/// `call_0` at every step (OpenAI-compatible servers that number afresh):
/// the approval of step 1's `append_note` is not step 2's `write_note`'s,
/// which waits for its own decision. (Before, both were `call_0`: the
/// write ran at once and overwrote the note.)
async fn each_write_waits_for_its_own_decision_whatever_ids_the_provider_sends(backend: Backend) {
    for ollama in [true, false] {
        let vault = vault_of(&[("notes/a.md", "# A\n")]);
        let note = vault.path().join("notes/a.md");
        let provider = FakeProvider::start().await;
        let mut settings = test_settings(&provider);
        settings.vault.dir = vault.path().to_owned();
        settings.harness.approval_required = Some("LOCAL_WRITE".parse().unwrap());
        settings.harness.turn_timeout_s = 60;
        if ollama {
            settings.providers.chain = Some("ollama:llama3.2".parse().unwrap());
            settings.providers.ollama_host = provider.root.parse().unwrap();
        }
        let app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
        let append = json!({"path": "notes/a.md", "content": "appended"});
        let write = json!({"path": "notes/a.md", "content": "overwritten"});
        if ollama {
            app.provider.enqueue([
                Reply::ollama_tool_call("append_note", &append),
                Reply::ollama_tool_call("write_note", &write),
                Reply::ndjson("ollama/text.ndjson"),
            ]);
        } else {
            app.provider.enqueue([
                Reply::openai_tool_call("call_0", "append_note", &append),
                Reply::openai_tool_call("call_0", "write_note", &write),
                Reply::sse("openai/text.sse"),
            ]);
        }
        let mut stream = app
            .post_turn_sse(
                "s-ids",
                json!({"message": "Add to my note, then rewrite it."}),
            )
            .await;
        let turn = stream.turn_id();
        let first = stream.read_until("approval.requested").await;
        let first = first.last().unwrap().json();
        assert_eq!(first["tool"], "append_note");
        let first_id = first["call_id"].as_str().unwrap().to_owned();
        assert_eq!(decide(&app, "s-ids", &turn, &first_id, true).await, 200);

        let second = stream.read_until("approval.requested").await;
        let second = second.last().unwrap().json();
        assert_eq!(second["tool"], "write_note");
        let second_id = second["call_id"].as_str().unwrap().to_owned();
        assert_ne!(second_id, first_id, "ollama: {ollama}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            std::fs::read_to_string(&note).unwrap(),
            "# A\nappended",
            "the write waits for its own decision (ollama: {ollama})"
        );
        assert_eq!(decide(&app, "s-ids", &turn, &second_id, false).await, 200);
        let rest = stream.read_to_end().await;
        assert_eq!(types(&rest).last(), Some(&"turn.completed"), "{rest:?}");
        assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\nappended");
        if !ollama {
            // The provider gets back a consistent pair: each call's id
            // on the tool message that answers it.
            let sent = &app.provider.requests()[2].body["messages"];
            let called: Vec<&str> = sent
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|m| m["tool_calls"].as_array().into_iter().flatten())
                .map(|c| c["id"].as_str().unwrap())
                .collect();
            let answered: Vec<&str> = sent
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|m| m["tool_call_id"].as_str())
                .collect();
            assert_eq!(called, ["call_0", second_id.as_str()]);
            assert_eq!(answered, called);
        }
    }
}

/// A decision for a call that is not waiting for one is refused and
/// recorded nowhere: when the call comes, it waits. (Before, any id was
/// recorded, and a write that came later ran without asking.)
async fn no_call_is_approved_in_advance(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let app = app(backend, vault.path(), 60).await;
    let gate = tokio_util::sync::CancellationToken::new();
    app.provider.enqueue([
        Reply::openai_tool_call(
            "call_a1",
            "write_note",
            &json!({"path": "notes/a.md", "content": "changed"}),
        )
        .hold_head(&gate),
        Reply::sse("openai/text.sse"),
    ]);
    let mut stream = app
        .post_turn_sse("s-early", json!({"message": "Change my note."}))
        .await;
    let turn = stream.turn_id();
    assert_eq!(decide(&app, "s-early", &turn, "call_a1", true).await, 404);
    gate.cancel();
    stream.read_until("approval.requested").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\n", "it waits");
    assert_eq!(decide(&app, "s-early", &turn, "call_a1", true).await, 200);
    let rest = stream.read_to_end().await;
    assert_eq!(types(&rest).last(), Some(&"turn.completed"));
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "changed");
}

on_both_backends!(
    writes_wait_for_a_person_who_approves_or_denies,
    a_cancel_or_the_deadline_ends_a_pending_approval,
    each_write_waits_for_its_own_decision_whatever_ids_the_provider_sends,
    no_call_is_approved_in_advance,
);
