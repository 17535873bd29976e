"""The PostgreSQL engine's run events (:class:`~.repositories.RunEventRepository`):
what a worker's turns emitted, so an SSE client on another worker replays and
follows them with the same ``seq`` (:mod:`agentik.core.cluster.events`).

A batch is one statement through the ordered writer (never a statement per event);
a row that is there already is left as it is (a batch written twice is harmless)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .postgres_room import PostgresRoom, nul_free

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresRunEvents"]

_ADD = (
    "INSERT INTO run_event (conversation_id, seq, at, data)"
    " SELECT * FROM unnest($1::text[], $2::bigint[], $3::float8[], $4::text[])"
    " ON CONFLICT (conversation_id, seq) DO NOTHING"
)
_REPLACE = _ADD.replace("DO NOTHING", "DO UPDATE SET data = excluded.data")


class PostgresRunEvents(PostgresRoom):
    """Run events in the ``run_event`` table (migration 7)."""

    async def run_events_add(
        self, rows: Sequence[tuple[str, int, float, str]], *, replace: bool = False
    ) -> None:
        if not rows:
            return
        sql = _REPLACE if replace else _ADD
        cids = [r[0] for r in rows]
        seqs = [r[1] for r in rows]
        ats = [r[2] for r in rows]
        data = [nul_free(r[3]) for r in rows]

        async def fn(conn: asyncpg.Connection) -> None:
            await conn.execute(sql, cids, seqs, ats, data)

        await self._write(fn, single=True)

    async def run_events_after(
        self, conversation_id: str, after: int, *, limit: int = 500
    ) -> list[tuple[int, str]]:
        rows = await self._read(
            "SELECT seq, data FROM run_event WHERE conversation_id = $1 AND seq > $2"
            " ORDER BY seq LIMIT $3",
            conversation_id, after, max(1, limit),
        )  # fmt: skip
        return [(int(r[0]), str(r[1])) for r in rows]

    async def run_events_last(self, conversation_id: str) -> int:
        rows = await self._read(
            "SELECT COALESCE(MAX(seq), 0) FROM run_event WHERE conversation_id = $1",
            conversation_id,
        )
        return int(rows[0][0]) if rows else 0

    async def run_events_prune(self, *, keep: int, before: float) -> int:
        async def fn(conn: asyncpg.Connection) -> int:
            status = await conn.execute("DELETE FROM run_event WHERE at < $1", before)
            n = int(status.split()[-1])
            status = await conn.execute(
                "DELETE FROM run_event r USING ("
                " SELECT conversation_id, seq, row_number() OVER"
                "  (PARTITION BY conversation_id ORDER BY seq DESC) AS n FROM run_event"
                ") old WHERE old.n > $1 AND r.conversation_id = old.conversation_id"
                " AND r.seq = old.seq",
                max(0, keep),
            )
            return n + int(status.split()[-1])

        n: int = await self._write(fn, single=True)
        return n
