-- Tool outputs too large for the prompt (over 12,000 characters).
CREATE TABLE artifacts (
    id          TEXT PRIMARY KEY NOT NULL,
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    turn_id     TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    tool        TEXT NOT NULL,
    content     TEXT NOT NULL,
    created_at  TEXT NOT NULL
);

CREATE INDEX artifacts_session ON artifacts (session_id, created_at);
