-- A step record names its turn without a foreign key: the check cost each
-- record a lookup and a share lock on the turn's row, in the hot path of
-- every tool step. Records are written only by the turn's owner, which
-- holds its lease, and deleted with the turn's end; a turn row is never
-- deleted while it runs.
ALTER TABLE turn_steps DROP CONSTRAINT turn_steps_turn_id_fkey;
