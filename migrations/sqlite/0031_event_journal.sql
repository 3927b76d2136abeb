-- Deltas that follow each other in a session are committed here first, in
-- commit order, and moved into `events` as runs (store/event_log/journal.rs):
-- a commit of many paced streams appends a few pages here instead of
-- rewriting one page of `events` per stream. Rows hold what `events` rows
-- hold; no index but the row id (rows are read back only after a crash).
CREATE TABLE event_journal (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    seq_end     INTEGER,
    turn_id     TEXT NOT NULL,
    type        TEXT NOT NULL,
    payload     TEXT NOT NULL,
    created_at  TEXT NOT NULL
);
