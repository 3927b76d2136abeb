-- A2A push notification configurations, each with its delivery state:
-- the task's log is the outbox, and `sent_seq` how far along it the URL
-- has acknowledged (a replica that dies mid-delivery leaves the cursor
-- where it was; its lease runs out and another delivers from there).
CREATE TABLE push_configs (
    task_id           TEXT NOT NULL REFERENCES turns (id) ON DELETE CASCADE,
    id                TEXT NOT NULL,
    session_id        TEXT NOT NULL,
    url               TEXT NOT NULL,
    token             TEXT,
    auth_scheme       TEXT,
    auth_credentials  TEXT,
    created_at        TEXT NOT NULL,
    sent_seq          INTEGER NOT NULL,
    attempts          INTEGER NOT NULL DEFAULT 0,
    failing_since     TEXT,
    next_at           TEXT NOT NULL,
    lease_owner       TEXT,
    lease_until       TEXT,
    done              INTEGER NOT NULL DEFAULT 0,
    last_error        TEXT,
    PRIMARY KEY (task_id, id)
);

-- The deliveries due, oldest first.
CREATE INDEX push_configs_due ON push_configs (next_at) WHERE done = 0;
