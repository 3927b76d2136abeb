//! `agent-harness health`: asks a running service whether it is ready, for
//! a container's HEALTHCHECK (the image has no curl). Exit 0: ready;
//! 1: not ready or not answering.

use std::{process::ExitCode, time::Duration};

/// How long the probe waits for the answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

pub async fn run(url: &str) -> ExitCode {
    let client = match reqwest::Client::builder().timeout(PROBE_TIMEOUT).build() {
        Ok(client) => client,
        Err(e) => {
            eprintln!("agent-harness health: {e}");
            return ExitCode::FAILURE;
        }
    };
    match client.get(url).send().await {
        Ok(response) if response.status().is_success() => ExitCode::SUCCESS,
        Ok(response) => {
            eprintln!("agent-harness health: {url} answered {}", response.status());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("agent-harness health: {url}: {e}");
            ExitCode::FAILURE
        }
    }
}
