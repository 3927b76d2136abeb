-- The cost of a turn in USD, when its models are priced.
ALTER TABLE turns ADD COLUMN cost_usd REAL;
