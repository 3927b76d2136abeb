-- The event journal, one row a commit (issue 42, sixth pass): a commit of
-- one delta for each of 1,000 paced streams inserted 1,000 rows into
-- `event_journal`, a statement and a B-tree insert each on the writer
-- thread; it now inserts one. `events` lists the commit's journal rows in
-- order, each `[session_id, seq, seq_end, turn_id, type, created_at,
-- payload]` with the payload's JSON as it is (store/event_log/journal.rs).
-- `id` is the place of the pack's first row in the journal's order (the
-- next pack's is this one's plus its rows), so the journal is still
-- measured and trimmed in rows. `event_journal` stays for what a process
-- before this migration left there: the store's open moves it as before.
CREATE TABLE event_journal_packs (
    id      INTEGER PRIMARY KEY,
    events  TEXT NOT NULL
);
