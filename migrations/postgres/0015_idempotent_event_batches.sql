-- A batch of events may be written twice: the writer tries a batch again
-- when the answer to its commit was lost (the connection cut right after
-- COMMIT was sent), and the first try may have landed. Its statements
-- insert with ON CONFLICT DO NOTHING and count the rows that were neither
-- inserted nor found stored as they are (the same turn, type and payload
-- at that seq): a true conflict. This fails the statement with such a
-- count, so nothing of it is written, with the error a unique index gives.
CREATE FUNCTION harness_event_conflicts(conflicts BIGINT) RETURNS BIGINT
LANGUAGE plpgsql AS $$
BEGIN
    IF conflicts > 0 THEN
        RAISE EXCEPTION 'the batch holds % event(s) at a seq where another event is stored', conflicts
            USING ERRCODE = 'unique_violation';
    END IF;
    RETURN 0;
END
$$;
