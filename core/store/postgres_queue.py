"""The PostgreSQL engine's turn queue (:class:`~.repositories.QueueRepository`; migration 6).

* A turn is queued with its user message in one transaction, through the ordered
  writer (:meth:`queue_add`): the message and its queue row commit together.
* A claim is one statement on the pool (``UPDATE ... FROM (SELECT ... FOR UPDATE
  SKIP LOCKED)``), committed alone: two workers claiming at once never take the
  same row, and neither waits for the other's locks.  It returns every row the
  worker holds (those it claimed before too), so a claim repeated after a lost
  answer loses nothing: the caller skips what it runs already.
* "Which conversations have queued turns that this worker may take" joins the
  lease table (the conversation's lease ``conv:<id>`` free, expired or its own),
  judged by the server's clock as the leases are.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..messages import Message, NewMessage
from .postgres_room import PostgresRoom, dumps
from .records import QueuedTurn, QueueStats

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresQueue"]

_NOW = "extract(epoch FROM clock_timestamp())::double precision"
_COLUMNS = "conversation_id, message_id, run_id, payload, enqueued_at, claimed_by, attempts"
_CLAIM = f"""
WITH picked AS (
    SELECT message_id FROM turn_queue
    WHERE conversation_id = $1 AND claimed_by IS DISTINCT FROM $2
    ORDER BY message_id LIMIT $3 FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE turn_queue q SET claimed_by = $2, claimed_at = $4, attempts = q.attempts + 1
    FROM picked WHERE q.message_id = picked.message_id
    RETURNING q.conversation_id, q.message_id, q.run_id, q.payload, q.enqueued_at,
              q.claimed_by, q.attempts
)
SELECT {_COLUMNS} FROM claimed
UNION ALL
SELECT {_COLUMNS} FROM turn_queue WHERE conversation_id = $1 AND claimed_by = $2
"""
_CONVERSATIONS = f"""
SELECT q.conversation_id FROM turn_queue q
LEFT JOIN lease l ON l.name = 'conv:' || q.conversation_id
WHERE $1::text IS NULL OR l.name IS NULL OR l.owner = $1 OR l.expires_at <= {_NOW}
GROUP BY q.conversation_id ORDER BY min(q.message_id) LIMIT $2
"""


def _turn(r: Any) -> QueuedTurn:
    payload = r[3]
    return QueuedTurn(
        conversation_id=r[0], message_id=int(r[1]), run_id=r[2],
        payload=json.loads(payload) if isinstance(payload, str) else dict(payload or {}),
        enqueued_at=float(r[4]), claimed_by=r[5], attempts=int(r[6]),
    )  # fmt: skip


class PostgresQueue(PostgresRoom):
    """The turn queue in the ``turn_queue`` table."""

    async def _append_in(
        self, conn: asyncpg.Connection, cid: str, message: NewMessage, updated_at: float | None
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
        body = dumps(dict(payload))

        async def fn(conn: asyncpg.Connection) -> QueuedTurn:
            m = await self._append_in(conn, conversation_id, message, updated_at)
            await conn.execute(
                "INSERT INTO turn_queue (message_id, conversation_id, run_id, payload,"
                " enqueued_at, claimed_by, claimed_at, attempts)"
                " VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8)",
                m.id, conversation_id, m.run_id, body, now, claimed_by,
                now if claimed_by else None, 1 if claimed_by else 0,
            )  # fmt: skip
            return QueuedTurn(conversation_id=conversation_id, message_id=m.id,
                              run_id=m.run_id or "", payload=dict(payload), enqueued_at=now,
                              claimed_by=claimed_by, attempts=1 if claimed_by else 0)  # fmt: skip

        turn: QueuedTurn = await self._write(fn, conversation_id=conversation_id)
        return turn

    async def queue_claim(
        self, conversation_id: str, worker: str, *, limit: int = 100
    ) -> list[QueuedTurn]:
        rows = await self._read(_CLAIM, conversation_id, worker, limit, time.time())
        return sorted((_turn(r) for r in rows), key=lambda t: t.message_id)

    async def queue_done(self, message_ids: Sequence[int]) -> int:
        if not message_ids:
            return 0
        rows = await self._read(
            "WITH d AS (DELETE FROM turn_queue WHERE message_id = ANY($1::bigint[]) RETURNING 1)"
            " SELECT count(*) FROM d",
            [int(i) for i in message_ids],
        )
        return int(rows[0][0])

    async def queue_stats(self) -> QueueStats:
        rows = await self._read(
            "SELECT count(*), count(*) FILTER (WHERE claimed_by IS NULL), min(enqueued_at)"
            " FROM turn_queue"
        )
        depth, waiting, oldest = rows[0]
        age = max(0.0, time.time() - float(oldest)) if oldest is not None else 0.0
        return QueueStats(depth=int(depth), waiting=int(waiting), oldest_age=age)

    async def queue_conversations(
        self, *, free_for: str | None = None, limit: int = 100
    ) -> list[str]:
        rows = await self._read(_CONVERSATIONS, free_for, limit)
        return [str(r[0]) for r in rows]

    async def lease_renew_many(
        self, leases: Sequence[tuple[str, int]], owner: str, ttl: float
    ) -> list[str]:
        if not leases:
            return []
        rows = await self._read(
            f"UPDATE lease l SET expires_at = {_NOW} + $3::double precision"
            " FROM unnest($1::text[], $2::bigint[]) AS w(name, epoch)"
            " WHERE l.name = w.name AND l.epoch = w.epoch AND l.owner = $4 RETURNING l.name",
            [n for n, _ in leases], [int(e) for _, e in leases], float(ttl), owner,
        )  # fmt: skip
        return [str(r[0]) for r in rows]
