-- A turn's events are a contiguous run of its session's seqs, so the
-- primary key (session_id, seq) finds them; a second index on every event
-- only cost a B-tree insert per event.
DROP INDEX events_turn;
