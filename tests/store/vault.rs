//! The vault's index on both backends: indexing a folder of notes, ranking,
//! and keeping the index in step with edits and deletions.

use std::{path::Path, sync::Arc};

use agent_harness::startup::VaultCheckpoints;
use harness_core::{
    hooks::{CheckpointRequest, CheckpointStore},
    tools::{Saved, Settled, Tool, ToolOutput, notes::WriteNote},
    vault::{Vault, Vaults},
};
use harness_store::store::{IndexedNote, VaultChunk};
use serde_json::json;

use super::{Backend, store};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/vault");

/// A copy of the fixture vault the test may change.
pub fn vault_copy() -> tempfile::TempDir {
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

async fn anchors(vault: &Vault, query: &str) -> Vec<String> {
    vault
        .search(query, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|hit| hit.anchor)
        .collect()
}

async fn a_vault_is_indexed_ranked_and_kept_in_step(backend: Backend) {
    let (_db, store) = store(backend).await;
    let dir = vault_copy();
    let vault = Vault::new(dir.path(), store.clone());

    let first = vault.reindex(&()).await.unwrap();
    // Three notes; the hidden folder and the text file are not notes.
    assert_eq!(
        (first.notes, first.added, first.skipped_count),
        (3, 3, 0),
        "{first:?}"
    );
    assert!(first.chunks >= 7, "{first:?}");

    // The section that matches best comes first.
    let found = anchors(&vault, "When do I book the train to Paris?").await;
    assert_eq!(found[0], "notes/paris.md#Open loops", "{found:?}");
    let found = anchors(&vault, "compost").await;
    assert_eq!(found[0], "notes/garden.md#Compost", "{found:?}");
    assert!(
        found.contains(&"journal/2026-11-02.md".to_owned()),
        "{found:?}"
    );
    assert!(anchors(&vault, "workspace hidden").await.is_empty());

    // Nothing changed: nothing is rewritten.
    let again = vault.reindex(&()).await.unwrap();
    assert_eq!(
        (again.unchanged, again.chunks, again.removed),
        (3, 0, 0),
        "{again:?}"
    );

    // An edit and a deletion are reflected.
    std::fs::write(
        dir.path().join("notes/garden.md"),
        "# Garden\n\n## Tomatoes\n\nSow tomatoes indoors in March.\n",
    )
    .unwrap();
    std::fs::remove_file(dir.path().join("notes/paris.md")).unwrap();
    std::fs::write(
        dir.path().join("notes/lisbon.md"),
        "# Lisbon\n\nTrams and tiles.\n",
    )
    .unwrap();
    let changed = vault.reindex(&()).await.unwrap();
    assert_eq!(
        (
            changed.added,
            changed.updated,
            changed.removed,
            changed.unchanged
        ),
        (1, 1, 1, 1),
        "{changed:?}"
    );
    let found = anchors(&vault, "compost").await;
    assert_eq!(found, ["journal/2026-11-02.md"]);
    assert!(anchors(&vault, "Paris Eurostar").await.is_empty());
    assert_eq!(anchors(&vault, "trams").await, ["notes/lisbon.md#Lisbon"]);
}

async fn vault_search_takes_any_words_and_index_writes_replace(backend: Backend) {
    let (_db, store) = store(backend).await;
    let note = |text: &str| IndexedNote {
        path: "a.md".into(),
        content_hash: format!("h-{text}"),
        bytes: 1,
        embedding_model: None,
        chunks: vec![VaultChunk {
            heading: "A".into(),
            anchor: "a.md#A".into(),
            text: text.into(),
            embedding: None,
        }],
    };
    store
        .vault_put_note("", &note("apples and pears"))
        .await
        .unwrap();
    store.vault_put_note("", &note("plums only")).await.unwrap();
    let terms = |words: &[&str]| words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
    assert!(
        store
            .vault_search("", &terms(&["apples"]), 5)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .vault_search("", &terms(&["plums"]), 5)
            .await
            .unwrap()
            .len(),
        1
    );
    // Query syntax in a word is only a word.
    for odd in [
        r#"plums""#,
        "plums*",
        "OR",
        "NEAR(plums",
        "plums:a",
        "!plums",
        "''",
    ] {
        let hits = store.vault_search("", &terms(&[odd]), 5).await;
        assert!(hits.is_ok(), "{odd}: {hits:?}");
    }
    assert!(store.vault_search("", &[], 5).await.unwrap().is_empty());
    assert_eq!(
        store.vault_notes("").await.unwrap()["a.md"].content_hash,
        "h-plums only"
    );
    assert_eq!(
        store
            .vault_remove_notes("", &terms(&["a.md", "b.md"]))
            .await
            .unwrap(),
        1
    );
    assert!(
        store
            .vault_search("", &terms(&["plums"]), 5)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.vault_notes("").await.unwrap().is_empty());
}

async fn embeddings_are_kept_by_model_and_chunks_read_by_id(backend: Backend) {
    let (_db, store) = store(backend).await;
    let chunk = |text: &str, vector: Vec<f32>| VaultChunk {
        heading: String::new(),
        anchor: "e.md".into(),
        text: text.into(),
        embedding: Some(vector),
    };
    store
        .vault_put_note(
            "",
            &IndexedNote {
                path: "e.md".into(),
                content_hash: "h".into(),
                bytes: 2,
                embedding_model: Some("openai:m".into()),
                chunks: vec![
                    chunk("one", vec![0.5, -1.25, 3.0]),
                    chunk("two", vec![1.0, 0.0, f32::MIN_POSITIVE]),
                ],
            },
        )
        .await
        .unwrap();
    let vectors = store.vault_vectors("", "openai:m", 10).await.unwrap();
    assert_eq!(vectors.len(), 2);
    assert_eq!(vectors[0].1, [0.5, -1.25, 3.0]);
    assert_eq!(vectors[1].1, [1.0, 0.0, f32::MIN_POSITIVE]);
    assert!(
        store
            .vault_vectors("", "ollama:other", 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.vault_vectors("", "openai:m", 1).await.unwrap().len(),
        1
    );
    let state = &store.vault_notes("").await.unwrap()["e.md"];
    assert_eq!(state.embedding_model.as_deref(), Some("openai:m"));
    let ids: Vec<i64> = vectors.iter().map(|(id, _)| *id).collect();
    let mut read = store
        .vault_chunks("", &[ids[1], ids[0], 999_999])
        .await
        .unwrap();
    read.sort_by_key(|hit| hit.id);
    let texts: Vec<&str> = read.iter().map(|hit| hit.text.as_str()).collect();
    assert_eq!(texts, ["one", "two"]);
    assert!(store.vault_chunks("", &[]).await.unwrap().is_empty());
}

/// A write that started in a process that died is told by its
/// checkpoint: landed (the note is what the write makes of the saved one),
/// not landed (the note is as saved), or unknown (something else changed
/// it since). A call that runs again keeps the checkpoint of its first run.
async fn a_started_write_is_settled_by_its_checkpoint(backend: Backend) {
    let (_db, store) = store(backend).await;
    let dir = vault_copy();
    let vault = Arc::new(Vault::new(dir.path(), store.clone()));
    vault.reindex(&()).await.unwrap();
    let turn = super::new_turn("s-vault", None);
    store.begin_turn(&turn).await.unwrap();
    let vaults = Arc::new(Vaults::one(vault.clone()));
    let checkpoints = VaultCheckpoints {
        vaults: vaults.clone(),
        store: store.clone(),
    };
    let turn_id = turn.id.to_string();
    let note = dir.path().join("notes/garden.md");
    let original = std::fs::read(&note).unwrap();
    let settle = |tool: WriteNote, call: &'static str, content: &'static str| {
        let checkpoints = &checkpoints;
        let turn_id = &turn_id;
        async move {
            let request = CheckpointRequest {
                session_id: "s-vault".into(),
                turn_id: turn_id.clone(),
                call_id: call.into(),
                tool: tool.spec().name.clone(),
                resource_keys: vec!["note:notes/garden.md".into()],
            };
            let first = checkpoints.snapshot(&request).await.unwrap();
            // Taken again (the call runs again): the first one stands.
            assert_eq!(checkpoints.snapshot(&request).await.unwrap(), first);
            let saved = checkpoints.saved("s-vault", turn_id, call).await.unwrap();
            (
                tool,
                saved,
                json!({"path": "notes/garden.md", "content": content}),
            )
        }
    };

    // Not landed: the note is as the checkpoint saved it.
    let (tool, saved, arguments) =
        settle(WriteNote::append(vaults.clone()), "c1", "Water daily.").await;
    assert_eq!(saved.len(), 1);
    assert_eq!(saved[0].content.as_deref(), Some(&original[..]));
    assert_eq!(
        tool.settle("s-vault", &arguments, &saved).await,
        Settled::NotLanded
    );
    // No checkpoint: the call never got past its gate.
    assert_eq!(
        tool.settle("s-vault", &arguments, &[]).await,
        Settled::NotLanded
    );

    // Landed: the file was renamed into place, and the process died
    // before indexing it; the answer is the write's, and the index is
    // brought in line.
    let mut appended = original.clone();
    if !appended.ends_with(b"\n") {
        appended.push(b'\n');
    }
    appended.extend_from_slice(b"Water daily.");
    std::fs::write(&note, &appended).unwrap();
    let Settled::Landed(output) = tool.settle("s-vault", &arguments, &saved).await else {
        panic!("the append landed");
    };
    assert_eq!(
        output.content,
        format!(
            "Appended to notes/garden.md ({} bytes now).",
            appended.len()
        )
    );
    let found = anchors(&vault, "water daily").await;
    assert!(
        found.iter().any(|a| a.starts_with("notes/garden.md")),
        "{found:?}"
    );
    assert_eq!(
        std::fs::read(&note).unwrap(),
        appended,
        "settling writes nothing"
    );

    // Changed since by something else: nothing tells.
    std::fs::write(&note, "# Garden\n\nSomeone else's words.\n").unwrap();
    assert_eq!(
        tool.settle("s-vault", &arguments, &saved).await,
        Settled::Unknown
    );

    // A replace of a note that did not exist: landed once the note holds
    // the content, not landed while it is missing.
    let (tool, _, _) = settle(WriteNote::replace(vaults.clone()), "c2", "").await;
    let new = dir.path().join("notes/new.md");
    let saved = [Saved {
        path: "notes/new.md".into(),
        content: None,
    }];
    let arguments = json!({"path": "notes/new.md", "content": "# New\n"});
    assert_eq!(
        tool.settle("s-vault", &arguments, &saved).await,
        Settled::NotLanded
    );
    std::fs::write(&new, "# New\n").unwrap();
    assert_eq!(
        tool.settle("s-vault", &arguments, &saved).await,
        Settled::Landed(ToolOutput::text("Wrote notes/new.md (6 bytes now)."))
    );
}

crate::on_both_backends!(
    a_started_write_is_settled_by_its_checkpoint,
    embeddings_are_kept_by_model_and_chunks_read_by_id,
    a_vault_is_indexed_ranked_and_kept_in_step,
    vault_search_takes_any_words_and_index_writes_replace,
);
