-- What each step of a running turn leaves for the rest of it
-- (`harness/durable.rs`): written with the step's events, read when the
-- turn is taken over, deleted with the turn's end.
CREATE TABLE turn_steps (
    turn_id    TEXT NOT NULL REFERENCES turns (id) ON DELETE CASCADE,
    step       INTEGER NOT NULL,
    phase      TEXT NOT NULL CHECK (phase IN ('answered', 'finished')),
    record     TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (turn_id, step, phase)
);
