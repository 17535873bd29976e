"""The SQLite engine's attachments (:class:`~.repositories.AttachmentRepository`): who
holds what in the ``attachment`` table (migration 20), the bytes in files named by
their SHA-256 in the folder beside the database, ``<database>.attachments/``.

A file is written (to a temporary name, then renamed) before the row that names it
commits, so a row never names missing bytes; files no row names any more are
removed after the rows go (a crash in between leaves a file that the next sweep
removes).  A ``:memory:`` database keeps the bytes in memory."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence

from .records import AttachmentRecord
from .snapshot import ImportResult
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteAttachments"]

_COLUMNS = "conversation_id, sha256, media_type, size, created_at"
#: A temporary file (a write a crash cut) younger than this is never swept.
_GRACE = 300.0


def _record(r: Sequence[object]) -> AttachmentRecord:
    return AttachmentRecord(
        conversation_id=str(r[0]), sha256=str(r[1]), media_type=str(r[2]),
        size=int(r[3]), created_at=float(r[4]),  # type: ignore[call-overload, arg-type]
    )  # fmt: skip


def _valid(sha256: str) -> bool:
    return len(sha256) == 64 and all(c in "0123456789abcdef" for c in sha256)


class SQLiteAttachments(SQLiteRoom):
    """Rows in ``attachment``; bytes in ``<database>.attachments/<sha256>``."""

    path: str

    @property
    def attachment_folder(self) -> str | None:
        """Where the bytes are (``None``: in memory, for a ``:memory:`` database)."""
        return None if self.path == ":memory:" else self.path + ".attachments"

    def _blobs(self) -> dict[str, bytes]:
        blobs: dict[str, bytes] = self.__dict__.setdefault("_memory_blobs", {})
        return blobs

    def _save_file(self, folder: str, sha: str, data: bytes) -> None:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        final = os.path.join(folder, sha)
        if os.path.exists(final):
            return
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    async def attachment_put(
        self, conversation_id: str, data: bytes, media_type: str, *, at: float
    ) -> AttachmentRecord:
        sha = hashlib.sha256(data).hexdigest()
        async with self._attachment_lock():
            return await self._put(conversation_id, sha, data, media_type, at)

    def _attachment_lock(self) -> asyncio.Lock:
        """Held by a put (bytes, then row) and a sweep: a sweep never removes bytes
        whose row is on its way."""
        lock: asyncio.Lock = self.__dict__.setdefault("_attach_lock", asyncio.Lock())
        return lock

    async def _put(
        self, conversation_id: str, sha: str, data: bytes, media_type: str, at: float
    ) -> AttachmentRecord:
        folder = self.attachment_folder
        if folder is None:
            self._blobs().setdefault(sha, bytes(data))
        else:
            await asyncio.to_thread(self._save_file, folder, sha, data)

        def fn(conn: sqlite3.Connection) -> AttachmentRecord:
            conn.execute(
                f"INSERT INTO attachment ({_COLUMNS}) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (conversation_id, sha256) DO NOTHING",
                (conversation_id, sha, media_type, len(data), at),
            )
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM attachment WHERE conversation_id = ? AND sha256 = ?",
                (conversation_id, sha),
            ).fetchone()
            return _record(row)

        try:
            record: AttachmentRecord = await self._write(fn)
        except Exception as exc:
            if "FOREIGN KEY" in str(exc) or "FOREIGN KEY" in str(exc.__cause__):
                raise KeyError(f"no conversation {conversation_id}") from exc
            raise
        return record

    async def with_import_blobs(
        self, blobs: Sequence[bytes], write: Callable[[], Awaitable[ImportResult]]
    ) -> ImportResult:
        """A snapshot's import (``write``: its one transaction, whose rows name
        ``blobs``): the bytes are saved first, so a committed row never names missing
        bytes; if the transaction fails, the bytes no row names are removed again."""
        async with self._attachment_lock():
            folder = self.attachment_folder
            for data in blobs:
                sha = hashlib.sha256(data).hexdigest()
                if folder is None:
                    self._blobs().setdefault(sha, bytes(data))
                else:
                    await asyncio.to_thread(self._save_file, folder, sha, data)
            try:
                return await write()
            except BaseException:
                with contextlib.suppress(Exception):
                    await self._sweep()
                raise

    async def attachment_get(self, conversation_id: str, sha256: str) -> AttachmentRecord | None:
        rows = await self._read(
            f"SELECT {_COLUMNS} FROM attachment WHERE conversation_id = ? AND sha256 = ?",
            (conversation_id, sha256),
        )
        return _record(rows[0]) if rows else None

    async def attachment_data(self, sha256: str) -> bytes | None:
        if not _valid(sha256):
            return None
        if not await self._read("SELECT 1 FROM attachment WHERE sha256 = ? LIMIT 1", (sha256,)):
            return None
        folder = self.attachment_folder
        if folder is None:
            return self._blobs().get(sha256)

        def load() -> bytes | None:
            try:
                with open(os.path.join(folder, sha256), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return None

        return await asyncio.to_thread(load)

    async def attachments(self, conversation_id: str) -> list[AttachmentRecord]:
        rows = await self._read(
            f"SELECT {_COLUMNS} FROM attachment WHERE conversation_id = ?"
            " ORDER BY created_at, sha256",
            (conversation_id,),
        )
        return [_record(r) for r in rows]

    async def attachment_drop(self, conversation_id: str, sha256s: Sequence[str]) -> int:
        wanted = sorted(set(sha256s))

        def fn(conn: sqlite3.Connection) -> int:
            return sum(
                conn.execute(
                    "DELETE FROM attachment WHERE conversation_id = ? AND sha256 = ?",
                    (conversation_id, sha),
                ).rowcount
                for sha in wanted
            )

        dropped: int = await self._write(fn)
        await self._attachment_sweep()
        return dropped

    async def _attachment_sweep(self) -> None:
        """Remove the bytes no row names any more."""
        async with self._attachment_lock():
            await self._sweep()

    async def _sweep(self) -> None:
        held = {r[0] for r in await self._read("SELECT DISTINCT sha256 FROM attachment")}
        folder = self.attachment_folder
        if folder is None:
            blobs = self._blobs()
            for sha in [s for s in blobs if s not in held]:
                del blobs[sha]
            return

        def sweep() -> None:
            try:
                names = os.listdir(folder)
            except FileNotFoundError:
                return
            now = time.time()
            for name in names:
                if name in held:
                    continue
                path = os.path.join(folder, name)
                with contextlib.suppress(FileNotFoundError):
                    # A temporary file a crash left behind goes once it is old.
                    if _valid(name) or now - os.stat(path).st_mtime > _GRACE:
                        os.unlink(path)

        await asyncio.to_thread(sweep)
