-- Durable facts and preferences per memory scope (a user or a session),
-- one per key, with a tsvector under a GIN index.
CREATE TABLE memories (
    id                 TEXT PRIMARY KEY,
    scope              TEXT NOT NULL,
    kind               TEXT NOT NULL CHECK (kind IN ('fact', 'preference')),
    key                TEXT NOT NULL,
    content            TEXT NOT NULL,
    source_session_id  TEXT NOT NULL,
    source_turn_id     TEXT NOT NULL,
    embedding          BYTEA,
    embedding_model    TEXT,
    created_at         TIMESTAMPTZ NOT NULL,
    updated_at         TIMESTAMPTZ NOT NULL,
    tsv                TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    UNIQUE (scope, key)
);

CREATE INDEX memories_scope ON memories (scope, updated_at);
CREATE INDEX memories_tsv ON memories USING GIN (tsv);

-- Work done after a turn, off its path (memory extraction, judges): kept
-- until done, so that a restart loses none; its model usage when done.
CREATE TABLE background_jobs (
    id             TEXT PRIMARY KEY,
    kind           TEXT NOT NULL,
    session_id     TEXT NOT NULL,
    turn_id        TEXT NOT NULL,
    payload        TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('pending', 'running', 'done', 'failed')),
    attempts       BIGINT NOT NULL DEFAULT 0,
    last_error     TEXT,
    run_after      TIMESTAMPTZ NOT NULL,
    claimed_at     TIMESTAMPTZ,
    input_tokens   BIGINT NOT NULL DEFAULT 0,
    output_tokens  BIGINT NOT NULL DEFAULT 0,
    cost_usd       DOUBLE PRECISION,
    created_at     TIMESTAMPTZ NOT NULL,
    updated_at     TIMESTAMPTZ NOT NULL
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
    score           DOUBLE PRECISION NOT NULL,
    passed          BOOLEAN NOT NULL,
    rationale       TEXT NOT NULL,
    provider        TEXT NOT NULL,
    model           TEXT NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL
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
    created_at      TIMESTAMPTZ NOT NULL
);

CREATE INDEX research_observations_session ON research_observations (session_id, created_at);
