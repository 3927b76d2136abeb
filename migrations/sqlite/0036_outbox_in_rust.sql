-- One outbox: which webhook deliveries an event makes is decided by the
-- service (`store::webhooks::routes`), in the transaction that logs the
-- event, not by a trigger; and both queues (A2A pushes, webhook
-- deliveries) carry the key their tenant's share is counted by, so that
-- one lease statement serves both (`store::leases`).
DROP TRIGGER IF EXISTS webhook_events;

-- The tenant a row is counted for (`*`: the operator's endpoint).
ALTER TABLE webhook_deliveries ADD COLUMN share_key TEXT NOT NULL DEFAULT '';
UPDATE webhook_deliveries SET share_key = CASE WHEN webhook_id = 'wh_operator' THEN '*' ELSE tenant END;

ALTER TABLE push_configs ADD COLUMN share_key TEXT NOT NULL DEFAULT '';
UPDATE push_configs SET share_key = CASE WHEN instr(session_id, '/') > 0
    THEN substr(session_id, 1, instr(session_id, '/') - 1) ELSE 'default' END;
