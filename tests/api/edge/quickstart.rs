//! The README's quickstart, run as written: each `sh` block of "See it
//! stream, with no key" and "A streamed turn", read from the README itself
//! (so the page cannot drift from what runs), in a shell, in an empty
//! folder. Two things stand in for a newcomer's machine:
//!
//! - `cargo run --release [--] ARGS` runs the binary cargo built for this
//!   test (a `cargo` script first on `PATH`); every other word of the
//!   block is as written;
//! - after a line that starts the service in the background, the shell
//!   waits until it answers `/healthz`, as a reader waits for the build;
//! - the provider of "A streamed turn" is the fake OpenAI server, named
//!   by `OPENAI_BASE_URL` (the block's own comment names that variable).
//!
//! The service listens on its default address, 127.0.0.1:8080, as the
//! blocks say.

use std::{path::Path, time::Duration};

use crate::fake_provider::{FakeProvider, Reply};

/// The `sh` blocks of the README section under `heading` (a line that
/// starts with it).
fn blocks_under(readme: &str, heading: &str) -> Vec<String> {
    let start = readme
        .lines()
        .position(|line| line.starts_with(heading))
        .unwrap_or_else(|| panic!("the README has no {heading:?}"));
    let mut blocks = Vec::new();
    let mut open: Option<Vec<&str>> = None;
    for line in readme.lines().skip(start + 1) {
        if line.starts_with("## ") {
            break;
        }
        match (&mut open, line.trim_end()) {
            (None, "```sh") => open = Some(Vec::new()),
            (Some(lines), "```") => {
                blocks.push(lines.join("\n"));
                open = None;
            }
            (Some(lines), text) => lines.push(text),
            (None, _) => {}
        }
    }
    blocks
}

/// `blocks` as one script: it stops at the first failure, stops the
/// services it started when it ends, and waits for a service started in
/// the background to answer before the next line. What the commands
/// after that print goes to `{name}.out` and `{name}.err` of the folder,
/// one pair a block (the service's own log stays where it was). Between
/// two blocks, `between` runs.
fn script(blocks: &[(&str, &str)], between: &str) -> String {
    let mut script = String::from("set -e\npids=\ntrap 'kill $pids 2>/dev/null; wait' EXIT\n");
    for (at, (name, block)) in blocks.iter().enumerate() {
        if at > 0 {
            script.push_str(between);
            script.push('\n');
        }
        let mut redirected = false;
        for line in block.lines() {
            let starts_service = line.trim_end().ends_with('&');
            if !starts_service && !redirected && !line.trim_start().starts_with("export ") {
                script.push_str(&format!("exec 1>{name}.out 2>{name}.err\n"));
                redirected = true;
            }
            script.push_str(line);
            script.push('\n');
            if starts_service {
                script.push_str("pids=\"$pids $!\"\n");
                script.push_str(
                    "i=0; until curl -s -o /dev/null http://127.0.0.1:8080/healthz; do \
                     i=$((i+1)); [ $i -lt 300 ] || exit 97; sleep 0.1; done\n",
                );
            }
        }
    }
    script
}

/// Runs `script` in `dir/work` with `env`; what each block printed is
/// read from there.
async fn run(dir: &Path, script: String, env: &[(&str, &str)]) {
    let shim = dir.join("bin");
    std::fs::create_dir_all(&shim).unwrap();
    let cargo = shim.join("cargo");
    std::fs::write(
        &cargo,
        format!(
            "#!/bin/sh\n[ \"$1\" = run ] && shift\n[ \"$1\" = --release ] && shift\n\
             [ \"$1\" = -- ] && shift\nexec '{}' \"$@\"\n",
            env!("CARGO_BIN_EXE_agent-harness")
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        shim.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let mut command = tokio::process::Command::new("sh");
    command
        .arg("-c")
        .arg(&script)
        .current_dir(&work)
        .env_clear()
        .env("PATH", path)
        .env("HOME", dir)
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the script ran for more than two minutes")
        .unwrap();
    let printed = |name: &str| std::fs::read_to_string(work.join(name)).unwrap_or_default();
    assert!(
        output.status.success(),
        "the script failed ({}):\n{script}\n--- service\n{}{}\n--- files\n{:?}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        std::fs::read_dir(&work)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                format!("{name}: {}", printed(&name))
            })
            .collect::<Vec<_>>(),
    );
}

/// What `name` printed in `dir`'s run.
fn printed(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join("work").join(name)).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_quickstart_runs_as_written() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();

    // See it stream, with no key: the demo provider echoes, and a message
    // that asks for notes searches them.
    let demo = blocks_under(&readme, "**See it stream, with no key:**");
    assert_eq!(demo.len(), 1, "one block: {demo:?}");
    let dir = tempfile::tempdir().unwrap();
    run(dir.path(), script(&[("demo", &demo[0])], ""), &[]).await;
    let (stdout, stderr) = (
        printed(dir.path(), "demo.out"),
        printed(dir.path(), "demo.err"),
    );
    assert!(stdout.contains("hello there"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("search"),
        "tool activity on stderr: {stderr}"
    );

    // A streamed turn, then, with the same service, its events again after
    // the 7th (`$TURN_ID` is the reader's to set: here, from the stream).
    let streamed = blocks_under(&readme, "## A streamed turn");
    assert_eq!(
        streamed.len(),
        2,
        "the turn and the re-attach: {streamed:?}"
    );
    let provider = FakeProvider::start().await;
    provider.enqueue([Reply::sse("openai/text.sse")]);
    let dir = tempfile::tempdir().unwrap();
    let blocks = [
        ("turn", streamed[0].as_str()),
        ("again", streamed[1].as_str()),
    ];
    let between = r#"TURN_ID=$(sed -n 's/.*"turn_id":"\([^"]*\)".*/\1/p' turn.out | head -n 1)"#;
    let env = [("OPENAI_BASE_URL", provider.base_url.as_str())];
    run(dir.path(), script(&blocks, between), &env).await;
    let turn = printed(dir.path(), "turn.out");
    assert!(turn.starts_with("id: 1\nevent: turn.started\n"), "{turn}");
    assert!(turn.contains("event: message.delta"), "{turn}");
    assert!(turn.contains("event: turn.completed"), "{turn}");
    assert!(turn.contains("Hello! How can I help you today?"), "{turn}");
    let again = printed(dir.path(), "again.out");
    assert!(again.starts_with("id: 8\n"), "{again}");
    assert!(again.contains("event: turn.completed"), "{again}");
    assert_eq!(
        turn.split("\n\n")
            .filter(|e| !e.is_empty())
            .skip(7)
            .collect::<Vec<_>>(),
        again
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .collect::<Vec<_>>(),
        "the re-attach sends what followed the 7th event, again"
    );
    assert_eq!(
        provider.requests().len(),
        1,
        "the re-attach reads the log; it asks the provider nothing"
    );
}
