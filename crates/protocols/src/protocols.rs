//! The protocols a turn is asked for and answered in, between the HTTP
//! edge ([`crate::http`]) and the runner.
//!
//! [`endpoint`] owns what every protocol's turn has in common: naming the
//! session in the caller's tenant, starting the turn, following it live or
//! waiting for its end, the `x-session-id`/`x-turn-id` headers, and what an
//! ended turn's status answers. [`sse`] streams any protocol's frames with
//! the same keep-alive. A protocol is then its request mapping, its
//! encoder and its error shapes: a file (or a folder) here and a route.
//!
//! A protocol reaches turns and sessions only through the turn service
//! ([`crate::service::TurnService`], in [`Protocols`]): it follows a turn
//! (its live events, then its log) and folds an ended one from its log a
//! page at a time.

pub mod a2a;
pub mod agui;
pub mod approvals;
pub mod chat_completions;
pub mod client_calls;
pub mod endpoint;
pub mod error;
pub mod json;
pub mod jsonrpc;
pub mod lookup;
pub mod mcp;
pub mod multitask;
pub mod native;
pub mod parts;
pub mod paths;
pub mod responses;
pub mod retraction;
pub(crate) mod schemas;
pub mod sse;
mod state;
pub mod ui_message;

pub use endpoint::ConversationTurn;
pub use parts::{CallResult, ToolDeclaration, declared_tools, finished_call};
pub use sse::{Encoded, KEEP_ALIVE, WireFormat, data_frame, stream_for, stream_turn, typed};
pub use state::{Protocols, Shared};
