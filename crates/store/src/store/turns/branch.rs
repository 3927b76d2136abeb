//! The reads of a branch: a turn and its ancestors, along their parent
//! links, and their messages.

/// The turns of a branch: the turn `$1` and its ancestors, at most `$depth`
/// turns up (a parameter's place).
macro_rules! branch_cte {
    ($depth:literal) => {
        concat!(
            "WITH RECURSIVE branch (id, depth) AS ( \
               SELECT id, CAST(0 AS BIGINT) FROM turns WHERE id = $1 \
               UNION ALL \
               SELECT t.parent_turn_id, b.depth + 1 FROM branch b JOIN turns t ON t.id = b.id \
               WHERE t.parent_turn_id IS NOT NULL AND b.depth < ",
            $depth,
            " ) "
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
