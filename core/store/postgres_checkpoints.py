"""The PostgreSQL engine's checkpoints (:class:`~.repositories.CheckpointRepository`):
the ``checkpoint`` table (PostgreSQL migration 15); adding one and trimming the automatic ones
is one transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import CheckpointLimit, StoreError
from .postgres_room import PostgresRoom
from .records import CheckpointRecord
from .rows import CHECKPOINT

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresCheckpoints"]


class PostgresCheckpoints(PostgresRoom):
    """Checkpoints in the ``checkpoint`` table; they go with their conversation (the
    foreign key cascades)."""

    async def checkpoint_add(
        self,
        conversation_id: str,
        document: str,
        *,
        at: float,
        label: str = "",
        automatic: bool = False,
        keep: int | None = None,
        limit: int | None = None,
    ) -> CheckpointRecord:
        size = len(document.encode("utf-8"))

        async def fn(conn: asyncpg.Connection) -> CheckpointRecord:
            # (The conversation's row is locked: two automatic checkpoints of one
            # conversation trim in turn, never both keeping the other's.)
            known = await conn.fetchval(
                "SELECT 1 FROM conversation WHERE id = $1 FOR UPDATE", conversation_id
            )
            if known is None:
                raise StoreError(f"no conversation {conversation_id!r}")
            if not automatic and limit is not None:
                taken = await conn.fetchval(
                    "SELECT count(*) FROM checkpoint WHERE conversation_id = $1 AND NOT automatic",
                    conversation_id,
                )
                if taken >= limit:
                    raise CheckpointLimit(conversation_id, limit)
            row = await conn.fetchrow(
                "INSERT INTO checkpoint"
                " (conversation_id, created_at, label, automatic, size, document)"
                f" VALUES ($1, $2, $3, $4, $5, $6) RETURNING {CHECKPOINT.columns}",
                conversation_id, at, label, automatic, size, document,
            )  # fmt: skip
            if automatic and keep is not None:
                await conn.execute(
                    "DELETE FROM checkpoint WHERE conversation_id = $1 AND automatic"
                    " AND id NOT IN (SELECT id FROM checkpoint WHERE conversation_id = $1"
                    " AND automatic ORDER BY id DESC LIMIT $2)",
                    conversation_id,
                    max(0, keep),
                )
            return CHECKPOINT.record(row)

        record: CheckpointRecord = await self._write(fn)
        return record

    async def checkpoints(self, conversation_id: str) -> list[CheckpointRecord]:
        rows = await self._read(
            f"SELECT {CHECKPOINT.columns} FROM checkpoint WHERE conversation_id = $1"
            " ORDER BY id DESC",
            conversation_id,
        )
        return [CHECKPOINT.record(r) for r in rows]

    async def checkpoint_get(self, conversation_id: str, checkpoint_id: int) -> str | None:
        rows = await self._read(
            "SELECT document FROM checkpoint WHERE conversation_id = $1 AND id = $2",
            conversation_id,
            checkpoint_id,
        )
        return str(rows[0][0]) if rows else None

    async def checkpoint_delete(self, conversation_id: str, checkpoint_id: int) -> bool:
        async def fn(conn: asyncpg.Connection) -> bool:
            status = await conn.execute(
                "DELETE FROM checkpoint WHERE conversation_id = $1 AND id = $2",
                conversation_id,
                checkpoint_id,
            )
            return int(status.split()[-1]) > 0

        return bool(await self._write(fn, single=True))
