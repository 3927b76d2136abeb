-- Each tenant its own vault: the index keeps which vault a note is of
-- ('' is the default tenant's, and the shared one). A tenant's note is
-- keyed `{tenant}:{path}` (a path holds no `:`), so the default tenant's
-- keys stay as they were.
ALTER TABLE vault_notes ADD COLUMN vault TEXT NOT NULL DEFAULT '';
ALTER TABLE vault_chunks ADD COLUMN vault TEXT NOT NULL DEFAULT '';
CREATE INDEX vault_notes_vault ON vault_notes (vault);
CREATE INDEX vault_chunks_vault ON vault_chunks (vault, id);
