//! The harness against a scripted provider: every rule of the seeds' turn.

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
