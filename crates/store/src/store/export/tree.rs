//! An imported session's tree: the parents of its turns when its export
//! is older than trees, and whether it is branched.

use super::{Cell, PARTS, Parsed};

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
