-- The vault's full-text index: one row per markdown note (its content hash
-- makes re-indexing incremental) and its chunks, split by heading, with an
-- FTS5 index over heading and text kept in step by triggers.
CREATE TABLE vault_notes (
    path          TEXT PRIMARY KEY,
    content_hash  TEXT NOT NULL,
    bytes         INTEGER NOT NULL,
    indexed_at    TEXT NOT NULL
);

CREATE TABLE vault_chunks (
    id       INTEGER PRIMARY KEY,
    path     TEXT NOT NULL REFERENCES vault_notes (path) ON DELETE CASCADE,
    ordinal  INTEGER NOT NULL,
    heading  TEXT NOT NULL,
    anchor   TEXT NOT NULL,
    text     TEXT NOT NULL
);

CREATE INDEX vault_chunks_path ON vault_chunks (path, ordinal);

CREATE VIRTUAL TABLE vault_fts USING fts5 (
    heading,
    text,
    content = 'vault_chunks',
    content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);

CREATE TRIGGER vault_chunks_insert AFTER INSERT ON vault_chunks BEGIN
    INSERT INTO vault_fts (rowid, heading, text) VALUES (new.id, new.heading, new.text);
END;

CREATE TRIGGER vault_chunks_delete AFTER DELETE ON vault_chunks BEGIN
    INSERT INTO vault_fts (vault_fts, rowid, heading, text)
    VALUES ('delete', old.id, old.heading, old.text);
END;
