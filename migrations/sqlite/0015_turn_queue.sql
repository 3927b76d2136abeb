-- Requests waiting for a session's running turn to end (`multitask:
-- enqueue`), in the order they were posted: the lowest ticket of a
-- session goes next. A waiting request keeps its ticket alive
-- (`alive_ms`, milliseconds since the epoch); a ticket left by a process
-- that died goes stale and is passed over.
CREATE TABLE turn_queue (
    ticket      INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id  TEXT NOT NULL,
    alive_ms    INTEGER NOT NULL
);
CREATE INDEX turn_queue_session ON turn_queue (session_id, ticket);
