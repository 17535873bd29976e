"""The SQLite engine's checkpoints (:class:`~.repositories.CheckpointRepository`): the
``checkpoint`` table (migration 26); a write is one job of the writer thread."""

from __future__ import annotations

import sqlite3

from ..errors import CheckpointLimit, StoreError
from .records import CheckpointRecord
from .rows import CHECKPOINT
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteCheckpoints"]


class SQLiteCheckpoints(SQLiteRoom):
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

        def fn(conn: sqlite3.Connection) -> CheckpointRecord:
            known = conn.execute("SELECT 1 FROM conversation WHERE id = ?", (conversation_id,))
            if known.fetchone() is None:
                raise StoreError(f"no conversation {conversation_id!r}")
            if not automatic and limit is not None:
                (taken,) = conn.execute(
                    "SELECT COUNT(*) FROM checkpoint WHERE conversation_id = ? AND automatic = 0",
                    (conversation_id,),
                ).fetchone()
                if taken >= limit:
                    raise CheckpointLimit(conversation_id, limit)
            row = conn.execute(
                "INSERT INTO checkpoint"
                " (conversation_id, created_at, label, automatic, size, document)"
                f" VALUES (?, ?, ?, ?, ?, ?) RETURNING {CHECKPOINT.columns}",
                (conversation_id, at, label, int(automatic), size, document),
            ).fetchone()
            if automatic and keep is not None:
                conn.execute(
                    "DELETE FROM checkpoint WHERE conversation_id = ? AND automatic = 1"
                    " AND id NOT IN (SELECT id FROM checkpoint WHERE conversation_id = ?"
                    " AND automatic = 1 ORDER BY id DESC LIMIT ?)",
                    (conversation_id, conversation_id, max(0, keep)),
                )
            return CHECKPOINT.record(row)

        record: CheckpointRecord = await self._write(fn)
        return record

    async def checkpoints(self, conversation_id: str) -> list[CheckpointRecord]:
        rows = await self._read(
            f"SELECT {CHECKPOINT.columns} FROM checkpoint WHERE conversation_id = ?"
            " ORDER BY id DESC",
            (conversation_id,),
        )
        return [CHECKPOINT.record(r) for r in rows]

    async def checkpoint_get(self, conversation_id: str, checkpoint_id: int) -> str | None:
        rows = await self._read(
            "SELECT document FROM checkpoint WHERE conversation_id = ? AND id = ?",
            (conversation_id, checkpoint_id),
        )
        return str(rows[0][0]) if rows else None

    async def checkpoint_delete(self, conversation_id: str, checkpoint_id: int) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "DELETE FROM checkpoint WHERE conversation_id = ? AND id = ?",
                (conversation_id, checkpoint_id),
            )
            return cur.rowcount > 0

        return bool(await self._write(fn))
