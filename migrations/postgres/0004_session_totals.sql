-- Running totals of a session, kept by the turns' own transactions, so
-- that starting a turn needs no aggregate query. `last_seq` is the seq of
-- the session's newest event whenever no turn of it is running (a turn's
-- begin and end set it; its deltas in between do not).
ALTER TABLE sessions ADD COLUMN turn_count BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN last_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN cost_usd DOUBLE PRECISION;
UPDATE sessions SET
    turn_count = (SELECT COUNT(*) FROM turns WHERE turns.session_id = sessions.id),
    last_seq = (SELECT COALESCE(MAX(seq), 0) FROM events WHERE events.session_id = sessions.id),
    cost_usd = (SELECT SUM(cost_usd) FROM turns WHERE turns.session_id = sessions.id);
