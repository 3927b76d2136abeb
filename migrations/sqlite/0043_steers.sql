-- Messages steered into a running turn (issue 66, part 5): each is
-- applied once at one of the turn's step boundaries (`applied_step`), or,
-- when the turn ends first, becomes the session's next turn
-- (`deferred_to`). Kept until the session is erased.
CREATE TABLE steers (
    id           TEXT PRIMARY KEY NOT NULL,
    session_id   TEXT NOT NULL,
    turn_id      TEXT NOT NULL,
    message      TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    applied_step INTEGER,
    deferred_to  TEXT
);

-- A turn's steers, in the order they came.
CREATE INDEX steers_turn ON steers (turn_id, id);
