//! # agent-harness
//!
//! An HTTP/SSE service that runs one LLM agent turn per request.
//!
//! # Layout
//!
//! - [`config`]: settings in sections, one file each under `config/`
//!   (server, database, providers, harness, vault, web, memory, judges,
//!   tools, telemetry), each a flag, a variable and a file key, typed and
//!   range-checked by its parser at start.
//! - [`startup`]: [`startup::Application`] builds and runs the service (binary and tests).
//! - [`app`]: the state handlers share.
//! - [`http`]: the connection loop (timeouts, connection limit), routes,
//!   problem+json errors, CORS, the OpenAPI document, the chat page; the
//!   wire formats (`http/formats/`: native SSE, OpenAI chat completions,
//!   the OpenAI Responses API, the AI SDK's UI message stream, AG-UI, A2A
//!   tasks, the MCP server's `ask`) as encoders under one driver, and
//!   each protocol's way of answering a call of the client's own tool
//!   (`http/formats/client_calls.rs`).
//! - [`runner`]: turns as detached, cancellable tasks (`runner/turn.rs`: a
//!   turn's life and its end; `runner/sink.rs`: its events and step
//!   records; `runner/resume.rs`: a turn taken over, or handed over at
//!   shutdown, `runner/shutdown.rs`); the event log writer (group commit), live fan-out,
//!   gap-free resumable subscriptions, the session queue
//!   (`runner/queue.rs`), heartbeat, cancels and the sweep that takes
//!   orphaned turns over.
//! - [`harness`]: the agent turn itself (prompt, bounded loop, the gates of
//!   a tool call in `gates.rs`, a step's waves in `waves.rs`, the
//!   finalizer; `durable.rs`: what a step leaves for the rest of its turn,
//!   and the turn rebuilt from it), emitting [`events::TurnEvent`]s.
//! - [`tools`]: the `Tool` trait, specs, the registry, the built-in tools
//!   (retrieval, notes, web), HTTP tools from the settings, MCP servers,
//!   and a turn's client tools (`tools/client.rs`: a call that waits for
//!   the result its client posts).
//! - [`vault`]: the folder of notes, its chunking, index and path checks.
//! - [`background`]: the finalizer's collaborators on the store: memory
//!   (`memory.rs`), the judges (`judges.rs`), the research learner
//!   (`learner.rs`), and the worker that runs their jobs (`jobs.rs`).
//! - [`providers`]: the `LlmProvider` trait, the OpenAI-compatible,
//!   Anthropic and Ollama adapters (`transport.rs`: requests and limits;
//!   `stream.rs`: SSE/NDJSON decoding), the chain, pricing, redaction.
//! - [`store`]: SQLite and Postgres behind one trait per concern
//!   (`EventLog`, `Turns`, `Jobs`, `VaultIndex`, `Access`; `Store` is all).
//! - [`events`], [`turn`], [`ids`], [`hooks`]: the shared vocabulary
//!   (events, what a turn is asked and answers, identifiers, the traits of
//!   the harness's collaborators).
//! - [`telemetry`], [`metrics`], [`pii`]: logs, OTLP traces, Prometheus
//!   text, and the masking of personal data in what is written for
//!   observation (`HARNESS_REDACT_LOGS`).
//!
//! The layers, lowest first: `ids` and `pii`; `providers`; `turn`;
//! `events`; `store`; `metrics` and `vault`; `tools`; `hooks`;
//! `background`; `harness`; `config`; `telemetry`; `runner`; `app`; `http`;
//! `startup` (and the binary's `cli`). A module imports only from its own
//! layer and those below, and no two files import each other, around a
//! circle or directly: `tests/architecture.rs` parses the sources to check
//! both.

pub mod app;
pub mod background;
pub mod config;
pub mod events;
pub mod harness;
pub mod hooks;
pub mod http;
pub mod ids;
pub mod metrics;
pub mod pii;
pub mod providers;
pub mod runner;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod turn;
pub mod vault;
