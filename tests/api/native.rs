//! The native turn API (`/sessions/{id}/turns`) and what a turn does: tools, approvals, client tools, models, memory, the vault.

pub(crate) mod approval_edits;
pub(crate) mod approvals;
pub(crate) mod chain;
pub(crate) mod client_tools;
pub(crate) mod decisions;
pub(crate) mod fork;
pub(crate) mod http_tools;
pub(crate) mod lifecycle;
pub(crate) mod memory;
pub(crate) mod models;
pub(crate) mod multitask;
pub(crate) mod output;
pub(crate) mod steer;
pub(crate) mod stops;
pub(crate) mod tool_turn;
pub(crate) mod tools;
pub(crate) mod tree;
pub(crate) mod turns;
pub(crate) mod vault;
pub(crate) mod web;
