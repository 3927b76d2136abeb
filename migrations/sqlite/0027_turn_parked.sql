-- A turn that waits for a person or a client beyond its hold is parked:
-- no process owns it (owner_process '') until the answer comes or the
-- wait's deadline passes. `parked_until`: when it is due (the wait's
-- deadline; set to the present when an answer or a cancel wakes it).
-- `waited_ms`: what its parks lasted in all (its compute deadline moves
-- by as much). `resumes`: take-overs that were a parked turn's (they do
-- not count against the take-overs a turn may have).
ALTER TABLE turns ADD COLUMN parked_at TEXT;
ALTER TABLE turns ADD COLUMN parked_until TEXT;
ALTER TABLE turns ADD COLUMN waited_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN resumes INTEGER NOT NULL DEFAULT 0;
