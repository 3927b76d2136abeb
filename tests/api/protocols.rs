//! Every other protocol a turn is asked in: OpenAI chat and Responses, the AI SDK UI stream, AG-UI, A2A, MCP.

pub(crate) mod a2a;
pub(crate) mod a2a_push;
pub(crate) mod a2a_rest;
pub(crate) mod agui;
pub(crate) mod approvals;
pub(crate) mod attachments;
pub(crate) mod branches;
pub(crate) mod mcp;
pub(crate) mod mcp_current;
pub(crate) mod mcp_server;
pub(crate) mod openai_compat;
pub(crate) mod reasoning;
pub(crate) mod responses;
pub(crate) mod steering;
pub(crate) mod ui_stream;
