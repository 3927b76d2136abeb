-- A memory (or a note's chunk) deleted is taken out of the full-text
-- index's pages, not only marked deleted there (FTS5's secure-delete):
-- an erase leaves no token of it in the index (issue 63).
INSERT INTO memories_fts (memories_fts, rank) VALUES ('secure-delete', 1);
INSERT INTO vault_fts (vault_fts, rank) VALUES ('secure-delete', 1);
