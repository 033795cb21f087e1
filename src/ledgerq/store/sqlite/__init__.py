"""SQLite: the embedded default dialect."""
