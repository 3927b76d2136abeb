-- Running totals of a session, kept by the turn's own transactions, so
-- that starting a turn needs no aggregate query.
ALTER TABLE sessions ADD COLUMN turn_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN cost_usd REAL;
UPDATE sessions SET
    turn_count = (SELECT COUNT(*) FROM turns WHERE turns.session_id = sessions.id),
    cost_usd = (SELECT SUM(cost_usd) FROM turns WHERE turns.session_id = sessions.id);
