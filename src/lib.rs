//! # agent-harness
//!
//! An HTTP/SSE service that runs one LLM agent turn per request.
//!
//! # Layout
//!
//! - [`config`]: settings (defaults → TOML file → environment), validated at start.
//! - [`startup`]: [`startup::Application`] builds and runs the service (binary and tests).
//! - [`app`]: the state handlers share.
//! - [`http`]: routes, problem+json errors, SSE encoding, the OpenAPI document.
//! - [`runner`]: turns as detached, cancellable tasks; the event log writer
//!   (group commit), live fan-out and gap-free resumable subscriptions.
//! - [`harness`]: the agent turn itself (prompt, bounded loop), emitting
//!   [`events::TurnEvent`]s.
//! - [`providers`]: the `LlmProvider` trait and the OpenAI-compatible adapter.
//! - [`store`]: SQLite and Postgres behind one `Store` trait.
//! - [`events`], [`turn`], [`ids`]: the shared vocabulary (events, what a
//!   turn is asked and answers, identifiers); they import no layer above.
//! - [`telemetry`]: logs and OTLP traces.

pub mod app;
pub mod config;
pub mod events;
pub mod harness;
pub mod http;
pub mod ids;
pub mod metrics;
pub mod providers;
pub mod runner;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod turn;
