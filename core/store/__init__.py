"""Persistence: the Store interface, SQLite (default), PostgreSQL (:mod:`.postgres`,
the ``postgres`` extra) and in-memory engines."""
