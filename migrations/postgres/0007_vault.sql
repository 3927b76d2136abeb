-- The vault's full-text index: one row per markdown note (its content hash
-- makes re-indexing incremental) and its chunks, split by heading, with a
-- weighted tsvector (heading above text) under a GIN index.
CREATE TABLE vault_notes (
    path          TEXT PRIMARY KEY,
    content_hash  TEXT NOT NULL,
    bytes         BIGINT NOT NULL,
    indexed_at    TIMESTAMPTZ NOT NULL
);

CREATE TABLE vault_chunks (
    id       BIGSERIAL PRIMARY KEY,
    path     TEXT NOT NULL REFERENCES vault_notes (path) ON DELETE CASCADE,
    ordinal  INTEGER NOT NULL,
    heading  TEXT NOT NULL,
    anchor   TEXT NOT NULL,
    text     TEXT NOT NULL,
    tsv      TSVECTOR GENERATED ALWAYS AS (
        setweight(to_tsvector('english', heading), 'A')
        || setweight(to_tsvector('english', text), 'B')
    ) STORED
);

CREATE INDEX vault_chunks_path ON vault_chunks (path, ordinal);
CREATE INDEX vault_chunks_tsv ON vault_chunks USING GIN (tsv);
