-- An approval may change the call's arguments (docs/client-tools-and-approvals.md): the
-- arguments that run when the person edited them, and the SHA-256 of the
-- arguments the decision is for (edited or as asked), so that it applies
-- to those alone.
ALTER TABLE approvals ADD COLUMN edited_arguments TEXT;
ALTER TABLE approvals ADD COLUMN arguments_sha256 TEXT;
