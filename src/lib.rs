//! # agent-harness
//!
//! An HTTP/SSE service that runs one LLM agent turn per request.
//!
//! The map of its modules, their layers and how a turn goes through them
//! is `docs/architecture.md`; `tests/architecture.rs` holds the layers to
//! their order.

pub mod app;
pub mod background;
pub mod config;
pub mod events;
pub mod harness;
pub mod hooks;
pub mod http;
pub mod ids;
pub mod metrics;
pub mod outbox;
pub mod pii;
pub mod protocols;
pub mod providers;
pub mod retry;
pub mod runner;
pub mod service;
pub mod signing;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod turn;
pub mod vault;
pub mod when_woken;
