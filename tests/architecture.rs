//! The layers: the shared vocabulary and the lower layers (providers, the
//! store, tools, events, the vault, the background collaborators, metrics) import nothing from
//! the layers that use them (the harness, the runner, the HTTP edge,
//! start-up and configuration), so the modules form no cycle.
//!
//! The sources are parsed, not searched as text: every path counts, in a
//! `use` of any shape (`use crate::{a, harness::X}`, `use super::super::…`,
//! renames, globs) or written out in code, resolved against the module
//! the file is.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly; the lint holds in the service code"
)]

use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Files and folders of the lower layers, relative to `src/`.
const LOWER: &[&str] = &[
    "providers.rs",
    "providers",
    "store.rs",
    "store",
    "tools.rs",
    "tools",
    "events.rs",
    "turn.rs",
    "ids.rs",
    "pii.rs",
    "hooks.rs",
    "vault.rs",
    "vault",
    "background.rs",
    "background",
    "metrics.rs",
];

/// The top-level modules a lower layer must not name.
const UPPER: &[&str] = &["harness", "http", "runner", "startup", "app", "config"];

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            rust_files(&entry.unwrap().path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_owned());
    }
}

/// The module path of a file under `src` (`store/sqlite/writer.rs` is
/// `["store", "sqlite", "writer"]`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .filter(|c| c != "mod" && c != "lib")
        .collect()
}

/// Every path a file names, resolved to the crate root where it starts
/// with `crate`, `self` or `super`, with the line it is on.
struct Paths {
    module: Vec<String>,
    found: Vec<(Vec<String>, usize)>,
}

impl Paths {
    /// `segments` as a path from the crate root; `None` for a path that
    /// starts elsewhere (another crate, a local name).
    fn resolve(&self, segments: &[String]) -> Option<Vec<String>> {
        let (first, rest) = segments.split_first()?;
        let mut base = match first.as_str() {
            "crate" | "$crate" => Vec::new(),
            "self" => self.module.clone(),
            "super" => self.module[..self.module.len().saturating_sub(1)].to_vec(),
            _ => return None,
        };
        let mut rest = rest;
        while let Some((next, tail)) = rest.split_first() {
            if next != "super" {
                break;
            }
            base.pop();
            rest = tail;
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn note(&mut self, segments: &[String], line: usize) {
        if let Some(path) = self.resolve(segments) {
            self.found.push((path, line));
        }
    }

    /// Every full path of a `use` tree.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.note(&prefix.clone(), n.ident.span().start().line);
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.note(&prefix.clone(), r.ident.span().start().line);
                prefix.pop();
            }
            syn::UseTree::Glob(g) => {
                self.note(&prefix.clone(), g.star_token.span.start().line);
            }
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = path
            .segments
            .first()
            .map_or(0, |s| s.ident.span().start().line);
        self.note(&segments, line);
        syn::visit::visit_path(self, path);
    }

    /// Paths inside macro calls (`matches!`, `format!`, the store's own
    /// macros) are tokens: any `crate`, `$crate`, `self` or `super` path
    /// among them counts too.
    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let mut tokens = Vec::new();
        flatten(mac.tokens.clone(), &mut tokens);
        let mut segments: Vec<String> = Vec::new();
        let mut line = 0;
        let mut joined = false;
        for token in tokens.into_iter().chain([Token::Other]) {
            match token {
                Token::Name(name, at) => {
                    if !joined {
                        if segments.len() > 1 {
                            self.note(&segments, line);
                        }
                        segments.clear();
                        line = at;
                    }
                    segments.push(name);
                    joined = false;
                }
                Token::Colons => joined = true,
                Token::Other => {
                    if segments.len() > 1 {
                        self.note(&segments, line);
                    }
                    segments.clear();
                    joined = false;
                }
            }
        }
        syn::visit::visit_macro(self, mac);
    }
}

/// A macro's tokens, flat: names, `::` and anything else.
enum Token {
    Name(String, usize),
    Colons,
    Other,
}

fn flatten(stream: proc_macro2::TokenStream, out: &mut Vec<Token>) {
    use proc_macro2::{Spacing, TokenTree};
    let mut pending_colon = false;
    for tree in stream {
        match tree {
            TokenTree::Punct(p) if p.as_char() == ':' => {
                if pending_colon {
                    out.push(Token::Colons);
                    pending_colon = false;
                } else if p.spacing() == Spacing::Joint {
                    pending_colon = true;
                } else {
                    out.push(Token::Other);
                }
                continue;
            }
            // `$crate` is `$` then `crate`.
            TokenTree::Punct(p) if p.as_char() == '$' => {}
            TokenTree::Ident(i) => out.push(Token::Name(i.to_string(), i.span().start().line)),
            TokenTree::Group(g) => {
                out.push(Token::Other);
                flatten(g.stream(), out);
                out.push(Token::Other);
            }
            TokenTree::Punct(_) | TokenTree::Literal(_) => out.push(Token::Other),
        }
        pending_colon = false;
    }
}

/// The upward imports of the files `files` (under `src`).
fn upward_imports(src: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut offences = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        let syntax = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let mut paths = Paths {
            module: module_of(src, file),
            found: Vec::new(),
        };
        paths.visit_file(&syntax);
        for (path, line) in paths.found {
            if path
                .first()
                .is_some_and(|top| UPPER.contains(&top.as_str()))
            {
                offences.push(format!(
                    "{}:{line}: crate::{}",
                    file.display(),
                    path.join("::")
                ));
            }
        }
    }
    offences
}

fn lower_files(src: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for lower in LOWER {
        let path = src.join(lower);
        assert!(path.exists(), "{lower} is a lower layer of src/");
        rust_files(&path, &mut files);
    }
    files
}

#[test]
fn lower_layers_import_nothing_from_the_layers_above() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = lower_files(&src);
    assert!(files.len() >= 30, "the lower layers were found: {files:?}");
    let offences = upward_imports(&src, &files);
    assert!(
        offences.is_empty(),
        "upward imports:\n{}",
        offences.join("\n")
    );
}

/// The check itself: a scratch copy of `src` with upward imports planted
/// in the shapes imports take, each of which it must find.
#[test]
fn an_upward_import_of_any_shape_is_found() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let scratch = tempfile::tempdir().unwrap();
    let copy = scratch.path().join("src");
    copy_dir(&src, &copy);
    let plants = [
        (
            "store.rs",
            "use crate::{events::TurnEvent, harness::AgentHarness};",
        ),
        (
            "tools.rs",
            "use crate::{ids::{self, SessionId}, config::{Settings as S}};",
        ),
        ("store/sqlite.rs", "use super::super::runner::*;"),
        ("vault.rs", "fn planted() { let _ = crate::http::router; }"),
        (
            "background.rs",
            "fn planted() -> Option<crate::app::App> { None }",
        ),
        (
            "providers/openai.rs",
            "fn planted() { let _ = matches!(1, _ if crate::startup::x()); }",
        ),
    ];
    for (file, line) in plants {
        let path = copy.join(file);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push('\n');
        text.push_str(line);
        text.push('\n');
        std::fs::write(&path, text).unwrap();
    }
    let offences = upward_imports(&copy, &lower_files(&copy));
    for (file, upper) in [
        ("store.rs", "crate::harness::AgentHarness"),
        ("tools.rs", "crate::config::Settings"),
        ("store/sqlite.rs", "crate::runner"),
        ("vault.rs", "crate::http::router"),
        ("background.rs", "crate::app::App"),
        ("providers/openai.rs", "crate::startup::x"),
    ] {
        let at = copy.join(file).display().to_string();
        assert!(
            offences
                .iter()
                .any(|o| o.starts_with(&format!("{at}:")) && o.ends_with(upper)),
            "{file}: {upper} not found in {offences:#?}"
        );
    }
    assert_eq!(offences.len(), plants.len(), "{offences:#?}");
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
