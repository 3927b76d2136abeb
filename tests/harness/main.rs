//! The harness against a scripted provider: every rule of the seeds' turn.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly; the lint holds in the service code"
)]

mod durable;
mod finalizer;
mod gates;
mod helpers;
mod limits;
mod prompt;
mod thinking;
mod waves;
