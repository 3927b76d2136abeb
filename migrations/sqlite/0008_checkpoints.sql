-- A note as it was before a write changed it (or that it did not exist),
-- so that the write can be undone.
CREATE TABLE checkpoints (
    id           TEXT PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    turn_id      TEXT NOT NULL,
    call_id      TEXT NOT NULL,
    tool         TEXT NOT NULL,
    path         TEXT NOT NULL,
    existed      BOOLEAN NOT NULL,
    content      BLOB,
    bytes        INTEGER,
    created_at   TEXT NOT NULL,
    restored_at  TEXT
);

CREATE INDEX checkpoints_session ON checkpoints (session_id, created_at);
