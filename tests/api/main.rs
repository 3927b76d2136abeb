//! Black-box tests: the service on 127.0.0.1:0, a fake provider speaking the
//! OpenAI wire format over real HTTP, a real SQLite file or Postgres schema.

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

#[path = "../support/mod.rs"]
mod support;

use support::fake_provider;

mod durability;
mod edge;
mod helpers;
mod native;
mod protocols;
