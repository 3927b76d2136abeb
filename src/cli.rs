//! The binary's client commands (`chat`, `health`): they talk to a running
//! service over HTTP. Part of the `agent-harness` binary, not of the
//! library.

pub mod chat;
pub mod health;
