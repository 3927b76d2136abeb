-- A tenant's own limits, over the service's defaults (`agent-harness
-- tenants set`); a column left NULL keeps the default.
CREATE TABLE tenants (
    tenant             TEXT PRIMARY KEY NOT NULL,
    max_running_turns  BIGINT,
    max_streams        BIGINT,
    tokens_per_day     BIGINT,
    updated_at         TIMESTAMPTZ NOT NULL
);

-- What each tenant's turns used, by UTC day (`YYYY-MM-DD`): the daily
-- token quota and `GET /usage` read it.
CREATE TABLE tenant_usage (
    tenant         TEXT NOT NULL,
    day            TEXT NOT NULL,
    input_tokens   BIGINT NOT NULL DEFAULT 0,
    output_tokens  BIGINT NOT NULL DEFAULT 0,
    cost_usd       DOUBLE PRECISION,
    PRIMARY KEY (tenant, day)
);
