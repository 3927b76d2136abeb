-- When a client hid a turn from its protocol's reads (`DELETE
-- /v1/responses/{id}`): the turn stays in its session's log and history.
ALTER TABLE turns ADD COLUMN hidden_at TIMESTAMPTZ;
