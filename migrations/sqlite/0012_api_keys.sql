-- API keys: only a SHA-256 of each key is kept; the key itself is shown
-- once, when it is made.
CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    key_hash    TEXT NOT NULL UNIQUE,
    created_at  TEXT NOT NULL,
    revoked_at  TEXT
);
