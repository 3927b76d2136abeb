//! The vault's index in the store: notes by content hash, their chunks,
//! and full-text search over them (SQLite FTS5, Postgres `tsvector`).

/// A piece of a note, as indexed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VaultChunk {
    /// The nearest heading above the text; empty before the first one.
    pub heading: String,
    /// `path#heading`, or `path` before the first heading: what a citation
    /// of this chunk points at.
    pub anchor: String,
    pub text: String,
}

/// A note to (re-)index: it replaces whatever was indexed at its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedNote {
    /// Path in the vault, `/`-separated (`notes/project.md`).
    pub path: String,
    /// SHA-256 of the file's bytes, hex.
    pub content_hash: String,
    pub bytes: i64,
    pub chunks: Vec<VaultChunk>,
}

/// A chunk that matched a search, best first.
#[derive(Debug, Clone, PartialEq)]
pub struct VaultHit {
    pub path: String,
    pub heading: String,
    pub anchor: String,
    pub text: String,
    /// Higher is better; comparable within one search only.
    pub score: f64,
}

/// Search words a full-text query may carry: letters and digits only, so
/// that nothing in them is query syntax.
pub(super) fn clean_terms(terms: &[String]) -> Vec<String> {
    terms
        .iter()
        .map(|t| {
            t.chars()
                .filter(|c| c.is_alphanumeric())
                .collect::<String>()
        })
        .filter(|t| !t.is_empty())
        .take(32)
        .collect()
}
