//! The reads of a branch: a turn and its ancestors, along their parent
//! links, and their messages.

/// A walk up the parent links, as the CTE `$name (id, depth)`: the rows
/// of `$start` (depth 0), then each one's parent, in whichever session it
/// is, at most `$depth` turns up (a number, or a parameter's place).
macro_rules! walk_up {
    ($name:literal, $start:literal, $depth:literal) => {
        concat!(
            "WITH RECURSIVE ",
            $name,
            " (id, depth) AS ( ",
            $start,
            " UNION ALL SELECT t.parent_turn_id, w.depth + 1 FROM ",
            $name,
            " w JOIN turns t ON t.id = w.id WHERE t.parent_turn_id IS NOT NULL AND w.depth < ",
            $depth,
            " ) "
        )
    };
}
pub(in crate::store) use walk_up;

/// The turns of a branch: the turn `$1` and its ancestors, at most `$depth`
/// turns up (a parameter's place).
macro_rules! branch_cte {
    ($depth:literal) => {
        walk_up!(
            "branch",
            "SELECT id, CAST(0 AS BIGINT) FROM turns WHERE id = $1",
            $depth
        )
    };
}

/// A branch's last messages, newest first: those of the turn `$1` and of
/// its ancestors (at most `$2` turns up, so as many messages), at most `$2`.
pub(in crate::store) const BRANCH_MESSAGES: &str = concat!(
    branch_cte!("$2"),
    "SELECT m.id, m.message_id, m.turn_id, m.role, m.content, m.created_at, m.attachments \
     FROM messages m WHERE m.turn_id IN (SELECT id FROM branch) ORDER BY m.id DESC LIMIT $2"
);

/// A branch's messages in order, a page at a time: those of the turn `$1`
/// and its ancestors (at most [`super::BRANCH_DEPTH_MAX`] turns up, `$4`) after
/// message `$2`, at most `$3`.
pub(super) const BRANCH_PAGE: &str = concat!(
    branch_cte!("$4"),
    "SELECT m.id, m.message_id, m.turn_id, m.role, m.content, m.created_at \
     FROM messages m WHERE m.turn_id IN (SELECT id FROM branch) AND m.id > $2 \
     ORDER BY m.id LIMIT $3"
);
