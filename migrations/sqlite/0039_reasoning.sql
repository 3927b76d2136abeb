-- A tenant's own choice of whether its clients see the model's
-- reasoning (`show` or `hidden`; NULL: the operator's
-- `HARNESS_REASONING`), and the reasoning tokens of each day's usage
-- (among its output tokens).
ALTER TABLE tenants ADD COLUMN reasoning TEXT CHECK (reasoning IN ('show', 'hidden'));
ALTER TABLE tenant_usage ADD COLUMN reasoning_tokens INTEGER NOT NULL DEFAULT 0;
