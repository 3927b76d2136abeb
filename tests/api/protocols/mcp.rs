//! MCP servers through the service: the `mcp-fixture` server (written with
//! rmcp) over stdio and streamable HTTP, including one call that hangs and
//! one that crashes the server.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use crate::{
    fake_provider::FakeProvider,
    helpers::{TestApp, spawn_app_with, test_settings},
    support::{Backend, TestDb},
};

/// The `mcp-fixture` example. A plain `cargo test` builds the examples
/// beside the test binaries (`target/<profile>/examples`); a run of one
/// test target alone (`cargo test --test api`) needs `cargo build
/// --example mcp-fixture` first.
static FIXTURE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let fixture = profile.join("examples").join("mcp-fixture");
    assert!(
        fixture.is_file(),
        "{} is missing: run `cargo build --example mcp-fixture` (a plain `cargo test` builds it)",
        fixture.display()
    );
    fixture.display().to_string()
});

async fn app_with_servers(servers: Value) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.tools.mcp = Some(servers.to_string().parse().unwrap());
    spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await
}

/// Waits until the server has restarted `restarts` times and is connected.
async fn wait_restarted(app: &TestApp, restarts: u64) -> Value {
    for _ in 0..300 {
        let (_, listed) = app.get_json("/tools").await;
        let server = listed["mcp_servers"][0].clone();
        if server["connected"] == true && server["restarts"].as_u64() >= Some(restarts) {
            return server;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the MCP server was not restarted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_serves_tools_and_is_restarted_after_a_hang_or_a_crash() {
    let app = app_with_servers(json!([
        {"name": "fx", "command": *FIXTURE, "args": ["stdio"], "timeout_s": 2}
    ]))
    .await;
    let (_, listed) = app.get_json("/tools").await;
    let mut mcp: Vec<(String, String)> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["source"] == "mcp:fx")
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_owned(),
                t["effect"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    mcp.sort();
    let expected: Vec<(String, String)> = [
        ("fx__add", "READ_ONLY"),
        ("fx__crash", "READ_ONLY"),
        ("fx__echo", "READ_ONLY"),
        ("fx__hang", "READ_ONLY"),
        ("fx__note", "LOCAL_WRITE"),
        ("fx__pid", "READ_ONLY"),
        ("fx__wipe", "DESTRUCTIVE"),
    ]
    .iter()
    .map(|(n, e)| ((*n).to_owned(), (*e).to_owned()))
    .collect();
    assert_eq!(mcp, expected);
    assert_eq!(listed["mcp_servers"][0]["connected"], true);

    let (finished, message) = app.call_tool("fx__echo", json!({"text": "hi"})).await;
    assert_eq!(finished["status"], "completed", "{finished}");
    assert!(message.contains("echo: hi"), "{message}");
    let (_, message) = app.call_tool("fx__add", json!({"a": 2, "b": 3})).await;
    assert!(message.contains("\n5\n"), "{message}");

    // A call that never answers fails at the server's timeout, and the
    // server is restarted.
    let (finished, _) = app.call_tool("fx__hang", json!({})).await;
    assert_eq!(finished["status"], "failed", "{finished}");
    assert!(
        finished["error"]
            .as_str()
            .unwrap()
            .contains("did not answer within 2 s"),
        "{finished}"
    );
    wait_restarted(&app, 1).await;
    let (finished, _) = app.call_tool("fx__echo", json!({"text": "again"})).await;
    assert_eq!(finished["status"], "completed", "{finished}");

    // A crash fails the call; the server comes back as a new process.
    let (_, before) = app.call_tool("fx__pid", json!({})).await;
    let (finished, _) = app.call_tool("fx__crash", json!({})).await;
    assert_eq!(finished["status"], "failed", "{finished}");
    let server = wait_restarted(&app, 2).await;
    assert!(server["last_error"].is_string(), "{server}");
    let (_, after) = app.call_tool("fx__pid", json!({})).await;
    assert_ne!(before, after, "a new process answers");
    // The service was never down.
    let (status, _) = app.get_json("/healthz").await;
    assert_eq!(status, 200);
}

/// A stdio server killed from outside (`kill -9`) is noticed between
/// calls: `/tools` shows it restarted, by a new process, before any tool
/// is called. (Before, it showed `connected: true, restarts: 0` until the
/// next call failed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_stdio_server_is_restarted_before_any_call() {
    let app = app_with_servers(json!([
        {"name": "fx", "command": *FIXTURE, "args": ["stdio"], "timeout_s": 2}
    ]))
    .await;
    let (_, before) = app.call_tool("fx__pid", json!({})).await;
    // The tool's output is the line of digits inside the fence.
    let pid = before
        .lines()
        .find(|line| !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()))
        .unwrap_or_else(|| panic!("no pid in {before}"))
        .to_owned();
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let started = tokio::time::Instant::now();
    let server = wait_restarted(&app, 1).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "restarted after {:?}: {server}",
        started.elapsed()
    );
    assert_eq!(server["last_error"], "the connection closed", "{server}");
    let (_, after) = app.call_tool("fx__pid", json!({})).await;
    assert_ne!(before, after, "a new process answers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamable_http_server_serves_tools_and_a_hang_times_out() {
    let mut server = tokio::process::Command::new(&*FIXTURE)
        .arg("http")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(server.stdout.take().unwrap()).lines();
    let first = lines.next_line().await.unwrap().unwrap();
    let url = first.strip_prefix("listening on ").unwrap().to_owned();
    let app = app_with_servers(json!([{"name": "remote", "url": url, "timeout_s": 2}])).await;
    let (_, listed) = app.get_json("/tools").await;
    assert!(
        listed["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "remote__echo" && t["source"] == "mcp:remote")
    );
    let (finished, message) = app
        .call_tool("remote__echo", json!({"text": "over http"}))
        .await;
    assert_eq!(finished["status"], "completed", "{finished}");
    assert!(message.contains("echo: over http"), "{message}");
    let (finished, _) = app.call_tool("remote__hang", json!({})).await;
    assert!(
        finished["error"]
            .as_str()
            .unwrap()
            .contains("did not answer within 2 s"),
        "{finished}"
    );
    // Reconnected: a new session answers.
    wait_restarted(&app, 1).await;
    let (finished, _) = app.call_tool("remote__add", json!({"a": 1, "b": 1})).await;
    assert_eq!(finished["status"], "completed", "{finished}");
    server.kill().await.unwrap();
}

#[tokio::test]
async fn a_server_that_cannot_start_leaves_its_tools_out_and_the_service_up() {
    let app = app_with_servers(json!([
        {"name": "missing", "command": "/nonexistent/mcp-server"}
    ]))
    .await;
    let (status, listed) = app.get_json("/tools").await;
    assert_eq!(status, 200);
    assert!(
        !listed["tools"].to_string().contains("missing__"),
        "{listed}"
    );
    assert_eq!(listed["mcp_servers"], json!([]));
}
