"""The embedded default store: SQLite.

* WAL journal; ``synchronous`` is configurable (``"full"`` by default: a
  committed message survives power loss, not only a killed process).
* One writer: every write is a job handed, in batches, to the writer: a
  process of its own (``writer = "process"``, :mod:`.sqlite_writer`) for the
  batches of plain data (appends, the outbox's named operations), the writer
  thread for those holding a closure; one batch is in flight at a time.  A
  batch is one transaction run in a single round trip (not one per
  statement), and jobs that arrive
  while a commit is in flight are committed together in the next one (group
  commit): many conversations writing at once cost one fsync, not one each.
  Each caller still waits for *its* commit; a failing job fails alone.
* A write handed in with ``defer=True`` (held) never starts a commit of its
  own while another write may come to carry it: it waits for the next write
  that is not held, or :data:`~.base.DEFER_MAX` seconds, whichever is first —
  also when it queued behind a commit in flight (the end of that commit used
  to take whatever had queued, so a commit could carry held writes only: a
  sixth of the Slack benchmark's commits held only outbox rows, most held).
* Reads go through aiosqlite on a second connection (WAL lets it read while
  the writer commits); with ``:memory:`` the one connection serves both.
* The event loop never blocks on disk: SQLite only runs in those threads
  and in the writer process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiosqlite

from ..errors import ClosedError, StoreError, StoreRefusal
from ..messages import ChatMessage, Message, MessageKind, NewMessage
from ..settings import defaults, settings_dataclass
from ..threads import yield_to_loop
from .base import (
    DEFER_MAX,
    ConversationRecord,
    MemoryEntry,
    Store,
    TurnEnd,
)
from .care import backup_before_migrating
from .migrations import apply_migrations
from .sqlite_a2a import SQLiteA2ATasks
from .sqlite_attachments import SQLiteAttachments
from .sqlite_checkpoints import SQLiteCheckpoints
from .sqlite_cluster import SQLiteCluster
from .sqlite_copy import SQLiteCopy
from .sqlite_events import SQLiteRunEvents
from .sqlite_governance import SQLiteGovernance
from .sqlite_jobs import SQLiteJobs
from .sqlite_lifecycle import SQLiteLifecycle
from .sqlite_links import SQLiteLinks
from .sqlite_outbox import SQLiteOutbox
from .sqlite_process import WriterProcess
from .sqlite_queue import SQLiteQueue
from .sqlite_redaction import SQLiteRedaction
from .sqlite_runs import SQLiteRuns, run_row
from .sqlite_search import SQLiteSearch
from .sqlite_seen import SQLiteSeen
from .sqlite_waits import SQLiteWaits
from .sqlite_webhooks import SQLiteWebhooks
from .sqlite_writer import (
    Failed,
    open_connection,
    run_batch,
    trace,
    transaction,
    write_appends,
)

__all__ = ["SQLiteSettings", "SQLiteStore", "Synchronous", "Writer"]

log = logging.getLogger(__name__)

Synchronous = Literal["off", "normal", "full", "extra"]
Writer = Literal["process", "thread"]


@settings_dataclass
class SQLiteSettings:
    """The store's settings (the configuration's ``[storage]`` adds its ``path``)."""

    #: SQLite ``synchronous`` mode: ``full`` survives power loss; ``normal``
    #: survives a killed process and is faster; ``off`` is for throwaway bots.
    synchronous: Synchronous = "full"
    #: Where the writes of a database file run: ``process`` (a small process of
    #: its own, so writing never waits for the bot's GIL) or ``thread`` (a thread
    #: of the bot's process).  Jobs that are closures (rare ones: redaction,
    #: imports, a plugin's ``run_write``) always run in the thread.
    writer: Writer = "process"


_DEFAULTS = defaults(SQLiteSettings)

#: WAL pages between automatic checkpoints (see ``_open_writer``).
_WAL_PAGES = 4000
#: The writing connections' page caches with a writer process (KB; SQLite's default
#: is 2000): the process's memory is the bot's too, and a miss is a read from the
#: OS's cache, in the process (bench_irc's peak RSS: +24.5 MB with 512, +26.7 with 2000).
_CACHE_KB = 512

_MESSAGE_COLUMNS = (
    "id, conversation_id, kind, content, author, channel, run_id, tool_call_id, tool_name,"
    " arguments, is_error, status, data, duration, created_at"
)


@dataclass(slots=True)
class _Append:
    conversation_id: str
    log: Sequence[NewMessage]
    memory: Sequence[ChatMessage]
    updated_at: float | None
    future: asyncio.Future[Any]
    ended: TurnEnd | None = None
    held: bool = False  # written with ``defer=True``: waits for a write that is not
    #: A new conversation written first (``create_conversation_with``), and its binding.
    record: ConversationRecord | None = None
    channel_key: str | None = None


#: The future of an append written inside another job (nobody awaits it).
_NO_FUTURE: Any = None


@dataclass(slots=True)
class _Job:
    fn: Callable[[sqlite3.Connection], Any] | None
    future: asyncio.Future[Any]
    conversation_id: str | None = None  # the conversation it writes to, if one
    held: bool = False  # written with ``defer=True``: waits for a write that is not
    #: A named operation of :data:`.sqlite_writer.OPS` and its arguments (``fn`` is
    #: then None): plain data, so the writer process can take it.
    op: tuple[str, tuple[Any, ...]] | None = None


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


def _conversation_row(record: ConversationRecord) -> tuple[Any, ...]:
    return (record.id, record.title, record.created_at, record.updated_at, json.dumps(record.meta))


def _append_rows(a: _Append, now: float) -> tuple[Any, ...]:
    """``a`` as the writer takes it (plain data: see :mod:`.sqlite_writer`)."""
    record = a.record
    conversation = binding = None
    if record is not None:
        conversation = _conversation_row(record)
        if a.channel_key is not None:
            binding = (a.channel_key, record.id, record.created_at)
    messages = [
        (
            m.kind, m.content, m.author, m.channel, m.run_id, m.tool_call_id, m.tool_name,
            m.arguments, int(m.is_error), m.status,
            None if m.data is None else json.dumps(m.data, ensure_ascii=False),
            m.duration, m.created_at or now,
        )
        for m in a.log
    ]  # fmt: skip
    memory = [_memory_row(cm) for cm in a.memory]
    end = run = None
    if a.ended is not None:
        end = (a.ended.run_id, a.ended.outcome, now)
        if a.ended.run is not None:
            run = run_row(a.ended.run)
    return (a.conversation_id, conversation, binding, messages, memory, a.updated_at, end, run)


def _memory_row(cm: ChatMessage) -> tuple[Any, ...]:
    """A working-memory entry as the writer takes it.  ``message_id = -(k + 1)``
    names the k-th row of its append (``link_stored``): its JSON goes without the
    value of its last key, ``message_id``, which the writer adds once it knows it."""
    body = cm.to_json()
    if cm.message_id is None or cm.message_id >= 0:
        return (None, cm.message_id, body)
    tail = f"{cm.message_id}}}"
    if not body.endswith(f'"message_id":{tail}'):
        raise ValueError("a working-memory entry's JSON does not end with its message_id")
    return (-cm.message_id - 1, None, body[: -len(tail)])


def _stored(a: _Append, first: int | None, now: float) -> list[Message]:
    """``a``'s rows as written: ids from ``first`` on (:func:`.sqlite_writer.write_appends`)."""
    if first is None:
        return []
    cid = a.conversation_id
    return [m.stored(id=first + k, conversation_id=cid, now=now) for k, m in enumerate(a.log)]


def _item(job: _Append | _Job, now: float) -> tuple[Any, ...]:
    """One job of a batch as the writer takes it."""
    if isinstance(job, _Append):
        return ("append", _append_rows(job, now))
    if job.op is not None:
        return ("op", *job.op)
    return ("fn", job.fn)


class _WriterThread:
    """One thread that owns the writing connection; ``call`` runs a function there.

    A bare thread and queue rather than an executor: a round trip costs
    about a third less CPU, and a turn makes two of them.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        # A batch thread: its wake-ups never preempt the event loop (core/threads.py).
        yield_to_loop()
        while True:
            item = self._queue.get()
            if item is None:
                return
            loop, done, fn, args = item
            try:
                result = fn(*args)
            except BaseException as exc:
                loop.call_soon_threadsafe(done, None, exc)
            else:
                loop.call_soon_threadsafe(done, result, None)

    def submit(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        done: Callable[[Any, BaseException | None], None],
    ) -> None:
        """Run ``fn(*args)`` in the thread; ``done(result, error)`` runs on the loop."""
        self._queue.put((asyncio.get_running_loop(), done, fn, args))

    def call(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        fut = asyncio.get_running_loop().create_future()
        self.submit(fn, args, lambda result, exc: _settle(fut, result, exc))
        return fut

    async def stop(self) -> None:
        await self.call(int)  # everything queued before has run
        self._queue.put(None)
        self._thread.join()


#: SQLite result codes of a write that may succeed later: busy/locked (another
#: process holds the lock past ``busy_timeout``), read-only, I/O error, disk full.
_TRANSIENT_CODES = frozenset({5, 6, 8, 10, 13})


def _transient(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.OperationalError)
        and code is not None
        and (code & 0xFF in _TRANSIENT_CODES)
    )


def _settle_failed(job: _Append | _Job, err: BaseException) -> None:
    """A job's future fails with ``err``: a :class:`StoreError` (retryable when
    SQLite's error may pass) unless it is one, or a refusal."""
    if job.future is None or job.future.done():
        return
    if not isinstance(err, (StoreError, StoreRefusal)):
        wrapped = StoreError(f"database write failed: {err}")
        wrapped.__cause__ = err
        wrapped.retryable = _transient(err)
        err = wrapped
    job.future.set_exception(err)


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.cancelled():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class SQLiteStore(
    SQLiteRedaction,
    SQLiteOutbox,
    SQLiteWaits,
    SQLiteGovernance,
    SQLiteRuns,
    SQLiteLifecycle,
    SQLiteJobs,
    SQLiteCluster,
    SQLiteSeen,
    SQLiteRunEvents,
    SQLiteQueue,
    SQLiteLinks,
    SQLiteWebhooks,
    SQLiteAttachments,
    SQLiteA2ATasks,
    SQLiteCheckpoints,
    SQLiteSearch,
    SQLiteCopy,
    Store,
):
    """SQLite implementation of :class:`~agentik.core.store.base.Store`.

    ``path`` is a file path or ``":memory:"``.  ``max_batch`` bounds how many
    queued writes one transaction takes.  ``defer_max``: seconds a held write
    (``defer=True``) waits at most for a write to carry it (:data:`~.base.DEFER_MAX`).
    """

    def __init__(
        self,
        path: str = ":memory:",
        *,
        synchronous: Synchronous = _DEFAULTS.synchronous,
        max_batch: int = 512,
        busy_timeout: float = 5.0,
        defer_max: float = DEFER_MAX,
        writer: Writer = _DEFAULTS.writer,
    ) -> None:
        if synchronous not in ("off", "normal", "full", "extra"):
            raise ValueError(f"synchronous must be off|normal|full|extra, not {synchronous!r}")
        if writer not in ("process", "thread"):
            raise ValueError(f"writer must be process|thread, not {writer!r}")
        self.writer = writer
        self.path = str(path)
        self.synchronous = synchronous
        self.max_batch = max_batch
        self.busy_timeout = busy_timeout
        self.defer_max = defer_max
        self._memory = self.path == ":memory:"
        self._writer: _WriterThread | None = None
        self._process: WriterProcess | None = None
        self._conn: sqlite3.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._pending: list[_Append | _Job] = []
        self._urgent = 0  # how many of ``_pending`` are not held (``defer=False``)
        self._due = False  # the held writes in ``_pending`` commit with the next batch
        self._busy = False  # a batch is in the writer thread
        # Commits held writes (``append(defer=True)``) if no write follows them.
        self._flush_timer: asyncio.TimerHandle | None = None
        # Conversations whose writes need no fsync of their own (see set_internal).
        self._internal: set[str] = set()
        self._idle: asyncio.Event | None = None
        self._started = False
        self._closed = False
        self._traced_from = 0  # (trace_statements)

    # -- lifecycle -----------------------------------------------------------
    def _connection_settings(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "busy_ms": int(self.busy_timeout * 1000),
            "synchronous": self.synchronous,
            # Checkpoints every 4000 pages (SQLite's default: 1000): the WAL file is up
            # to 16 MB (see ``open_connection``).
            "wal_pages": _WAL_PAGES,
        }

    def _open_writer(self) -> None:
        conn = open_connection(**self._connection_settings())
        try:
            if not self._memory:
                # An existing database about to change schema is copied first.
                backup_before_migrating(conn, self.path)
            apply_migrations(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    async def _in_writer(self, fn: Callable[..., Any], *args: Any) -> Any:
        assert self._writer is not None
        return await self._writer.call(fn, *args)

    async def start(self) -> None:
        if self._started:
            return
        self._writer = _WriterThread("agentik-sqlite-writer")
        try:
            await self._in_writer(self._open_writer)
            if not self._memory:
                self._reader = await aiosqlite.connect(self.path, isolation_level=None)
                await self._reader.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                await self._reader.execute("PRAGMA query_only = ON")
                if self.writer == "process":
                    await self._start_process()
        except sqlite3.Error as exc:
            await self._shutdown()
            raise StoreError(f"cannot open database {self.path!r}: {exc}") from exc
        except BaseException:
            await self._shutdown()
            raise
        self._idle = asyncio.Event()
        self._idle.set()
        self._started = True

    @property
    def writer_pid(self) -> int | None:
        """The writer process's pid; None while the writes run in the thread."""
        process = self._process
        return process.pid if process is not None and process.alive else None

    async def _start_process(self) -> None:
        try:
            # Its page cache is 512 KB, not SQLite's 2 MB: the process's memory is
            # the bot's too (a cache miss is a read from the OS's cache, in there).
            settings = {**self._connection_settings(), "parent": os.getpid(), "cache_kb": _CACHE_KB}
            self._process = await WriterProcess.start(settings)
            # The thread's connection now runs the rare closures only, and the
            # process's commits empty its cache anyway: the same bound.
            conn = self._conn
            assert conn is not None
            await self._in_writer(conn.execute, f"PRAGMA cache_size = {-_CACHE_KB}")
        except sqlite3.Error:
            raise  # the database itself: as the thread's connection would have said
        except Exception as exc:
            # (No interpreter to start, no process allowed: the thread writes.)
            log.warning("SQLite writer process not started (%s); writing from a thread", exc)

    async def settle(self) -> None:
        if self._closed or self._idle is None:
            return
        self._flush()  # a held write commits now
        await self._idle.wait()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._flush()  # a held write commits now
        if self._idle is not None:
            await self._idle.wait()  # every write submitted before is committed
        await self._shutdown()

    async def _shutdown(self) -> None:
        if self._process is not None:
            with contextlib.suppress(Exception):
                await self._process.stop()
            self._process = None
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await self._reader.close()
            self._reader = None
        if self._conn is not None and self._writer is not None:
            with contextlib.suppress(Exception):
                await self._in_writer(self._conn.close)
        self._conn = None
        if self._writer is not None:
            await self._writer.stop()
            self._writer = None

    # -- the single writer ---------------------------------------------------
    def _submit(self, item: _Append | _Job, *, defer: bool = False) -> asyncio.Future[Any]:
        if self._closed or not self._started:
            raise ClosedError("the store is closed" if self._closed else "the store is not started")
        self._pending.append(item)
        if defer:
            # Held for the write that follows (see Store.append): both commit in
            # one transaction.  The timer commits it alone if none comes.
            item.held = True
            assert self._idle is not None
            self._idle.clear()
            self._hold()
            return item.future
        self._urgent += 1
        if not self._busy:
            self._pump()
        return item.future

    def _hold(self) -> None:
        """Held writes are pending: the timer commits them if no other write comes."""
        if self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(self.defer_max, self._flush)

    def _flush(self) -> None:
        """Commit held writes now (the deferral timer, or closing)."""
        self._flush_timer = None
        if self._pending:
            self._due = True  # (a batch in flight: they go with the next one)
            if not self._busy:
                self._pump()

    def _pump(self) -> None:
        """Hand everything pending to the writer thread as one batch.

        Runs when a write arrives at an idle writer, and when a batch
        finishes: writes that queued meanwhile go together (group commit).
        No task sits in between, so a write costs one thread round trip.
        Held writes alone do not make a batch (until they are due): they wait
        for the next write, which commits them with it.
        """
        if self._pending and not self._urgent and not self._due:
            self._busy = False  # (the idle event stays clear: they are not committed)
            self._hold()
            return
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        batch = self._pending[: self.max_batch]
        del self._pending[: self.max_batch]
        self._urgent -= sum(not item.held for item in batch)
        if not self._pending:
            self._due = False
        # Each job as the writer takes it: one that cannot be (data that is not
        # JSON, say) fails alone, here, as it would have in the writer.
        now = time.time()
        items: list[tuple[Any, ...]] = []
        ready: list[_Append | _Job] = []
        for job in batch:
            try:
                items.append(_item(job, now))
            except Exception as exc:
                _settle_failed(job, exc)
                continue
            ready.append(job)
        batch = ready
        if not batch and self._pending:
            self._pump()
            return
        if not batch:
            self._busy = False
            assert self._idle is not None
            self._idle.set()
            return
        self._busy = True
        assert self._writer is not None and self._idle is not None
        self._idle.clear()
        restore = None
        if (
            self._internal
            and self.synchronous in ("full", "extra")
            and all(item.conversation_id in self._internal for item in batch)
        ):
            restore = self.synchronous.upper()

        def done(results: list[Any] | None, exc: BaseException | None) -> None:
            self._done(batch, now, results, exc)

        process = self._process
        if process is not None and not process.alive:
            process = self._process = None
        if (
            process is not None
            and all(item[0] != "fn" for item in items)
            and process.submit(items, restore, done)
        ):
            return
        self._writer.submit(run_batch, (self._conn, items, restore), done)

    def _done(
        self,
        batch: list[_Append | _Job],
        now: float,
        results: list[Any] | None,
        exc: BaseException | None,
    ) -> None:
        if exc is not None or results is None:  # the writer itself failed
            results = [Failed(exc or StoreError("the writer failed"))] * len(batch)
        for item, result in zip(batch, results, strict=True):
            if item.future.done():
                continue
            if isinstance(result, Failed):
                _settle_failed(item, result.error)
            elif isinstance(item, _Append):
                item.future.set_result(_stored(item, result, now))
            else:
                item.future.set_result(result)
        self._pump()

    async def _write(self, fn: Callable[[sqlite3.Connection], Any], *, defer: bool = False) -> Any:
        loop = asyncio.get_running_loop()
        return await self._submit(_Job(fn, loop.create_future()), defer=defer)

    async def _write_op(self, name: str, *args: Any, defer: bool = False) -> Any:
        """Run ``OPS[name](connection, *args)`` (:data:`.sqlite_writer.OPS`) as a write:
        plain data, so the writer process can take it."""
        loop = asyncio.get_running_loop()
        return await self._submit(_Job(None, loop.create_future(), op=(name, args)), defer=defer)

    def _append_in(
        self, conn: sqlite3.Connection, cid: str, message: NewMessage, updated_at: float | None
    ) -> Message:
        """One audit-log row written in the caller's transaction (the turn queue's)."""
        append = _Append(cid, (message,), (), updated_at, _NO_FUTURE)
        now = time.time()
        [first] = write_appends(conn, [_append_rows(append, now)])
        [m] = _stored(append, first, now)
        return m

    async def run_write(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``fn(connection)`` in the writer thread, in its own transaction.

        For components sharing this database (long-term memory): the job is
        ordered and group-committed with every other write.  ``fn`` must not
        commit or roll back itself; an exception rolls back its changes only.
        """
        return await self._write(fn)

    async def trace_statements(self, on: bool) -> list[str]:
        """A debugging aid: the SQL the writing connections run (the thread's and the
        writer process's), in the order they ran it.  ``on=True`` starts recording
        (and returns ``[]``); ``on=False`` stops and returns what was recorded since."""
        got = list(await self._write(lambda conn: trace(conn, on)))
        if self._process is not None and self._process.alive:
            got += await self._write_op("trace", on)
        if on:
            self._traced_from = time.monotonic_ns()
            return []
        return [st for t, st in sorted(got) if t >= self._traced_from]

    async def run_read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run a read-only query on the reading connection; rows as tuples."""
        return await self._read(sql, params)

    async def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        if self._closed or not self._started:
            raise ClosedError("the store is closed" if self._closed else "the store is not started")
        try:
            if self._reader is None:  # :memory: - one connection for everything
                assert self._conn is not None
                conn = self._conn
                return await self._in_writer(lambda: conn.execute(sql, params).fetchall())
            # One hop to the reader's thread (execute, fetch and close there), not three.
            return list(await self._reader.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise StoreError(f"database read failed: {exc}") from exc

    # -- conversations ---------------------------------------------------------
    async def create_conversation(
        self, record: ConversationRecord, *, channel_key: str | None = None
    ) -> None:
        await self.create_conversation_with(record, channel_key=channel_key)

    async def create_conversation_with(
        self,
        record: ConversationRecord,
        *,
        log: Sequence[NewMessage] = (),
        memory: Sequence[ChatMessage] = (),
        updated_at: float | None = None,
        defer: bool = False,
        channel_key: str | None = None,
    ) -> list[Message]:
        # One job: the record (and its binding) and the first rows commit in one
        # transaction.  The new row carries the first rows' ``updated_at`` (no UPDATE after it).
        if updated_at is not None and updated_at > record.updated_at:
            record = dataclasses.replace(record, updated_at=updated_at)
        # (An append that writes the record first: it joins the batch's run of appends.)
        first = _Append(
            record.id,
            tuple(log),
            tuple(memory),
            None,
            asyncio.get_running_loop().create_future(),
            record=record,
            channel_key=channel_key,
        )
        return await self._submit(first, defer=defer)

    def set_internal(self, conversation_id: str, internal: bool) -> None:
        # A batch of only such writes commits with synchronous = NORMAL: its WAL
        # frames are fsynced by the next full commit (the WAL is one file,
        # appended in order), or by a checkpoint, whichever comes first.
        if internal:
            self._internal.add(conversation_id)
        else:
            self._internal.discard(conversation_id)

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

    async def list_conversations_after(
        self, updated_at: float, conversation_id: str, *, limit: int = 50
    ) -> list[ConversationRecord]:
        # "updated_at <= ?" seeks in conversation_by_update (updated_at DESC, id); the
        # rest drops the ties up to the key. (A row comparison cannot say "DESC, ASC".)
        rows = await self._read(
            "SELECT id, title, created_at, updated_at, meta FROM conversation"
            " WHERE updated_at <= ? AND (updated_at < ? OR id > ?)"
            " ORDER BY updated_at DESC, id LIMIT ?",
            (updated_at, updated_at, conversation_id, limit),
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

        def fn(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"UPDATE conversation SET {', '.join(sets)} WHERE id = ?",
                (*params, conversation_id),
            )

        await self._write(fn)

    async def delete_conversation(self, conversation_id: str) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("DELETE FROM conversation WHERE id = ?", (conversation_id,))
            conn.execute("DELETE FROM run_event WHERE conversation_id = ?", (conversation_id,))
            return cur.rowcount > 0

        deleted = bool(await self._write(fn))
        if deleted:
            await self._attachment_sweep()
        return deleted

    # -- bindings -----------------------------------------------------------------
    async def get_binding(self, channel_key: str) -> str | None:
        rows = await self._read(
            "SELECT conversation_id FROM channel_binding WHERE channel_key = ?", (channel_key,)
        )
        return rows[0][0] if rows else None

    async def set_binding(self, channel_key: str, conversation_id: str) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute(
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
        ended: TurnEnd | None = None,
        defer: bool = False,
    ) -> list[Message]:
        loop = asyncio.get_running_loop()
        item = _Append(
            conversation_id, tuple(log), tuple(memory), updated_at, loop.create_future(), ended
        )
        return await self._submit(item, defer=defer)

    async def pending_turns(self, *, limit: int = 1000, after: int = 0) -> list[Message]:
        rows = await self._read(
            f"SELECT {_MESSAGE_COLUMNS} FROM message m"
            " WHERE m.id > ? AND m.kind = 'user' AND m.run_id IS NOT NULL AND NOT EXISTS ("
            "  SELECT 1 FROM turn_end t"
            "  WHERE t.conversation_id = m.conversation_id AND t.run_id = m.run_id)"
            # A child run's conversation is not taken up again: its parent's turn is.
            " AND NOT EXISTS (SELECT 1 FROM conversation c WHERE c.id = m.conversation_id"
            "  AND json_extract(c.meta, '$.parent_run_id') IS NOT NULL)"
            " ORDER BY m.id LIMIT ?",
            (after, limit),
        )
        return [_row_to_message(r) for r in rows]

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
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM working_memory WHERE conversation_id = ? AND pos <= ?",
                (conversation_id, upto),
            )
            conn.execute(
                "INSERT INTO working_memory (conversation_id, pos, message_id, body)"
                " VALUES (?, ?, ?, ?)",
                (conversation_id, upto, summary.message_id, summary.to_json()),
            )

        await self._write(fn)

    async def rewind(self, conversation_id: str, from_pos: int) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "DELETE FROM working_memory WHERE conversation_id = ? AND pos >= ?",
                (conversation_id, from_pos),
            ).rowcount

        removed: int = await self._write(fn)
        return removed

    def _redact_securely(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Runs in the writer thread, between batches: ``fn`` in its own
        transaction with ``secure_delete`` on (freed bytes are zeroed), then a
        WAL checkpoint that truncates the WAL (its frames held the old text)."""
        conn = self._conn
        assert conn is not None
        conn.execute("PRAGMA secure_delete = ON")
        try:
            try:
                result = transaction(conn, [("fn", fn)])[0]
            except Exception as exc:
                return exc
        finally:
            conn.execute("PRAGMA secure_delete = OFF")
        if not self._memory:
            for _ in range(50):
                busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                if busy is None or not busy[0]:
                    break
                time.sleep(0.05)  # a reader holds an old snapshot: let it finish
            else:
                log.warning("redaction: the WAL could not be truncated (readers busy)")
        return result
