//! The layers: every top-level module of the service (`src`, and each
//! crate's `crates/*/src`) has its place in [`LAYERS`], lowest first, and
//! imports only from its own layer and those below it; the crates hold
//! consecutive layers, in the order they depend on each other (the
//! compiler holds a crate to its dependencies; this holds the modules
//! within one to their order); and no two files import each other,
//! directly or around a circle (a module and the modules inside it aside:
//! a parent declares its children and re-exports them). A crate's root
//! names the modules of the crates below it as its own (`use
//! harness_base::ids;`), so a path is `crate::ids::…` in every crate.
//!
//! The sources are parsed, not searched as text: every path counts, in a
//! `use` of any shape (`use crate::{a, harness::X}`, `use super::super::…`,
//! renames, globs) or written out in code or in a macro's tokens, resolved
//! against the module the file is.

#![allow(
    clippy::disallowed_methods,
    reason = "a test's (the bench's) own servers and clients live as long as it does"
)]
#![allow(
    clippy::too_many_lines,
    reason = "a test (a scenario) is one story told whole; the lint holds in the service code"
)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly; the lint holds in the service code"
)]

use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The top-level modules of `src`, lowest layer first: the vocabulary
/// (identifiers, masking, signing, a future polled when woken), the providers, what a turn is asked and
/// answers, its events, the store, what the store serves (metrics, the
/// vault), the tools, the harness's collaborators (hooks, the background
/// jobs), the harness, configuration and telemetry, the runner, the state
/// handlers share, the protocols a turn is asked in, the HTTP edge,
/// start-up and the command line.
const LAYERS: &[&[&str]] = &[
    // harness-base
    &["ids", "pii", "retry", "signing", "when_woken"],
    &["providers"],
    &["turn"],
    &["events"],
    // harness-store
    &["store"],
    // harness-core
    &["metrics", "vault", "files"],
    &["tools"],
    &["hooks"],
    &["background", "outbox"],
    &["harness"],
    &["config"],
    &["telemetry"],
    &["runner"],
    &["service"],
    // harness-protocols
    &["protocols"],
    // agent-harness, the server
    &["app"],
    &["http"],
    &["startup", "cli"],
];

/// The layer of a top-level module; `None` for the crate roots.
fn layer(top: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&top))
}

/// The source folders under `root`, lowest crate first: each crate's
/// (`crates/{base,store,core,protocols}/src`), then the server's (`src`).
fn sources(root: &Path) -> Vec<PathBuf> {
    let mut folders: Vec<PathBuf> = ["base", "store", "core", "protocols"]
        .iter()
        .map(|name| root.join("crates").join(name).join("src"))
        .collect();
    folders.push(root.join("src"));
    folders
}

/// The service's own source folders.
fn service() -> Vec<PathBuf> {
    sources(Path::new(env!("CARGO_MANIFEST_DIR")))
}

/// A scratch copy of the service's sources, to plant offences in.
fn scratch_copy() -> (tempfile::TempDir, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch = tempfile::tempdir().unwrap();
    let copy = scratch.path().to_owned();
    copy_dir(&root.join("src"), &copy.join("src"));
    copy_dir(&root.join("crates"), &copy.join("crates"));
    (scratch, copy)
}

/// The top-level modules a source folder holds (its files and folders
/// but the crate roots).
fn tops(src: &Path) -> Vec<String> {
    let mut tops: Vec<String> = std::fs::read_dir(src)
        .unwrap()
        .map(|entry| {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            name.trim_end_matches(".rs").to_owned()
        })
        .filter(|top| !["lib", "main"].contains(&top.as_str()))
        .collect();
    tops.sort();
    tops.dedup();
    tops
}

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

/// Whether an item is compiled for tests only (`#[cfg(test)]`): a unit
/// test may use its module's neighbours without making them a circle.
fn for_tests(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
    })
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if !for_tests(&item.attrs) {
            syn::visit::visit_item_mod(self, item);
        }
    }

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

/// A file of `src`, its module path and the paths it names from the crate
/// root (with their lines).
struct Source {
    file: PathBuf,
    module: Vec<String>,
    found: Vec<(Vec<String>, usize)>,
}

/// Every file of the source folders but the crate roots.
fn imports(srcs: &[PathBuf]) -> Vec<Source> {
    let mut files = Vec::new();
    for src in srcs {
        let mut own = Vec::new();
        rust_files(src, &mut own);
        own.sort();
        files.extend(own.into_iter().map(|file| (src, file)));
    }
    let mut out = Vec::new();
    for (src, file) in files {
        let module = module_of(src, &file);
        if module.is_empty() || module == ["main"] {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let syntax = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let mut paths = Paths {
            module: module.clone(),
            found: Vec::new(),
        };
        paths.visit_file(&syntax);
        out.push(Source {
            file,
            module,
            found: paths.found,
        });
    }
    out
}

/// The imports that run upward (`file:line: crate::path`).
fn upward_imports(srcs: &[PathBuf]) -> Vec<String> {
    let mut offences = Vec::new();
    for Source {
        file,
        module,
        found,
    } in imports(srcs)
    {
        let here = layer(&module[0])
            .unwrap_or_else(|| panic!("{}: {} has no place in LAYERS", file.display(), module[0]));
        for (path, line) in found {
            let Some(top) = path.first() else { continue };
            if layer(top).is_some_and(|there| there > here) {
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

/// The circles of imports between files (each as `a -> b -> … -> a`).
fn circles(srcs: &[PathBuf]) -> Vec<String> {
    let all = imports(srcs);
    let modules: Vec<Vec<String>> = all.iter().map(|s| s.module.clone()).collect();
    // The file a path names: the longest module that begins it.
    let owner = |path: &[String]| -> Option<usize> {
        (0..modules.len())
            .filter(|&i| path.starts_with(&modules[i]))
            .max_by_key(|&i| modules[i].len())
    };
    let nested = |a: &[String], b: &[String]| a.starts_with(b) || b.starts_with(a);
    let mut edges: Vec<std::collections::BTreeSet<usize>> = vec![Default::default(); all.len()];
    for (from, source) in all.iter().enumerate() {
        let module = &source.module;
        for (path, _) in &source.found {
            if let Some(to) = owner(path)
                && !nested(module, &modules[to])
            {
                edges[from].insert(to);
            }
        }
    }
    // A circle through each file, found by a search from it (the files are
    // few: a few hundred).
    let name = |i: usize| modules[i].join("::");
    let mut found = std::collections::BTreeSet::new();
    for start in 0..all.len() {
        let mut stack = vec![(start, vec![start])];
        let mut seen = std::collections::BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for &next in &edges[at] {
                if next == start {
                    let mut circle = trail.clone();
                    // One spelling per circle: from its least file.
                    let least = circle
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, f)| **f)
                        .map_or(0, |(i, _)| i);
                    circle.rotate_left(least);
                    found.insert(
                        circle
                            .iter()
                            .chain(circle.first())
                            .map(|&i| name(i))
                            .collect::<Vec<_>>()
                            .join(" -> "),
                    );
                } else if next > start && seen.insert(next) {
                    let mut longer = trail.clone();
                    longer.push(next);
                    stack.push((next, longer));
                }
            }
        }
    }
    found.into_iter().collect()
}

#[test]
fn no_module_imports_from_a_layer_above_it() {
    let srcs = service();
    for src in &srcs {
        for top in tops(src) {
            assert!(
                layer(&top).is_some(),
                "{}/{top} has no place in LAYERS",
                src.display()
            );
        }
    }
    let offences = upward_imports(&srcs);
    assert!(
        offences.is_empty(),
        "upward imports:\n{}",
        offences.join("\n")
    );
}

/// Each crate holds consecutive layers, above those of the crates it
/// depends on (the folders are listed lowest first).
#[test]
fn the_crates_hold_the_layers_in_order() {
    let mut below = 0;
    for src in service() {
        let layers: Vec<usize> = tops(&src).iter().filter_map(|t| layer(t)).collect();
        let (low, high) = (*layers.iter().min().unwrap(), *layers.iter().max().unwrap());
        assert!(low >= below, "{} reaches below its crate", src.display());
        let own = tops(&src);
        for (between, layer) in LAYERS.iter().enumerate().take(high + 1).skip(low) {
            assert!(
                layer.iter().any(|top| own.contains(&(*top).to_owned())),
                "{}: layer {between} lies in another crate",
                src.display()
            );
        }
        below = high + 1;
    }
    assert_eq!(below, LAYERS.len(), "every layer is some crate's");
}

#[test]
fn no_files_import_each_other() {
    let found = circles(&service());
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// The check itself: a scratch copy of `src` with upward imports planted
/// in the shapes imports take, each of which it must find.
#[test]
fn an_upward_import_of_any_shape_is_found() {
    let (_scratch, copy) = scratch_copy();
    let plants = [
        (
            "crates/store/src/store.rs",
            "use crate::{events::TurnEvent, harness::AgentHarness};",
        ),
        (
            "crates/core/src/tools.rs",
            "use crate::{ids::{self, SessionId}, config::{Settings as S}};",
        ),
        (
            "crates/store/src/store/sqlite.rs",
            "use super::super::runner::*;",
        ),
        (
            "crates/core/src/vault.rs",
            "fn planted() { let _ = crate::http::router; }",
        ),
        (
            "crates/core/src/background.rs",
            "fn planted() -> Option<crate::app::App> { None }",
        ),
        (
            "crates/base/src/providers/openai.rs",
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
    let offences = upward_imports(&sources(&copy));
    for (file, upper) in [
        ("crates/store/src/store.rs", "crate::harness::AgentHarness"),
        ("crates/core/src/tools.rs", "crate::config::Settings"),
        ("crates/store/src/store/sqlite.rs", "crate::runner"),
        ("crates/core/src/vault.rs", "crate::http::router"),
        ("crates/core/src/background.rs", "crate::app::App"),
        ("crates/base/src/providers/openai.rs", "crate::startup::x"),
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

/// The other check: a circle planted between two files that import each
/// other only one way today is found.
#[test]
fn a_planted_circle_is_found() {
    let (_scratch, copy) = scratch_copy();
    // `store/postgres.rs` uses `store/reader.rs`; the planted line makes
    // the reader use the Postgres backend back (as it did before).
    let path = copy.join("crates/store/src/store/reader.rs");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("\nfn planted() { let _ = super::postgres::PostgresStore::connect; }\n");
    std::fs::write(&path, text).unwrap();
    let found = circles(&sources(&copy));
    assert!(
        found
            .iter()
            .any(|c| c.contains("store::postgres") && c.contains("store::reader")),
        "{found:#?}"
    );
}

/// The longest a source file may be, in lines. (A function's length is
/// clippy's `too_many_lines`, at 80: `clippy.toml`.)
const FILE_LINES_MAX: usize = 600;

/// Each source file over [`FILE_LINES_MAX`] lines.
fn long_files(srcs: &[PathBuf]) -> Vec<String> {
    let mut files = Vec::new();
    for src in srcs {
        rust_files(src, &mut files);
    }
    files.sort();
    files
        .into_iter()
        .filter_map(|file| {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            (lines > FILE_LINES_MAX).then(|| format!("{} ({lines} lines)", file.display()))
        })
        .collect()
}

/// No source file is over 600 lines: a long file is two modules in one.
#[test]
fn files_stay_short() {
    let long = long_files(&service());
    assert!(long.is_empty(), "{long:#?}");
}

/// The size check finds a file planted too long in a scratch copy.
#[test]
fn a_planted_long_file_is_found() {
    let (_scratch, copy) = scratch_copy();
    assert!(long_files(&sources(&copy)).is_empty());
    let path = copy.join("crates/base/src/ids.rs");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&"\n".repeat(FILE_LINES_MAX));
    std::fs::write(&path, text).unwrap();
    let long = long_files(&sources(&copy));
    assert_eq!(long.len(), 1, "{long:#?}");
    assert!(long[0].contains("ids.rs"), "{long:#?}");
}

/// Each place outside a test where the protocols read JSON by index
/// (`value["field"]`) or build it with `json!`: they read into types and
/// say typed chunks (docs/development.md, "A protocol").
fn untyped_json(src: &Path) -> Vec<String> {
    struct Found<'a> {
        file: &'a Path,
        out: Vec<String>,
    }
    impl<'ast> Visit<'ast> for Found<'_> {
        fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
            if !for_tests(&item.attrs) {
                syn::visit::visit_item_mod(self, item);
            }
        }
        fn visit_expr_index(&mut self, index: &'ast syn::ExprIndex) {
            if let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(field),
                ..
            }) = &*index.index
            {
                let line = field.span().start().line;
                self.out.push(format!(
                    "{}:{line}: [{:?}]",
                    self.file.display(),
                    field.value()
                ));
            }
            syn::visit::visit_expr_index(self, index);
        }
        fn visit_macro(&mut self, mac: &'ast syn::Macro) {
            if mac.path.segments.last().is_some_and(|s| s.ident == "json") {
                let line = mac.path.segments[0].ident.span().start().line;
                self.out
                    .push(format!("{}:{line}: json!", self.file.display()));
            }
        }
    }
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let parsed = syn::parse_file(&text).unwrap();
        let mut found = Found {
            file,
            out: Vec::new(),
        };
        found.visit_file(&parsed);
        out.extend(found.out);
    }
    out
}

/// The protocols read into types and answer with typed chunks.
#[test]
fn the_protocols_read_and_write_typed_json() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let found = untyped_json(&root.join("crates/protocols/src"));
    assert!(found.is_empty(), "{found:#?}");
}

/// The check finds an index read and a `json!` planted in a protocol.
#[test]
fn a_planted_json_read_is_found() {
    let (_scratch, copy) = scratch_copy();
    let protocols = copy.join("crates/protocols/src");
    assert!(untyped_json(&protocols).is_empty());
    let path = protocols.join("protocols/parts.rs");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(
        "\nfn planted(v: &serde_json::Value) -> serde_json::Value {\n    \
         serde_json::json!({\"a\": v[\"field\"]})\n}\n",
    );
    std::fs::write(&path, text).unwrap();
    let found = untyped_json(&protocols);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("json!"), "{found:#?}");
}
