"""The PostgreSQL engine's outbox aggregate (:class:`~.repositories.OutboxRepository`)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .postgres_room import PostgresRoom, dumps, nul_free
from .records import OutboxEntry, OutboxState

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresOutbox"]

_OUTBOX_COLUMNS = (
    "id, channel_key, run_id, piece, transport, kind, text, reply_to, complete, state,"
    " awaits_confirm, ref, created_at"
)
#: Writes a piece once (an incomplete one is completed) and returns its id either way.
_OUTBOX_UPSERT = (
    "INSERT INTO outbox (channel_key, run_id, piece, transport, kind, text, reply_to, complete,"
    " created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
    " ON CONFLICT (channel_key, run_id, piece) DO UPDATE SET"
    " text = CASE WHEN outbox.complete THEN outbox.text ELSE excluded.text END,"
    " complete = outbox.complete OR excluded.complete"
    " RETURNING id"
)
#: Every piece of one call in one statement (their ids, by key).
_OUTBOX_UPSERT_MANY = (
    "INSERT INTO outbox (channel_key, run_id, piece, transport, kind, text, reply_to, complete,"
    " created_at) SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::text[],"
    " $5::text[], $6::text[], $7::jsonb[], $8::boolean[], $9::double precision[])"
    " ON CONFLICT (channel_key, run_id, piece) DO UPDATE SET"
    " text = CASE WHEN outbox.complete THEN outbox.text ELSE excluded.text END,"
    " complete = outbox.complete OR excluded.complete"
    " RETURNING channel_key, run_id, piece, id"
)
#: States only move forward: queued (0) → sent (1) → confirmed (2).
_OUTBOX_RANK = "(CASE {} WHEN 'queued' THEN 0 WHEN 'sent' THEN 1 ELSE 2 END)"
_OUTBOX_MARK = (
    "UPDATE outbox SET"
    f" state = CASE WHEN {_OUTBOX_RANK.format('$1::text')} > {_OUTBOX_RANK.format('state')}"
    " THEN $1 ELSE state END,"
    " awaits_confirm = COALESCE($2, awaits_confirm), ref = COALESCE($3, ref) WHERE id = $4"
)


class PostgresOutbox(PostgresRoom):
    """Outgoing pieces and their delivery state."""

    async def outbox_add(self, entries: Sequence[OutboxEntry], *, defer: bool = False) -> list[int]:
        now = time.time()
        rows = [
            (
                e.channel_key, e.run_id, e.piece, e.transport, e.kind, nul_free(e.text),
                dumps(e.reply_to), e.complete, now,
            )
            for e in entries
        ]  # fmt: skip
        if not rows:
            return []

        keys = [row[:3] for row in rows]
        if len(set(keys)) < len(keys):
            # The same piece twice in one call: one upsert each, in order (one statement
            # may not change a row twice).
            async def each(conn: asyncpg.Connection) -> list[int]:
                return [int(await conn.fetchval(_OUTBOX_UPSERT, *row)) for row in rows]

            listed: list[int] = await self._write(each, defer=defer)
            return listed

        async def fn(conn: asyncpg.Connection) -> list[int]:
            found = await conn.fetch(_OUTBOX_UPSERT_MANY, *map(list, zip(*rows, strict=True)))
            ids = {(r[0], r[1], r[2]): int(r[3]) for r in found}
            return [ids[key] for key in keys]

        result: list[int] = await self._write(fn, single=True, defer=defer)
        return result

    async def outbox_mark(
        self, updates: Sequence[tuple[int, OutboxState, bool | None, str | None]]
    ) -> None:
        rows = [(state, awaits, ref, id_) for id_, state, awaits, ref in updates]
        if not rows:
            return

        async def fn(conn: asyncpg.Connection) -> None:
            await conn.executemany(_OUTBOX_MARK, rows)

        await self._write(fn)

    async def outbox_undelivered(self, *, limit: int = 10_000) -> list[OutboxEntry]:
        rows = await self._read(
            f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE state = 'queued' OR NOT complete"
            " OR (state = 'sent' AND awaits_confirm) ORDER BY id LIMIT $1",
            limit,
        )
        return [
            OutboxEntry(
                id=r[0], channel_key=r[1], run_id=r[2], piece=r[3], transport=r[4], kind=r[5],
                text=r[6], reply_to=json.loads(r[7]) if r[7] is not None else None,
                complete=r[8], state=r[9], awaits_confirm=r[10], ref=r[11], created_at=r[12],
            )
            for r in rows
        ]  # fmt: skip

    async def outbox_prune(self, before: float) -> int:
        async def fn(conn: asyncpg.Connection) -> int:
            status = await conn.execute("DELETE FROM outbox WHERE created_at < $1", before)
            return int(status.split()[-1])

        result: int = await self._write(fn, single=True)
        return result
