-- An admin key may also use the admin routes (erase a tenant, import a
-- session, read the audit trail).
ALTER TABLE api_keys ADD COLUMN admin BOOLEAN NOT NULL DEFAULT FALSE;

-- The audit trail: who did what to whose data, never what was said. Rows
-- are only added (the service has no route that changes or removes one;
-- `HARNESS_AUDIT_RETENTION` trims the oldest). Failed authentications
-- are one row per client address and minute, with their count.
CREATE TABLE audit (
    id       BIGSERIAL PRIMARY KEY,
    at       TIMESTAMPTZ NOT NULL,
    -- The tenant whose data it was (NULL: a failed authentication).
    tenant   TEXT,
    kind     TEXT NOT NULL,
    -- Who: a key's id, `local` (keys off), `cli`, `retention`.
    actor    TEXT NOT NULL,
    subject  TEXT,
    outcome  TEXT,
    address  TEXT,
    count    BIGINT NOT NULL DEFAULT 1
);
CREATE INDEX audit_tenant ON audit (tenant, id);
CREATE INDEX audit_at ON audit (at);
CREATE UNIQUE INDEX audit_auth_failures ON audit (address, at) WHERE kind = 'auth.failed';
