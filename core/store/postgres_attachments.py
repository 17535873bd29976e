"""The PostgreSQL engine's attachments (:class:`~.repositories.AttachmentRepository`):
who holds what in ``attachment``, the bytes in ``attachment_blob`` (``bytea``, one row
per SHA-256; migration 9).  In the database rather than in files, so that every
worker of a cluster, wherever it runs, reads them and a backup holds them."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .postgres_room import PostgresRoom
from .records import AttachmentRecord

if TYPE_CHECKING:
    import asyncpg

__all__ = ["SWEEP", "PostgresAttachments"]

_COLUMNS = "conversation_id, sha256, media_type, size, created_at"
SWEEP = (
    "DELETE FROM attachment_blob b WHERE b.sha256 = ANY($1::text[])"
    " AND NOT EXISTS (SELECT 1 FROM attachment a WHERE a.sha256 = b.sha256)"
)


def _record(r: Sequence[object]) -> AttachmentRecord:
    return AttachmentRecord(
        conversation_id=str(r[0]), sha256=str(r[1]), media_type=str(r[2]),
        size=int(r[3]), created_at=float(r[4]),  # type: ignore[call-overload, arg-type]
    )  # fmt: skip


class PostgresAttachments(PostgresRoom):
    """Rows in ``attachment``; bytes in ``attachment_blob``."""

    async def attachment_put(
        self, conversation_id: str, data: bytes, media_type: str, *, at: float
    ) -> AttachmentRecord:
        import asyncpg

        sha = hashlib.sha256(data).hexdigest()

        async def fn(conn: asyncpg.Connection) -> AttachmentRecord:
            await conn.execute(
                "INSERT INTO attachment_blob (sha256, data) VALUES ($1, $2)"
                " ON CONFLICT (sha256) DO NOTHING",
                sha, bytes(data),
            )  # fmt: skip
            await conn.execute(
                f"INSERT INTO attachment ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5)"
                " ON CONFLICT (conversation_id, sha256) DO NOTHING",
                conversation_id, sha, media_type, len(data), at,
            )  # fmt: skip
            row = await conn.fetchrow(
                f"SELECT {_COLUMNS} FROM attachment WHERE conversation_id = $1 AND sha256 = $2",
                conversation_id, sha,
            )  # fmt: skip
            return _record(tuple(row))

        try:
            record: AttachmentRecord = await self._write(fn, conversation_id=conversation_id)
        except asyncpg.ForeignKeyViolationError as exc:
            raise KeyError(f"no conversation {conversation_id}") from exc
        except Exception as exc:
            if isinstance(exc.__cause__, asyncpg.ForeignKeyViolationError):
                raise KeyError(f"no conversation {conversation_id}") from exc
            raise
        return record

    async def attachment_get(self, conversation_id: str, sha256: str) -> AttachmentRecord | None:
        rows = await self._read(
            f"SELECT {_COLUMNS} FROM attachment WHERE conversation_id = $1 AND sha256 = $2",
            conversation_id, sha256,
        )  # fmt: skip
        return _record(tuple(rows[0])) if rows else None

    async def attachment_data(self, sha256: str) -> bytes | None:
        rows = await self._read("SELECT data FROM attachment_blob WHERE sha256 = $1", sha256)
        return bytes(rows[0][0]) if rows else None

    async def attachments(self, conversation_id: str) -> list[AttachmentRecord]:
        rows = await self._read(
            f"SELECT {_COLUMNS} FROM attachment WHERE conversation_id = $1"
            " ORDER BY created_at, sha256",
            conversation_id,
        )
        return [_record(tuple(r)) for r in rows]

    async def attachment_drop(self, conversation_id: str, sha256s: Sequence[str]) -> int:
        wanted = sorted(set(sha256s))

        async def fn(conn: asyncpg.Connection) -> int:
            status = await conn.execute(
                "DELETE FROM attachment WHERE conversation_id = $1 AND sha256 = ANY($2::text[])",
                conversation_id, wanted,
            )  # fmt: skip
            await conn.execute(SWEEP, wanted)
            return int(status.split()[-1])

        dropped: int = await self._write(fn, conversation_id=conversation_id)
        return dropped
