//! `agent-harness chat`: a turn from the terminal. The answer streams to
//! standard output; tool activity, citations' sources and errors go to
//! standard error.

use std::{
    io::{BufRead as _, Write as _},
    process::ExitCode,
};

use futures::StreamExt;
use serde_json::{Value, json};

/// Largest SSE frame read (a bigger one is an error, not a memory hog).
const FRAME_MAX: usize = 4 * 1024 * 1024;

/// `chat`'s arguments.
#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    /// The service's address.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// The session [default: a new one for this run].
    #[arg(long)]
    session: Option<String>,
    /// Whose memories (the turn's `user_id`).
    #[arg(long)]
    user: Option<String>,
    /// The message; without one, each line of standard input is a turn.
    message: Vec<String>,
}

/// Runs the turns: the message given, or one per line of standard input.
pub async fn run(args: ChatArgs) -> ExitCode {
    let ChatArgs {
        url,
        session,
        user,
        message,
    } = args;
    let session = session.unwrap_or_else(|| format!("cli-{}", uuid::Uuid::now_v7().simple()));
    let client = reqwest::Client::new();
    let endpoint = format!("{}/sessions/{session}/turns", url.trim_end_matches('/'));
    if !message.is_empty() {
        return turn(&client, &endpoint, &message.join(" "), user.as_deref()).await;
    }
    let stdin = std::io::stdin();
    let mut code = ExitCode::SUCCESS;
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        code = turn(&client, &endpoint, &line, user.as_deref()).await;
    }
    code
}

fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

fn note(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{text}");
}

async fn turn(
    client: &reqwest::Client,
    endpoint: &str,
    message: &str,
    user: Option<&str>,
) -> ExitCode {
    let mut body = json!({ "message": message, "show_citations": false });
    if let Some(user) = user {
        body["user_id"] = json!(user);
    }
    let response = match client
        .post(endpoint)
        .header("accept", "text/event-stream")
        .json(&body)
        .send()
        .await
    {
        Ok(response) => response,
        Err(e) => {
            note(&format!(
                "agent-harness chat: cannot reach the service: {e}"
            ));
            return ExitCode::FAILURE;
        }
    };
    if !response.status().is_success() {
        let status = response.status();
        let problem: Value = response.json().await.unwrap_or(Value::Null);
        note(&format!(
            "agent-harness chat: {status}: {}",
            problem["detail"]
                .as_str()
                .unwrap_or("the request was refused")
        ));
        return ExitCode::FAILURE;
    }
    let mut stream = response.bytes_stream();
    let mut buffer: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            note("agent-harness chat: the stream broke off");
            return ExitCode::FAILURE;
        };
        buffer.extend_from_slice(&chunk);
        if buffer.len() > FRAME_MAX {
            note("agent-harness chat: an event is too large");
            return ExitCode::FAILURE;
        }
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let frame: Vec<u8> = buffer.drain(..end + 2).collect();
            if let Some(code) = show(&String::from_utf8_lossy(&frame)) {
                return code;
            }
        }
    }
    note("agent-harness chat: the stream ended before the turn did");
    ExitCode::FAILURE
}

/// Shows one SSE frame; `Some` when the turn ended.
fn show(frame: &str) -> Option<ExitCode> {
    let data: String = frame
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim_start)
        .collect();
    let event: Value = serde_json::from_str(&data).ok()?;
    let text = |key: &str| event[key].as_str().unwrap_or_default().to_owned();
    match event["type"].as_str()? {
        "message.delta" => say(&text("text")),
        "message.retracted" => say("\n[the answer so far was withdrawn; retrying]\n"),
        "tool.started" => note(&format!("… {} {}", text("tool"), event["arguments"])),
        "tool.finished" => note(&format!(
            "  {} {}{}",
            text("tool"),
            text("status"),
            event["reason"]
                .as_str()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        )),
        "citations" => {
            let local: Vec<&str> = event["local"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let web: Vec<&str> = event["web"]
                .as_array()
                .map(|a| a.iter().filter_map(|w| w["url"].as_str()).collect())
                .unwrap_or_default();
            if !local.is_empty() || !web.is_empty() {
                note(&format!("sources: {}", [local, web].concat().join(", ")));
            }
        }
        "turn.completed" => {
            say("\n");
            return Some(ExitCode::SUCCESS);
        }
        "turn.failed" => {
            say("\n");
            note(&format!(
                "agent-harness chat: the turn failed: {}: {}",
                text("code"),
                text("message")
            ));
            return Some(ExitCode::FAILURE);
        }
        "turn.cancelled" | "turn.interrupted" => {
            say("\n");
            note(&format!(
                "agent-harness chat: the turn ended: {}",
                text("reason")
            ));
            return Some(ExitCode::FAILURE);
        }
        _ => {}
    }
    None
}
