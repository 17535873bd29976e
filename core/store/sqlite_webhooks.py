"""The SQLite engine's webhook deliveries (:class:`~.repositories.WebhookRepository`),
written through the one writer (so a claim is atomic: nothing else writes meanwhile)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from .records import WebhookDelivery, WebhookState
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteWebhooks"]

_COLUMNS = (
    "id, webhook, event_kind, conversation_id, body, created_at, state, attempts, next_at,"
    " claimed_by, claimed_until, last_error, finished_at"
)


def _row(r: Sequence[Any]) -> WebhookDelivery:
    return WebhookDelivery(
        id=r[0], webhook=r[1], event_kind=r[2], conversation_id=r[3], body=r[4],
        created_at=float(r[5]), state=r[6], attempts=int(r[7]), next_at=float(r[8]),
        claimed_by=r[9], claimed_until=r[10], last_error=r[11], finished_at=r[12],
    )  # fmt: skip


class SQLiteWebhooks(SQLiteRoom):
    """Deliveries in the ``webhook_delivery`` table (migration 22)."""

    async def webhook_enqueue(self, rows: Sequence[WebhookDelivery]) -> int:
        values = [
            (d.id, d.webhook, d.event_kind, d.conversation_id, d.body, d.created_at,
             d.attempts, d.next_at, d.last_error)
            for d in rows
        ]  # fmt: skip
        if not values:
            return 0

        def fn(conn: sqlite3.Connection) -> int:
            before = conn.total_changes
            conn.executemany(
                "INSERT INTO webhook_delivery (id, webhook, event_kind, conversation_id, body,"
                " created_at, attempts, next_at, last_error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (id) DO NOTHING",
                values,
            )
            return conn.total_changes - before

        added: int = await self._write(fn)
        return added

    async def webhook_claim(
        self, worker: str, *, now: float, lease: float, limit: int = 50
    ) -> list[WebhookDelivery]:
        def fn(conn: sqlite3.Connection) -> list[WebhookDelivery]:
            rows = conn.execute(
                f"UPDATE webhook_delivery SET claimed_by = ?, claimed_until = ?"
                " WHERE id IN (SELECT id FROM webhook_delivery WHERE state = 'pending'"
                " AND next_at <= ? AND (claimed_until IS NULL OR claimed_until < ?)"
                f" ORDER BY created_at, id LIMIT ?) RETURNING {_COLUMNS}",
                (worker, now + lease, now, now, limit),
            ).fetchall()
            return sorted((_row(r) for r in rows), key=lambda d: (d.created_at, d.id))

        claimed: list[WebhookDelivery] = await self._write(fn)
        return claimed

    async def webhook_settle(
        self,
        delivery_id: str,
        worker: str,
        state: WebhookState,
        *,
        now: float,
        next_at: float | None = None,
        error: str | None = None,
    ) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            finished = None if state == "pending" else now
            cursor = conn.execute(
                "UPDATE webhook_delivery SET state = ?, attempts = attempts + 1,"
                " next_at = COALESCE(?, next_at), claimed_by = NULL, claimed_until = NULL,"
                " last_error = COALESCE(?, last_error), finished_at = ?"
                " WHERE id = ? AND state = 'pending' AND claimed_by = ?",
                (state, next_at, error, finished, delivery_id, worker),
            )
            return cursor.rowcount > 0

        settled: bool = await self._write(fn)
        return settled

    async def webhook_deliveries(
        self, *, state: WebhookState | None = None, webhook: str | None = None, limit: int = 100
    ) -> list[WebhookDelivery]:
        rows = await self._read(
            f"SELECT {_COLUMNS} FROM webhook_delivery WHERE (? IS NULL OR state = ?)"
            " AND (? IS NULL OR webhook = ?) ORDER BY created_at, id LIMIT ?",
            (state, state, webhook, webhook, limit),
        )
        return [_row(r) for r in rows]

    async def webhook_replay(self, ids: Sequence[str] | None, *, now: float) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            sql = (
                "UPDATE webhook_delivery SET state = 'pending', attempts = 0, next_at = ?,"
                " claimed_by = NULL, claimed_until = NULL, finished_at = NULL"
                " WHERE state = 'dead'"
            )
            if ids is None:
                return int(conn.execute(sql, (now,)).rowcount)
            return sum(conn.execute(sql + " AND id = ?", (now, i)).rowcount for i in set(ids))

        count: int = await self._write(fn)
        return count

    async def webhook_next_due(self) -> float | None:
        rows = await self._read(
            "SELECT MIN(MAX(next_at, COALESCE(claimed_until, 0))) FROM webhook_delivery"
            " WHERE state = 'pending'"
        )
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    async def webhook_prune(self, before: float) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            return int(
                conn.execute(
                    "DELETE FROM webhook_delivery WHERE state = 'delivered' AND finished_at < ?",
                    (before,),
                ).rowcount
            )

        count: int = await self._write(fn)
        return count
