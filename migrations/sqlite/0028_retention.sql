-- A tenant's own retention (seconds of inactivity after which its
-- sessions are erased; NULL keeps the service's `HARNESS_RETENTION`).
ALTER TABLE tenants ADD COLUMN retention_s INTEGER;

-- Work one replica at a time does (the retention sweep): who holds it,
-- until when.
CREATE TABLE service_leases (
    name    TEXT PRIMARY KEY NOT NULL,
    holder  TEXT NOT NULL,
    until   TEXT NOT NULL
);
