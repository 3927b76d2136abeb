-- A field of a JSON document kept as text, read without letting the
-- document fail the statement: `jsonb` refuses U+0000 (JSON's `\u0000`),
-- and one such stored request made every tenant's `DELETE /users/{id}`
-- and a turn's end (the webhook trigger) fail (issue 63). The service now
-- refuses U+0000 in every request and import; what older versions stored
-- reads as NULL here. The pattern is an escape whose backslash is not
-- itself escaped (an odd run of backslashes before `u0000`).
CREATE FUNCTION harness_json_field(doc TEXT, field TEXT) RETURNS TEXT
LANGUAGE SQL IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN doc ~ '(^|[^\\])(\\\\)*\\u0000' THEN NULL
                ELSE doc::jsonb ->> field END
$$;

CREATE OR REPLACE FUNCTION harness_webhook_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    event_tenant TEXT := CASE WHEN position('/' IN NEW.session_id) > 0
                              THEN split_part(NEW.session_id, '/', 1) ELSE 'default' END;
    wanted TEXT := CASE WHEN NEW.type IN ('approval.requested', 'tool.requested')
                        THEN 'turn.waiting' ELSE NEW.type END;
    message TEXT := 'msg_' || replace(NEW.turn_id, '-', '') || '_' || NEW.seq;
BEGIN
    INSERT INTO webhook_deliveries (id, webhook_id, tenant, session_id, seq, kind, created_at, next_at)
    SELECT message, w.id, event_tenant, NEW.session_id, NEW.seq, 'turn', NEW.created_at, NEW.created_at
    FROM webhooks w
    WHERE (w.tenant = '*' OR w.tenant = event_tenant)
      AND position('"' || wanted || '"' IN w.events) > 0
    ON CONFLICT DO NOTHING;
    IF NEW.type IN ('turn.completed', 'turn.failed', 'turn.cancelled') THEN
        INSERT INTO webhook_deliveries (id, webhook_id, tenant, session_id, seq, kind, created_at, next_at)
        SELECT message || '_response', w.id, event_tenant, NEW.session_id, NEW.seq, 'response',
               NEW.created_at, NEW.created_at
        FROM webhooks w JOIN turns t ON t.id = NEW.turn_id
        WHERE harness_json_field(t.request, 'background') = 'true'
          AND (w.tenant = '*' OR w.tenant = event_tenant)
          AND position('"response.' IN w.events) > 0
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;
