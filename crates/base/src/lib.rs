//! # harness-base
//!
//! The vocabulary every layer of agent-harness speaks, lowest first: ids
//! and tenants, masking, signing, the one backoff, a future polled when
//! woken; the LLM providers; what a turn is asked and answers; its
//! events. The map of the crates and their layers is
//! `docs/architecture.md`.

pub mod events;
pub mod ids;
pub mod pii;
pub mod providers;
pub mod retry;
pub mod signing;
pub mod turn;
pub mod when_woken;
