//! The vault: a folder of markdown notes, indexed into the store's
//! full-text index and searched by the retrieval tools.
//!
//! Indexing walks the folder (markdown files only; hidden entries and
//! symlinks are skipped, so nothing outside the folder is read), compares
//! each note's SHA-256 with the indexed one, re-chunks the notes that
//! changed ([`chunk`]: by heading, anchored `path#Heading`) and removes
//! the notes that are gone. One indexing runs at a time per process.

pub mod chunk;
mod files;
pub mod paths;
mod search;
mod vaults;

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use serde::Serialize;
use sha2::{Digest, Sha256};

use files::{Found, read_capped, replace_file, walk};
pub use vaults::{Sharing, Vaults};

use crate::{
    providers::embeddings::Embedder,
    store::{IndexedNote, NoteState, StoreError, VaultIndex},
};

/// The chunks' embeddings by chunk id, as read from the store.
type Vectors = Arc<Vec<(i64, Vec<f32>)>>;

/// How long embeddings read from the store are used before they are read
/// again (this process's own index changes drop them at once).
pub const VECTORS_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// Most embeddings ranked by meaning (a larger vault ranks the rest by
/// words only).
pub const MAX_VECTORS: u32 = 20_000;

/// Most notes indexed; a larger vault is indexed up to this many.
pub const MAX_NOTES: usize = 100_000;

/// Largest note indexed, in bytes; a larger one is skipped.
pub const MAX_NOTE_BYTES: u64 = 4 * 1024 * 1024;

/// Skipped notes listed in a report (the count is always whole).
const SKIPPED_LISTED: usize = 100;

/// Common words that say nothing about what to look for.
const STOPWORDS: &[&str] = &[
    "the", "and", "for", "are", "but", "not", "you", "your", "with", "have", "this", "that",
    "what", "when", "where", "which", "who", "how", "why", "was", "were", "can", "could", "would",
    "should", "about", "from", "into", "there", "their", "them", "they", "then", "than", "been",
    "being", "does", "did", "done", "just", "like", "some", "any", "all", "my", "me", "our", "its",
    "it's", "is", "of", "to", "in", "on", "a", "an", "do",
];

/// The words of a query worth searching for, lower-case, deduplicated.
pub fn query_terms(query: &str) -> Vec<String> {
    let mut seen = HashSet::new();
    query
        .split(|c: char| !c.is_alphanumeric())
        .map(str::to_lowercase)
        .filter(|w| w.chars().count() > 2 && !STOPWORDS.contains(&w.as_str()))
        .filter(|w| seen.insert(w.clone()))
        .collect()
}

/// Why the vault could not be indexed.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("the vault folder {0} does not exist")]
    Missing(PathBuf),
    #[error("cannot read the vault: {0}")]
    Io(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A note indexing left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SkippedNote {
    pub path: String,
    pub reason: String,
}

/// What an indexing did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct IndexReport {
    /// Markdown notes found.
    pub notes: usize,
    pub added: usize,
    pub updated: usize,
    pub unchanged: usize,
    /// Notes indexed before and gone now.
    pub removed: usize,
    /// Chunks written for the added and updated notes.
    pub chunks: usize,
    /// Of those, the chunks embedded (0 without an embedding model, or
    /// when the embeddings endpoint failed: then only words rank).
    pub embedded_chunks: usize,
    pub skipped_count: usize,
    /// The first skipped notes, with the reason.
    pub skipped: Vec<SkippedNote>,
    pub took_ms: u64,
}

impl IndexReport {
    fn skip(&mut self, path: String, reason: impl Into<String>) {
        self.skipped_count += 1;
        if self.skipped.len() < SKIPPED_LISTED {
            self.skipped.push(SkippedNote {
                path,
                reason: reason.into(),
            });
        }
    }

    /// One line for logs and the terminal.
    pub fn summary(&self) -> String {
        format!(
            "{} notes: {} added, {} updated, {} unchanged, {} removed, {} skipped; {} chunks written ({} embedded) in {} ms",
            self.notes,
            self.added,
            self.updated,
            self.unchanged,
            self.removed,
            self.skipped_count,
            self.chunks,
            self.embedded_chunks,
            self.took_ms
        )
    }
}

/// Where indexing is, for a progress bar: `done` of `total` notes.
pub trait Progress: Send + Sync {
    fn found(&self, _total: usize) {}
    fn indexed(&self, _done: usize, _path: &str) {}
}

/// No progress shown.
impl Progress for () {}

/// Why a note could not be read, written or restored.
#[derive(Debug, thiserror::Error)]
pub enum NoteError {
    #[error(transparent)]
    Path(#[from] paths::PathError),
    #[error("there is no note {0}")]
    NotFound(String),
    #[error("{path} is larger than {MAX_NOTE_BYTES} bytes")]
    TooLarge { path: String },
    #[error("{0} is not UTF-8 text")]
    NotText(String),
    #[error("{0}")]
    Io(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The vault is shared, and only the operator's tenant writes to it.
    #[error("this vault is shared and read-only here (HARNESS_VAULT_SHARED_WRITABLE)")]
    ReadOnly,
}

/// How a write changes a note.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// The content replaces the note (or makes it).
    Replace,
    /// The content is added at the end, on a line of its own.
    Append,
}

/// What became of a write that started, told from the note's
/// checkpoint ([`Vault::settle_write`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteSettled {
    /// The note is what the write makes: its path and size.
    Landed { path: String, bytes: usize },
    /// The note is as the checkpoint saved it.
    NotLanded,
    /// The note is neither: something else changed it since.
    Changed,
}

/// What a write of `content` makes of a note that is `now`.
fn written(
    note: &paths::NotePath,
    now: Option<&[u8]>,
    content: &str,
    mode: WriteMode,
) -> Result<String, NoteError> {
    let mut text = match (mode, now) {
        (WriteMode::Replace, _) | (WriteMode::Append, None) => String::new(),
        (WriteMode::Append, Some(bytes)) => std::str::from_utf8(bytes)
            .map_err(|_| NoteError::NotText(note.relative.clone()))?
            .to_owned(),
    };
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(content);
    Ok(text)
}

/// The vault folder and the index of it.
pub struct Vault {
    root: PathBuf,
    /// Which vault of the index this is: `""` for the default tenant's
    /// (and the shared one), else its tenant (see `store::vault::note_key`).
    name: String,
    /// Writes are refused (a shared vault, for the tenants other than the
    /// operator's, unless they may write).
    read_only: bool,
    store: Arc<dyn VaultIndex>,
    indexing: tokio::sync::Mutex<()>,
    /// One write at a time in this process, so that an append never loses
    /// another.
    writing: tokio::sync::Mutex<()>,
    /// Ranks by meaning beside words, when configured.
    embedder: Option<Arc<dyn Embedder>>,
    /// The chunks' embeddings, read from the store at most every
    /// [`VECTORS_FRESH_FOR`] (sooner after this process changed the index).
    vectors: tokio::sync::Mutex<Option<(Instant, Vectors)>>,
}

impl Vault {
    pub fn new(root: impl Into<PathBuf>, store: Arc<dyn VaultIndex>) -> Self {
        Self {
            root: root.into(),
            name: String::new(),
            read_only: false,
            store,
            indexing: tokio::sync::Mutex::new(()),
            writing: tokio::sync::Mutex::new(()),
            embedder: None,
            vectors: tokio::sync::Mutex::new(None),
        }
    }

    /// Another vault of the same index and embedder: named `name` in the
    /// index, at `root`.
    pub fn sibling(&self, name: &str, root: PathBuf, read_only: bool) -> Self {
        Self {
            root,
            name: name.to_owned(),
            read_only,
            embedder: self.embedder.clone(),
            ..Self::new(PathBuf::new(), self.store.clone())
        }
    }

    /// Its name in the index (`""`: the default tenant's, or the shared).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn writable(&self) -> Result<(), NoteError> {
        if self.read_only {
            Err(NoteError::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// The embedder, when the vault has one (memory shares it).
    pub fn embedder(&self) -> Option<Arc<dyn Embedder>> {
        self.embedder.clone()
    }

    /// Embeds chunks with `embedder` and ranks searches by words and
    /// meaning together.
    pub fn with_embedder(mut self, embedder: Arc<dyn Embedder>) -> Self {
        self.embedder = Some(embedder);
        self
    }

    /// The embeddings of `texts`, or `None` (logged) when there is no
    /// embedder or it failed: the text index works without them.
    async fn embed(&self, texts: &[String]) -> Option<(String, Vec<Vec<f32>>)> {
        let embedder = self.embedder.as_ref()?;
        match embedder.embed(texts).await {
            Ok(vectors) => Some((embedder.model_id().to_owned(), vectors)),
            Err(e) => {
                tracing::warn!(error = %e, "embeddings unavailable; indexed for full-text search only");
                None
            }
        }
    }

    /// The note as the index should hold it, embedded when it can be.
    async fn indexed(&self, relative: &str, text: &str) -> IndexedNote {
        let mut chunks = chunk::chunk_note(relative, text);
        let texts: Vec<String> = chunks
            .iter()
            .map(|c| format!("{}\n{}", c.heading, c.text))
            .collect();
        let mut embedding_model = None;
        if let Some((model, vectors)) = self.embed(&texts).await {
            for (chunk, vector) in chunks.iter_mut().zip(vectors) {
                chunk.embedding = Some(vector);
            }
            embedding_model = Some(model);
        }
        // The cached vectors no longer match the index.
        *self.vectors.lock().await = None;
        IndexedNote {
            path: relative.to_owned(),
            content_hash: hex::encode(Sha256::digest(text.as_bytes())),
            bytes: i64::try_from(text.len()).unwrap_or(i64::MAX),
            embedding_model,
            chunks,
        }
    }

    /// The note `path` names, checked against the folder (which a write
    /// creates when it is missing).
    pub fn resolve(&self, path: &str, for_write: bool) -> Result<paths::NotePath, NoteError> {
        if for_write {
            std::fs::create_dir_all(&self.root)
                .map_err(|e| NoteError::Io(format!("cannot create the vault folder: {e}")))?;
        }
        let root = self.canonical_root().map_err(|e| match e {
            VaultError::Missing(_) => NoteError::NotFound(path.to_owned()),
            other => NoteError::Io(other.to_string()),
        })?;
        Ok(paths::resolve(&root, path)?)
    }

    /// The text of a note.
    pub async fn read_note(&self, path: &str) -> Result<(paths::NotePath, String), NoteError> {
        let note = self.resolve(path, false)?;
        let bytes = read_capped(&note)
            .await?
            .ok_or_else(|| NoteError::NotFound(note.relative.clone()))?;
        let text =
            String::from_utf8(bytes).map_err(|_| NoteError::NotText(note.relative.clone()))?;
        Ok((note, text))
    }

    /// The bytes of a note as they are now (`None`: there is none), for a
    /// checkpoint.
    pub async fn snapshot(
        &self,
        path: &str,
    ) -> Result<(paths::NotePath, Option<Vec<u8>>), NoteError> {
        let note = self.resolve(path, true)?;
        let bytes = read_capped(&note).await?;
        Ok((note, bytes))
    }

    /// Writes a note (atomically: a temporary file renamed over it) and
    /// indexes it. Returns its path in the vault and its size.
    pub async fn write_note(
        &self,
        path: &str,
        content: &str,
        mode: WriteMode,
    ) -> Result<(String, usize), NoteError> {
        self.writable()?;
        let _one_at_a_time = self.writing.lock().await;
        let note = self.resolve(path, true)?;
        let now = match mode {
            WriteMode::Replace => None,
            WriteMode::Append => read_capped(&note).await?,
        };
        let text = written(&note, now.as_deref(), content, mode)?;
        if text.len() as u64 > MAX_NOTE_BYTES {
            return Err(NoteError::TooLarge {
                path: note.relative,
            });
        }
        replace_file(&note.absolute, Some(text.as_bytes())).await?;
        self.index_one(&note.relative, Some(text.as_bytes()))
            .await?;
        Ok((note.relative, text.len()))
    }

    /// Whether a [`Vault::write_note`] of `content` that started when the
    /// note was `before` (its checkpoint) took effect: the note is what
    /// the write makes of `before` (it landed: the index is brought in line
    /// and the write's answer returned, as `write_note` gives it), or it is
    /// still `before` (it did not), or it is neither (it changed since:
    /// nothing tells).
    pub async fn settle_write(
        &self,
        path: &str,
        content: &str,
        mode: WriteMode,
        before: Option<&[u8]>,
    ) -> Result<WriteSettled, NoteError> {
        let _one_at_a_time = self.writing.lock().await;
        let note = self.resolve(path, true)?;
        let now = read_capped(&note).await?;
        let Ok(landed) = written(&note, before, content, mode) else {
            // `before` was no text: the write refused it, so it changed
            // nothing.
            return Ok(if now.as_deref() == before {
                WriteSettled::NotLanded
            } else {
                WriteSettled::Changed
            });
        };
        if now.as_deref() == Some(landed.as_bytes()) {
            self.index_one(&note.relative, Some(landed.as_bytes()))
                .await?;
            return Ok(WriteSettled::Landed {
                path: note.relative,
                bytes: landed.len(),
            });
        }
        Ok(if now.as_deref() == before {
            WriteSettled::NotLanded
        } else {
            WriteSettled::Changed
        })
    }

    /// Puts a note back as a checkpoint saw it: its bytes, or no file.
    pub async fn restore(&self, path: &str, bytes: Option<&[u8]>) -> Result<String, NoteError> {
        self.writable()?;
        let _one_at_a_time = self.writing.lock().await;
        let note = self.resolve(path, true)?;
        replace_file(&note.absolute, bytes).await?;
        self.index_one(&note.relative, bytes).await?;
        Ok(note.relative)
    }

    /// Brings one note's index in line with `bytes` (`None`: removed).
    async fn index_one(&self, relative: &str, bytes: Option<&[u8]>) -> Result<(), StoreError> {
        match bytes.map(std::str::from_utf8) {
            Some(Ok(text)) => {
                let note = self.indexed(relative, text).await;
                self.store.vault_put_note(&self.name, &note).await
            }
            Some(Err(_)) | None => {
                *self.vectors.lock().await = None;
                self.store
                    .vault_remove_notes(&self.name, &[relative.to_owned()])
                    .await
                    .map(drop)
            }
        }
    }

    /// The folder as configured.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The folder with symlinks resolved; [`VaultError::Missing`] when it
    /// does not exist.
    pub fn canonical_root(&self) -> Result<PathBuf, VaultError> {
        std::fs::canonicalize(&self.root).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => VaultError::Missing(self.root.clone()),
            _ => VaultError::Io(format!("{}: {e}", self.root.display())),
        })
    }

    /// Brings the index in line with the folder. An indexing already
    /// running is waited for, then this one runs (it sees what changed
    /// since).
    pub async fn reindex(&self, progress: &dyn Progress) -> Result<IndexReport, VaultError> {
        let _one_at_a_time = self.indexing.lock().await;
        let started = Instant::now();
        let root = match self.canonical_root() {
            Ok(root) => root,
            // A tenant's vault is made by its first write: until then it
            // is empty (and its path no business of the tenant's).
            Err(VaultError::Missing(_)) if !self.name.is_empty() => {
                let gone: Vec<String> = self
                    .store
                    .vault_notes(&self.name)
                    .await?
                    .into_keys()
                    .collect();
                let removed = self.store.vault_remove_notes(&self.name, &gone).await?;
                return Ok(IndexReport {
                    removed: usize::try_from(removed).unwrap_or(usize::MAX),
                    ..IndexReport::default()
                });
            }
            Err(e) => return Err(e),
        };
        #[expect(
            clippy::disallowed_methods,
            reason = "awaited here: the walk ends before this call does"
        )]
        let walked = tokio::task::spawn_blocking(move || walk(&root));
        let (found, mut report) = walked
            .await
            .map_err(|e| VaultError::Io(format!("the folder walk stopped: {e}")))??;
        report.notes = found.len();
        progress.found(found.len());
        let mut indexed: HashMap<String, NoteState> = self.store.vault_notes(&self.name).await?;
        for (done, note) in found.iter().enumerate() {
            let previous = indexed.remove(&note.relative);
            self.index_note(note, previous.as_ref(), &mut report)
                .await?;
            progress.indexed(done + 1, &note.relative);
        }
        let gone: Vec<String> = indexed.into_keys().collect();
        report.removed = usize::try_from(self.store.vault_remove_notes(&self.name, &gone).await?)
            .unwrap_or(usize::MAX);
        report.took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(report)
    }

    async fn index_note(
        &self,
        note: &Found,
        previous: Option<&NoteState>,
        report: &mut IndexReport,
    ) -> Result<(), VaultError> {
        let bytes = match tokio::fs::read(&note.absolute).await {
            Ok(bytes) => bytes,
            Err(e) => {
                report.skip(note.relative.clone(), format!("cannot read: {e}"));
                return Ok(());
            }
        };
        let hash = hex::encode(Sha256::digest(&bytes));
        let model = self.embedder.as_ref().map(|e| e.model_id());
        let current = previous.is_some_and(|p| {
            p.content_hash == hash && (model.is_none() || p.embedding_model.as_deref() == model)
        });
        if current {
            report.unchanged += 1;
            return Ok(());
        }
        let Ok(text) = String::from_utf8(bytes) else {
            report.skip(note.relative.clone(), "not UTF-8 text");
            return Ok(());
        };
        let indexed = self.indexed(&note.relative, &text).await;
        report.chunks += indexed.chunks.len();
        if indexed.embedding_model.is_some() {
            report.embedded_chunks += indexed.chunks.len();
        }
        self.store.vault_put_note(&self.name, &indexed).await?;
        if previous.is_some() {
            report.updated += 1;
        } else {
            report.added += 1;
        }
        Ok(())
    }
}
