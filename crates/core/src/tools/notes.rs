//! Tools over the vault's notes: `read_note` (read-only), `write_note` and
//! `append_note` (local writes; the harness takes a checkpoint of the note
//! before either runs, so that the write can be undone).
//!
//! A path is checked before the call runs ([`Tool::check`]: relative,
//! no `..`, nothing hidden, markdown, no symlink out of the vault); a
//! refused path is a validation denial. Each call's resource key is
//! `note:{path}`, so that calls on one note never share a wave.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{
    Citation, EffectClass, Saved, Settled, Tool, ToolContext, ToolError, ToolErrorKind, ToolOutput,
    ToolSpec,
};
use crate::vault::{NoteError, Vault, Vaults, WriteMode, WriteSettled, paths};

/// Largest content one write takes, in bytes.
pub const MAX_WRITE_BYTES: usize = 1024 * 1024;

/// The resource key of the note a call names: its path as the vault
/// keys it, or the text given when it is no path at all.
pub fn note_key(arguments: &Value) -> Vec<String> {
    let raw = arguments["path"].as_str().unwrap_or_default();
    let normal: Vec<&str> = raw
        .trim()
        .split(['/', '\\'])
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    vec![format!("note:{}", normal.join("/"))]
}

/// The path of a note key (`note:notes/a.md` → `notes/a.md`).
pub fn path_of_key(key: &str) -> Option<&str> {
    key.strip_prefix("note:")
}

fn check_path(vault: &Vault, arguments: &Value, for_write: bool) -> Result<(), String> {
    let path = arguments["path"]
        .as_str()
        .ok_or_else(|| "`path` is required".to_owned())?;
    // A read of a vault that does not exist yet finds nothing; the shape
    // of the path is still checked.
    let root = vault.canonical_root().ok();
    match root {
        Some(root) => paths::resolve(&root, path).map(drop),
        None => paths::resolve(vault.root(), path).map(drop),
    }
    .map_err(|e| e.to_string())?;
    if for_write {
        let content = arguments["content"].as_str().unwrap_or_default();
        if content.len() > MAX_WRITE_BYTES {
            return Err(format!("`content` is larger than {MAX_WRITE_BYTES} bytes"));
        }
    }
    Ok(())
}

fn tool_error(e: NoteError) -> ToolError {
    match e {
        NoteError::Path(e) => ToolError::new(ToolErrorKind::PermissionDenied, e.to_string(), false),
        NoteError::ReadOnly => {
            ToolError::new(ToolErrorKind::PermissionDenied, e.to_string(), false)
        }
        NoteError::NotFound(_) => ToolError::new(ToolErrorKind::NotFound, e.to_string(), true),
        NoteError::TooLarge { .. } | NoteError::NotText(_) => {
            ToolError::new(ToolErrorKind::InvalidInput, e.to_string(), true)
        }
        NoteError::Io(_) | NoteError::Store(_) => {
            ToolError::new(ToolErrorKind::Unavailable, e.to_string(), true)
        }
    }
}

fn path_argument(arguments: &Value) -> Result<&str, ToolError> {
    arguments["path"]
        .as_str()
        .ok_or_else(|| ToolError::new(ToolErrorKind::InvalidInput, "`path` is required", true))
}

/// `read_note`: a whole note by its path.
pub struct ReadNote {
    vaults: Arc<Vaults>,
    spec: ToolSpec,
}

impl ReadNote {
    pub fn new(vaults: Arc<Vaults>) -> Self {
        Self {
            vaults,
            spec: ToolSpec::new(
                "read_note",
                "Read a whole note of the user's vault by its path (e.g. notes/project.md, \
                 as local_search and get_context_pack anchors name it, without the #heading).",
                json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "minLength": 1, "description": "Path of the note in the vault."}
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }),
                EffectClass::ReadOnly,
            ),
        }
    }
}

#[async_trait]
impl Tool for ReadNote {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn resource_keys(&self, arguments: &Value) -> Vec<String> {
        note_key(arguments)
    }

    fn check(&self, arguments: &Value) -> Result<(), String> {
        check_path(self.vaults.default_vault(), arguments, false)
    }

    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let path = path_argument(&arguments)?;
        let vault = self.vaults.of_session(&ctx.session_id);
        let (note, text) = vault.read_note(path).await.map_err(tool_error)?;
        Ok(ToolOutput {
            content: text,
            citations: vec![Citation::Local {
                anchor: note.relative,
            }],
        })
    }
}

/// `write_note` and `append_note`.
pub struct WriteNote {
    vaults: Arc<Vaults>,
    mode: WriteMode,
    spec: ToolSpec,
}

impl WriteNote {
    /// `write_note`: replaces a note, or makes it.
    pub fn replace(vaults: Arc<Vaults>) -> Self {
        Self::new(
            vaults,
            WriteMode::Replace,
            "write_note",
            "Write a note of the user's vault: the content replaces the note (or makes it). \
             The user can undo the write.",
        )
    }

    /// `append_note`: adds to the end of a note, or makes it.
    pub fn append(vaults: Arc<Vaults>) -> Self {
        Self::new(
            vaults,
            WriteMode::Append,
            "append_note",
            "Add text at the end of a note of the user's vault, on a line of its own \
             (the note is made if missing). The user can undo the write.",
        )
    }

    fn new(vaults: Arc<Vaults>, mode: WriteMode, name: &str, description: &str) -> Self {
        Self {
            vaults,
            mode,
            spec: ToolSpec::new(
                name,
                description,
                json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "minLength": 1, "description": "Path of the note in the vault, ending in .md."},
                        "content": {"type": "string", "description": "Markdown text."}
                    },
                    "required": ["path", "content"],
                    "additionalProperties": false
                }),
                EffectClass::LocalWrite,
            ),
        }
    }
}

#[async_trait]
impl Tool for WriteNote {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn resource_keys(&self, arguments: &Value) -> Vec<String> {
        note_key(arguments)
    }

    fn check(&self, arguments: &Value) -> Result<(), String> {
        check_path(self.vaults.default_vault(), arguments, true)
    }

    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let path = path_argument(&arguments)?;
        let content = arguments["content"].as_str().ok_or_else(|| {
            ToolError::new(ToolErrorKind::InvalidInput, "`content` is required", true)
        })?;
        let (relative, bytes) = self
            .vaults
            .of_session(&ctx.session_id)
            .write_note(path, content, self.mode)
            .await
            .map_err(tool_error)?;
        Ok(self.answer(&relative, bytes))
    }

    async fn settle(&self, session_id: &str, arguments: &Value, before: &[Saved]) -> Settled {
        let (Ok(path), Some(content)) = (path_argument(arguments), arguments["content"].as_str())
        else {
            return Settled::Unknown;
        };
        // The checkpoint gate saved the note before the write; with no
        // checkpoint, the write never ran.
        let Some(saved) = before.last() else {
            return Settled::NotLanded;
        };
        match self
            .vaults
            .of_session(session_id)
            .settle_write(path, content, self.mode, saved.content.as_deref())
            .await
        {
            Ok(WriteSettled::Landed { path, bytes }) => Settled::Landed(self.answer(&path, bytes)),
            Ok(WriteSettled::NotLanded) => Settled::NotLanded,
            Ok(WriteSettled::Changed) => Settled::Unknown,
            Err(e) => {
                tracing::warn!(error = %e, "a started write cannot be checked against its checkpoint");
                Settled::Unknown
            }
        }
    }
}

impl WriteNote {
    /// What a write answers.
    fn answer(&self, relative: &str, bytes: usize) -> ToolOutput {
        let done = match self.mode {
            WriteMode::Replace => "Wrote",
            WriteMode::Append => "Appended to",
        };
        ToolOutput::text(format!("{done} {relative} ({bytes} bytes now)."))
    }
}
