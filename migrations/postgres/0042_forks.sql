-- A fork (docs/conversation-trees.md): a session whose history begins
-- with another session's branch up to one of its turns, read through
-- that session rather than copied. `forked_from` is the source's stored
-- key, `forked_at` the turn its first turn continues.
ALTER TABLE sessions ADD COLUMN forked_from TEXT;
ALTER TABLE sessions ADD COLUMN forked_at TEXT;

-- Which sessions hold a source's turns (an erase, retention).
CREATE INDEX sessions_forked_from ON sessions (forked_from) WHERE forked_from IS NOT NULL;
