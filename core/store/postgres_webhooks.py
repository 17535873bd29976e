"""The PostgreSQL engine's webhook deliveries (:class:`~.repositories.WebhookRepository`),
as SQLite's (:mod:`.sqlite_webhooks`); a claim takes rows ``FOR UPDATE SKIP LOCKED``, so
workers claiming at once each get other rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .postgres_room import PostgresRoom, nul_free
from .records import WebhookDelivery, WebhookOutcome, WebhookState
from .rows import WEBHOOK_DELIVERY as ROW

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresWebhooks"]


class PostgresWebhooks(PostgresRoom):
    """Deliveries in the ``webhook_delivery`` table (migration 11)."""

    async def webhook_enqueue(self, rows: Sequence[WebhookDelivery]) -> int:
        values = [
            (nul_free(d.id), nul_free(d.webhook), d.event_kind, nul_free(d.conversation_id),
             nul_free(d.body), d.created_at, d.attempts, d.next_at,
             None if d.last_error is None else nul_free(d.last_error))
            for d in rows
        ]  # fmt: skip
        if not values:
            return 0

        async def fn(conn: asyncpg.Connection) -> int:
            found = await conn.fetch(
                "INSERT INTO webhook_delivery (id, webhook, event_kind, conversation_id, body,"
                " created_at, attempts, next_at, last_error)"
                " SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[],"
                " $5::text[], $6::double precision[], $7::int[], $8::double precision[],"
                " $9::text[]) ON CONFLICT (id) DO NOTHING RETURNING id",
                *map(list, zip(*values, strict=True)),
            )
            return len(found)

        added: int = await self._write(fn, single=True)
        return added

    async def webhook_claim(
        self, worker: str, *, now: float, lease: float, limit: int = 50
    ) -> list[WebhookDelivery]:
        async def fn(conn: asyncpg.Connection) -> list[WebhookDelivery]:
            rows = await conn.fetch(
                "UPDATE webhook_delivery SET claimed_by = $1, claimed_until = $2"
                " WHERE id IN (SELECT id FROM webhook_delivery WHERE state = 'pending'"
                " AND next_at <= $3 AND (claimed_until IS NULL OR claimed_until < $3)"
                " ORDER BY created_at, id LIMIT $4 FOR UPDATE SKIP LOCKED)"
                f" RETURNING {ROW.columns}",
                nul_free(worker), now + lease, now, limit,
            )  # fmt: skip
            return sorted((ROW.record(r) for r in rows), key=lambda d: (d.created_at, d.id))

        claimed: list[WebhookDelivery] = await self._write(fn, single=True)
        return claimed

    async def webhook_settle(
        self, worker: str, outcomes: Sequence[WebhookOutcome], *, now: float
    ) -> int:
        if not outcomes:
            return 0
        columns = (
            [nul_free(o.id) for o in outcomes],
            [o.state for o in outcomes],
            [o.next_at for o in outcomes],
            [None if o.error is None else nul_free(o.error) for o in outcomes],
        )

        async def fn(conn: asyncpg.Connection) -> int:
            status = await conn.execute(
                "UPDATE webhook_delivery AS w SET state = o.state, attempts = w.attempts + 1,"
                " next_at = COALESCE(o.next_at, w.next_at), claimed_by = NULL,"
                " claimed_until = NULL, last_error = COALESCE(o.error, w.last_error), finished_at"
                " = CASE WHEN o.state = 'pending' THEN NULL ELSE $5::double precision END"
                " FROM unnest($1::text[], $2::text[], $3::double precision[], $4::text[])"
                " AS o(id, state, next_at, error)"
                " WHERE w.id = o.id AND w.state = 'pending' AND w.claimed_by = $6",
                *columns, now, nul_free(worker),
            )  # fmt: skip
            return int(status.split()[-1])

        settled: int = await self._write(fn, single=True)
        return settled

    async def webhook_release(self, worker: str) -> int:
        async def fn(conn: asyncpg.Connection) -> int:
            status = await conn.execute(
                "UPDATE webhook_delivery SET claimed_by = NULL, claimed_until = NULL"
                " WHERE claimed_by = $1 AND state = 'pending'",
                nul_free(worker),
            )
            return int(status.split()[-1])

        released: int = await self._write(fn, single=True)
        return released

    async def webhook_deliveries(
        self, *, state: WebhookState | None = None, webhook: str | None = None, limit: int = 100
    ) -> list[WebhookDelivery]:
        rows = await self._read(
            f"SELECT {ROW.columns} FROM webhook_delivery WHERE ($1::text IS NULL OR state = $1)"
            " AND ($2::text IS NULL OR webhook = $2) ORDER BY created_at, id LIMIT $3",
            state, None if webhook is None else nul_free(webhook), limit,
        )  # fmt: skip
        return [ROW.record(r) for r in rows]

    async def webhook_replay(self, ids: Sequence[str] | None, *, now: float) -> int:
        async def fn(conn: asyncpg.Connection) -> int:
            status = await conn.execute(
                "UPDATE webhook_delivery SET state = 'pending', attempts = 0, next_at = $1,"
                " claimed_by = NULL, claimed_until = NULL, finished_at = NULL"
                " WHERE state = 'dead' AND ($2::text[] IS NULL OR id = ANY($2::text[]))",
                now, None if ids is None else [nul_free(i) for i in ids],
            )  # fmt: skip
            return int(status.split()[-1])

        count: int = await self._write(fn, single=True)
        return count

    async def webhook_next_due(self) -> float | None:
        rows = await self._read(
            "SELECT MIN(GREATEST(next_at, COALESCE(claimed_until, 0))) FROM webhook_delivery"
            " WHERE state = 'pending'"
        )
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    async def webhook_prune(self, before: float) -> int:
        async def fn(conn: asyncpg.Connection) -> int:
            status = await conn.execute(
                "DELETE FROM webhook_delivery WHERE state = 'delivered' AND finished_at < $1",
                before,
            )
            return int(status.split()[-1])

        count: int = await self._write(fn, single=True)
        return count
