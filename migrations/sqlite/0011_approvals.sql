-- A person's decision on a tool call that waited for approval; the first
-- decision stands.
CREATE TABLE approvals (
    turn_id     TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    approved    BOOLEAN NOT NULL,
    reason      TEXT,
    decided_at  TEXT NOT NULL,
    PRIMARY KEY (turn_id, call_id)
);
