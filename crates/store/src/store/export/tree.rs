//! A session's tree in an export: the branch a fork's export carries
//! (the turns it reads through, and their rows), and on import the
//! parents of its turns when its export is older than trees, and whether
//! it is branched.

use super::{Cell, FILE_CHUNKS, PARTS, Parsed, Part};

/// An export that names no turn's parent is of a session from before
/// turns formed a tree: each of its turns continued the one before.
pub(super) const LINEAR: &str = "UPDATE turns SET parent_turn_id = (SELECT p.id FROM turns p \
     WHERE p.session_id = turns.session_id AND (p.created_at, p.id) < (turns.created_at, turns.id) \
     ORDER BY p.created_at DESC, p.id DESC LIMIT 1) WHERE session_id = $1";

/// The imported session is `branched` when a turn of it continues another
/// than the turn before it.
pub(super) const BRANCHED: &str = "UPDATE sessions SET branched = EXISTS (SELECT 1 FROM turns t \
     WHERE t.session_id = $1 AND t.parent_turn_id IS DISTINCT FROM (SELECT p.id FROM turns p \
       WHERE p.session_id = $1 AND (p.created_at, p.id) < (t.created_at, t.id) \
       ORDER BY p.created_at DESC, p.id DESC LIMIT 1)) \
     WHERE id = $1";

/// Whether any turn of the export names its parent (see [`LINEAR`]).
pub(super) fn names_parents(parsed: &Parsed) -> bool {
    let Some(at) = PARTS[0]
        .columns
        .iter()
        .position(|c| c.name == "parent_turn_id")
    else {
        return false;
    };
    parsed
        .rows
        .iter()
        .any(|(part, row)| part.line == "turn" && matches!(row.get(at), Some(Cell::Text(_))))
}

/// The turns a fork reads through (`$1` the fork's key): the turn it was
/// forked at and that turn's ancestors, in whichever sessions they are.
macro_rules! prefix_cte {
    () => {
        crate::store::turns::branch::walk_up!(
            "prefix",
            "SELECT forked_at, CAST(0 AS BIGINT) FROM sessions \
             WHERE id = $1 AND forked_at IS NOT NULL",
            "100000"
        )
    };
}

/// See [`prefix_cte`].
pub(super) const PREFIX: &str = prefix_cte!();

/// The prefix's turns, root first: their sessions' keys and ids.
pub(super) const PREFIX_TURNS: &str = concat!(
    prefix_cte!(),
    "SELECT t.session_id, t.id FROM prefix p JOIN turns t ON t.id = p.id ORDER BY p.depth DESC"
);

/// Which rows of `part` a fork's export takes from its prefix (the
/// `prefix` of [`PREFIX`]): those of its turns, and the files their
/// messages carried. The observations are the fork's own.
pub(super) fn of_prefix(part: &Part) -> Option<String> {
    let carried = |file: &str, session: &str| {
        format!(
            "EXISTS (SELECT 1 FROM messages m WHERE m.session_id = {session} \
             AND m.turn_id IN (SELECT id FROM prefix) AND m.attachments LIKE '%' || {file} || '%')"
        )
    };
    match part.table {
        "turns" => Some("id IN (SELECT id FROM prefix)".to_owned()),
        "research_observations" | "sessions" => None,
        "files" => Some(carried("files.id", "files.session_id")),
        FILE_CHUNKS => Some(carried("fc.file_id", "fc.session_id")),
        _ => Some("turn_id IN (SELECT id FROM prefix)".to_owned()),
    }
}
