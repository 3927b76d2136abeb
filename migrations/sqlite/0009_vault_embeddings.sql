-- Optional embeddings of the vault's chunks (f32, little-endian), and the
-- model that made a note's, so that a change of model re-embeds it.
ALTER TABLE vault_notes ADD COLUMN embedding_model TEXT;
ALTER TABLE vault_chunks ADD COLUMN embedding BLOB;
