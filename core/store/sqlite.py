"""The embedded default store: SQLite through aiosqlite.

* WAL journal; ``synchronous`` is configurable (``"full"`` by default: a
  committed message survives power loss, not only a killed process).
* One writer: every write is a job on one queue, executed by one task on one
  connection.  Jobs that queue up while a commit is in flight are committed
  together in the next transaction (group commit), so many conversations
  writing at once cost one fsync, not one each.  Each caller still waits for
  *its* commit.
* Reads use a second connection (WAL lets it read while the writer commits);
  with ``:memory:`` everything shares the one connection.
* aiosqlite runs SQLite in its own thread: the event loop never blocks on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiosqlite

from ..errors import ClosedError, StoreError
from ..messages import ChatMessage, Message, MessageKind, NewMessage
from .base import ConversationRecord, MemoryEntry, Store
from .migrations import apply_migrations

__all__ = ["SQLiteStore"]

log = logging.getLogger(__name__)

Synchronous = Literal["off", "normal", "full", "extra"]

_MESSAGE_COLUMNS = (
    "id, conversation_id, kind, content, author, channel, run_id, tool_call_id, tool_name,"
    " arguments, is_error, status, data, duration, created_at"
)
_INSERT_MESSAGE = f"INSERT INTO message ({_MESSAGE_COLUMNS}) VALUES ({', '.join('?' * 15)})"
_INSERT_MEMORY = (
    "INSERT INTO working_memory (conversation_id, pos, message_id, body) VALUES"
    " (?, (SELECT COALESCE(MAX(pos), 0) + 1 FROM working_memory WHERE conversation_id = ?), ?, ?)"
)
_TOUCH = "UPDATE conversation SET updated_at = MAX(updated_at, ?) WHERE id = ?"


@dataclass(slots=True)
class _Append:
    conversation_id: str
    log: Sequence[NewMessage]
    memory: Sequence[ChatMessage]
    updated_at: float | None
    future: asyncio.Future[Any]
    result: list[Message] = field(default_factory=list)


@dataclass(slots=True)
class _Job:
    fn: Callable[[aiosqlite.Connection], Awaitable[Any]]
    future: asyncio.Future[Any]


def _row_to_message(row: sqlite3.Row | tuple[Any, ...]) -> Message:
    data = row[12]
    return Message(
        id=row[0],
        conversation_id=row[1],
        kind=row[2],
        content=row[3],
        author=row[4],
        channel=row[5],
        run_id=row[6],
        tool_call_id=row[7],
        tool_name=row[8],
        arguments=row[9],
        is_error=bool(row[10]),
        status=row[11],
        data=json.loads(data) if data is not None else None,
        duration=row[13],
        created_at=row[14],
    )


def _row_to_conversation(row: tuple[Any, ...]) -> ConversationRecord:
    return ConversationRecord(
        id=row[0], title=row[1], created_at=row[2], updated_at=row[3], meta=json.loads(row[4])
    )


class SQLiteStore(Store):
    """SQLite implementation of :class:`~agentik.core.store.base.Store`.

    ``path`` is a file path or ``":memory:"``.  ``max_batch`` bounds how many
    queued writes one transaction takes.
    """

    def __init__(
        self,
        path: str = ":memory:",
        *,
        synchronous: Synchronous = "full",
        max_batch: int = 512,
        busy_timeout: float = 5.0,
    ) -> None:
        if synchronous not in ("off", "normal", "full", "extra"):
            raise ValueError(f"synchronous must be off|normal|full|extra, not {synchronous!r}")
        self.path = str(path)
        self.synchronous = synchronous
        self.max_batch = max_batch
        self.busy_timeout = busy_timeout
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._queue: asyncio.Queue[_Append | _Job | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle -----------------------------------------------------------
    async def _connect(self, *, readonly: bool) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        await conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        await conn.execute("PRAGMA foreign_keys = ON")
        if readonly:
            await conn.execute("PRAGMA query_only = ON")
        else:
            await conn.execute("PRAGMA journal_mode = WAL")
            await conn.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
        return conn

    async def start(self) -> None:
        if self._task is not None:
            return
        try:
            self._writer = await self._connect(readonly=False)
            await apply_migrations(self._writer)
            if self.path == ":memory:" or self.path.startswith("file::memory:"):
                self._reader = self._writer
            else:
                self._reader = await self._connect(readonly=True)
        except sqlite3.Error as exc:
            await self._close_connections()
            raise StoreError(f"cannot open database {self.path!r}: {exc}") from exc
        except BaseException:
            await self._close_connections()
            raise
        self._task = asyncio.create_task(
            self._write_loop(), name=f"agentik-sqlite-writer:{self.path}"
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._queue.put_nowait(None)  # drain what is queued, then stop
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._close_connections()

    async def _close_connections(self) -> None:
        for conn in {id(c): c for c in (self._reader, self._writer) if c is not None}.values():
            with contextlib.suppress(Exception):
                await conn.close()
        self._reader = self._writer = None

    # -- the single writer ---------------------------------------------------
    def _submit(self, item: _Append | _Job) -> asyncio.Future[Any]:
        if self._closed or self._task is None:
            raise ClosedError("the store is closed" if self._closed else "the store is not started")
        self._queue.put_nowait(item)
        return item.future

    async def _write_loop(self) -> None:
        stop = False
        while not stop:
            first = await self._queue.get()
            if first is None:
                break
            batch: list[_Append | _Job] = [first]
            while len(batch) < self.max_batch and not self._queue.empty():
                item = self._queue.get_nowait()
                if item is None:
                    stop = True
                    break
                batch.append(item)
            await self._commit_batch(batch)

    async def _commit_batch(self, batch: list[_Append | _Job]) -> None:
        assert self._writer is not None
        conn = self._writer
        try:
            await conn.execute("BEGIN IMMEDIATE")
            results = await self._apply(conn, batch)
            await conn.execute("COMMIT")
        except Exception as exc:
            if conn.in_transaction:
                with contextlib.suppress(Exception):
                    await conn.execute("ROLLBACK")
            if len(batch) > 1:
                # Isolate the failing job: every other job still commits.
                for item in batch:
                    await self._commit_batch([item])
                return
            item = batch[0]
            if not item.future.done():
                err = (
                    exc
                    if isinstance(exc, StoreError)
                    else StoreError(f"database write failed: {exc}")
                )
                if err is not exc:
                    err.__cause__ = exc
                item.future.set_exception(err)
            return
        for item, result in zip(batch, results, strict=True):
            if not item.future.done():
                item.future.set_result(result)

    async def _apply(self, conn: aiosqlite.Connection, batch: list[_Append | _Job]) -> list[Any]:
        results: list[Any] = []
        run: list[_Append] = []
        for item in batch:
            if isinstance(item, _Append):
                run.append(item)
                continue
            if run:
                await self._apply_appends(conn, run)
                results.extend(a.result for a in run)
                run = []
            results.append(await item.fn(conn))
        if run:
            await self._apply_appends(conn, run)
            results.extend(a.result for a in run)
        return results

    async def _apply_appends(self, conn: aiosqlite.Connection, appends: list[_Append]) -> None:
        """Write consecutive appends with one statement per table."""
        async with conn.execute("SELECT COALESCE(MAX(id), 0) FROM message") as cur:
            row = await cur.fetchone()
        next_id = int(row[0]) + 1 if row else 1
        message_rows: list[tuple[Any, ...]] = []
        memory_rows: list[tuple[Any, ...]] = []
        touches: list[tuple[float, str]] = []
        for a in appends:
            a.result = []
            for m in a.log:
                created = m.created_at or time.time()
                msg = Message(
                    id=next_id,
                    conversation_id=a.conversation_id,
                    kind=m.kind,
                    content=m.content,
                    author=m.author,
                    channel=m.channel,
                    run_id=m.run_id,
                    tool_call_id=m.tool_call_id,
                    tool_name=m.tool_name,
                    arguments=m.arguments,
                    is_error=m.is_error,
                    status=m.status,
                    data=m.data,
                    duration=m.duration,
                    created_at=created,
                )
                next_id += 1
                a.result.append(msg)
                message_rows.append(
                    (
                        msg.id,
                        msg.conversation_id,
                        msg.kind,
                        msg.content,
                        msg.author,
                        msg.channel,
                        msg.run_id,
                        msg.tool_call_id,
                        msg.tool_name,
                        msg.arguments,
                        int(msg.is_error),
                        msg.status,
                        json.dumps(msg.data, ensure_ascii=False) if msg.data is not None else None,
                        msg.duration,
                        msg.created_at,
                    )
                )
            for cm in a.memory:
                memory_rows.append(
                    (a.conversation_id, a.conversation_id, cm.message_id, cm.to_json())
                )
            if a.updated_at is not None:
                touches.append((a.updated_at, a.conversation_id))
        if message_rows:
            await conn.executemany(_INSERT_MESSAGE, message_rows)
        if memory_rows:
            await conn.executemany(_INSERT_MEMORY, memory_rows)
        if touches:
            await conn.executemany(_TOUCH, touches)

    async def _write(self, fn: Callable[[aiosqlite.Connection], Awaitable[Any]]) -> Any:
        loop = asyncio.get_running_loop()
        return await self._submit(_Job(fn, loop.create_future()))

    async def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        if self._reader is None:
            raise ClosedError("the store is closed" if self._closed else "the store is not started")
        try:
            async with self._reader.execute(sql, params) as cur:
                return list(await cur.fetchall())
        except sqlite3.Error as exc:
            raise StoreError(f"database read failed: {exc}") from exc

    # -- conversations ---------------------------------------------------------
    async def create_conversation(
        self, record: ConversationRecord, *, channel_key: str | None = None
    ) -> None:
        async def fn(conn: aiosqlite.Connection) -> None:
            await conn.execute(
                "INSERT INTO conversation (id, title, created_at, updated_at, meta)"
                " VALUES (?, ?, ?, ?, ?)",
                (
                    record.id,
                    record.title,
                    record.created_at,
                    record.updated_at,
                    json.dumps(record.meta),
                ),
            )
            if channel_key is not None:
                await conn.execute(
                    "INSERT OR REPLACE INTO channel_binding (channel_key, conversation_id,"
                    " created_at) VALUES (?, ?, ?)",
                    (channel_key, record.id, record.created_at),
                )

        await self._write(fn)

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        rows = await self._read(
            "SELECT id, title, created_at, updated_at, meta FROM conversation WHERE id = ?",
            (conversation_id,),
        )
        return _row_to_conversation(rows[0]) if rows else None

    async def list_conversations(
        self, *, limit: int = 50, offset: int = 0
    ) -> list[ConversationRecord]:
        rows = await self._read(
            "SELECT id, title, created_at, updated_at, meta FROM conversation"
            " ORDER BY updated_at DESC, id LIMIT ? OFFSET ?",
            (limit, offset),
        )
        return [_row_to_conversation(r) for r in rows]

    async def update_conversation(
        self,
        conversation_id: str,
        *,
        title: str | None = None,
        updated_at: float | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        sets: list[str] = []
        params: list[Any] = []
        for column, value in (("title", title), ("updated_at", updated_at)):
            if value is not None:
                sets.append(f"{column} = ?")
                params.append(value)
        if meta is not None:
            sets.append("meta = ?")
            params.append(json.dumps(meta))
        if not sets:
            return

        async def fn(conn: aiosqlite.Connection) -> None:
            await conn.execute(
                f"UPDATE conversation SET {', '.join(sets)} WHERE id = ?",
                (*params, conversation_id),
            )

        await self._write(fn)

    async def delete_conversation(self, conversation_id: str) -> bool:
        async def fn(conn: aiosqlite.Connection) -> bool:
            cur = await conn.execute("DELETE FROM conversation WHERE id = ?", (conversation_id,))
            deleted = cur.rowcount > 0
            await cur.close()
            return deleted

        return bool(await self._write(fn))

    # -- bindings -----------------------------------------------------------------
    async def get_binding(self, channel_key: str) -> str | None:
        rows = await self._read(
            "SELECT conversation_id FROM channel_binding WHERE channel_key = ?", (channel_key,)
        )
        return rows[0][0] if rows else None

    async def set_binding(self, channel_key: str, conversation_id: str) -> None:
        async def fn(conn: aiosqlite.Connection) -> None:
            await conn.execute(
                "INSERT OR REPLACE INTO channel_binding (channel_key, conversation_id, created_at)"
                " VALUES (?, ?, ?)",
                (channel_key, conversation_id, time.time()),
            )

        await self._write(fn)

    # -- the dual log -----------------------------------------------------------------
    async def append(
        self,
        conversation_id: str,
        *,
        log: Sequence[NewMessage] = (),
        memory: Sequence[ChatMessage] = (),
        updated_at: float | None = None,
    ) -> list[Message]:
        loop = asyncio.get_running_loop()
        item = _Append(conversation_id, tuple(log), tuple(memory), updated_at, loop.create_future())
        return await self._submit(item)  # type: ignore[no-any-return]

    async def messages(
        self,
        conversation_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        offset: int | None = None,
        limit: int = 100,
        kinds: Sequence[MessageKind] | None = None,
    ) -> list[Message]:
        where = ["conversation_id = ?"]
        params: list[Any] = [conversation_id]
        if kinds:
            where.append(f"kind IN ({', '.join('?' * len(kinds))})")
            params.extend(kinds)
        if after is not None:
            where.append("id > ?")
            params.append(after)
        if before is not None:
            where.append("id < ?")
            params.append(before)
        cond = " AND ".join(where)
        if after is not None or offset is not None:
            sql = (
                f"SELECT {_MESSAGE_COLUMNS} FROM message WHERE {cond} ORDER BY id LIMIT ? OFFSET ?"
            )
            rows = await self._read(sql, (*params, limit, offset or 0))
        else:
            sql = f"SELECT {_MESSAGE_COLUMNS} FROM message WHERE {cond} ORDER BY id DESC LIMIT ?"
            rows = (await self._read(sql, (*params, limit)))[::-1]
        return [_row_to_message(r) for r in rows]

    async def count_messages(self, conversation_id: str) -> int:
        rows = await self._read(
            "SELECT COUNT(*) FROM message WHERE conversation_id = ?", (conversation_id,)
        )
        return int(rows[0][0])

    async def load_memory(self, conversation_id: str) -> list[MemoryEntry]:
        rows = await self._read(
            "SELECT pos, body FROM working_memory WHERE conversation_id = ? ORDER BY pos",
            (conversation_id,),
        )
        return [MemoryEntry(pos=r[0], message=ChatMessage.from_json(r[1])) for r in rows]

    async def compact(self, conversation_id: str, upto: int, summary: ChatMessage) -> None:
        async def fn(conn: aiosqlite.Connection) -> None:
            await conn.execute(
                "DELETE FROM working_memory WHERE conversation_id = ? AND pos <= ?",
                (conversation_id, upto),
            )
            await conn.execute(
                "INSERT INTO working_memory (conversation_id, pos, message_id, body)"
                " VALUES (?, ?, ?, ?)",
                (conversation_id, upto, summary.message_id, summary.to_json()),
            )

        await self._write(fn)
