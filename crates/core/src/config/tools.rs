//! `[tools]`: HTTP tools and MCP servers.

use crate::{tools::http_tool::HttpToolList, tools::mcp::McpServerList};

#[derive(Debug, Clone, clap::Args)]
pub struct ToolSettings {
    /// HTTP APIs as tools: a JSON list of {name, description, parameters,
    /// method, url, headers, effect, timeout_s} (a `[[tools.http]]` table
    /// each in the file); `${NAME}` in a header value is read from the
    /// environment at start [default: none].
    #[arg(id = "tools.http", long = "http-tools")]
    pub http: Option<HttpToolList>,
    /// MCP servers whose tools join the registry as `{server}__{tool}`: a
    /// JSON list of {name, command, args, env} (stdio) or {name, url,
    /// headers} (streamable HTTP), each with an optional timeout_s (a
    /// `[[tools.mcp]]` table each in the file) [default: none].
    #[arg(id = "tools.mcp", long = "mcp-servers")]
    pub mcp: Option<McpServerList>,
}
