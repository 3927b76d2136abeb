//! The vault through the service: a turn that retrieves and cites, a write
//! undone by its checkpoint, and paths that lead out of the vault.

use std::path::Path;

use serde_json::{Value, json};

use crate::{
    fake_provider::Reply,
    helpers::{TestApp, spawn_app_with_vault, types},
    on_both_backends,
    support::Backend,
};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/vault");

/// A copy of the fixture vault the test may change.
fn vault_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(Path::new(FIXTURE), dir.path());
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Runs a turn in which the model makes one call, then answers; returns
/// the call's `tool.finished` event.
async fn turn_with_call(app: &TestApp, session: &str, name: &str, arguments: Value) -> Value {
    app.provider.enqueue([
        Reply::openai_tool_call("call_v1", name, &arguments),
        Reply::sse("openai/text.sse"),
    ]);
    let mut stream = app
        .post_turn_sse(session, json!({"message": "Please update my notes."}))
        .await;
    let events = stream.read_to_end().await;
    assert_eq!(
        types(&events).last(),
        Some(&"turn.completed"),
        "{:?}",
        types(&events)
    );
    events
        .iter()
        .find(|e| e.event == "tool.finished")
        .map(|e| e.json())
        .expect("a tool.finished event")
}

async fn a_turn_retrieves_from_the_vault_and_cites_it(backend: Backend) {
    let vault = vault_copy();
    let app = spawn_app_with_vault(backend, vault.path()).await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let mut stream = app
        .post_turn_sse(
            "s-vault",
            json!({"message": "When should I book the train to Paris?", "show_citations": true}),
        )
        .await;
    let events = stream.read_to_end().await;
    let citations = events
        .iter()
        .find(|e| e.event == "citations")
        .map(|e| e.json())
        .expect("a citations event");
    let local: Vec<&str> = citations["local"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        local.first(),
        Some(&"notes/paris.md#Open loops"),
        "{local:?}"
    );
    let result = &events.last().unwrap().json()["result"];
    assert!(
        result["text"]
            .as_str()
            .unwrap()
            .contains("Local citations:\n- notes/paris.md#Open loops"),
        "{result}"
    );
    assert_eq!(
        result["context_pack_json"]["relevant_facts"][0]["anchor"],
        "notes/paris.md#Open loops"
    );
    // The model was shown the note's text, inside the untrusted block.
    let requests = app.provider.requests();
    let sent = requests[0].body["messages"].to_string();
    assert!(
        sent.contains("Eurostar") && sent.contains("UNTRUSTED_CONTEXT"),
        "{sent}"
    );
}

async fn a_write_is_undone_by_restoring_its_checkpoint(backend: Backend) {
    let vault = vault_copy();
    let app = spawn_app_with_vault(backend, vault.path()).await;
    let paris = vault.path().join("notes/paris.md");
    let before = std::fs::read(&paris).unwrap();

    let finished = turn_with_call(
        &app,
        "s-undo",
        "write_note",
        json!({"path": "notes/paris.md", "content": "# Paris trip\n\nCancelled.\n"}),
    )
    .await;
    assert_eq!(finished["status"], "completed", "{finished}");
    assert_eq!(
        std::fs::read_to_string(&paris).unwrap(),
        "# Paris trip\n\nCancelled.\n"
    );
    let (status, listed) = app.get_json("/sessions/s-undo/checkpoints").await;
    assert_eq!(status, 200, "{listed}");
    let checkpoint = &listed["checkpoints"][0];
    assert_eq!(checkpoint["path"], "notes/paris.md");
    assert_eq!(checkpoint["tool"], "write_note");
    assert_eq!(checkpoint["call_id"], "call_v1");
    assert_eq!(checkpoint["existed"], true);
    assert_eq!(checkpoint["bytes"], before.len());
    let id = checkpoint["id"].as_str().unwrap().to_owned();

    let (status, restored) = app.post_json(&format!("/checkpoints/{id}/restore")).await;
    assert_eq!(status, 200, "{restored}");
    assert_eq!(restored["outcome"], "restored");
    assert_eq!(
        std::fs::read(&paris).unwrap(),
        before,
        "the exact previous bytes"
    );
    // The index followed the restore: nothing is left to re-index.
    let (_, report) = app.post_json("/vault/reindex").await;
    assert_eq!(
        (report["updated"].as_u64(), report["unchanged"].as_u64()),
        (Some(0), Some(3))
    );

    // A checkpoint is restored once; the restore itself can be undone.
    let (status, again) = app.post_json(&format!("/checkpoints/{id}/restore")).await;
    assert_eq!(status, 409, "{again}");
    assert_eq!(again["code"], "checkpoint_already_restored");
    let undo = restored["undo_checkpoint_id"].as_str().unwrap();
    let (status, _) = app.post_json(&format!("/checkpoints/{undo}/restore")).await;
    assert_eq!(status, 200);
    assert!(
        std::fs::read_to_string(&paris)
            .unwrap()
            .contains("Cancelled.")
    );

    // A note the write made is removed by its restore.
    let finished = turn_with_call(
        &app,
        "s-undo",
        "append_note",
        json!({"path": "notes/new/idea.md", "content": "A new idea."}),
    )
    .await;
    assert_eq!(finished["status"], "completed", "{finished}");
    let idea = vault.path().join("notes/new/idea.md");
    assert_eq!(std::fs::read_to_string(&idea).unwrap(), "A new idea.");
    let (_, listed) = app.get_json("/sessions/s-undo/checkpoints").await;
    let made = listed["checkpoints"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        (made["existed"].as_bool(), made["bytes"].as_i64()),
        (Some(false), None)
    );
    let (status, removed) = app
        .post_json(&format!(
            "/checkpoints/{}/restore",
            made["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(
        (status, removed["outcome"].as_str()),
        (200, Some("removed"))
    );
    assert!(!idea.exists());

    for unknown in [
        "ckpt_0123456789abcdef0123456789abcdef",
        "nope",
        "ckpt_..%2F",
    ] {
        let (status, problem) = app
            .post_json(&format!("/checkpoints/{unknown}/restore"))
            .await;
        assert_eq!(status, 404, "{unknown}: {problem}");
        assert_eq!(problem["code"], "checkpoint_not_found");
    }
}

/// The context pack the model was shown for `message` (its facts' anchors).
async fn pack_anchors(app: &TestApp, message: &str) -> Vec<String> {
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let response = app
        .post_turn("s-meaning", json!({"message": message}))
        .await;
    assert_eq!(response.status(), 200);
    let result: Value = response.json().await.unwrap();
    result["context_pack_json"]["relevant_facts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["anchor"].as_str().unwrap().to_owned())
        .collect()
}

async fn embeddings_find_by_meaning_what_words_miss(backend: Backend) {
    let notes = [
        (
            "notes/car.md",
            "# Car\n\nThe car needs new tyres before winter.\n",
        ),
        ("notes/garden.md", "# Garden\n\nPlant tulips in autumn.\n"),
    ];
    for embeddings in ["openai:text-embedding-3-small", "ollama:nomic-embed-text"] {
        let vault = crate::helpers::vault_of(&notes);
        let provider = crate::fake_provider::FakeProvider::start().await;
        let mut settings = crate::helpers::test_settings(&provider);
        settings.vault.dir = vault.path().to_owned();
        settings.vault.embeddings = Some(embeddings.parse().unwrap());
        settings.vault.index_on_start = false;
        settings.providers.ollama_host = provider.root.parse().unwrap();
        let app = crate::helpers::spawn_app_with(
            crate::support::TestDb::new(backend).await,
            provider,
            settings,
        )
        .await;
        let (_, report) = app.post_json("/vault/reindex").await;
        assert_eq!(
            report["embedded_chunks"], report["chunks"],
            "{embeddings}: {report}"
        );
        let sent = app.provider.embedding_requests();
        let (model, path) = embeddings
            .split_once(':')
            .map(|(kind, model)| {
                (
                    model,
                    if kind == "openai" {
                        "/v1/embeddings"
                    } else {
                        "/api/embed"
                    },
                )
            })
            .unwrap();
        assert_eq!(sent[0].path, path);
        assert_eq!(sent[0].body["model"], model);
        // No note says "automobile": words alone find nothing; meaning does.
        let found = pack_anchors(&app, "What about my automobile?").await;
        assert_eq!(
            found.first().map(String::as_str),
            Some("notes/car.md#Car"),
            "{embeddings}: {found:?}"
        );
        // Words and meaning together: the garden note still comes first for its words.
        let found = pack_anchors(&app, "When do I plant tulips?").await;
        assert_eq!(
            found.first().map(String::as_str),
            Some("notes/garden.md#Garden"),
            "{found:?}"
        );
    }
}

async fn without_its_embeddings_endpoint_the_vault_ranks_by_words(backend: Backend) {
    let vault =
        crate::helpers::vault_of(&[("notes/car.md", "# Car\n\nThe car needs new tyres.\n")]);
    let provider = crate::fake_provider::FakeProvider::start().await;
    provider.fail_embeddings(true);
    let mut settings = crate::helpers::test_settings(&provider);
    settings.vault.dir = vault.path().to_owned();
    settings.vault.embeddings = Some("openai:text-embedding-3-small".parse().unwrap());
    settings.vault.index_on_start = false;
    let app = crate::helpers::spawn_app_with(
        crate::support::TestDb::new(backend).await,
        provider,
        settings,
    )
    .await;
    let (_, report) = app.post_json("/vault/reindex").await;
    assert_eq!(
        (report["added"].as_u64(), report["embedded_chunks"].as_u64()),
        (Some(1), Some(0)),
        "{report}"
    );
    assert_eq!(pack_anchors(&app, "new tyres").await, ["notes/car.md#Car"]);
    assert!(pack_anchors(&app, "my automobile").await.is_empty());
    // Once the endpoint is back, a reindex embeds what was left unembedded.
    app.provider.fail_embeddings(false);
    let (_, report) = app.post_json("/vault/reindex").await;
    assert_eq!(
        (
            report["updated"].as_u64(),
            report["embedded_chunks"].as_u64()
        ),
        (Some(1), Some(1)),
        "{report}"
    );
    assert_eq!(
        pack_anchors(&app, "my automobile").await,
        ["notes/car.md#Car"]
    );
}

on_both_backends!(
    embeddings_find_by_meaning_what_words_miss,
    without_its_embeddings_endpoint_the_vault_ranks_by_words,
    a_turn_retrieves_from_the_vault_and_cites_it,
    a_write_is_undone_by_restoring_its_checkpoint,
);

/// Every way out of the vault is a validation denial: the call never runs,
/// nothing outside is touched, no checkpoint is taken.
#[cfg(unix)]
#[tokio::test]
async fn paths_out_of_the_vault_are_denied_by_validation() {
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.md");
    std::fs::write(&secret, "secret").unwrap();
    let vault = vault_copy();
    std::os::unix::fs::symlink(outside.path(), vault.path().join("out")).unwrap();
    std::os::unix::fs::symlink(&secret, vault.path().join("link.md")).unwrap();
    let app = spawn_app_with_vault(Backend::Sqlite, vault.path()).await;
    let escapes = [
        "../outside.md",
        "notes/../../outside.md",
        "/etc/passwd.md",
        secret.to_str().unwrap(),
        ".obsidian/workspace.md",
        "notes/script.sh",
        "out/secret.md",
        "out/new.md",
        "link.md",
    ];
    for path in escapes {
        for tool in ["write_note", "append_note", "read_note"] {
            let finished = turn_with_call(
                &app,
                "s-escape",
                tool,
                json!({"path": path, "content": "pwned"}),
            )
            .await;
            assert_eq!(finished["status"], "denied", "{tool} {path}: {finished}");
            assert_eq!(
                finished["reason"], "validation",
                "{tool} {path}: {finished}"
            );
        }
    }
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "secret");
    assert!(!outside.path().join("new.md").exists());
    assert!(!vault.path().parent().unwrap().join("outside.md").exists());
    let (_, listed) = app.get_json("/sessions/s-escape/checkpoints").await;
    assert_eq!(listed["checkpoints"], json!([]));
}
