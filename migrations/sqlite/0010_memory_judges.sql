-- Durable facts and preferences per memory scope (a user or a session),
-- one per key, with a full-text index kept in step by triggers.
CREATE TABLE memories (
    id                 TEXT PRIMARY KEY,
    scope              TEXT NOT NULL,
    kind               TEXT NOT NULL CHECK (kind IN ('fact', 'preference')),
    key                TEXT NOT NULL,
    content            TEXT NOT NULL,
    source_session_id  TEXT NOT NULL,
    source_turn_id     TEXT NOT NULL,
    embedding          BLOB,
    embedding_model    TEXT,
    created_at         TEXT NOT NULL,
    updated_at         TEXT NOT NULL,
    UNIQUE (scope, key)
);

CREATE INDEX memories_scope ON memories (scope, updated_at);

CREATE VIRTUAL TABLE memories_fts USING fts5 (
    content,
    content = 'memories',
    content_rowid = 'rowid',
    tokenize = 'porter unicode61 remove_diacritics 2'
);

CREATE TRIGGER memories_insert AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts (rowid, content) VALUES (new.rowid, new.content);
END;

CREATE TRIGGER memories_delete AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, content) VALUES ('delete', old.rowid, old.content);
END;

CREATE TRIGGER memories_update AFTER UPDATE OF content ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, content) VALUES ('delete', old.rowid, old.content);
    INSERT INTO memories_fts (rowid, content) VALUES (new.rowid, new.content);
END;

-- Work done after a turn, off its path (memory extraction, judges): kept
-- until done, so that a restart loses none; its model usage when done.
CREATE TABLE background_jobs (
    id             TEXT PRIMARY KEY,
    kind           TEXT NOT NULL,
    session_id     TEXT NOT NULL,
    turn_id        TEXT NOT NULL,
    payload        TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('pending', 'running', 'done', 'failed')),
    attempts       INTEGER NOT NULL DEFAULT 0,
    last_error     TEXT,
    run_after      TEXT NOT NULL,
    claimed_at     TEXT,
    input_tokens   INTEGER NOT NULL DEFAULT 0,
    output_tokens  INTEGER NOT NULL DEFAULT 0,
    cost_usd       REAL,
    created_at     TEXT NOT NULL,
    updated_at     TEXT NOT NULL
);

CREATE INDEX background_jobs_due ON background_jobs (status, run_after);
CREATE INDEX background_jobs_session ON background_jobs (session_id, created_at);

-- A judge's score of a turn.
CREATE TABLE judgements (
    id              TEXT PRIMARY KEY,
    session_id      TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    turn_id         TEXT NOT NULL,
    judge           TEXT NOT NULL,
    prompt_id       TEXT NOT NULL,
    prompt_version  TEXT NOT NULL,
    score           REAL NOT NULL,
    passed          BOOLEAN NOT NULL,
    rationale       TEXT NOT NULL,
    provider        TEXT NOT NULL,
    model           TEXT NOT NULL,
    created_at      TEXT NOT NULL
);

CREATE INDEX judgements_turn ON judgements (session_id, turn_id, created_at);

-- The research learner's observations: a turn's question and answer, its
-- source the stored assistant message.
CREATE TABLE research_observations (
    id              TEXT PRIMARY KEY,
    session_id      TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    source_id       TEXT NOT NULL,
    user_text       TEXT NOT NULL,
    assistant_text  TEXT NOT NULL,
    created_at      TEXT NOT NULL
);

CREATE INDEX research_observations_session ON research_observations (session_id, created_at);
