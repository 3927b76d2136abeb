-- The steers no step took and no turn answers yet: a sweep finds those
-- of turns that ended (their owner died, or shut down, before it made
-- them the session's next turn) without reading the rest.
CREATE INDEX steers_waiting ON steers (turn_id)
    WHERE applied_step IS NULL AND deferred_to IS NULL;
