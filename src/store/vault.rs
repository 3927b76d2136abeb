//! The vault's index in the store: notes by content hash, their chunks,
//! and full-text search over them (SQLite FTS5, Postgres `tsvector`).

/// A piece of a note, as indexed.
#[derive(Debug, Clone, PartialEq)]
pub struct VaultChunk {
    /// The nearest heading above the text; empty before the first one.
    pub heading: String,
    /// `path#heading`, or `path` before the first heading: what a citation
    /// of this chunk points at.
    pub anchor: String,
    pub text: String,
    /// The text's embedding, when the vault has an embedding model.
    pub embedding: Option<Vec<f32>>,
}

/// A note to (re-)index: it replaces whatever was indexed at its path.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexedNote {
    /// Path in the vault, `/`-separated (`notes/project.md`).
    pub path: String,
    /// SHA-256 of the file's bytes, hex.
    pub content_hash: String,
    pub bytes: i64,
    /// The model that embedded the chunks; `None`: not embedded.
    pub embedding_model: Option<String>,
    pub chunks: Vec<VaultChunk>,
}

/// What the index holds of a note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoteState {
    pub content_hash: String,
    pub embedding_model: Option<String>,
}

/// A chunk that matched a search, best first.
#[derive(Debug, Clone, PartialEq)]
pub struct VaultHit {
    /// The chunk's row (it changes when its note is indexed again).
    pub id: i64,
    pub path: String,
    pub heading: String,
    pub anchor: String,
    pub text: String,
    /// Higher is better; comparable within one search only.
    pub score: f64,
}

/// An embedding as stored: f32, little-endian.
pub fn vector_bytes(vector: &[f32]) -> Vec<u8> {
    vector.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// An embedding read back; `None` when the bytes are not whole floats.
pub fn vector_of(bytes: &[u8]) -> Option<Vec<f32>> {
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    )
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
