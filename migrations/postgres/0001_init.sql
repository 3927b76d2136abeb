-- The core of the store: sessions, turns, the event log, history, decisions.
-- Event payloads are TEXT rather than JSONB on purpose: JSONB reorders keys and
-- drops whitespace, and a replayed event must be byte-for-byte what was sent live.

CREATE TABLE sessions (
    id          TEXT PRIMARY KEY,
    created_at  TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL
);

CREATE TABLE turns (
    id               TEXT PRIMARY KEY,
    session_id       TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    status           TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled', 'interrupted')),
    request          TEXT NOT NULL,
    idempotency_key  TEXT,
    result           TEXT,
    error_code       TEXT,
    error_message    TEXT,
    owner_instance   TEXT NOT NULL,
    owner_process    TEXT NOT NULL,
    heartbeat_at     TIMESTAMPTZ NOT NULL,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    first_seq        BIGINT NOT NULL,
    created_at       TIMESTAMPTZ NOT NULL,
    finished_at      TIMESTAMPTZ
);

-- One running turn per session, enforced by the database so it holds between replicas.
CREATE UNIQUE INDEX turns_one_running_per_session ON turns (session_id) WHERE status = 'running';
CREATE UNIQUE INDEX turns_idempotency ON turns (session_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX turns_session_created ON turns (session_id, created_at);
CREATE INDEX turns_running_owner ON turns (owner_process) WHERE status = 'running';

CREATE TABLE events (
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq         BIGINT NOT NULL,
    turn_id     TEXT NOT NULL,
    type        TEXT NOT NULL,
    payload     TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE INDEX events_turn ON events (turn_id, seq);

CREATE TABLE messages (
    id          BIGSERIAL PRIMARY KEY,
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    turn_id     TEXT NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    content     TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL
);

CREATE INDEX messages_session ON messages (session_id, id);

CREATE TABLE decisions (
    id            TEXT PRIMARY KEY,
    session_id    TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    turn_id       TEXT NOT NULL,
    decision_key  TEXT NOT NULL,
    strategy      TEXT NOT NULL,
    record        TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL
);

CREATE INDEX decisions_session ON decisions (session_id, created_at);
