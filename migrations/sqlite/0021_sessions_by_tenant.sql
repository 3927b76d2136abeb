-- A tenant's sessions, newest first (`list_sessions` of the MCP server).
CREATE INDEX sessions_tenant_updated ON sessions (tenant, updated_at DESC, id);
