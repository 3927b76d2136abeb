//! A tenant's files: an upload read into a spooled copy (never whole in
//! memory), what its bytes are (checked against the allow-list by their
//! first bytes, not only by what the client declared), and its put into
//! the store under the service's limits.

use std::path::Path;

use chrono::Utc;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::store::{FilePut, FileRecord, Store, StoreError};

/// What an OpenAI-compatible provider is sent for an image a message
/// gave by URL (`HARNESS_FILE_URLS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum FileUrls {
    /// A data URL of the stored bytes.
    #[default]
    Inline,
    /// The URL the client gave.
    Pass,
}

/// What a file may be: its size, and what a tenant's files may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimits {
    /// Bytes one file has at most (`HARNESS_FILE_MAX_BYTES`).
    pub max_bytes: u64,
    /// Bytes a tenant's files take at most, each stored byte once
    /// (`HARNESS_TENANT_FILE_BYTES`).
    pub tenant_bytes: u64,
}

/// The settings' defaults: 20 MiB a file, 1 GiB a tenant.
impl Default for FileLimits {
    fn default() -> Self {
        Self {
            max_bytes: 20 * 1024 * 1024,
            tenant_bytes: 1024 * 1024 * 1024,
        }
    }
}

/// Bytes a file's name has at most.
pub const FILENAME_MAX: usize = 255;

/// The purposes a file may be uploaded for (OpenAI's, and `inline`: a
/// message carried it).
pub const PURPOSES: &[&str] = &[
    "user_data",
    "vision",
    "assistants",
    "batch",
    "fine-tune",
    "evals",
];

/// The media types a file may be, and what they are.
pub const MEDIA_TYPES: &[(&str, Kind)] = &[
    ("image/png", Kind::Image),
    ("image/jpeg", Kind::Image),
    ("image/webp", Kind::Image),
    ("image/gif", Kind::Image),
    ("application/pdf", Kind::Pdf),
    ("text/plain", Kind::Text),
    ("text/markdown", Kind::Text),
    ("text/csv", Kind::Text),
    ("application/json", Kind::Text),
];

/// What a file is, to a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Image,
    Pdf,
    Text,
}

/// What an allowed media type is; `None`: not allowed.
pub fn kind_of(media_type: &str) -> Option<Kind> {
    MEDIA_TYPES
        .iter()
        .find(|(name, _)| *name == media_type)
        .map(|(_, kind)| *kind)
}

/// Why a file was refused.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Over [`FileLimits::max_bytes`].
    #[error("a file has at most {limit} bytes")]
    TooLarge { limit: u64 },
    /// Its bytes are not of an allowed type (or not the type declared).
    #[error("{0}")]
    Unsupported(String),
    /// Its bytes would take its tenant past [`FileLimits::tenant_bytes`].
    #[error("this tenant's files take {used} of its {limit} bytes; this one needs {size} more")]
    OverQuota { used: u64, limit: u64, size: u64 },
    #[error("the file is empty")]
    Empty,
    /// The spooled copy could not be written.
    #[error("spooling the upload: {0}")]
    Io(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<std::io::Error> for FileError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e.to_string())
    }
}

/// Bytes of a file kept for telling its type.
const HEAD: usize = 16;

/// An upload on its way to a temporary file: its hash, its size and what
/// its first bytes say, counted as it comes.
pub struct Spool {
    file: tokio::fs::File,
    path: tempfile::TempPath,
    hasher: Sha256,
    bytes: u64,
    max: u64,
    head: Vec<u8>,
    text: Utf8,
}

impl Spool {
    /// A spool that refuses more than `max` bytes.
    pub fn new(max: u64) -> Result<Self, FileError> {
        let (file, path) = tempfile::NamedTempFile::new()?.into_parts();
        Ok(Self {
            file: tokio::fs::File::from_std(file),
            path,
            hasher: Sha256::new(),
            bytes: 0,
            max,
            head: Vec::with_capacity(HEAD),
            text: Utf8::default(),
        })
    }

    /// Adds the next bytes.
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), FileError> {
        self.bytes = self.bytes.saturating_add(chunk.len() as u64);
        if self.bytes > self.max {
            return Err(FileError::TooLarge { limit: self.max });
        }
        let missing = HEAD.saturating_sub(self.head.len()).min(chunk.len());
        self.head.extend_from_slice(&chunk[..missing]);
        self.hasher.update(chunk);
        self.text.feed(chunk);
        self.file.write_all(chunk).await?;
        Ok(())
    }

    /// The whole upload, written.
    pub async fn finish(mut self) -> Result<Spooled, FileError> {
        self.file.flush().await?;
        self.file.sync_data().await?;
        Ok(Spooled {
            path: self.path,
            sha256: hex::encode(self.hasher.finalize()),
            bytes: self.bytes,
            text: self.text.is_text(),
            head: self.head,
        })
    }
}

/// An upload, whole in its temporary file (removed when this is dropped).
pub struct Spooled {
    path: tempfile::TempPath,
    pub sha256: String,
    pub bytes: u64,
    head: Vec<u8>,
    /// UTF-8 without NUL.
    text: bool,
}

impl Spooled {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the bytes are, given what the client declared (`declared`, a
    /// media type, parameters allowed) and the file's name: a type of the
    /// allow-list, or why not.
    pub fn media_type(
        &self,
        declared: Option<&str>,
        filename: &str,
    ) -> Result<&'static str, FileError> {
        let declared = declared
            .map(|d| {
                d.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .filter(|d| !d.is_empty() && d != "application/octet-stream");
        if let Some(found) = binary_type(&self.head) {
            // The bytes say what they are; a declared image or PDF type
            // that is another is refused, a generic one is not.
            return match declared.as_deref() {
                Some(d) if d != found && kind_of(d).is_some_and(|k| k != Kind::Text) => {
                    Err(FileError::Unsupported(format!(
                        "the file was declared `{d}` but its bytes are `{found}`"
                    )))
                }
                Some(d) if d != found && kind_of(d).is_none() => Err(FileError::Unsupported(
                    format!("`{d}` is not a type files may be"),
                )),
                _ => Ok(found),
            };
        }
        if !self.text {
            let what = if self.head.starts_with(b"PK\x03\x04") {
                "a ZIP archive".to_owned()
            } else {
                "not an image, a PDF or text".to_owned()
            };
            let declared = declared.map_or(String::new(), |d| format!(" (declared `{d}`)"));
            return Err(FileError::Unsupported(format!(
                "the file's bytes are {what}{declared}; files may be PNG, JPEG, WebP, GIF, PDF, \
                 plain text, Markdown, CSV or JSON"
            )));
        }
        match declared.as_deref() {
            Some(d) => match MEDIA_TYPES.iter().find(|(name, _)| *name == d) {
                Some((name, Kind::Text)) => Ok(name),
                Some((name, _)) => Err(FileError::Unsupported(format!(
                    "the file was declared `{name}` but its bytes are text"
                ))),
                None => Err(FileError::Unsupported(format!(
                    "`{d}` is not a type files may be: PNG, JPEG, WebP, GIF, PDF, plain text, \
                     Markdown, CSV or JSON"
                ))),
            },
            None => Ok(text_type_of(filename)),
        }
    }
}

/// The type a binary file's first bytes say, of those allowed.
fn binary_type(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if head.starts_with(b"\xff\xd8\xff") {
        Some("image/jpeg")
    } else if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if head.len() >= 12 && head.starts_with(b"RIFF") && &head[8..12] == b"WEBP" {
        Some("image/webp")
    } else if head.starts_with(b"%PDF-") {
        Some("application/pdf")
    } else {
        None
    }
}

/// A text file's type, by its name's extension.
fn text_type_of(filename: &str) -> &'static str {
    let extension = filename
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match extension.as_str() {
        "md" | "markdown" => "text/markdown",
        "csv" => "text/csv",
        "json" => "application/json",
        _ => "text/plain",
    }
}

/// Whether bytes fed in pieces are UTF-8 without NUL.
#[derive(Debug, Default)]
struct Utf8 {
    /// The start of a character the last piece ended inside.
    pending: Vec<u8>,
    broken: bool,
}

impl Utf8 {
    fn feed(&mut self, chunk: &[u8]) {
        if self.broken {
            return;
        }
        if chunk.contains(&0) {
            self.broken = true;
            return;
        }
        let joined;
        let bytes = if self.pending.is_empty() {
            chunk
        } else {
            joined = [self.pending.as_slice(), chunk].concat();
            &joined
        };
        self.pending.clear();
        if let Err(e) = std::str::from_utf8(bytes) {
            match e.error_len() {
                // Cut inside a character: the rest comes with the next.
                None => self.pending.extend_from_slice(&bytes[e.valid_up_to()..]),
                Some(_) => self.broken = true,
            }
        }
    }

    fn is_text(&self) -> bool {
        !self.broken && self.pending.is_empty()
    }
}

/// A file's name as it is kept: its last path segment, without control
/// characters, at most [`FILENAME_MAX`] bytes (`file` when nothing is left).
pub fn clean_filename(name: &str) -> String {
    let last = name.rsplit(['/', '\\']).next().unwrap_or("");
    let mut clean = String::new();
    for c in last.chars().filter(|c| !c.is_control()) {
        if clean.len() + c.len_utf8() > FILENAME_MAX {
            break;
        }
        clean.push(c);
    }
    let clean = clean.trim().to_owned();
    if clean.is_empty() || clean == "." || clean == ".." {
        "file".to_owned()
    } else {
        clean
    }
}

/// What a new file is, besides its bytes.
#[derive(Debug, Clone)]
pub struct NewFile<'a> {
    pub tenant: &'a str,
    pub filename: String,
    pub purpose: &'a str,
    /// The media type the client declared, if it did.
    pub declared: Option<&'a str>,
    pub session_id: Option<String>,
    pub user_id: Option<String>,
}

/// Stores a spooled upload as a new file of its tenant, under `limits`.
pub async fn put(
    store: &dyn Store,
    limits: FileLimits,
    new: NewFile<'_>,
    spooled: &Spooled,
) -> Result<FileRecord, FileError> {
    if spooled.bytes == 0 {
        return Err(FileError::Empty);
    }
    let media_type = spooled.media_type(new.declared, &new.filename)?;
    let file = FileRecord {
        tenant: new.tenant.to_owned(),
        id: format!("file-{}", uuid::Uuid::now_v7().simple()),
        sha256: spooled.sha256.clone(),
        bytes: i64::try_from(spooled.bytes).unwrap_or(i64::MAX),
        media_type: media_type.to_owned(),
        filename: new.filename,
        purpose: new.purpose.to_owned(),
        session_id: new.session_id,
        user_id: new.user_id,
        created_at: Utc::now(),
    };
    match store
        .put_file(&file, spooled.path(), limits.tenant_bytes)
        .await?
    {
        FilePut::Stored { .. } => Ok(file),
        FilePut::OverQuota { used } => Err(FileError::OverQuota {
            used,
            limit: limits.tenant_bytes,
            size: spooled.bytes,
        }),
    }
}

/// A file's bytes, whole (a provider call sends them): its chunks in
/// order.
pub async fn read_all(store: &dyn Store, file: &FileRecord) -> Result<Vec<u8>, StoreError> {
    let mut bytes = Vec::with_capacity(usize::try_from(file.bytes).unwrap_or(0));
    for index in 0..file.chunks() {
        let chunk = store
            .file_chunk(&file.tenant, &file.sha256, index)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("{} lost its bytes", file.id)))?;
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// A message's image or file as a call sends it: `file`'s `bytes`, as
/// `asked` named it.
pub fn attachment(
    asked: &crate::turn::Asked,
    file: FileRecord,
    bytes: Vec<u8>,
) -> crate::providers::Attachment {
    crate::providers::Attachment {
        file_id: file.id,
        media_type: file.media_type,
        filename: asked.filename.clone().unwrap_or(file.filename),
        detail: asked.detail.clone(),
        at: asked.at,
        url: asked.url.clone(),
        data: Some(std::sync::Arc::from(bytes)),
    }
}

/// Whether a file of `media_type` reaches a model as text.
pub fn is_text(media_type: &str) -> bool {
    kind_of(media_type) == Some(Kind::Text)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn spooled(pieces: &[&[u8]]) -> Spooled {
        let mut spool = Spool::new(1 << 20).unwrap();
        for piece in pieces {
            spool.write(piece).await.unwrap();
        }
        spool.finish().await.unwrap()
    }

    #[tokio::test]
    async fn the_bytes_say_what_a_file_is() {
        let png = spooled(&[b"\x89PNG\r\n\x1a\n", b"rest of it"]).await;
        assert_eq!(png.media_type(None, "a.bin").unwrap(), "image/png");
        assert_eq!(
            png.media_type(Some("application/octet-stream"), "x")
                .unwrap(),
            "image/png"
        );
        assert!(matches!(
            png.media_type(Some("image/jpeg"), "a.jpg"),
            Err(FileError::Unsupported(_))
        ));
        let zip = spooled(&[b"PK\x03\x04\x14\x00\x00\x00\xff\xfe"]).await;
        let refused = zip.media_type(Some("image/png"), "a.png").unwrap_err();
        assert!(refused.to_string().contains("ZIP"), "{refused}");
        let webp = spooled(&[b"RIFF\x10\x00\x00\x00WEBPVP8 "]).await;
        assert_eq!(webp.media_type(None, "a").unwrap(), "image/webp");
        let pdf = spooled(&[b"%PDF-1.7\n"]).await;
        assert_eq!(
            pdf.media_type(Some("application/pdf"), "a").unwrap(),
            "application/pdf"
        );
    }

    #[tokio::test]
    async fn text_is_utf8_without_nul_even_cut_inside_a_character() {
        // "é" is C3 A9: cut between the two.
        let text = spooled(&[b"caf\xc3", b"\xa9,1\n"]).await;
        assert_eq!(text.media_type(None, "a.csv").unwrap(), "text/csv");
        assert_eq!(
            text.media_type(Some("text/markdown"), "a").unwrap(),
            "text/markdown"
        );
        assert!(matches!(
            text.media_type(Some("image/png"), "a.png"),
            Err(FileError::Unsupported(_))
        ));
        assert!(matches!(
            text.media_type(Some("text/html"), "a.html"),
            Err(FileError::Unsupported(_))
        ));
        let cut = spooled(&[b"caf\xc3"]).await;
        assert!(cut.media_type(None, "a.txt").is_err());
        let nul = spooled(&[b"a\0b"]).await;
        assert!(nul.media_type(Some("text/plain"), "a.txt").is_err());
    }

    #[tokio::test]
    async fn a_spool_refuses_past_its_limit() {
        let mut spool = Spool::new(4).unwrap();
        spool.write(b"abcd").await.unwrap();
        assert!(matches!(
            spool.write(b"e").await,
            Err(FileError::TooLarge { limit: 4 })
        ));
    }

    #[test]
    fn a_filename_keeps_its_last_segment_only() {
        assert_eq!(clean_filename("../../etc/passwd"), "passwd");
        assert_eq!(clean_filename("C:\\x\\report.pdf"), "report.pdf");
        assert_eq!(clean_filename("a\u{0}b\nc.txt"), "abc.txt");
        assert_eq!(clean_filename(".."), "file");
        assert_eq!(clean_filename(&"é".repeat(200)).len(), 254);
    }
}
