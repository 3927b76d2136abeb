-- The event log is the hottest table: a 20-token turn writes about 24
-- events, and the foreign key to sessions ran a lookup and a row lock on
-- the session for every one of them (264,003 checks for 8,800 turns in
-- the bench: the largest single cost of a turn on the server). Every
-- event is written either by the statement that makes or updates its
-- session (a turn's begin), or for a turn that is running (so its
-- session exists), and sessions are never deleted by the service: the
-- key only checked what is already true. An operator who deletes a
-- session by hand deletes its events with it.
ALTER TABLE events DROP CONSTRAINT events_session_id_fkey;

-- The orphan sweep reads the running turns oldest first, several times a
-- second on every replica. The partial index on the owner also served it,
-- but by a bitmap scan, and a bitmap scan never marks the entries of
-- turns that ended as dead: between two vacuums it read every turn
-- ended since (18 ms a sweep after 50,000 turns). Ordered by when the
-- turns began, with a limit, the sweep walks this index directly, and an
-- index scan marks the dead entries it passes so later sweeps skip them.
CREATE INDEX turns_running_since ON turns (created_at) WHERE status = 'running';
