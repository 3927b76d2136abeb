-- The column that SQLite's runs of text deltas use (store/event_log/runs.rs):
-- the read is one for both backends. Postgres writes one row per event (its
-- unique seq is what fences two replicas), so it is always NULL here.
ALTER TABLE events ADD COLUMN seq_end BIGINT;
