-- The W3C trace context of the span that began a turn (none when traces
-- are not exported): a replica that takes the turn over links its own
-- span to it, so the turn's lives read as one in a trace viewer.
ALTER TABLE turns ADD COLUMN traceparent TEXT;
