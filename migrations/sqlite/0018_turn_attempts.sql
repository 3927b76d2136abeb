-- A turn's lease: which take-over of the turn owns it (0: the process that
-- began it). A take-over adds one; the owner's writes name the attempt
-- they hold, and a write of an attempt no longer held is refused (the
-- owner that lost its turn can write nothing more).
ALTER TABLE turns ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;
