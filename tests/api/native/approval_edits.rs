//! Approving with edits: a person approves a call with other arguments;
//! the edit is checked against the tool's schema at once (a bad one is
//! 422 and the call still waits), the edited call goes through the gates
//! again and runs, the model's history and the log show it, and an
//! approval holds only for the arguments it was made for.

use serde_json::{Value, json};

use super::approvals::{app, script};
use crate::{
    helpers::{first_event, types, vault_of},
    on_both_backends,
    support::Backend,
};

async fn an_approval_with_edits_runs_the_edited_call_and_the_model_sees_it(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let app = app(backend, vault.path(), 60).await;
    script(&app);
    let mut stream = app
        .post_turn_sse("s-edit", json!({"message": "Change my note."}))
        .await;
    let turn = stream.turn_id();
    let mut events = stream.read_until("approval.requested").await;
    let url = format!("/sessions/s-edit/turns/{turn}/approvals/call_a1");

    // Edits that cannot run are refused at once, and the call waits on.
    for (body, says) in [
        (
            json!({"approve": true, "edited_arguments": {"path": "notes/a.md"}}),
            "content",
        ),
        (
            json!({"approve": true, "edited_arguments": {"path": "../../etc/x.md", "content": "x"}}),
            "..",
        ),
        (
            json!({"approve": false, "edited_arguments": {"path": "notes/a.md", "content": "x"}}),
            "approval",
        ),
    ] {
        let (status, problem) = app.post_body(&url, body.clone()).await;
        assert_eq!(
            (status, problem["code"].as_str(), problem["field"].as_str()),
            (422, Some("invalid_field"), Some("edited_arguments")),
            "{body}: {problem}"
        );
        let detail = problem["detail"].as_str().unwrap().to_lowercase();
        assert!(detail.contains(says), "{body}: {problem}");
    }
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\n");

    let edit = json!({"path": "notes/a.md", "content": "edited by a person"});
    let (status, view) = app
        .post_body(&url, json!({"approve": true, "edited_arguments": edit}))
        .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        view,
        json!({"call_id": "call_a1", "approved": true, "edited": true})
    );
    events.extend(stream.read_to_end().await);
    assert_eq!(types(&events).last(), Some(&"turn.completed"));
    let resolved = first_event(&events, "approval.resolved");
    assert_eq!(
        (&resolved["outcome"], &resolved["edited_arguments"]),
        (&json!("approved"), &edit)
    );
    // The call starts again with the edit, and runs with it.
    let starts: Vec<Value> = events
        .iter()
        .filter(|e| e.event == "tool.started")
        .map(|e| e.json())
        .collect();
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert_eq!(starts[0]["arguments"]["content"], "changed");
    assert_eq!(
        (&starts[1]["arguments"], &starts[1]["edited"]),
        (&edit, &json!(true))
    );
    assert_eq!(first_event(&events, "tool.finished")["status"], "completed");
    assert_eq!(
        std::fs::read_to_string(&note).unwrap(),
        "edited by a person"
    );
    // The model's next request shows the call as it ran.
    let requests = app.provider.requests();
    let messages = requests.last().unwrap().body["messages"]
        .as_array()
        .unwrap()
        .clone();
    let call = messages
        .iter()
        .find_map(|m| m["tool_calls"].as_array().and_then(|calls| calls.first()))
        .unwrap();
    let sent: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(sent, edit);
    // The audit trail keeps that it was edited; the approval keeps both.
    let store = app.db.open().await;
    let filter = harness_store::store::AuditFilter {
        limit: 100,
        ..Default::default()
    };
    let rows = store.audit_rows(&filter).await.unwrap();
    let decided = rows.iter().find(|r| r.kind == "approval.decided").unwrap();
    assert_eq!(decided.outcome.as_deref(), Some("approved_with_edits"));
    let (edited, sha) = store
        .approval_terms(uuid::Uuid::parse_str(&turn).unwrap(), "call_a1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&edited.unwrap()).unwrap(),
        edit
    );
    assert_eq!(sha.unwrap().len(), 64);
    let (status, _) = app.post_body(&url, json!({"approve": true})).await;
    assert_eq!(status, 409);
}

/// A decision recorded for other arguments than the call's (its SHA-256
/// another's) does not let the call run: it is denied, and the model is
/// told.
async fn an_approval_holds_only_for_the_arguments_it_was_made_for(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let note = vault.path().join("notes/a.md");
    let app = app(backend, vault.path(), 60).await;
    script(&app);
    let mut stream = app
        .post_turn_sse("s-bound", json!({"message": "Change my note."}))
        .await;
    let turn = stream.turn_id();
    stream.read_until("approval.requested").await;
    let store = app.db.open().await;
    let recorded = store
        .decide_approval(&harness_store::store::NewApproval {
            session_id: harness_base::ids::SessionKey::from_stored("s-bound"),
            turn_id: uuid::Uuid::parse_str(&turn).unwrap(),
            call_id: "call_a1".into(),
            approved: true,
            reason: None,
            edited_arguments: None,
            arguments_sha256: Some("0".repeat(64)),
        })
        .await
        .unwrap();
    assert!(recorded);
    let events = stream.read_to_end().await;
    let finished = first_event(&events, "tool.finished");
    assert_eq!(
        (&finished["status"], &finished["reason"]),
        (&json!("denied"), &json!("approval")),
        "{finished}"
    );
    assert!(
        finished["error"]
            .as_str()
            .unwrap()
            .contains("not the ones the approval was for"),
        "{finished}"
    );
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "# A\n");
}

on_both_backends!(
    an_approval_with_edits_runs_the_edited_call_and_the_model_sees_it,
    an_approval_holds_only_for_the_arguments_it_was_made_for,
);
