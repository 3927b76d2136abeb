-- A turn names its session's tenant, and the tenant's running turns have
-- an index of their own: a begin counts them (the tenant's limit) from
-- that index alone. The count read every running turn of every tenant and
-- each one's session at every begin (docs/benchmarks.md, issue 42).
ALTER TABLE turns ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
UPDATE turns t SET tenant = s.tenant FROM sessions s WHERE s.id = t.session_id;
CREATE INDEX turns_running_by_tenant ON turns (tenant)
    WHERE status = 'running' AND parked_until IS NULL;
