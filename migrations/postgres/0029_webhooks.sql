-- Webhook endpoints (a tenant's, and the operator's as tenant '*'), and
-- their deliveries. A delivery is written by the trigger below in the
-- transaction that logs its event, so an event the log holds is never
-- without its deliveries (a replica killed after the commit loses
-- nothing: any replica's delivery loop sends it).
CREATE TABLE webhooks (
    id          TEXT PRIMARY KEY NOT NULL,
    tenant      TEXT NOT NULL,
    url         TEXT NOT NULL,
    -- The event types wanted, a JSON array of strings.
    events      TEXT NOT NULL,
    secret      TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL
);

CREATE INDEX webhooks_tenant ON webhooks (tenant);

CREATE TABLE webhook_deliveries (
    -- The `webhook-id` of the message: the same on every try.
    id            TEXT NOT NULL,
    webhook_id    TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    tenant        TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    seq           BIGINT NOT NULL,
    -- 'turn' (the event's own type) or 'response' (a background
    -- response's end).
    kind          TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL,
    -- pending, delivered, failed (given up: the dead letters), skipped
    status        TEXT NOT NULL DEFAULT 'pending',
    attempts      BIGINT NOT NULL DEFAULT 0,
    next_at       TIMESTAMPTZ NOT NULL,
    lease_owner   TEXT,
    lease_until   TIMESTAMPTZ,
    last_status   BIGINT,
    last_error    TEXT,
    delivered_at  TIMESTAMPTZ,
    PRIMARY KEY (webhook_id, id)
);

CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_listed ON webhook_deliveries (webhook_id, created_at);

CREATE FUNCTION harness_webhook_events() RETURNS trigger LANGUAGE plpgsql AS $$
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
        WHERE (t.request::jsonb ->> 'background') = 'true'
          AND (w.tenant = '*' OR w.tenant = event_tenant)
          AND position('"response.' IN w.events) > 0
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER webhook_events AFTER INSERT ON events FOR EACH ROW
WHEN (NEW.type IN ('turn.completed', 'turn.failed', 'turn.cancelled', 'approval.requested', 'tool.requested'))
EXECUTE FUNCTION harness_webhook_events();
