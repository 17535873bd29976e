"""The SQLite engine's webhook deliveries (:class:`~.repositories.WebhookRepository`),
written through the one writer (so a claim is atomic: nothing else writes meanwhile)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from .records import WebhookDelivery, WebhookOutcome, WebhookState
from .rows import WEBHOOK_DELIVERY as ROW
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteWebhooks"]


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
                f" ORDER BY created_at, id LIMIT ?) RETURNING {ROW.columns}",
                (worker, now + lease, now, now, limit),
            ).fetchall()
            return sorted((ROW.record(r) for r in rows), key=lambda d: (d.created_at, d.id))

        claimed: list[WebhookDelivery] = await self._write(fn)
        return claimed

    async def webhook_settle(
        self, worker: str, outcomes: Sequence[WebhookOutcome], *, now: float
    ) -> int:
        values = [
            (o.state, o.next_at, o.error, None if o.state == "pending" else now, o.id, worker)
            for o in outcomes
        ]
        if not values:
            return 0

        def fn(conn: sqlite3.Connection) -> int:
            before = conn.total_changes
            conn.executemany(
                "UPDATE webhook_delivery SET state = ?, attempts = attempts + 1,"
                " next_at = COALESCE(?, next_at), claimed_by = NULL, claimed_until = NULL,"
                " last_error = COALESCE(?, last_error), finished_at = ?"
                " WHERE id = ? AND state = 'pending' AND claimed_by = ?",
                values,
            )
            return conn.total_changes - before

        settled: int = await self._write(fn)
        return settled

    async def webhook_release(self, worker: str) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            return int(
                conn.execute(
                    "UPDATE webhook_delivery SET claimed_by = NULL, claimed_until = NULL"
                    " WHERE claimed_by = ? AND state = 'pending'",
                    (worker,),
                ).rowcount
            )

        released: int = await self._write(fn)
        return released

    async def webhook_deliveries(
        self, *, state: WebhookState | None = None, webhook: str | None = None, limit: int = 100
    ) -> list[WebhookDelivery]:
        rows = await self._read(
            f"SELECT {ROW.columns} FROM webhook_delivery WHERE (? IS NULL OR state = ?)"
            " AND (? IS NULL OR webhook = ?) ORDER BY created_at, id LIMIT ?",
            (state, state, webhook, webhook, limit),
        )
        return [ROW.record(r) for r in rows]

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
