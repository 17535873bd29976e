"""The PostgreSQL engine's handled events (:class:`~.repositories.SeenEventRepository`):
one statement per call, atomic per key (the primary key decides which of two workers
racing with the same event sees it first)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .postgres_room import PostgresRoom

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresSeen"]

#: Keys in sorted order: two workers' calls lock shared keys in one order (never a
#: deadlock, whatever order their events came in).
_FIRST = (
    "INSERT INTO seen_event (key, at) SELECT k, $2 FROM unnest($1::text[]) AS k ORDER BY k"
    " ON CONFLICT (key) DO UPDATE SET at = excluded.at WHERE seen_event.at < $3"
    " RETURNING key"
)


#: :data:`_FIRST` for the claims, and the handled keys read from the table as it was
#: before them (one snapshot: the statement's).
_CLAIM = (
    "WITH claimed AS (" + _FIRST + ")"
    " SELECT true, key FROM claimed"
    " UNION ALL SELECT false, key FROM seen_event WHERE key = ANY($4::text[]) AND at >= $5"
)


class PostgresSeen(PostgresRoom):
    """Handled events in the ``seen_event`` table (migration 5)."""

    async def seen_first(self, keys: Sequence[str], *, now: float, window: float) -> list[str]:
        # (One statement may not touch a row twice: each key once.)
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return []

        async def fn(conn: asyncpg.Connection) -> list[str]:
            rows = await conn.fetch(_FIRST, sorted(wanted), now, now - window)
            return [r[0] for r in rows]

        found = set(await self._write(fn, single=True))
        return [k for k in wanted if k in found]

    async def seen_claim(
        self,
        claims: Sequence[str],
        keys: Sequence[str],
        *,
        now: float,
        window: float,
        since: float,
    ) -> tuple[list[str], list[str]]:
        # One statement, one round trip: the claims and the read (Slack's per-event cost).
        wanted = list(dict.fromkeys(claims))
        asked = list(dict.fromkeys(keys))
        if not wanted:
            return [], await self.seen_known(asked, since=since)

        async def fn(conn: asyncpg.Connection) -> list[tuple[bool, str]]:
            rows = await conn.fetch(_CLAIM, sorted(wanted), now, now - window, asked, since)
            return [(r[0], r[1]) for r in rows]

        rows: list[tuple[bool, str]] = await self._write(fn, single=True)
        got = {k for claim, k in rows if claim}
        known = {k for claim, k in rows if not claim}
        return [k for k in wanted if k in got], [k for k in asked if k in known]

    async def seen_prune(self, before: float) -> int:
        async def fn(conn: asyncpg.Connection) -> int:
            status = await conn.execute("DELETE FROM seen_event WHERE at < $1", before)
            return int(status.split()[-1])

        n: int = await self._write(fn, single=True)
        return n

    async def seen_known(self, keys: Sequence[str], *, since: float) -> list[str]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return []
        rows = await self._read(
            "SELECT key FROM seen_event WHERE key = ANY($1::text[]) AND at >= $2", wanted, since
        )
        found = {r[0] for r in rows}
        return [k for k in wanted if k in found]
