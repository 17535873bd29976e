"""The PostgreSQL engine's full-text search over the audit log
(:class:`~.repositories.SearchRepository`), as SQLite's (:mod:`.sqlite_search`): a
GIN index of the ``user`` and ``assistant`` rows' ``tsvector`` (migration 10)."""

from __future__ import annotations

from .postgres_room import PostgresRoom
from .search import SearchHit, hit, search_terms

__all__ = ["SEARCHED_CHARS", "PostgresSearch"]

#: The characters of a message the index holds (a ``tsvector`` is at most 1 MB: a
#: longer message would fail to be written); the rest of a longer one is not found.
SEARCHED_CHARS = 100_000

_VECTOR = f"to_tsvector('simple', left(content, {SEARCHED_CHARS}))"


class PostgresSearch(PostgresRoom):
    """``message_search``: the index; the ``simple`` configuration (no stemming, no
    stop words: the words as written, in any language)."""

    async def search_messages(
        self, query: str, *, limit: int = 20, offset: int = 0
    ) -> list[SearchHit]:
        terms = search_terms(query)
        if not terms:
            return []
        # Letters and digits only (search_terms): no tsquery syntax gets through.
        match = " & ".join(f"{t}:*" for t in terms)
        rows = await self._read(
            "SELECT conversation_id, id, kind, author, run_id, created_at, content"
            f" FROM message WHERE kind IN ('user', 'assistant')"
            f" AND {_VECTOR} @@ to_tsquery('simple', $1)"
            " ORDER BY created_at DESC, id DESC LIMIT $2 OFFSET $3",
            match, limit, offset,
        )  # fmt: skip
        return [hit(r, terms) for r in rows]
