-- The orphan sweep's query (status = 'running' and an owner or heartbeat
-- condition) is answered by turns_one_running_per_session, which holds
-- exactly the running turns; this index only cost two page writes a turn
-- (one at its begin, one at its end).
DROP INDEX turns_running_owner;
