//! # agent-harness
//!
//! An HTTP/SSE service that runs one LLM agent turn per request: the
//! server (the HTTP edge, start-up, the command line) over the crates
//! that are its layers (`crates/`).
//!
//! The map of the crates, their layers and how a turn goes through them
//! is `docs/architecture.md`; `tests/architecture.rs` holds the layers to
//! their order within each crate.

use harness_base::{events, ids, providers, signing, when_woken};
use harness_core::{
    background, config, files, harness, metrics, outbox, runner, service, telemetry, tools, vault,
};
use harness_protocols::protocols;
use harness_store::store;

pub mod app;
pub mod http;
pub mod startup;
