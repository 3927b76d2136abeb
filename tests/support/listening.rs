//! Where a service process listens. Started with `HARNESS_LISTEN=127.0.0.1:0`
//! and JSON logs to a file, it picks a free port itself and logs it; a test
//! that picked a free port and handed it over could see it taken in
//! between, and two services of two tests then shared one port.

use std::{path::Path, time::Duration};

/// The environment that makes the service pick its port and log it as JSON.
pub const ANY_PORT: [(&str, &str); 2] = [
    ("HARNESS_LISTEN", "127.0.0.1:0"),
    ("HARNESS_LOG_FORMAT", "json"),
];

/// `http://127.0.0.1:<port>` of the service writing its logs to `log` (a
/// file of this process alone), once it has logged that it listens (10 s at
/// most).
pub async fn listening_at(log: &Path) -> String {
    for _ in 0..400 {
        let port = std::fs::read_to_string(log)
            .ok()
            .and_then(|logs| logs.lines().find_map(port_in));
        if let Some(port) = port {
            return format!("http://127.0.0.1:{port}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no `listening` line in {} within 10 s", log.display());
}

/// The port of a `listening` log line.
pub fn port_in(line: &str) -> Option<u64> {
    let line: serde_json::Value = serde_json::from_str(line).ok()?;
    (line["message"] == "listening").then(|| line["port"].as_u64())?
}

/// A new file for the logs of one service process, for its standard output
/// and its standard error.
pub fn log_file(path: &Path) -> (std::process::Stdio, std::process::Stdio) {
    let file = std::fs::OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(path)
        .unwrap();
    (file.try_clone().unwrap().into(), file.into())
}

/// The service binary with nothing of this process's environment: its
/// SQLite file and its vault in `dir`, its port its own (see [`ANY_PORT`]).
pub fn service_in(dir: &Path) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_agent-harness"));
    command
        .env_clear()
        .env("DATABASE_URL", format!("sqlite://{}/h.db", dir.display()))
        .env("HARNESS_VAULT_DIR", dir.join("vault"))
        .envs(ANY_PORT);
    command
}
