"""HTTP: the client (status table, response parsing), its transport, and the context-overflow parser."""
