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

mod a2a;
mod a2a_push;
mod a2a_rest;
mod admin;
mod agui;
mod approvals;
mod auth;
mod chain;
mod client_tools;
mod cors;
mod decisions;
mod edge;
mod erase;
mod errors;
mod export;
mod faults;
mod helpers;
mod http_tools;
mod lifecycle;
mod mcp;
mod mcp_current;
mod mcp_server;
mod memory;
mod models;
mod multitask;
mod openai_compat;
mod openapi;
mod parked;
mod protocol_approvals;
mod quickstart;
mod replicas;
mod responses;
mod stops;
mod takeover;
mod tenant_limits;
mod tenants;
mod tool_turn;
mod tools;
mod turns;
mod ui_stream;
mod vault;
mod web;
mod webhooks;
