-- The turns of a session form a tree (docs/conversation-trees.md): each
-- turn names the turn whose state it continues (NULL: a root). A session
-- that was ever branched (a turn that does not continue the newest one:
-- a regenerate, an edit) reads a turn's history along its branch; one
-- that never was reads its last messages, as before.
ALTER TABLE turns ADD COLUMN parent_turn_id TEXT;
-- The client's name for the turn (an AG-UI runId): a later run names it
-- as its parent.
ALTER TABLE turns ADD COLUMN run_id TEXT;
ALTER TABLE sessions ADD COLUMN branched INTEGER NOT NULL DEFAULT 0;

-- Every turn so far continued the one before it.
UPDATE turns SET parent_turn_id = (
    SELECT p.id FROM turns p
    WHERE p.session_id = turns.session_id
      AND (p.created_at, p.id) < (turns.created_at, turns.id)
    ORDER BY p.created_at DESC, p.id DESC LIMIT 1
);

-- A branch's messages are read by turn.
CREATE INDEX messages_turn ON messages (turn_id);
