-- A run of a turn's text deltas committed together is one row: `seq` its
-- first event's, `seq_end` its last's (NULL: a row of one event), and its
-- payload each event's time and payload in order (store/event_log/runs.rs).
-- Only the SQLite writer makes runs; reads expand them.
ALTER TABLE events ADD COLUMN seq_end INTEGER;
