-- What a client posted for a call of a tool it runs itself (declared with
-- its turn); the first answer stands.
CREATE TABLE client_tool_results (
    turn_id     TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    output      TEXT NOT NULL,
    is_error    BOOLEAN NOT NULL,
    posted_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (turn_id, call_id)
);
