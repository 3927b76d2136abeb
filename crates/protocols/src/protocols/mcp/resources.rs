//! What `/mcp` offers to read, whichever protocol version asks: the
//! caller's vault notes (`vault:///{path}`) and its sessions' transcripts
//! (`session:///{session_id}`), and completion of a note's path.

use std::hash::{DefaultHasher, Hash, Hasher};

use rmcp::model::{
    CompleteRequestParams, CompleteResult, CompletionInfo, ReadResourceResult, Reference, Resource,
    ResourceContents, ResourceTemplate,
};
use serde::Serialize;

use crate::{
    ids::Tenant,
    protocols::Shared,
    protocols::{error::ApiError, paths::parse_session_id},
    vault::NoteError,
};

pub(super) const NOTE_SCHEME: &str = "vault:///";
const SESSION_SCHEME: &str = "session:///";

/// Notes `resources/list` names at most (the first, by path).
const LIST_MAX: usize = 1000;

/// Messages a transcript holds at most (the newest).
const TRANSCRIPT_MAX: u32 = 200;

/// Paths a completion offers at most (the spec's cap).
const COMPLETION_MAX: usize = 100;

/// Why a resource cannot be read.
pub(super) enum Unreadable {
    /// No such resource of the caller's (another tenant's included).
    NotFound(String),
    Failed(ApiError),
}

impl From<crate::service::StoreError> for Unreadable {
    fn from(e: crate::service::StoreError) -> Self {
        Self::Failed(e.into())
    }
}

/// Whether a URI is of this server's schemes (a note or a transcript).
pub(super) fn is_ours(uri: &str) -> bool {
    uri.starts_with(NOTE_SCHEME) || uri.starts_with(SESSION_SCHEME)
}

/// The caller's indexed notes, by path.
async fn note_paths(app: &Shared, tenant: &Tenant) -> Result<Vec<String>, ApiError> {
    let vault = app.vaults.of_tenant(&tenant.0);
    let notes = app.turns.vault_notes(vault.name()).await?;
    let mut paths: Vec<String> = notes.into_keys().collect();
    paths.sort();
    Ok(paths)
}

/// `resources/list`: the caller's notes.
pub(super) async fn list(app: &Shared, tenant: &Tenant) -> Result<Vec<Resource>, ApiError> {
    let paths = note_paths(app, tenant).await?;
    Ok(paths
        .into_iter()
        .take(LIST_MAX)
        .map(|path| {
            Resource::new(format!("{NOTE_SCHEME}{path}"), &path)
                .with_title(path)
                .with_mime_type("text/markdown")
        })
        .collect())
}

/// `resources/templates/list`: a note by its path, a session's transcript.
pub(super) fn templates() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new(format!("{NOTE_SCHEME}{{+path}}"), "note")
            .with_title("A vault note")
            .with_description("A Markdown note of the caller's vault, by its path in the vault.")
            .with_mime_type("text/markdown"),
        ResourceTemplate::new(format!("{SESSION_SCHEME}{{session_id}}"), "transcript")
            .with_title("A session's transcript")
            .with_description("The newest messages of a session of the caller's, oldest first.")
            .with_mime_type("application/json"),
    ]
}

/// A resource's contents: one text.
fn contents(uri: &str, mime_type: &str, text: String) -> ReadResourceResult {
    let mut result = ReadResourceResult::new(vec![
        ResourceContents::text(text, uri).with_mime_type(mime_type),
    ]);
    // Each protocol version says its result's type itself.
    result.result_type = None;
    result
}

/// A session's transcript.
#[derive(Debug, Serialize)]
struct Transcript<'a, M> {
    session_id: &'a str,
    messages: Vec<M>,
}

#[derive(Debug, Serialize)]
struct TranscriptMessage<'a, T> {
    role: &'a str,
    content: &'a str,
    created_at: T,
}

/// `resources/read`: the contents of one resource.
pub(super) async fn read(
    app: &Shared,
    tenant: &Tenant,
    uri: &str,
) -> Result<ReadResourceResult, Unreadable> {
    let not_found = || Unreadable::NotFound(format!("resource {uri} not found"));
    if let Some(path) = uri.strip_prefix(NOTE_SCHEME) {
        let vault = app.vaults.of_tenant(&tenant.0);
        let text = match vault.read_note(path).await {
            Ok((_, text)) => text,
            Err(NoteError::Path(_) | NoteError::NotFound(_) | NoteError::NotText(_)) => {
                return Err(not_found());
            }
            Err(e) => return Err(Unreadable::Failed(ApiError::Internal(e.to_string()))),
        };
        return Ok(contents(uri, "text/markdown", text));
    }
    if let Some(id) = uri.strip_prefix(SESSION_SCHEME) {
        let session = parse_session_id(id, tenant).map_err(|_| not_found())?;
        let Some(record) = app.turns.get_session(&session).await? else {
            return Err(not_found());
        };
        let messages = app
            .turns
            .current_messages(&session, &record, TRANSCRIPT_MAX)
            .await?;
        let transcript = Transcript {
            session_id: id,
            messages: messages
                .iter()
                .map(|m| TranscriptMessage {
                    role: m.role.as_str(),
                    content: &m.content,
                    created_at: m.created_at,
                })
                .collect(),
        };
        let text = serde_json::to_string(&transcript).unwrap_or_default();
        return Ok(contents(uri, "application/json", text));
    }
    Err(not_found())
}

/// A completion's values (at most [`COMPLETION_MAX`] of `matching`).
fn completion(matching: Vec<String>) -> CompleteResult {
    let total = matching.len();
    let has_more = total > COMPLETION_MAX;
    let values: Vec<String> = matching.into_iter().take(COMPLETION_MAX).collect();
    // At most the cap: rmcp takes them.
    let info = CompletionInfo::with_pagination(values, u32::try_from(total).ok(), has_more)
        .unwrap_or_default();
    let mut result = CompleteResult::new(info);
    // Each protocol version says its result's type itself.
    result.result_type = None;
    result
}

/// `completion/complete`: for the note template's `path`, the caller's
/// note paths that start with what is typed; for a prompt's argument, the
/// values its profile lists ([`super::prompts::complete`]); nothing for
/// any other argument or template.
pub(super) async fn complete(
    app: &Shared,
    tenant: &Tenant,
    params: &CompleteRequestParams,
) -> Result<Result<CompleteResult, String>, ApiError> {
    let (argument, typed) = (&params.argument.name, &params.argument.value);
    let uri = match &params.r#ref {
        Reference::Prompt(prompt) => {
            return Ok(super::prompts::complete(app, &prompt.name, argument, typed).map(completion));
        }
        Reference::Resource(resource) => &resource.uri,
        // rmcp may name more references.
        _ => return Ok(Err("ref/resource and ref/prompt are completed here".into())),
    };
    let note_path = *uri == format!("{NOTE_SCHEME}{{+path}}") && argument == "path";
    let matching = if note_path {
        note_paths(app, tenant)
            .await?
            .into_iter()
            .filter(|path| path.starts_with(typed.as_str()))
            .collect()
    } else {
        Vec::new()
    };
    Ok(Ok(completion(matching)))
}

/// A resource as it reads now, hashed; `None`: it could not be read (the
/// look after tries again).
/// What a resource's version is, read cheaply: a note's modification
/// time and size (a stat, not its text), a transcript's session's last
/// event and update time (one row, not its messages). A listen compares
/// these, not the contents (once, 32 listens of a 4 MB transcript,
/// each re-read and hashed every second, took both cores). `None`: it
/// cannot be told now (the look after compares with the one before).
pub(super) async fn version(app: &Shared, tenant: &Tenant, uri: &str) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    if let Some(path) = uri.strip_prefix(NOTE_SCHEME) {
        let vault = app.vaults.of_tenant(&tenant.0);
        match vault.resolve(path, false) {
            Ok(note) => match tokio::fs::metadata(&note.absolute).await {
                Ok(meta) => {
                    meta.len().hash(&mut hasher);
                    meta.modified().ok().hash(&mut hasher);
                }
                // Gone (or never there): one version, "none".
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0u8.hash(&mut hasher),
                Err(_) => return None,
            },
            Err(NoteError::Path(_) | NoteError::NotFound(_)) => 0u8.hash(&mut hasher),
            Err(_) => return None,
        }
        return Some(hasher.finish());
    }
    if let Some(id) = uri.strip_prefix(SESSION_SCHEME) {
        let Ok(session) = parse_session_id(id, tenant) else {
            return Some(0);
        };
        match app.turns.get_session(&session).await {
            Ok(Some(record)) => {
                record.last_seq.hash(&mut hasher);
                record.updated_at.hash(&mut hasher);
            }
            Ok(None) => 0u8.hash(&mut hasher),
            Err(_) => return None,
        }
        return Some(hasher.finish());
    }
    Some(0)
}
