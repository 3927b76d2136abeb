-- A turn names its session's tenant, and the tenant's running turns have
-- an index of their own: a begin counts them (the tenant's limit) from
-- that index alone. The count read every running turn of every tenant and
-- each one's session, on the writer thread, at every begin: 0.5 ms a
-- begin at 1,000 running turns (docs/benchmarks.md, issue 42). The index
-- holds the status and the park too, so the count reads no turn's row.
ALTER TABLE turns ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
UPDATE turns SET tenant = COALESCE(
    (SELECT s.tenant FROM sessions s WHERE s.id = turns.session_id), '');
CREATE INDEX turns_running_by_tenant ON turns (tenant, status, parked_until)
    WHERE status = 'running' AND parked_until IS NULL;
