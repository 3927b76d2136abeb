-- Each history message gets the id the harness gave it (a UUID v7), so
-- that references made during the turn (the research learner's source,
-- the decision record's `assistant_message_id`) point at a stored row.
-- Rows written before this migration have none.
ALTER TABLE messages ADD COLUMN message_id TEXT;
CREATE UNIQUE INDEX messages_message_id ON messages (message_id);
