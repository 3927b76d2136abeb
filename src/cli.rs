//! The binary's commands beside `serve`: the client commands (`chat`,
//! `health`), which talk to a running service over HTTP, and the
//! operator's (`migrate`, `keys`, `tenants`, `audit`, `import`,
//! `index-vault`), which work on its database. Part of the
//! `agent-harness` binary, not of the library.

pub mod admin;
pub mod chat;
pub mod error;
pub mod health;
pub mod import;
pub mod vault;
