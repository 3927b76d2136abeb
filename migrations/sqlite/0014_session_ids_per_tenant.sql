-- Session ids are per tenant: the same id in two tenants is two sessions.
-- A session is stored under a key: the default tenant's under its id (as
-- before, so nothing of theirs moves), another tenant's under
-- `{tenant}/{id}` (neither a tenant nor an id holds a `/`). This moves
-- the other tenants' sessions, and every row that names one, to their
-- keys. A child row cannot point at a key that is not there yet, so the
-- sessions are copied first, the rows moved, and the old sessions, by
-- then without rows, removed.
INSERT INTO sessions (id, created_at, updated_at, turn_count, last_seq, cost_usd, tenant)
SELECT tenant || '/' || id, created_at, updated_at, turn_count, last_seq, cost_usd, tenant
FROM sessions
WHERE tenant <> 'default' AND id NOT LIKE '%/%';

UPDATE turns SET
    session_id = (SELECT s.tenant || '/' || s.id FROM sessions s WHERE s.id = turns.session_id)
WHERE session_id IN (SELECT id FROM sessions WHERE tenant <> 'default' AND id NOT LIKE '%/%');

UPDATE events SET
    session_id = (SELECT s.tenant || '/' || s.id FROM sessions s WHERE s.id = events.session_id)
WHERE session_id IN (SELECT id FROM sessions WHERE tenant <> 'default' AND id NOT LIKE '%/%');

UPDATE messages SET
    session_id = (SELECT s.tenant || '/' || s.id FROM sessions s WHERE s.id = messages.session_id)
WHERE session_id IN (SELECT id FROM sessions WHERE tenant <> 'default' AND id NOT LIKE '%/%');

UPDATE decisions SET
    session_id = (SELECT s.tenant || '/' || s.id FROM sessions s WHERE s.id = decisions.session_id)
WHERE session_id IN (SELECT id FROM sessions WHERE tenant <> 'default' AND id NOT LIKE '%/%');

UPDATE artifacts SET
    session_id = (SELECT s.tenant || '/' || s.id FROM sessions s WHERE s.id = artifacts.session_id)
WHERE session_id IN (SELECT id FROM sessions WHERE tenant <> 'default' AND id NOT LIKE '%/%');

UPDATE checkpoints SET
    session_id = (SELECT s.tenant || '/' || s.id FROM sessions s WHERE s.id = checkpoints.session_id)
WHERE session_id IN (SELECT id FROM sessions WHERE tenant <> 'default' AND id NOT LIKE '%/%');

UPDATE judgements SET
    session_id = (SELECT s.tenant || '/' || s.id FROM sessions s WHERE s.id = judgements.session_id)
WHERE session_id IN (SELECT id FROM sessions WHERE tenant <> 'default' AND id NOT LIKE '%/%');

UPDATE research_observations SET
    session_id = (SELECT s.tenant || '/' || s.id FROM sessions s WHERE s.id = research_observations.session_id)
WHERE session_id IN (SELECT id FROM sessions WHERE tenant <> 'default' AND id NOT LIKE '%/%');

UPDATE approvals SET
    session_id = (SELECT s.tenant || '/' || s.id FROM sessions s WHERE s.id = approvals.session_id)
WHERE session_id IN (SELECT id FROM sessions WHERE tenant <> 'default' AND id NOT LIKE '%/%');

-- A background job names its session in its payload too.
UPDATE background_jobs SET
    session_id = (SELECT s.tenant || '/' || s.id FROM sessions s WHERE s.id = background_jobs.session_id),
    payload = (SELECT json_set(payload, '$.session_id', s.tenant || '/' || s.id)
               FROM sessions s WHERE s.id = background_jobs.session_id)
WHERE session_id IN (SELECT id FROM sessions WHERE tenant <> 'default' AND id NOT LIKE '%/%');

UPDATE memories SET
    source_session_id = (SELECT s.tenant || '/' || s.id FROM sessions s WHERE s.id = memories.source_session_id)
WHERE source_session_id IN (SELECT id FROM sessions WHERE tenant <> 'default' AND id NOT LIKE '%/%');

DELETE FROM sessions WHERE tenant <> 'default' AND id NOT LIKE '%/%';
