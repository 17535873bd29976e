"""The SQLite engine's run events (:class:`~.repositories.RunEventRepository`).

A bot on SQLite is one process: its SSE clients replay from the conversation's
in-memory buffer and nothing writes here.  ``pos`` (migration 27) is taken from
``run_event_position.last`` in the writer's transaction.  The table keeps the store contract
whole (and PostgreSQL's twin: ``agentik db copy`` skips it, as it is the workers'
own)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteRunEvents"]


class SQLiteRunEvents(SQLiteRoom):
    """Run events in the ``run_event`` table (migration 18)."""

    async def run_events_add(
        self,
        rows: Sequence[tuple[str, int, float, str]],
        *,
        replace: bool = False,
        wide: Sequence[bool] | None = None,
    ) -> None:
        if not rows:
            return
        then = "DO UPDATE SET data = excluded.data" if replace else "DO NOTHING"
        flags = [True] * len(rows) if wide is None else [bool(w) for w in wide]
        if len(flags) != len(rows):
            raise ValueError("wide must have one flag per row")

        def fn(conn: sqlite3.Connection) -> None:
            # One writer: the numbers are taken in this transaction, in the batch's order.
            (last,) = conn.execute(
                "SELECT COALESCE((SELECT MAX(last) FROM run_event_position),"
                " (SELECT MAX(pos) FROM run_event), 0)"
            ).fetchone()
            numbered = []
            for row, flag in zip(rows, flags, strict=True):
                pos = None
                if flag:
                    last += 1
                    pos = last
                numbered.append((*row, pos))
            conn.executemany(
                "INSERT INTO run_event (conversation_id, seq, at, data, pos)"
                f" VALUES (?, ?, ?, ?, ?) ON CONFLICT (conversation_id, seq) {then}",
                numbered,
            )
            conn.execute(
                "INSERT INTO run_event_position (id, last) VALUES (1, ?)"
                " ON CONFLICT (id) DO UPDATE SET last = excluded.last",
                (last,),
            )

        await self._write(fn)

    async def run_events_since(self, after: int, *, limit: int = 500) -> list[tuple[int, str]]:
        rows = await self._read(
            "SELECT pos, data FROM run_event WHERE pos > ? ORDER BY pos LIMIT ?",
            (after, max(1, limit)),
        )
        return [(int(r[0]), str(r[1])) for r in rows]

    async def run_events_position(self) -> tuple[int, int]:
        rows = await self._read(
            "SELECT (SELECT COALESCE(MAX(pos), 0) FROM run_event),"
            " (SELECT MAX(pruned) FROM run_event_position)",
            (),
        )
        return (int(rows[0][0]), int(rows[0][1] or 0)) if rows else (0, 0)

    async def run_events_after(
        self, conversation_id: str, after: int, *, limit: int = 500
    ) -> list[tuple[int, str]]:
        rows = await self._read(
            "SELECT seq, data FROM run_event WHERE conversation_id = ? AND seq > ?"
            " ORDER BY seq LIMIT ?",
            (conversation_id, after, max(1, limit)),
        )
        return [(int(r[0]), str(r[1])) for r in rows]

    async def run_events_last(self, conversation_id: str) -> int:
        rows = await self._read(
            "SELECT COALESCE(MAX(seq), 0) FROM run_event WHERE conversation_id = ?",
            (conversation_id,),
        )
        return int(rows[0][0]) if rows else 0

    async def run_events_prune(self, *, keep: int, before: float) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            old = " FROM run_event WHERE at < ?"
            (top,) = conn.execute("SELECT MAX(pos)" + old, (before,)).fetchone()
            n = conn.execute("DELETE" + old, (before,)).rowcount
            doomed = (
                " FROM run_event WHERE (conversation_id, seq) IN ("
                " SELECT conversation_id, seq FROM ("
                "  SELECT conversation_id, seq, ROW_NUMBER() OVER"
                "   (PARTITION BY conversation_id ORDER BY seq DESC) AS n FROM run_event"
                " ) WHERE n > ?)"
            )
            (more,) = conn.execute("SELECT MAX(pos)" + doomed, (max(0, keep),)).fetchone()
            n += conn.execute("DELETE" + doomed, (max(0, keep),)).rowcount
            top = max(top or 0, more or 0)
            if top:
                conn.execute(
                    "INSERT INTO run_event_position (id, pruned) VALUES (1, ?)"
                    " ON CONFLICT (id) DO UPDATE SET pruned = MAX(pruned, excluded.pruned)",
                    (top,),
                )
            return n

        n: int = await self._write(fn)
        return n
