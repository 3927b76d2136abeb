//! # harness-store
//!
//! The store of agent-harness: the event log, turns and sessions, and
//! everything else a replica shares with the others, on SQLite
//! (embedded) or Postgres. One trait per concern; both backends held to
//! one contract (`tests/store`). The event log's rules are
//! `docs/event-log.md`.

use harness_base::{events, ids, turn};

pub mod store;
