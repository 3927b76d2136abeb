-- A tenant's own limits, over the service's defaults (`agent-harness
-- tenants set`); a column left NULL keeps the default.
CREATE TABLE tenants (
    tenant             TEXT PRIMARY KEY NOT NULL,
    max_running_turns  INTEGER,
    max_streams        INTEGER,
    tokens_per_day     INTEGER,
    updated_at         TEXT NOT NULL
);

-- What each tenant's turns used, by UTC day (`YYYY-MM-DD`): the daily
-- token quota and `GET /usage` read it.
CREATE TABLE tenant_usage (
    tenant         TEXT NOT NULL,
    day            TEXT NOT NULL,
    input_tokens   INTEGER NOT NULL DEFAULT 0,
    output_tokens  INTEGER NOT NULL DEFAULT 0,
    cost_usd       REAL,
    PRIMARY KEY (tenant, day)
);
