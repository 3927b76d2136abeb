-- A turn's lease: which take-over of the turn owns it (0: the process that
-- began it). A take-over adds one; the owner's writes name the attempt
-- they hold, and a write of an attempt no longer held is refused (the
-- owner that lost its turn can write nothing more).
ALTER TABLE turns ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;

-- Fails the statement that calls it when it holds writes of turns it no
-- longer holds the lease of (`lost` of them), so nothing of it is written.
CREATE FUNCTION harness_lease_lost(lost BIGINT) RETURNS BIGINT
LANGUAGE plpgsql AS $$
BEGIN
    IF lost > 0 THEN
        RAISE EXCEPTION 'the batch holds % write(s) of a turn another process has taken over', lost;
    END IF;
    RETURN 0;
END
$$;
