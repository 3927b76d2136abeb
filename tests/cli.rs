//! The binary's command line: `--help` lists every setting with its
//! variable, a bad value stops it with exit code 2 naming the variable, and
//! the settings file is read.

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

use std::process::{Command, Output};

use serde_json::json;

#[allow(
    dead_code,
    reason = "this binary reads the log from a pipe, not a file"
)]
#[path = "support/listening.rs"]
mod listening;

fn harness(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agent-harness"));
    command.env_clear().args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run agent-harness")
}

#[test]
fn help_lists_the_settings_by_section_with_their_variables_and_hides_keys() {
    let out = harness(
        &["--help"],
        &[
            ("OPENAI_API_KEY", "sk-must-not-show"),
            (
                "OPENAI_BASE_URL",
                "http://user:pw-must-not-show@llm.internal/v1",
            ),
            ("DATABASE_URL", "postgres://app:db-pw-must-not-show@db/x"),
            ("OLLAMA_HOST", "http://u:ollama-pw-must-not-show@gpu:11434"),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8(out.stdout).unwrap();
    for expected in [
        "Server:",
        "Database:",
        "Providers:",
        "Harness:",
        "Telemetry:",
        "--max-steps <MAX_STEPS>",
        "[env: HARNESS_MAX_STEPS=]",
        "[env: DATABASE_URL]",
        "[env: OTEL_EXPORTER_OTLP_ENDPOINT]",
        "[env: OPENAI_API_KEY]",
        "--config <FILE>",
    ] {
        assert!(help.contains(expected), "{expected} missing:\n{help}");
    }
    assert!(!help.contains("must-not-show"), "{help}");
}

#[test]
fn a_bad_setting_stops_the_binary_with_exit_code_2_naming_it() {
    let out = harness(&["migrate"], &[("HARNESS_MAX_STEPS", "0")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("HARNESS_MAX_STEPS: must be between 1 and 100"),
        "{stderr}"
    );
    let out = harness(&["--think-level", "extreme", "migrate"], &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("--think-level: "), "{stderr}");
    // A CA file that is not there, or holds no certificate.
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    for file in [dir.path().join("missing.pem"), empty] {
        let out = harness(
            &["migrate"],
            &[("HARNESS_OUTBOUND_CA_FILE", file.to_str().unwrap())],
        );
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(stderr.contains("HARNESS_OUTBOUND_CA_FILE: "), "{stderr}");
    }
}

#[test]
fn the_settings_file_is_read_and_the_environment_overrides_it() {
    let dir = tempfile::tempdir().unwrap();
    let from_file = dir.path().join("from-file.db");
    let from_env = dir.path().join("from-env.db");
    let config = dir.path().join("harness.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = \"sqlite://{}\"\n[telemetry]\nlog = \"warn\"\n",
            from_file.display()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let out = harness(&["--config", config, "migrate"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(from_file.exists() && !from_env.exists());
    std::fs::remove_file(&from_file).unwrap();
    let env_url = format!("sqlite://{}", from_env.display());
    let out = harness(
        &["migrate"],
        &[("HARNESS_CONFIG", config), ("DATABASE_URL", &env_url)],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(from_env.exists() && !from_file.exists());
    // A key the file does not know stops the binary.
    std::fs::write(dir.path().join("bad.toml"), "[harness]\nmax_stpes = 3\n").unwrap();
    let bad = dir.path().join("bad.toml");
    let out = harness(&["--config", bad.to_str().unwrap(), "migrate"], &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("harness.max_stpes: no such setting"),
        "{stderr}"
    );
}

#[test]
fn index_vault_indexes_a_folder_incrementally_and_prints_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    let vault = dir.path().join("vault");
    std::fs::create_dir_all(vault.join("notes")).unwrap();
    std::fs::write(vault.join("notes/a.md"), "# A\n\nApples.\n").unwrap();
    std::fs::write(vault.join("b.md"), "Bananas.\n").unwrap();
    let db = format!("sqlite://{}", dir.path().join("h.db").display());
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("HARNESS_VAULT_DIR", vault.to_str().unwrap()),
    ];
    let out = harness(&["index-vault"], &env);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains("2 notes: 2 added, 0 updated, 0 unchanged, 0 removed"),
        "{stdout}"
    );
    std::fs::remove_file(vault.join("b.md")).unwrap();
    let out = harness(&["index-vault"], &env);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains("1 notes: 0 added, 0 updated, 1 unchanged, 1 removed"),
        "{stdout}"
    );
    // A folder that is not there is an error, not an empty vault.
    let missing = dir.path().join("nowhere");
    let out = harness(
        &["index-vault"],
        &[
            ("DATABASE_URL", db.as_str()),
            ("HARNESS_VAULT_DIR", missing.to_str().unwrap()),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("does not exist"), "{stderr}");
}

/// On a terminal, `index-vault` draws a progress bar (run under `script`,
/// which gives it a pseudo-terminal), then prints its summary.
#[test]
fn index_vault_shows_progress_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let vault = dir.path().join("vault");
    std::fs::create_dir_all(&vault).unwrap();
    for i in 0..50 {
        std::fs::write(
            vault.join(format!("n{i}.md")),
            format!("# Note {i}\n\nText {i}.\n"),
        )
        .unwrap();
    }
    let db = format!("sqlite://{}", dir.path().join("h.db").display());
    let command = format!("{} index-vault", env!("CARGO_BIN_EXE_agent-harness"));
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("TERM", "xterm")
        .env("DATABASE_URL", &db)
        .env("HARNESS_VAULT_DIR", &vault)
        .output()
        .expect("script (util-linux) runs the command on a pseudo-terminal");
    assert!(out.status.success(), "{out:?}");
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(screen.contains("/50 notes"), "{screen}");
    assert!(screen.contains('█') || screen.contains('░'), "{screen}");
    assert!(screen.contains("50 notes: 50 added"), "{screen}");
}

/// The binary serving with the `demo` provider on a free port; killed when
/// dropped.
struct Serving {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The service picks its own port (`127.0.0.1:0`) and the test reads it
/// from the `listening` log line on its standard output (see
/// `support/listening.rs` for why).
fn serve_demo() -> Serving {
    serve_demo_with(&[]).0
}

/// [`serve_demo`] with more of the environment; the log lines up to the
/// `listening` one come back too.
fn serve_demo_with(env: &[(&str, &str)]) -> (Serving, Vec<String>) {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let mut child = listening::service_in(dir.path())
        .env("HARNESS_PROVIDERS", "demo:echo")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut logs = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut before = Vec::new();
    let port = logs
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| {
            let port = listening::port_in(&line);
            before.push(line);
            port
        })
        .expect("the service logs the port it listens on");
    // The service goes on logging: read on, so that it never blocks on a
    // full pipe. The reader ends when the service does.
    std::thread::spawn(move || logs.for_each(drop));
    let serving = Serving {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _dir: dir,
    };
    (serving, before)
}

/// A listener on a free port of its own that answers each request `204`
/// and keeps its head (the request line and headers); for a receiver and
/// for a proxy that must see nothing.
fn recording_listener() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(64) {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(2)));
            let mut buf = vec![0u8; 64 * 1024];
            let n = stream.read(&mut buf).unwrap_or(0);
            kept.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            let _ = stream.write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
        }
    });
    (port, seen)
}

/// Issue 63: with `HTTP_PROXY` set, a webhook goes straight to its
/// receiver (where the outbound guard checked it), never through the
/// proxy, which would connect past the guard. And the start-up log (the
/// settings, with `Debug`) holds neither the webhook secret nor a key.
/// Before, the delivery went to the proxy and the secret was logged.
#[test]
fn webhooks_go_past_a_proxy_and_the_start_up_log_holds_no_secret() {
    let (receiver, delivered) = recording_listener();
    let (proxy, proxied) = recording_listener();
    let secret = "whsec_c2VjcmV0LXNpZ25pbmcta2V5LW9mLXRoZS1vcGVyYXRvcg==";
    let hook = format!("http://127.0.0.1:{receiver}/hook");
    let proxy = format!("http://127.0.0.1:{proxy}");
    let (serving, logs) = serve_demo_with(&[
        ("HARNESS_WEBHOOK_URL", &hook),
        ("HARNESS_WEBHOOK_SECRET", secret),
        ("HARNESS_OUTBOUND_ALLOW_PRIVATE", "true"),
        ("OPENAI_API_KEY", "sk-never-logged"),
        ("HTTP_PROXY", &proxy),
        ("http_proxy", &proxy),
        ("ALL_PROXY", &proxy),
    ]);
    let logs = logs.join("\n");
    assert!(logs.contains("\"starting\""), "{logs}");
    for hidden in ["c2VjcmV0LXNpZ25pbmcta2V5", "sk-never-logged"] {
        assert!(!logs.contains(hidden), "{hidden} in {logs}");
    }
    let out = harness(&["chat", "--url", &serving.url, "hello"], &[]);
    assert!(out.status.success(), "{out:?}");
    for _ in 0..200 {
        if !delivered.lock().unwrap().is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let delivered = delivered.lock().unwrap().clone();
    assert!(
        delivered.iter().any(|head| head.starts_with("POST /hook ")),
        "{delivered:?}"
    );
    assert_eq!(*proxied.lock().unwrap(), Vec::<String>::new());
}

#[test]
fn chat_streams_a_demo_turn_with_no_key_and_shows_tool_activity() {
    let serving = serve_demo();
    let out = harness(&["chat", "--url", &serving.url, "hello", "there"], &[]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.starts_with("Echo: hello there"), "{stdout}");
    assert!(stdout.contains("This is the demo provider"), "{stdout}");
    // A message about notes makes the demo search them: the tool's
    // activity is on standard error, the answer on standard output.
    let out = harness(
        &[
            "chat",
            "--url",
            &serving.url,
            "--session",
            "s-notes",
            "search my notes",
        ],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("local_search") && stderr.contains("completed"),
        "{stderr}"
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.starts_with("Here is what the search found:"),
        "{stdout}"
    );
    assert!(!stdout.contains("<<<"), "{stdout}");
    // A service that is not there is an error.
    let out = harness(&["chat", "--url", "http://127.0.0.1:9", "hi"], &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[test]
fn text_logs_have_no_colour_codes_when_not_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}/h.db", dir.path().display());
    let out = harness(
        &["migrate"],
        &[("DATABASE_URL", &db), ("HARNESS_LOG_FORMAT", "text")],
    );
    assert!(out.status.success(), "{out:?}");
    let logs =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(logs.contains("migrations applied"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "{logs:?}");
}

#[test]
fn keys_are_made_listed_and_revoked_and_only_their_hash_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}/h.db", dir.path().display());
    let env = [("DATABASE_URL", db.as_str())];
    let out = harness(&["keys", "create", "--tenant", "acme"], &env);
    assert!(out.status.success(), "{out:?}");
    let key = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(key.starts_with("ah_") && key.len() == 67, "{key}");
    let out = harness(&["keys", "list"], &env);
    let listed = String::from_utf8(out.stdout).unwrap();
    assert!(
        listed.contains(" acme ") && !listed.contains(&key),
        "{listed}"
    );
    let id = listed.split_whitespace().next().unwrap().to_owned();
    // The database has the hash, never the key.
    let file = std::fs::read(dir.path().join("h.db")).unwrap();
    assert!(!file.windows(key.len()).any(|w| w == key.as_bytes()));
    let out = harness(&["keys", "revoke", &id], &env);
    assert!(out.status.success(), "{out:?}");
    let out = harness(&["keys", "revoke", &id], &env);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let out = harness(&["keys", "create", "--tenant", "no tenant"], &env);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

/// A tenant's own limits, its choice of shown reasoning among them, are
/// set, listed, and cleared by a `set` that leaves them out.
#[test]
fn a_tenants_limits_and_reasoning_are_set_and_listed() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}/h.db", dir.path().display());
    let env = [("DATABASE_URL", db.as_str())];
    let out = harness(
        &[
            "tenants",
            "set",
            "acme",
            "--max-running-turns",
            "8",
            "--reasoning",
            "hidden",
        ],
        &env,
    );
    assert!(out.status.success(), "{out:?}");
    let listed = String::from_utf8(harness(&["tenants", "list"], &env).stdout).unwrap();
    assert_eq!(
        listed.trim(),
        "acme max_running_turns=8 max_streams=default tokens_per_day=default \
         retention_s=default reasoning=hidden"
    );
    let out = harness(&["tenants", "set", "acme", "--reasoning", "show"], &env);
    assert!(out.status.success(), "{out:?}");
    let listed = String::from_utf8(harness(&["tenants", "list"], &env).stdout).unwrap();
    assert!(
        listed.contains("max_running_turns=default") && listed.contains("reasoning=show"),
        "{listed}"
    );
    let out = harness(&["tenants", "set", "acme", "--reasoning", "loud"], &env);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn an_admin_key_is_made_and_the_audit_trail_printed() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}/h.db", dir.path().display());
    let env = [("DATABASE_URL", db.as_str())];
    // A tenant key needs its tenant; an admin key is the default's.
    let out = harness(&["keys", "create"], &env);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = harness(&["keys", "create", "--admin"], &env);
    assert!(out.status.success(), "{out:?}");
    let out = harness(&["keys", "create", "--tenant", "acme"], &env);
    assert!(out.status.success(), "{out:?}");
    let out = harness(&["keys", "list"], &env);
    let listed = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 2, "{listed}");
    assert!(lines[0].contains(" default admin "), "{listed}");
    assert!(
        lines[1].contains(" acme ") && !lines[1].contains("admin"),
        "{listed}"
    );
    let acme = lines[1].split_whitespace().next().unwrap();
    assert!(harness(&["keys", "revoke", acme], &env).status.success());

    let out = harness(&["audit"], &env);
    assert!(out.status.success(), "{out:?}");
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let kinds: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap(),
                r["tenant"].as_str().unwrap(),
                r["actor"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("key.created", "default", "cli"),
            ("key.created", "acme", "cli"),
            ("key.revoked", "acme", "cli")
        ]
    );
    assert_eq!(rows[0]["outcome"], "admin");
    assert_eq!(rows[2]["subject"], acme);
    let out = harness(
        &["audit", "--tenant", "acme", "--kind", "key.revoked"],
        &env,
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap().lines().count(), 1);
}

#[test]
fn an_export_is_imported_for_a_tenant_whole_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}/h.db", dir.path().display());
    let env = [("DATABASE_URL", db.as_str())];
    let turn = "018f0000-0000-7000-8000-0000000000a1";
    let at = "2026-11-28T03:00:00.000001Z";
    let lines = [
        json!({"format": "agent-harness/session", "version": 1, "exported_at": at,
               "backend": "sqlite", "local": ["header.exported_at", "header.backend", "session.tenant"]}),
        json!({"type": "session", "id": "s-cli", "tenant": "elsewhere", "created_at": at,
               "updated_at": at, "turn_count": 1, "last_seq": 1, "cost_usd": null}),
        json!({"type": "turn", "id": turn, "status": "completed", "request": "{}",
               "idempotency_key": null, "result": "{}", "error_code": null,
               "error_message": null, "first_seq": 1, "created_at": at, "finished_at": at,
               "cost_usd": null, "attempt": 0, "traceparent": null, "hidden_at": null,
               "waited_ms": 0, "resumes": 0}),
        json!({"type": "event", "seq": 1, "turn_id": turn, "event": "turn.completed",
               "payload": "{}", "created_at": at}),
        json!({"type": "end", "lines": 4}),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let file = dir.path().join("s.jsonl");
    std::fs::write(&file, &text).unwrap();
    let path = file.to_str().unwrap();
    let out = harness(&["import", path, "--tenant", "acme"], &env);
    assert!(out.status.success(), "{out:?}");
    let made: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        made,
        json!({"session_id": "s-cli", "tenant": "acme", "rows": 2})
    );
    // Again: the tenant has it; nothing more is written.
    let out = harness(&["import", path, "--tenant", "acme"], &env);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("session_exists"),
        "{out:?}"
    );
    // Cut short: refused, naming the line.
    std::fs::write(&file, text.lines().take(4).collect::<Vec<_>>().join("\n")).unwrap();
    let out = harness(&["import", path, "--tenant", "globex"], &env);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("line 5") && said.contains("invalid_import"),
        "{said}"
    );
    let out = harness(&["audit", "--kind", "session.imported"], &env);
    let rows: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0].contains("\"actor\":\"cli\"") && rows[0].contains("\"tenant\":\"acme\""));
}

#[test]
fn health_exits_zero_for_a_ready_service_and_one_otherwise() {
    let serving = serve_demo();
    let port = serving.url.rsplit(':').next().unwrap().to_owned();
    // The default: /readyz on loopback at HARNESS_LISTEN's port.
    let listen = format!("0.0.0.0:{port}");
    let ready = harness(&["health"], &[("HARNESS_LISTEN", &listen)]);
    assert!(ready.status.success(), "{ready:?}");
    let url = format!("{}/readyz", serving.url);
    assert!(harness(&["health", "--url", &url], &[]).status.success());
    // Not a probe that answers 200, and nothing listening.
    let missing = format!("{}/nowhere", serving.url);
    let refused = harness(&["health", "--url", &missing], &[]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("404"));
    drop(serving);
    let down = harness(&["health", "--url", &url], &[]);
    assert_eq!(down.status.code(), Some(1), "{down:?}");
}

/// The settings' variables that `--help` lists.
fn listed_settings() -> std::collections::BTreeSet<String> {
    let out = harness(&["--help"], &[]);
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8(out.stdout).unwrap();
    let listed: std::collections::BTreeSet<String> = help
        .split("[env: ")
        .skip(1)
        .filter_map(|rest| rest.split(['=', ']']).next())
        .map(str::to_owned)
        .collect();
    assert!(listed.len() > 50, "{listed:?}");
    listed
}

/// The settings' variables a page names.
fn named_settings(text: &str) -> std::collections::BTreeSet<String> {
    let prefixes = [
        "HARNESS_",
        "OPENAI_",
        "ANTHROPIC_",
        "OLLAMA_",
        "OTEL_",
        "DATABASE_",
    ];
    text.split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .filter(|word| prefixes.iter().any(|p| word.starts_with(p)))
        .map(|word| word.trim_end_matches('_').to_owned())
        .filter(|word| !prefixes.contains(&format!("{word}_").as_str()))
        .collect()
}

/// The README and the pages of `docs/`.
fn doc_pages(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut pages = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages
}

/// The README and the pages of `docs/` name only settings that exist, and
/// the configuration page names every one. (Before, the README named a
/// `record_decisions` switch that had no setting.)
#[test]
fn the_docs_and_help_name_the_same_settings() {
    let listed = listed_settings();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let pages = doc_pages(root);
    for page in &pages {
        let named = named_settings(&std::fs::read_to_string(page).unwrap());
        let unknown: Vec<_> = named.difference(&listed).collect();
        assert!(
            unknown.is_empty(),
            "{} names settings that do not exist: {unknown:?}",
            page.display()
        );
    }
    let configuration =
        named_settings(&std::fs::read_to_string(root.join("docs/configuration.md")).unwrap());
    let undocumented: Vec<_> = listed.difference(&configuration).collect();
    assert!(
        undocumented.is_empty(),
        "settings docs/configuration.md does not name: {undocumented:?}"
    );
}

/// One line of a Markdown table's cell.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// The tables of every setting, by section, from the settings' own
/// definitions: the file key, the variable, the flag, the default and the
/// help text.
fn settings_tables() -> String {
    let command = harness_core::config::Settings::command();
    let mut out = String::new();
    let mut section: Option<String> = None;
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long() else { continue };
        if ["help", "version"].contains(&long) {
            continue;
        }
        let (table, key) = id.split_once('.').unwrap_or(("", id));
        if section.as_deref() != Some(table) {
            let heading = match table {
                "" => "The command line".to_owned(),
                table => format!("`[{table}]`"),
            };
            out.push_str(&format!(
                "\n### {heading}\n\n| file key | environment | flag | default | what it sets |\n|---|---|---|---|---|\n"
            ));
            section = Some(table.to_owned());
        }
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let default: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .filter(|v| !v.is_empty())
            .collect();
        let default = if default.is_empty() || arg.is_hide_default_value_set() {
            String::new()
        } else {
            format!("`{}`", default.join(","))
        };
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(|h| cell(&h.to_string()))
            .unwrap_or_default();
        let key = if table.is_empty() {
            String::new()
        } else {
            format!("`{key}`")
        };
        out.push_str(&format!(
            "| {key} | {env} | `--{long}` | {default} | {help} |\n"
        ));
    }
    out
}

/// `docs/configuration.md` lists every setting as the settings define it:
/// the tables between its markers are generated (`UPDATE_DOCS=1` writes
/// them), so the page cannot drift from the code.
#[test]
fn the_configuration_page_is_generated_from_the_settings() {
    const START: &str = "<!-- generated: settings -->\n";
    const END: &str = "<!-- end of generated settings -->";
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    let page = std::fs::read_to_string(path).unwrap();
    let (head, rest) = page.split_once(START).expect("the page's start marker");
    let (_, tail) = rest.split_once(END).expect("the page's end marker");
    let generated = format!("{head}{START}{}{END}{tail}", settings_tables());
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(path, &generated).unwrap();
    }
    assert!(
        page == generated,
        "docs/configuration.md is stale: run `UPDATE_DOCS=1 cargo test --test cli configuration_page`"
    );
}

/// A heading's anchor as Markdown renderers make it.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings (not of lines in its code blocks).
fn anchors(text: &str) -> std::collections::BTreeSet<String> {
    let mut code = false;
    let mut out = std::collections::BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            code = !code;
        } else if !code && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// Every link between the README and the pages of `docs/` reaches a file
/// that exists and, when it names one, a heading of it: the pages were
/// split out of one README, and a moved section must not leave a dead link.
#[test]
fn the_docs_links_reach_their_pages_and_headings() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let pages = doc_pages(root);
    let mut dead = Vec::new();
    let mut links = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (_, rest) in text.match_indices("](").map(|(i, _)| ((), &text[i + 2..])) {
            let Some(link) = rest.split(')').next() else {
                continue;
            };
            if link.contains("://") || link.contains(' ') || link.starts_with("mailto:") {
                continue;
            }
            links += 1;
            let (path, fragment) = link.split_once('#').unwrap_or((link, ""));
            let target = if path.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(path)
            };
            let Ok(target_text) = std::fs::read_to_string(&target) else {
                if !target.is_dir() {
                    dead.push(format!("{}: {link}", page.display()));
                }
                continue;
            };
            if !fragment.is_empty() && !anchors(&target_text).contains(fragment) {
                dead.push(format!("{}: {link}", page.display()));
            }
        }
    }
    assert!(links > 30, "the links were found: {links}");
    assert!(dead.is_empty(), "dead links:\n{}", dead.join("\n"));
}

/// The shipped compose file trusts its gateway, and only it, with the
/// client's address (issue 63: behind nginx every client had nginx's
/// address, and 30 bad keys a minute locked out every tenant): the
/// replicas' `HARNESS_TRUSTED_PROXIES` is the gateway's fixed address,
/// and the gateway appends the client's address to `X-Forwarded-For`.
#[test]
fn the_compose_file_trusts_its_gateway_with_the_clients_address() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let compose = std::fs::read_to_string(root.join("docker-compose.yml")).unwrap();
    let value = |key: &str| -> Vec<String> {
        compose
            .lines()
            .filter_map(|line| line.trim().strip_prefix(key))
            .map(|rest| rest.trim().to_owned())
            .collect()
    };
    let trusted = value("HARNESS_TRUSTED_PROXIES:");
    let gateway = value("ipv4_address:");
    assert_eq!(trusted.len(), 1, "{trusted:?}");
    assert_eq!(gateway, trusted);
    let parsed: Result<harness_core::config::TrustedProxies, _> = trusted[0].parse();
    assert!(parsed.is_ok(), "{parsed:?}");
    let nginx = std::fs::read_to_string(root.join("deploy/nginx.conf")).unwrap();
    assert!(
        nginx.contains("proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;"),
        "{nginx}"
    );
}
