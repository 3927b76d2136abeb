-- The orphan sweep's query (status = 'running' and an owner or heartbeat
-- condition) is answered by turns_one_running_per_session, which holds
-- exactly the running turns; this index was only upkeep on every begin and
-- end of a turn.
DROP INDEX turns_running_owner;
