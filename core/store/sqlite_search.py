"""The SQLite engine's full-text search over the audit log
(:class:`~.repositories.SearchRepository`): an FTS5 index of the ``user`` and
``assistant`` rows of ``message`` (migration 21), kept by triggers."""

from __future__ import annotations

from .search import SearchHit, hit, search_terms
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteSearch"]


class SQLiteSearch(SQLiteRoom):
    """``message_fts``: an external-content FTS5 table over ``message.content``."""

    async def search_messages(
        self, query: str, *, limit: int = 20, offset: int = 0
    ) -> list[SearchHit]:
        terms = search_terms(query)
        if not terms:
            return []
        # Each word quoted (never FTS5 syntax) and a prefix; all of them.
        match = " AND ".join(f'"{t}"*' for t in terms)
        rows = await self._read(
            "SELECT m.conversation_id, m.id, m.kind, m.author, m.run_id, m.created_at, m.content"
            " FROM message_fts JOIN message m ON m.id = message_fts.rowid"
            " WHERE message_fts MATCH ? ORDER BY m.created_at DESC, m.id DESC"
            " LIMIT ? OFFSET ?",
            (match, limit, offset),
        )
        return [hit(r, terms) for r in rows]
