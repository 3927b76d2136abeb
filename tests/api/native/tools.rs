//! `GET /tools` and the permission mode through the service.

use serde_json::json;

use crate::{
    fake_provider::FakeProvider,
    helpers::{spawn_app, spawn_app_with, test_settings, vault_of},
    support::{Backend, TestDb},
};

#[tokio::test]
async fn the_registry_is_listed_with_effects_and_permissions() {
    let app = spawn_app(Backend::Sqlite).await;
    let (status, listed) = app.get_json("/tools").await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["permission_mode"], "auto");
    let tools = listed["tools"].as_array().unwrap();
    let summary: Vec<(&str, &str, bool)> = tools
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap(),
                t["effect"].as_str().unwrap(),
                t["permitted"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("get_context_pack", "READ_ONLY", true),
            ("local_search", "READ_ONLY", true),
            ("read_note", "READ_ONLY", true),
            ("write_note", "LOCAL_WRITE", true),
            ("append_note", "LOCAL_WRITE", true),
            ("fetch_url", "NETWORK", true),
        ]
    );
    assert_eq!(tools[2]["parameters"]["required"], json!(["path"]));
    assert_eq!(tools[2]["source"], "builtin");
    assert_eq!(tools[2]["timeout_s"], 45.0);
}

#[tokio::test]
async fn a_tool_outside_the_permission_mode_is_denied_with_reason_permission() {
    let vault = vault_of(&[("notes/a.md", "# A\n\nApples.\n")]);
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.vault.dir = vault.path().to_owned();
    settings.harness.tool_permission = "read_only".parse().unwrap();
    let app = spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await;
    let (_, listed) = app.get_json("/tools").await;
    assert_eq!(listed["permission_mode"], "read_only");
    let permitted: Vec<bool> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["permitted"].as_bool().unwrap())
        .collect();
    assert_eq!(permitted, [true, true, true, false, false, false]);

    let arguments = json!({"path": "notes/a.md", "content": "gone"});
    let (finished, _) = app.call_tool("write_note", arguments).await;
    assert_eq!(
        (finished["status"].as_str(), finished["reason"].as_str()),
        (Some("denied"), Some("permission"))
    );
    // Not offered, not run, nothing saved.
    let offered = app.provider.requests()[0].body["tools"].to_string();
    assert!(!offered.contains("write_note"), "{offered}");
    assert_eq!(
        std::fs::read_to_string(vault.path().join("notes/a.md")).unwrap(),
        "# A\n\nApples.\n"
    );
    let (_, checkpoints) = app.get_json("/sessions/s-tool/checkpoints").await;
    assert_eq!(checkpoints["checkpoints"], json!([]));
}
