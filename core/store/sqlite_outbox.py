"""The SQLite engine's outbox aggregate (:class:`~.repositories.OutboxRepository`)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence

from .records import OutboxEntry, OutboxState
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteOutbox"]

_OUTBOX_COLUMNS = (
    "id, channel_key, run_id, piece, transport, kind, text, reply_to, complete, state,"
    " awaits_confirm, ref, created_at"
)


class SQLiteOutbox(SQLiteRoom):
    """Outgoing pieces and their delivery state."""

    # -- the outbox ---------------------------------------------------------------------
    async def outbox_add(self, entries: Sequence[OutboxEntry], *, defer: bool = False) -> list[int]:
        rows = [
            (
                e.channel_key, e.run_id, e.piece, e.transport, e.kind, e.text,
                json.dumps(e.reply_to) if e.reply_to is not None else None,
                int(e.complete), time.time(),
            )
            for e in entries
        ]  # fmt: skip
        ids: list[int] = await self._write_op("outbox_add", rows, defer=defer)
        return ids

    async def outbox_mark(
        self, updates: Sequence[tuple[int, OutboxState, bool | None, str | None]]
    ) -> None:
        rows = [
            (state, None if awaits is None else int(awaits), ref, id_)
            for id_, state, awaits, ref in updates
        ]
        await self._write_op("outbox_mark", rows)

    async def outbox_undelivered(self, *, limit: int = 10_000) -> list[OutboxEntry]:
        rows = await self._read(
            f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE state = 'queued' OR complete = 0"
            " OR (state = 'sent' AND awaits_confirm = 1) ORDER BY id LIMIT ?",
            (limit,),
        )
        return [
            OutboxEntry(
                id=r[0], channel_key=r[1], run_id=r[2], piece=r[3], transport=r[4], kind=r[5],
                text=r[6], reply_to=json.loads(r[7]) if r[7] is not None else None,
                complete=bool(r[8]), state=r[9], awaits_confirm=bool(r[10]), ref=r[11],
                created_at=r[12],
            )
            for r in rows
        ]  # fmt: skip

    async def outbox_prune(self, before: float) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM outbox WHERE created_at < ?", (before,)).rowcount

        return await self._write(fn)
