-- Every session belongs to a tenant (the tenant of the API key that began
-- it; `default` without keys). Its turns, events, decisions, artifacts,
-- checkpoints, jobs and judgements belong to it through the session.
ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
