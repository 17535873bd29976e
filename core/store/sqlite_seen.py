"""The SQLite engine's handled events (:class:`~.repositories.SeenEventRepository`):
one write job per call, in the writer thread (so ordered with every other write)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteSeen"]

#: A key not seen (or seen before the window) is (re)recorded and returned; one seen
#: within the window is left as it is and not returned.
_FIRST = (
    "INSERT INTO seen_event (key, at) VALUES (?, ?)"
    " ON CONFLICT (key) DO UPDATE SET at = excluded.at WHERE seen_event.at < ?"
    " RETURNING key"
)


def _known_query(keys: Sequence[str], since: float) -> tuple[str, list[Any]]:
    """The read of which of ``keys`` (each once) were recorded at ``since`` or later."""
    marks = ", ".join("?" * len(keys))
    return f"SELECT key FROM seen_event WHERE key IN ({marks}) AND at >= ?", [*keys, since]


def _first_in(
    conn: sqlite3.Connection, keys: Sequence[str], now: float, window: float
) -> list[str]:
    """Record ``keys`` (each once) in the caller's transaction; those seen first."""
    return [k for k in keys if conn.execute(_FIRST, (k, now, now - window)).fetchone()]


class SQLiteSeen(SQLiteRoom):
    """Handled events in the ``seen_event`` table (migration 16)."""

    async def seen_first(self, keys: Sequence[str], *, now: float, window: float) -> list[str]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return []
        found: list[str] = await self._write(lambda conn: _first_in(conn, wanted, now, window))
        return found

    async def seen_claim(
        self,
        claims: Sequence[str],
        keys: Sequence[str],
        *,
        now: float,
        window: float,
        since: float,
    ) -> tuple[list[str], list[str]]:
        # One job in the writer: the read sees the table before the claims, as on
        # PostgreSQL (the claims' rows are written after it).
        wanted = list(dict.fromkeys(claims))
        asked = list(dict.fromkeys(keys))

        def fn(conn: sqlite3.Connection) -> tuple[list[str], list[str]]:
            found = {r[0] for r in conn.execute(*_known_query(asked, since))} if asked else set()
            return _first_in(conn, wanted, now, window), [k for k in asked if k in found]

        result: tuple[list[str], list[str]] = await self._write(fn)
        return result

    async def seen_prune(self, before: float) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM seen_event WHERE at < ?", (before,)).rowcount

        n: int = await self._write(fn)
        return n

    async def seen_known(self, keys: Sequence[str], *, since: float) -> list[str]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return []
        found = {r[0] for r in await self._read(*_known_query(wanted, since))}
        return [k for k in wanted if k in found]
