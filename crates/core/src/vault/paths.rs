//! Paths a tool names, checked against the vault root: relative, without
//! `..`, hidden parts or a way out through a symlink, and markdown.

use std::path::{Component, Path, PathBuf};

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path is empty")]
    Empty,
    #[error("the path must be relative to the vault, not absolute")]
    Absolute,
    #[error("the path must not contain `..`")]
    Traversal,
    #[error("the path must not name hidden files or folders")]
    Hidden,
    #[error("only markdown notes (.md) can be read or written")]
    NotMarkdown,
    #[error("the path leads out of the vault (through a symlink)")]
    Escapes,
    #[error("the path is not valid: {0}")]
    Invalid(String),
}

/// Whether `name` is a markdown file name.
pub fn is_markdown(name: &str) -> bool {
    Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("md") || e.eq_ignore_ascii_case("markdown"))
}

/// A note's path in the vault, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotePath {
    /// `/`-separated, relative to the root: the index's key and the anchor.
    pub relative: String,
    /// Where the file is (or would be) on disk.
    pub absolute: PathBuf,
}

/// Checks `requested` against the vault at `root` (canonical). Every
/// part of the path that exists is resolved (symlinks included) and must
/// stay under `root`.
pub fn resolve(root: &Path, requested: &str) -> Result<NotePath, PathError> {
    let requested = requested.trim();
    if requested.is_empty() {
        return Err(PathError::Empty);
    }
    if requested.contains('\0') {
        return Err(PathError::Invalid("it contains a NUL character".into()));
    }
    if requested.starts_with(['/', '\\']) || requested.contains(':') {
        return Err(PathError::Absolute);
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in requested.split(['/', '\\']) {
        match part {
            "" | "." => {}
            ".." => return Err(PathError::Traversal),
            hidden if hidden.starts_with('.') => return Err(PathError::Hidden),
            name => parts.push(name),
        }
    }
    let Some(name) = parts.last() else {
        return Err(PathError::Empty);
    };
    if !is_markdown(name) {
        return Err(PathError::NotMarkdown);
    }
    let relative = parts.join("/");
    let absolute = parts
        .iter()
        .fold(root.to_path_buf(), |p, part| p.join(part));
    if !Path::new(&relative)
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(PathError::Invalid(relative));
    }
    // The deepest part that exists decides where the path really leads.
    let mut existing = absolute.as_path();
    loop {
        if std::fs::symlink_metadata(existing).is_ok() {
            let real = std::fs::canonicalize(existing).map_err(|_| PathError::Escapes)?;
            if !real.starts_with(root) {
                return Err(PathError::Escapes);
            }
            break;
        }
        match existing.parent() {
            Some(parent) if parent.starts_with(root) => existing = parent,
            _ => break,
        }
    }
    Ok(NotePath { relative, absolute })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_leave_the_vault_or_are_not_notes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        for (path, error) in [
            ("", PathError::Empty),
            ("/etc/passwd.md", PathError::Absolute),
            ("\\\\server\\x.md", PathError::Absolute),
            ("C:/x.md", PathError::Absolute),
            ("../x.md", PathError::Traversal),
            ("notes/../../x.md", PathError::Traversal),
            (".git/config.md", PathError::Hidden),
            ("notes/.hidden.md", PathError::Hidden),
            ("notes/script.sh", PathError::NotMarkdown),
            ("notes/", PathError::NotMarkdown),
        ] {
            assert_eq!(resolve(&root, path), Err(error), "{path:?}");
        }
        let ok = resolve(&root, "./notes//project.md").unwrap();
        assert_eq!(ok.relative, "notes/project.md");
        assert_eq!(ok.absolute, root.join("notes").join("project.md"));
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_out_of_the_vault_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.md"), "s").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.md"), root.join("link.md")).unwrap();
        std::fs::write(root.join("inside.md"), "i").unwrap();
        std::os::unix::fs::symlink(root.join("inside.md"), root.join("alias.md")).unwrap();
        assert_eq!(resolve(&root, "out/secret.md"), Err(PathError::Escapes));
        assert_eq!(resolve(&root, "out/new.md"), Err(PathError::Escapes));
        assert_eq!(resolve(&root, "link.md"), Err(PathError::Escapes));
        assert!(resolve(&root, "alias.md").is_ok());
    }
}
