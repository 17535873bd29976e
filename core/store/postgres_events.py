"""The PostgreSQL engine's run events (:class:`~.repositories.RunEventRepository`):
what a worker's turns emitted, so an SSE client on another worker replays and
follows them with the same ``seq`` (:mod:`agentik.core.cluster.events`).

A batch is one statement through the ordered writer (never a statement per event);
a row that is there already is left as it is (a batch written twice is harmless).

The agent-wide stream's ids (``pos``, migration 16) must mean the same on every
worker, so a client that resumes on another misses nothing: a batch takes the
advisory lock :data:`~.postgres_migrations.RUN_EVENT_LOCK_KEY` before numbering its
rows, and holds it to its commit.  The next batch (any worker's) numbers after it
has committed, so once a ``pos`` is visible every lower one is too (a reader that
went past ``n`` never finds a row below ``n`` later).  A bare sequence would not do:
two batches committing in the other order than they took their numbers leave a
hole a reader passes and that fills after it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .postgres_migrations import RUN_EVENT_LOCK_KEY
from .postgres_room import PostgresRoom, nul_free

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresRunEvents"]

# ``ORDER BY n``: rows numbered in the batch's order (PostgreSQL evaluates a volatile
# select list after the sort).
_ADD = (
    "INSERT INTO run_event (conversation_id, seq, at, data, pos)"
    " SELECT c, s, a, d, CASE WHEN w THEN nextval('run_event_pos_seq') END"
    " FROM unnest($1::text[], $2::bigint[], $3::float8[], $4::text[], $5::boolean[])"
    " WITH ORDINALITY AS u (c, s, a, d, w, n) ORDER BY n"
    " ON CONFLICT (conversation_id, seq) DO NOTHING"
)
_REPLACE = _ADD.replace("DO NOTHING", "DO UPDATE SET data = excluded.data")


class PostgresRunEvents(PostgresRoom):
    """Run events in the ``run_event`` table (migration 7)."""

    async def run_events_add(
        self,
        rows: Sequence[tuple[str, int, float, str]],
        *,
        replace: bool = False,
        wide: Sequence[bool] | None = None,
    ) -> None:
        if not rows:
            return
        sql = _REPLACE if replace else _ADD
        cids = [r[0] for r in rows]
        seqs = [r[1] for r in rows]
        ats = [r[2] for r in rows]
        data = [nul_free(r[3]) for r in rows]
        flags = [True] * len(rows) if wide is None else [bool(w) for w in wide]
        if len(flags) != len(rows):
            raise ValueError("wide must have one flag per row")

        async def fn(conn: asyncpg.Connection) -> None:
            await conn.execute(sql, cids, seqs, ats, data, flags)

        # Numbered under the lock, held to the commit (taken first by the writer's
        # transaction, with any other job's locks, in one order).
        await self._write(fn, locks=(RUN_EVENT_LOCK_KEY,) if any(flags) else ())

    async def run_events_since(self, after: int, *, limit: int = 500) -> list[tuple[int, str]]:
        rows = await self._read(
            "SELECT pos, data FROM run_event WHERE pos > $1 ORDER BY pos LIMIT $2",
            after, max(1, limit),
        )  # fmt: skip
        return [(int(r[0]), str(r[1])) for r in rows]

    async def run_events_position(self) -> tuple[int, int]:
        rows = await self._read(
            "SELECT (SELECT COALESCE(MAX(pos), 0) FROM run_event),"
            " (SELECT MAX(pruned) FROM run_event_position)"
        )
        return (int(rows[0][0]), int(rows[0][1] or 0)) if rows else (0, 0)

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
            old = await conn.fetchrow(
                "WITH d AS (DELETE FROM run_event WHERE at < $1 RETURNING pos)"
                " SELECT count(*), max(pos) FROM d",
                before,
            )
            more = await conn.fetchrow(
                "WITH d AS (DELETE FROM run_event r USING ("
                " SELECT conversation_id, seq, row_number() OVER"
                "  (PARTITION BY conversation_id ORDER BY seq DESC) AS n FROM run_event"
                ") old WHERE old.n > $1 AND r.conversation_id = old.conversation_id"
                " AND r.seq = old.seq RETURNING r.pos) SELECT count(*), max(pos) FROM d",
                max(0, keep),
            )
            top = max(int(old[1] or 0), int(more[1] or 0))
            if top:
                await conn.execute(
                    "INSERT INTO run_event_position (id, pruned) VALUES (true, $1)"
                    " ON CONFLICT (id) DO UPDATE"
                    " SET pruned = GREATEST(run_event_position.pruned, excluded.pruned)",
                    top,
                )
            return int(old[0]) + int(more[0])

        n: int = await self._write(fn)
        return n
