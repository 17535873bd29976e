"""The SQLite engine's turn queue (:class:`~.repositories.QueueRepository`; migration 17).

A bot on SQLite is one process: it never queues a turn (``Store.shared`` is false,
:mod:`agentik.core.cluster.conversations` does not run).  These keep the store
contract whole: each call is one write job in the single writer (one transaction),
the message and its queue row in the same one.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..messages import Message, NewMessage
from .records import QueuedTurn, QueueStats
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteQueue"]

_COLUMNS = "conversation_id, message_id, run_id, payload, enqueued_at, claimed_by, attempts"


def _turn(r: Any) -> QueuedTurn:
    return QueuedTurn(
        conversation_id=r[0], message_id=int(r[1]), run_id=r[2], payload=json.loads(r[3]),
        enqueued_at=float(r[4]), claimed_by=r[5], attempts=int(r[6]),
    )  # fmt: skip


class SQLiteQueue(SQLiteRoom):
    """The turn queue in the ``turn_queue`` table."""

    def _append_in(
        self, conn: sqlite3.Connection, cid: str, message: NewMessage, updated_at: float | None
    ) -> Message:
        raise NotImplementedError  # (the engine's: one audit row in this transaction)

    async def queue_add(
        self,
        conversation_id: str,
        message: NewMessage,
        payload: Mapping[str, Any],
        *,
        claimed_by: str | None = None,
        updated_at: float | None = None,
    ) -> QueuedTurn:
        if message.kind != "user" or not message.run_id:
            raise ValueError("a queued turn's message is a user message with a run id")
        now = time.time()
        body = json.dumps(dict(payload), ensure_ascii=False)

        def fn(conn: sqlite3.Connection) -> QueuedTurn:
            m = self._append_in(conn, conversation_id, message, updated_at)
            conn.execute(
                f"INSERT INTO turn_queue ({_COLUMNS}, claimed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, m.id, m.run_id, body, now, claimed_by, 1 if claimed_by else 0,
                 now if claimed_by else None),
            )  # fmt: skip
            return QueuedTurn(conversation_id=conversation_id, message_id=m.id,
                              run_id=m.run_id or "", payload=dict(payload), enqueued_at=now,
                              claimed_by=claimed_by, attempts=1 if claimed_by else 0)  # fmt: skip

        turn: QueuedTurn = await self._write(fn)
        return turn

    async def queue_claim(
        self, conversation_id: str, worker: str, *, limit: int = 100
    ) -> list[QueuedTurn]:
        def fn(conn: sqlite3.Connection) -> list[QueuedTurn]:
            conn.execute(
                "UPDATE turn_queue SET claimed_by = ?, claimed_at = ?, attempts = attempts + 1"
                " WHERE message_id IN (SELECT message_id FROM turn_queue WHERE conversation_id = ?"
                "  AND claimed_by IS NOT ? ORDER BY message_id LIMIT ?)",
                (worker, time.time(), conversation_id, worker, limit),
            )
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM turn_queue WHERE conversation_id = ? AND claimed_by = ?"
                " ORDER BY message_id",
                (conversation_id, worker),
            ).fetchall()
            return [_turn(r) for r in rows]

        turns: list[QueuedTurn] = await self._write(fn)
        return turns

    async def queue_done(self, message_ids: Sequence[int]) -> int:
        ids = [int(i) for i in message_ids]
        if not ids:
            return 0

        def fn(conn: sqlite3.Connection) -> int:
            marks = ", ".join("?" * len(ids))
            return conn.execute(f"DELETE FROM turn_queue WHERE message_id IN ({marks})",
                                ids).rowcount  # fmt: skip

        n: int = await self._write(fn)
        return n

    async def queue_stats(self) -> QueueStats:
        rows = await self._read(
            "SELECT count(*), coalesce(sum(claimed_by IS NULL), 0), min(enqueued_at)"
            " FROM turn_queue"
        )
        depth, waiting, oldest = rows[0]
        age = max(0.0, time.time() - float(oldest)) if oldest is not None else 0.0
        return QueueStats(depth=int(depth), waiting=int(waiting), oldest_age=age)

    async def queue_conversations(
        self, *, free_for: str | None = None, limit: int = 100
    ) -> list[str]:
        rows = await self._read(
            "SELECT q.conversation_id FROM turn_queue q"
            " LEFT JOIN lease l ON l.name = 'conv:' || q.conversation_id"
            " WHERE ? IS NULL OR l.name IS NULL OR l.owner = ? OR l.expires_at <= ?"
            " GROUP BY q.conversation_id ORDER BY min(q.message_id) LIMIT ?",
            (free_for, free_for, time.time(), limit),
        )
        return [str(r[0]) for r in rows]
