//! The harness against a scripted provider: every rule of the seeds' turn.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly; the lint holds in the service code"
)]

#[path = "../support/capture.rs"]
mod capture;
mod durable;
mod finalizer;
mod gates;
mod helpers;
mod limits;
mod prompt;
mod thinking;
mod waves;
