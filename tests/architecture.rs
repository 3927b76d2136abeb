//! The layers: the shared vocabulary and the lower layers (providers, the
//! store, tools, events) import nothing from the layers that use them (the
//! harness, the runner, the HTTP edge, start-up and configuration), so the
//! modules form no cycle.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly; the lint holds in the service code"
)]

use std::path::Path;

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
];

/// What a lower layer must not name.
const UPPER: &[&str] = &[
    "crate::harness",
    "crate::http",
    "crate::runner",
    "crate::startup",
    "crate::app",
    "crate::config",
];

fn rust_files(path: &Path, out: &mut Vec<std::path::PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            rust_files(&entry.unwrap().path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_owned());
    }
}

#[test]
fn lower_layers_import_nothing_from_the_layers_above() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for lower in LOWER {
        let path = src.join(lower);
        if path.exists() {
            rust_files(&path, &mut files);
        }
    }
    assert!(files.len() >= 15, "the lower layers were found: {files:?}");
    let mut offences = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for upper in UPPER {
                if code.contains(upper) {
                    offences.push(format!(
                        "{}:{}: {}",
                        file.display(),
                        number + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        offences.is_empty(),
        "upward imports:\n{}",
        offences.join("\n")
    );
}
