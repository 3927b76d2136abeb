-- Files a tenant uploaded (`POST /files`) or a turn's message carried
-- inline. A file row names its bytes by their SHA-256; the bytes are
-- stored once per tenant (`file_blobs`, in `file_chunks` of at most
-- 256 KiB each), however many files hold them, and go with the last
-- file that holds them.
CREATE TABLE files (
    tenant      TEXT NOT NULL,
    -- `file-…`
    id          TEXT NOT NULL,
    sha256      TEXT NOT NULL,
    bytes       INTEGER NOT NULL,
    media_type  TEXT NOT NULL,
    filename    TEXT NOT NULL,
    purpose     TEXT NOT NULL,
    -- The session whose message carried it inline (erased with it).
    session_id  TEXT,
    -- Who uploaded it (erased with `DELETE /users/{user_id}`).
    user_id     TEXT,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
);

CREATE INDEX files_by_blob ON files (tenant, sha256);
CREATE INDEX files_by_session ON files (session_id) WHERE session_id IS NOT NULL;
CREATE INDEX files_by_user ON files (tenant, user_id) WHERE user_id IS NOT NULL;

CREATE TABLE file_blobs (
    tenant      TEXT NOT NULL,
    sha256      TEXT NOT NULL,
    bytes       INTEGER NOT NULL,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (tenant, sha256)
);

CREATE TABLE file_chunks (
    tenant      TEXT NOT NULL,
    sha256      TEXT NOT NULL,
    -- 0, 1, …: the chunk's place in the bytes.
    idx         INTEGER NOT NULL,
    data        BLOB NOT NULL,
    PRIMARY KEY (tenant, sha256, idx)
);
