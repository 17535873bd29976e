"""Persistence: the Store interface, SQLite (default) and in-memory engines."""
