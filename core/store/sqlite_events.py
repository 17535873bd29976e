"""The SQLite engine's run events (:class:`~.repositories.RunEventRepository`).

A bot on SQLite is one process: its SSE clients replay from the conversation's
in-memory buffer and nothing writes here.  The table keeps the store contract
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
        self, rows: Sequence[tuple[str, int, float, str]], *, replace: bool = False
    ) -> None:
        if not rows:
            return
        then = "DO UPDATE SET data = excluded.data" if replace else "DO NOTHING"

        def fn(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO run_event (conversation_id, seq, at, data) VALUES (?, ?, ?, ?)"
                f" ON CONFLICT (conversation_id, seq) {then}",
                list(rows),
            )

        await self._write(fn)

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
            n = conn.execute("DELETE FROM run_event WHERE at < ?", (before,)).rowcount
            n += conn.execute(
                "DELETE FROM run_event WHERE (conversation_id, seq) IN ("
                " SELECT conversation_id, seq FROM ("
                "  SELECT conversation_id, seq, ROW_NUMBER() OVER"
                "   (PARTITION BY conversation_id ORDER BY seq DESC) AS n FROM run_event"
                " ) WHERE n > ?)",
                (max(0, keep),),
            ).rowcount
            return n

        n: int = await self._write(fn)
        return n
