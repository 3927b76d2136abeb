"""schemathesis hooks for the fuzz check: an export (`POST
/sessions/import`) is JSON Lines, sent as the text it is."""

import schemathesis

schemathesis.serializer.alias("application/jsonl", "text/plain")
