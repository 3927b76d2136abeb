-- The images and files a user's message carried (a JSON array of file
-- references: `file_id`, `media_type`, `filename`, `detail`, `at`; never
-- bytes), so that later turns send them again.
ALTER TABLE messages ADD COLUMN attachments TEXT;
