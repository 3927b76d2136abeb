-- The turns of a session form a tree (docs/conversation-trees.md): each
-- turn names the turn whose state it continues (NULL: a root). A session
-- that was ever branched (a turn that does not continue the newest one:
-- a regenerate, an edit) reads a turn's history along its branch; one
-- that never was reads its last messages, as before.
ALTER TABLE turns ADD COLUMN parent_turn_id TEXT;
-- The client's name for the turn (an AG-UI runId): a later run names it
-- as its parent.
ALTER TABLE turns ADD COLUMN run_id TEXT;
ALTER TABLE sessions ADD COLUMN branched BOOLEAN NOT NULL DEFAULT FALSE;

-- Every turn so far continued the one before it.
UPDATE turns t SET parent_turn_id = p.previous
FROM (
    SELECT id, lag(id) OVER (PARTITION BY session_id ORDER BY created_at, id) AS previous
    FROM turns
) p
WHERE p.id = t.id AND p.previous IS NOT NULL;

-- A branch's messages are read by turn.
CREATE INDEX messages_turn ON messages (turn_id, id);
