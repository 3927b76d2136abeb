//! # harness-core
//!
//! What runs a turn: the tools, the harness (a turn's stages), its
//! collaborators (hooks, background jobs, the outbox), configuration and
//! telemetry, the runner that drives turns and writes their events, and
//! the turn service, the one door the protocols go through. It holds
//! the store; the protocols above it do not.

use harness_base::{events, ids, pii, providers, retry, signing, turn, when_woken};
use harness_store::store;

pub mod background;
pub mod config;
pub mod files;
pub mod harness;
pub mod hooks;
pub mod metrics;
pub mod outbox;
pub mod runner;
pub mod service;
pub mod telemetry;
pub mod tools;
pub mod vault;
