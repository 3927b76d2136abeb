//! The vault's files: a note read within its size cap, written whole
//! (through a temporary file renamed over it), and the folder walked for
//! markdown notes.

use std::path::{Path, PathBuf};

use super::{IndexReport, MAX_NOTE_BYTES, MAX_NOTES, NoteError, VaultError, paths};

/// A markdown file found in the vault.
pub(super) struct Found {
    pub(super) relative: String,
    pub(super) absolute: PathBuf,
}

/// The bytes of a note, `None` when there is no file; a note over
/// [`MAX_NOTE_BYTES`] is refused.
pub(super) async fn read_capped(note: &paths::NotePath) -> Result<Option<Vec<u8>>, NoteError> {
    match tokio::fs::metadata(&note.absolute).await {
        Ok(meta) if !meta.is_file() => {
            Err(NoteError::Io(format!("{} is not a file", note.relative)))
        }
        Ok(meta) if meta.len() > MAX_NOTE_BYTES => Err(NoteError::TooLarge {
            path: note.relative.clone(),
        }),
        Ok(_) => tokio::fs::read(&note.absolute)
            .await
            .map(Some)
            .map_err(|e| NoteError::Io(format!("cannot read {}: {e}", note.relative))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(NoteError::Io(format!("cannot read {}: {e}", note.relative))),
    }
}

/// Makes `path` hold `bytes` (`None`: removes it), through a temporary
/// file beside it renamed over it, so that a reader never sees half.
pub(super) async fn replace_file(path: &Path, bytes: Option<&[u8]>) -> Result<(), NoteError> {
    let shown = |e: std::io::Error| NoteError::Io(format!("cannot write {}: {e}", path.display()));
    let Some(bytes) = bytes else {
        return match tokio::fs::remove_file(path).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(shown(e)),
            _ => Ok(()),
        };
    };
    let parent = path
        .parent()
        .ok_or_else(|| NoteError::Io("a note needs a folder".into()))?;
    tokio::fs::create_dir_all(parent).await.map_err(shown)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("note");
    let temporary = parent.join(format!(".{name}.{}.tmp", uuid::Uuid::now_v7()));
    if let Err(e) = tokio::fs::write(&temporary, bytes).await {
        let _ = tokio::fs::remove_file(&temporary).await;
        return Err(shown(e));
    }
    if let Err(e) = tokio::fs::rename(&temporary, path).await {
        let _ = tokio::fs::remove_file(&temporary).await;
        return Err(shown(e));
    }
    Ok(())
}

/// The markdown files under `root`, sorted by path, and a report of what
/// was left out. Hidden entries and symlinks are not followed; at most
/// [`MAX_NOTES`].
pub(super) fn walk(root: &Path) -> Result<(Vec<Found>, IndexReport), VaultError> {
    let mut found = Vec::new();
    let mut skipped = IndexReport::default();
    let mut folders = vec![(root.to_path_buf(), String::new())];
    while let Some((folder, prefix)) = folders.pop() {
        let entries = std::fs::read_dir(&folder)
            .map_err(|e| VaultError::Io(format!("{}: {e}", folder.display())))?;
        for entry in entries {
            let entry = entry.map_err(|e| VaultError::Io(format!("{}: {e}", folder.display())))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                skipped.skip(
                    format!("{prefix}{}", entry.file_name().to_string_lossy()),
                    "the name is not UTF-8",
                );
                continue;
            };
            if name.starts_with('.') {
                continue;
            }
            let relative = format!("{prefix}{name}");
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_symlink() {
                if paths::is_markdown(&name) {
                    skipped.skip(relative, "a symlink (not followed)");
                }
            } else if kind.is_dir() {
                folders.push((entry.path(), format!("{relative}/")));
            } else if kind.is_file() && paths::is_markdown(&name) {
                let too_big = entry.metadata().is_ok_and(|m| m.len() > MAX_NOTE_BYTES);
                if too_big {
                    skipped.skip(relative, format!("larger than {MAX_NOTE_BYTES} bytes"));
                } else if found.len() >= MAX_NOTES {
                    skipped.skip(relative, format!("the vault has over {MAX_NOTES} notes"));
                } else {
                    found.push(Found {
                        relative,
                        absolute: entry.path(),
                    });
                }
            }
        }
    }
    found.sort_by(|a, b| a.relative.cmp(&b.relative));
    Ok((found, skipped))
}
