"""The PostgreSQL store: the same contract as SQLite, on a server several bot
processes can share (the first step of scaling out; docs/operations.md).

* One :mod:`asyncpg` pool.  Reads run on any of its connections; writes go, in
  the order they were made, through one writer connection taken from the pool:
  every write is a transaction, and writes that queue while one commits are
  committed together in the next (group commit, as :class:`~.sqlite.SQLiteStore`
  does), a failing one alone.  Another process writes through its own writer:
  ids come from sequences, nothing is numbered in Python.
* Migrations are numbered and recorded (:mod:`.postgres_migrations`), applied at
  start under an advisory lock.
* The audit log's append-only rule is the database's: triggers refuse any other
  UPDATE or DELETE of its rows than a redaction, a conversation's deletion and
  retention.
* :mod:`asyncpg` is imported when a store starts (the ``postgres`` extra),
  never with :mod:`agentik.core`.

The DSN may hold a password: it is never logged nor shown (:func:`describe_dsn`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..errors import ClosedError, StoreError, StoreRefusal
from ..messages import ChatMessage, Message, MessageKind, NewMessage
from ..settings import defaults
from .base import DEFER_MAX, ConversationRecord, MemoryEntry, Store, TurnEnd
from .migrations import Migration
from .postgres_a2a import PostgresA2ATasks
from .postgres_attachments import SWEEP as ATTACHMENT_SWEEP
from .postgres_attachments import PostgresAttachments
from .postgres_checkpoints import PostgresCheckpoints
from .postgres_cluster import PostgresCluster
from .postgres_copy import PostgresCopy
from .postgres_events import PostgresRunEvents
from .postgres_governance import PostgresGovernance
from .postgres_jobs import PostgresJobs
from .postgres_lifecycle import PostgresLifecycle
from .postgres_links import PostgresLinks
from .postgres_migrations import MIGRATIONS, apply_migrations, schema_version
from .postgres_outbox import PostgresOutbox
from .postgres_queue import PostgresQueue
from .postgres_redaction import PostgresRedaction
from .postgres_room import (
    MESSAGE_COLUMNS,
    WriteFn,
    dumps,
    nul_free,
    nul_free_json,
)
from .postgres_runs import RUN_COLUMNS, UPSERT_RUN, PostgresRuns, run_args
from .postgres_search import PostgresSearch
from .postgres_seen import PostgresSeen
from .postgres_settings import PostgresSettings
from .postgres_waits import PostgresWaits
from .postgres_webhooks import PostgresWebhooks

if TYPE_CHECKING:
    import asyncpg

    from ..cluster.notify import PostgresNotifier

__all__ = [
    "PostgresSettings",
    "PostgresStore",
    "describe_dsn",
    "pending_migrations",
    "probe_server",
]

log = logging.getLogger(__name__)


_DEFAULTS = defaults(PostgresSettings)

#: An append, whole: audit-log rows (ids from the sequence, in order), working-memory
#: entries (after the last position; those linked to a row of this append get its id,
#: in their column and their body), the update time moved forward, the turn's end and
#: its run.  One statement is one round trip and atomic on its own.
_APPEND = f"""
WITH ids AS (
    SELECT COALESCE(array_agg(nextval('message_id_seq') ORDER BY g), '{{}}'::bigint[]) AS a
    FROM generate_series(1, $2::int) AS g
), m AS (
    INSERT INTO message ({MESSAGE_COLUMNS})
    SELECT ids.a[u.ord], $1, u.kind, u.content, u.author, u.channel, u.run_id, u.tool_call_id,
           u.tool_name, u.arguments, u.is_error, u.status, u.data, u.duration, u.created_at
    FROM ids, unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
                     $9::text[], $10::text[], $11::boolean[], $12::text[], $13::jsonb[],
                     $14::double precision[], $15::double precision[])
         WITH ORDINALITY AS u(kind, content, author, channel, run_id, tool_call_id, tool_name,
                              arguments, is_error, status, data, duration, created_at, ord)
), w AS (
    INSERT INTO working_memory (conversation_id, pos, message_id, body)
    SELECT $1, base.p + v.ord,
           CASE WHEN v.link > 0 THEN ids.a[v.link] ELSE v.mid END,
           CASE WHEN v.link > 0 THEN jsonb_set(v.body, '{{message_id}}', to_jsonb(ids.a[v.link]))
                ELSE v.body END
    FROM ids, unnest($16::int[], $17::bigint[], $18::jsonb[])
              WITH ORDINALITY AS v(link, mid, body, ord),
         (SELECT COALESCE(MAX(pos), 0) AS p FROM working_memory WHERE conversation_id = $1) base
), t AS (
    UPDATE conversation SET updated_at = GREATEST(updated_at, $19::double precision)
    WHERE id = $1 AND $19::double precision IS NOT NULL
), e AS (
    INSERT INTO turn_end (conversation_id, run_id, outcome, created_at)
    SELECT $1, $20::text, $21::text, $22::double precision WHERE $20::text IS NOT NULL
    ON CONFLICT DO NOTHING
), r AS (
    INSERT INTO run ({RUN_COLUMNS})
    SELECT $23::text, $24::text, $25::text, $26::text, $27::text, $28::text, $29::int,
           $30::double precision, $31::double precision, $32::text, $33::jsonb
    WHERE $23::text IS NOT NULL
    {UPSERT_RUN[UPSERT_RUN.index(" ON CONFLICT") :]}
)
SELECT a FROM ids
"""
_BIND = (
    "INSERT INTO channel_binding (channel_key, conversation_id, created_at) VALUES ($1, $2, $3)"
    " ON CONFLICT (channel_key) DO UPDATE SET conversation_id = excluded.conversation_id,"
    " created_at = excluded.created_at"
)

#: SQLSTATE classes of a failure that may clear by itself: connection exceptions,
#: transaction rollbacks (serialization, deadlock), insufficient resources, operator
#: intervention (a restart), system errors.
_TRANSIENT_CLASSES = ("08", "40", "53", "57", "58")


def describe_dsn(dsn: str) -> str:
    """``host:port/database`` of a DSN, without its user or password (safe to show)."""
    try:
        parts = urlsplit(dsn)
        host = parts.hostname or "localhost"
        port = parts.port or 5432
    except ValueError:
        return "(an unparsable DSN)"
    if parts.scheme not in ("postgres", "postgresql"):
        return "(a key=value DSN)"
    return f"{host}:{port}{parts.path or '/'}"


async def probe_server(dsn: str, *, connect_timeout: float = 10.0) -> dict[str, Any]:
    """Connect once (no pool, no migration) and report what ``agentik check --probe``
    shows: the server's version, this agentik's schema version in that database (0:
    none yet), the extensions installed there and whether pgvector (``vector``) is
    available to install.  Raises :class:`~agentik.core.errors.StoreError` (never
    quoting the DSN) when it cannot connect."""
    try:
        import asyncpg
    except ImportError as exc:
        raise StoreError(
            "the PostgreSQL store needs asyncpg: install the postgres extra"
            " (pip install -e '.[postgres]' in the agentik checkout)"
        ) from exc
    try:
        conn = await asyncpg.connect(dsn, timeout=connect_timeout)
    except Exception as exc:
        raise StoreError(f"cannot connect to PostgreSQL at {describe_dsn(dsn)}: {exc}") from exc
    try:
        version = await conn.fetchval("SHOW server_version")
        installed = await conn.fetch("SELECT extname, extversion FROM pg_extension ORDER BY 1")
        vector = await conn.fetchval(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
        )
        schema = 0
        if await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
            schema = int(
                await conn.fetchval("SELECT COALESCE(MAX(number), 0) FROM schema_migrations")
            )
    except Exception as exc:
        raise StoreError(f"PostgreSQL at {describe_dsn(dsn)}: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            await conn.close()
    return {
        "version": str(version),
        "schema_version": schema,
        "extensions": {str(r[0]): str(r[1]) for r in installed},
        "pgvector": None if vector is None else str(vector),
    }


async def pending_migrations(
    dsn: str, migrations: tuple[Migration, ...] = MIGRATIONS, *, connect_timeout: float = 10.0
) -> tuple[int, list[Migration]]:
    """Connect once (no pool) and read, without changing anything, the database's schema
    version and the known migrations it lacks (``agentik db migrate --dry-run``)."""
    import asyncpg

    try:
        conn = await asyncpg.connect(dsn, timeout=connect_timeout)
    except Exception as exc:
        raise StoreError(f"cannot connect to PostgreSQL at {describe_dsn(dsn)}: {exc}") from exc
    try:
        current = await schema_version(conn)
        done: set[int] = set()
        if current:
            done = {int(r[0]) for r in await conn.fetch("SELECT number FROM schema_migrations")}
    finally:
        await conn.close()
    return current, sorted((m for m in migrations if m.number not in done), key=lambda m: m.number)


def row_to_message(r: Sequence[Any]) -> Message:
    return Message(
        id=r[0], conversation_id=r[1], kind=r[2], content=r[3], author=r[4], channel=r[5],
        run_id=r[6], tool_call_id=r[7], tool_name=r[8], arguments=r[9], is_error=r[10],
        status=r[11], data=json.loads(r[12]) if r[12] is not None else None, duration=r[13],
        created_at=r[14],
    )  # fmt: skip


def _row_to_conversation(r: Sequence[Any]) -> ConversationRecord:
    return ConversationRecord(
        id=r[0], title=r[1], created_at=r[2], updated_at=r[3], meta=json.loads(r[4])
    )


async def _append(
    conn: asyncpg.Connection,
    cid: str,
    log_rows: Sequence[NewMessage],
    memory: Sequence[ChatMessage],
    updated_at: float | None,
    ended: TurnEnd | None,
) -> list[Message]:
    """One append in one statement (:data:`_APPEND`): one round trip to the server."""
    now = time.time()
    drafts = [m.stored(id=0, conversation_id=cid, now=now) for m in log_rows]
    cols: list[list[Any]] = [[] for _ in range(13)]
    for m in drafts:
        values = (
            m.kind, nul_free(m.content), nul_free(m.author), nul_free(m.channel), m.run_id,
            m.tool_call_id, m.tool_name, nul_free(m.arguments), m.is_error, m.status,
            dumps(m.data), m.duration, m.created_at,
        )  # fmt: skip
        for col, v in zip(cols, values, strict=True):
            col.append(v)
    # A memory entry linked to the k-th row of this append (message_id -k) gets that
    # row's id in the statement itself.
    links = [
        -cm.message_id if cm.message_id is not None and cm.message_id < 0 else 0 for cm in memory
    ]
    run = run_args(ended.run) if ended is not None and ended.run is not None else (None,) * 11
    ids = await conn.fetchval(
        _APPEND,
        cid,
        len(drafts),
        *cols,
        links,
        [None if k else cm.message_id for k, cm in zip(links, memory, strict=True)],
        [nul_free_json(cm.to_json()) for cm in memory],
        updated_at,
        None if ended is None else ended.run_id,
        None if ended is None else ended.outcome,
        now,
        *run,
    )
    return [dataclasses.replace(m, id=int(i)) for m, i in zip(drafts, ids, strict=True)]


async def _insert_conversation(
    conn: asyncpg.Connection, record: ConversationRecord, channel_key: str | None
) -> None:
    await conn.execute(
        "INSERT INTO conversation (id, title, created_at, updated_at, meta)"
        " VALUES ($1, $2, $3, $4, $5)",
        record.id, nul_free(record.title), record.created_at, record.updated_at,
        dumps(record.meta),
    )  # fmt: skip
    if channel_key is not None:
        await conn.execute(_BIND, channel_key, record.id, record.created_at)


#: Take advisory locks (a sorted ``bigint[]``) to the commit, one after another in order.
_LOCK_ALL = "SELECT count(pg_advisory_xact_lock(k)) FROM unnest($1::bigint[]) AS k"


@dataclass(slots=True)
class _Job:
    fn: WriteFn
    future: asyncio.Future[Any]
    conversation_id: str | None = None
    #: ``fn`` runs exactly one statement (atomic alone): committed alone, it needs no
    #: BEGIN and COMMIT round trips of its own.
    single: bool = False
    #: Advisory locks ``fn`` needs held to the commit: the transaction takes every
    #: job's locks first, in one sorted order (see :meth:`PostgresStore._transaction`).
    locks: tuple[int, ...] = ()
    #: Written with ``defer=True``: waits for a write that is not (see ``_write_loop``).
    held: bool = False


@dataclass(slots=True)
class _Failed:
    error: BaseException


def _store_error(exc: BaseException, what: str) -> BaseException:
    """``exc`` as the caller is told it: a database failure as a :class:`StoreError`
    (``retryable`` when a retry may succeed); a refusal the job raised on purpose
    (:class:`StoreRefusal`) as it is."""
    if isinstance(exc, (StoreError, StoreRefusal)):
        return exc
    err = StoreError(f"{what}: {exc}")
    err.__cause__ = exc
    state = getattr(exc, "sqlstate", None)
    err.retryable = _lost(exc) or (isinstance(state, str) and state[:2] in _TRANSIENT_CLASSES)
    return err


def _lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection itself is gone."""
    import asyncpg

    # InternalClientError: the protocol's state was broken by a connection dropped mid-call.
    lost = (
        OSError,
        ConnectionError,
        asyncpg.InterfaceError,
        asyncpg.InternalClientError,
        asyncpg.PostgresConnectionError,
    )
    return isinstance(exc, lost) or (getattr(exc, "sqlstate", None) or "").startswith(("08", "57P"))


class PostgresStore(
    PostgresRedaction,
    PostgresOutbox,
    PostgresWaits,
    PostgresGovernance,
    PostgresRuns,
    PostgresLifecycle,
    PostgresJobs,
    PostgresCluster,
    PostgresSeen,
    PostgresRunEvents,
    PostgresQueue,
    PostgresLinks,
    PostgresWebhooks,
    PostgresAttachments,
    PostgresA2ATasks,
    PostgresCheckpoints,
    PostgresSearch,
    PostgresCopy,
    Store,
):
    """PostgreSQL implementation of :class:`~agentik.core.store.base.Store`.

    ``dsn``: a libpq connection URI or key=value string.  ``pool_min``/``pool_max``:
    the pool's size (one connection is the writer's).  ``max_batch`` bounds how many
    queued writes one transaction takes.  ``defer_max``: seconds a held write
    (``defer=True``) waits at most for a write to carry it (:data:`~.base.DEFER_MAX`).
    """

    #: Several ``agentik run`` processes share one database (issue 32).
    shared = True

    def __init__(
        self,
        dsn: str,
        *,
        pool_min: int = _DEFAULTS.pool_min,
        pool_max: int = _DEFAULTS.pool_max,
        max_batch: int = 512,
        connect_timeout: float = 10.0,
        notify_poll: float = 30.0,
        defer_max: float = DEFER_MAX,
    ) -> None:
        if pool_min < 2 or pool_max < pool_min:
            raise ValueError(f"need 2 <= pool_min <= pool_max, not {pool_min} and {pool_max}")
        self.dsn = dsn
        self.pool_min = pool_min
        self.pool_max = pool_max
        self.max_batch = max_batch
        self.connect_timeout = connect_timeout
        self.defer_max = defer_max
        self._pool: asyncpg.Pool | None = None
        self._conn: asyncpg.Connection | None = None  # the writer's
        self._pending: list[_Job] = []
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._busy = False
        self._urgent = 0  # how many of ``_pending`` are not held (``defer=False``)
        self._due = False  # the held writes in ``_pending`` commit with the next batch
        self._flush_timer: asyncio.TimerHandle | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._started = False
        self._closed = False
        #: Seconds between the notifier's resyncs (``[cluster] poll_seconds``).
        self.notify_poll = notify_poll
        self._notifier: PostgresNotifier | None = None

    def __repr__(self) -> str:
        return f"<PostgresStore {describe_dsn(self.dsn)}>"

    @property
    def started(self) -> bool:
        """Started and not closed yet."""
        return self._started and not self._closed

    def notifier(self) -> PostgresNotifier:
        """``LISTEN``/``NOTIFY`` on this database
        (:class:`~agentik.core.cluster.notify.PostgresNotifier`), one per store."""
        if self._notifier is None:
            from ..cluster.notify import PostgresNotifier

            self._notifier = PostgresNotifier(self, poll_seconds=self.notify_poll)
        return self._notifier

    async def notify(self, channel: str, payloads: Sequence[str]) -> None:
        """``NOTIFY channel`` once per payload, in order, through the pool (outside any
        write's transaction: called after the write committed)."""
        await self._read("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p", channel,
                         list(payloads))  # fmt: skip

    @property
    def where(self) -> str:
        """Where the data lives, safe to show (no user, no password)."""
        return describe_dsn(self.dsn)

    # -- lifecycle -----------------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            return
        try:
            import asyncpg
        except ImportError as exc:
            raise StoreError(
                "the PostgreSQL store needs asyncpg: install the postgres extra"
                " (pip install -e '.[postgres]' in the agentik checkout)"
            ) from exc
        try:
            self._pool = await asyncpg.create_pool(
                self.dsn,
                min_size=self.pool_min,
                max_size=self.pool_max,
                timeout=self.connect_timeout,
            )
            async with self._pool.acquire() as conn:
                await apply_migrations(conn)
            self._conn = await self._pool.acquire()
        except StoreError:
            await self._shutdown()
            raise
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            await self._shutdown()
            raise StoreError(f"cannot open PostgreSQL database {self.where}: {exc}") from exc
        except BaseException:
            await self._shutdown()
            raise
        self._writer = asyncio.create_task(self._write_loop(), name="agentik-postgres-writer")
        self._started = True
        if self._notifier is not None:
            self._notifier.start()  # subscribed before the store started

    async def settle(self) -> None:
        if self._closed or not self._started:
            return
        self._kick()  # a held write commits now
        await self._idle.wait()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._notifier is not None:
            await self._notifier.aclose()
        if self._started:
            self._kick()  # a held write commits now
            await self._idle.wait()  # every write submitted before is committed
        await self._shutdown()

    async def _shutdown(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        if self._pool is not None:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    await self._pool.release(self._conn)
            self._conn = None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pool.close(), 10)
            self._pool = None

    # -- the writer ------------------------------------------------------------------
    def _submit(self, job: _Job, *, defer: bool = False) -> asyncio.Future[Any]:
        if self._closed or not self._started:
            raise ClosedError("the store is closed" if self._closed else "the store is not started")
        self._pending.append(job)
        self._idle.clear()
        if defer:
            # Held for the write that follows (see Store.append): both commit in one
            # transaction.  The timer commits it alone if none comes.
            job.held = True
            self._hold()
            return job.future
        self._urgent += 1
        if not self._busy:
            self._wake.set()  # (busy: the write loop takes it next)
        return job.future

    def _hold(self) -> None:
        """Held writes are pending: the timer commits them if no other write comes."""
        if self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(self.defer_max, self._kick)

    def _kick(self) -> None:
        """Commit held writes now (the deferral timer, settling, closing)."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._pending:
            self._due = True
        self._wake.set()

    async def _write_loop(self) -> None:
        # Held writes alone never make a batch (until they are due), even when they
        # queued behind a commit in flight: they wait for the next write that is not
        # held, and commit with it (as in the SQLite engine).
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending and (self._urgent or self._due):
                if self._flush_timer is not None:
                    self._flush_timer.cancel()
                    self._flush_timer = None
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
                self._urgent -= sum(not job.held for job in batch)
                if not self._pending:
                    self._due = False
                self._busy = True
                try:
                    results = await self._commit(batch)
                except Exception as exc:  # the connection could not be replaced
                    results = [_Failed(exc)] * len(batch)
                finally:
                    self._busy = False
                for job, result in zip(batch, results, strict=True):
                    if job.future.done():
                        continue
                    if isinstance(result, _Failed):
                        job.future.set_exception(
                            _store_error(result.error, "database write failed")
                        )
                    else:
                        job.future.set_result(result)
            if not self._pending:
                self._idle.set()
            else:
                self._hold()  # only held writes are left

    async def _transaction(self, batch: Sequence[_Job]) -> list[Any]:
        """Run ``batch`` in one transaction.  The advisory locks its jobs declare are
        taken first, all of them, in ascending order: two workers' batches holding
        jobs that lock (run events' numbering, budget counters, memory notes) in
        different orders then queue one behind the other instead of deadlocking
        (PostgreSQL would roll one back after its ``deadlock_timeout``, a second's
        stall).  A job may take its own declared lock again (they stack)."""
        conn = await self._writer_conn()
        if len(batch) == 1 and batch[0].single and not batch[0].locks:
            return [await batch[0].fn(conn)]
        locks = sorted({key for job in batch for key in job.locks})
        async with conn.transaction():
            if locks:
                await conn.execute(_LOCK_ALL, locks)
            return [await job.fn(conn) for job in batch]

    async def _commit(self, batch: list[_Job]) -> list[Any]:
        try:
            return await self._transaction(batch)
        except Exception as exc:
            await self._check_writer(exc)
            if len(batch) == 1:
                return [_Failed(exc)]
        # Isolate the failing job: every other one still commits.
        out: list[Any] = []
        for job in batch:
            try:
                out.extend(await self._transaction([job]))
            except Exception as exc:
                await self._check_writer(exc)
                out.append(_Failed(exc))
        return out

    async def _writer_conn(self) -> asyncpg.Connection:
        if self._conn is not None:
            return self._conn
        assert self._pool is not None
        # After a lost connection the pool's idle ones may be dead too (a server
        # restart drops them all): take one that answers.
        for attempt in range(self.pool_max + 1):
            conn = await self._pool.acquire()
            try:
                await conn.execute("SELECT 1")
            except Exception as exc:
                # (A connection found dead may already be back in the pool.)
                with contextlib.suppress(Exception):
                    conn.terminate()
                with contextlib.suppress(Exception):
                    await self._pool.release(conn)
                if not _lost(exc) or attempt == self.pool_max:
                    raise
                continue
            self._conn = conn
            break
        assert self._conn is not None
        return self._conn

    async def _check_writer(self, exc: BaseException) -> None:
        """After a failed write: a lost connection is dropped (the next write takes a new one)."""
        conn = self._conn
        if conn is None or not (_lost(exc) or conn.is_closed()):
            return
        self._conn = None
        log.warning("PostgreSQL %s: the writer's connection was lost (%s)", self.where, exc)
        assert self._pool is not None
        with contextlib.suppress(Exception):
            conn.terminate()
        with contextlib.suppress(Exception):
            await self._pool.release(conn)

    async def _write(
        self,
        fn: WriteFn,
        *,
        conversation_id: str | None = None,
        single: bool = False,
        defer: bool = False,
        locks: tuple[int, ...] = (),
    ) -> Any:
        loop = asyncio.get_running_loop()
        job = _Job(fn, loop.create_future(), conversation_id, single, locks)
        return await self._submit(job, defer=defer)

    async def _append_in(
        self, conn: asyncpg.Connection, cid: str, message: NewMessage, updated_at: float | None
    ) -> Message:
        """One audit-log row written in the caller's transaction (the turn queue's)."""
        [m] = await _append(conn, cid, (message,), (), updated_at, None)
        return m

    async def run_write(self, fn: WriteFn) -> Any:
        """Run ``fn(connection)`` on the writer connection, in its own transaction.

        For components keeping their tables in this database (long-term memory):
        the job is ordered with every other write; ``fn`` must not commit or roll
        back itself; an exception rolls back its changes only."""
        return await self._write(fn)

    async def run_read(self, sql: str, *args: Any) -> list[Any]:
        """Run a read-only query on a connection of the pool (tried again on another
        when the server dropped it); the rows."""
        return await self._read(sql, *args)

    async def _read(self, sql: str, *args: Any) -> list[Any]:
        if self._closed or not self._started:
            raise ClosedError("the store is closed" if self._closed else "the store is not started")
        assert self._pool is not None
        # A read is safe to repeat: one on a connection the server dropped (a restart)
        # is tried again on another, as many times as the pool has connections.
        for attempt in range(self.pool_max + 1):
            try:
                return list(await self._pool.fetch(sql, *args))
            except Exception as exc:
                if _lost(exc) and attempt < self.pool_max:
                    continue
                raise _store_error(exc, "database read failed") from exc
        raise AssertionError("unreachable")

    async def _vacuum(self, *tables: str) -> None:
        """``VACUUM`` the tables (outside a transaction): dead row versions holding text
        that was just replaced or deleted are removed from the tables (best effort)."""
        assert self._pool is not None
        try:
            async with self._pool.acquire() as conn:
                await conn.execute(f"VACUUM {', '.join(tables)}")
        except Exception as exc:
            log.warning("PostgreSQL %s: VACUUM %s failed: %s", self.where, tables, exc)

    # -- conversations ---------------------------------------------------------------
    async def create_conversation(
        self, record: ConversationRecord, *, channel_key: str | None = None
    ) -> None:
        await self._write(
            lambda conn: _insert_conversation(conn, record, channel_key),
            conversation_id=record.id,
        )

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
        # transaction.
        if updated_at is not None and updated_at > record.updated_at:
            record = dataclasses.replace(record, updated_at=updated_at)
        rows, mem = tuple(log), tuple(memory)

        async def fn(conn: asyncpg.Connection) -> list[Message]:
            await _insert_conversation(conn, record, channel_key)
            return await _append(conn, record.id, rows, mem, None, None)

        job = _Job(fn, asyncio.get_running_loop().create_future(), record.id)
        return await self._submit(job, defer=defer)

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        rows = await self._read(
            "SELECT id, title, created_at, updated_at, meta FROM conversation WHERE id = $1",
            conversation_id,
        )
        return _row_to_conversation(rows[0]) if rows else None

    async def list_conversations(
        self, *, limit: int = 50, offset: int = 0
    ) -> list[ConversationRecord]:
        rows = await self._read(
            "SELECT id, title, created_at, updated_at, meta FROM conversation"
            " ORDER BY updated_at DESC, id LIMIT $1 OFFSET $2",
            limit,
            offset,
        )
        return [_row_to_conversation(r) for r in rows]

    async def list_conversations_after(
        self, updated_at: float, conversation_id: str, *, limit: int = 50
    ) -> list[ConversationRecord]:
        # "updated_at <= $1" seeks in conversation_by_update (updated_at DESC, id); the
        # rest drops the ties up to the key. (A row comparison cannot say "DESC, ASC".)
        rows = await self._read(
            "SELECT id, title, created_at, updated_at, meta FROM conversation"
            " WHERE updated_at <= $1 AND (updated_at < $1 OR id > $2)"
            " ORDER BY updated_at DESC, id LIMIT $3",
            updated_at,
            conversation_id,
            limit,
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
        args: list[Any] = []
        for column, value in (
            ("title", nul_free(title)),
            ("updated_at", updated_at),
            ("meta", dumps(meta)),
        ):
            if value is not None:
                args.append(value)
                sets.append(f"{column} = ${len(args)}")
        if not sets:
            return
        args.append(conversation_id)
        sql = f"UPDATE conversation SET {', '.join(sets)} WHERE id = ${len(args)}"

        async def fn(conn: asyncpg.Connection) -> None:
            await conn.execute(sql, *args)

        await self._write(fn, conversation_id=conversation_id, single=True)

    async def delete_conversation(self, conversation_id: str) -> bool:
        async def fn(conn: asyncpg.Connection) -> bool:
            held = [
                r[0]
                for r in await conn.fetch(
                    "SELECT sha256 FROM attachment WHERE conversation_id = $1", conversation_id
                )
            ]
            status = await conn.execute("DELETE FROM conversation WHERE id = $1", conversation_id)
            await conn.execute("DELETE FROM run_event WHERE conversation_id = $1", conversation_id)
            if held:
                # Bytes no other conversation holds go with it.
                await conn.execute(ATTACHMENT_SWEEP, held)
            return bool(status != "DELETE 0")

        return bool(await self._write(fn, conversation_id=conversation_id))

    # -- bindings ----------------------------------------------------------------------
    async def get_binding(self, channel_key: str) -> str | None:
        rows = await self._read(
            "SELECT conversation_id FROM channel_binding WHERE channel_key = $1", channel_key
        )
        return str(rows[0][0]) if rows else None

    async def set_binding(self, channel_key: str, conversation_id: str) -> None:
        async def fn(conn: asyncpg.Connection) -> None:
            await conn.execute(_BIND, channel_key, conversation_id, time.time())

        await self._write(fn, conversation_id=conversation_id, single=True)

    # -- the dual log --------------------------------------------------------------------
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
        rows, mem = tuple(log), tuple(memory)

        async def fn(conn: asyncpg.Connection) -> list[Message]:
            return await _append(conn, conversation_id, rows, mem, updated_at, ended)

        job = _Job(fn, asyncio.get_running_loop().create_future(), conversation_id, single=True)
        return await self._submit(job, defer=defer)

    async def pending_turns(self, *, limit: int = 1000, after: int = 0) -> list[Message]:
        rows = await self._read(
            f"SELECT {MESSAGE_COLUMNS} FROM message m"
            " WHERE m.id > $1 AND m.kind = 'user' AND m.run_id IS NOT NULL AND NOT EXISTS ("
            "  SELECT 1 FROM turn_end t"
            "  WHERE t.conversation_id = m.conversation_id AND t.run_id = m.run_id)"
            # A child run's conversation is not taken up again: its parent's turn is.
            " AND NOT EXISTS (SELECT 1 FROM conversation c WHERE c.id = m.conversation_id"
            "  AND c.meta->>'parent_run_id' IS NOT NULL)"
            " ORDER BY m.id LIMIT $2",
            after,
            limit,
        )
        return [row_to_message(r) for r in rows]

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
        where = ["conversation_id = $1"]
        args: list[Any] = [conversation_id]
        if kinds:
            args.append(list(kinds))
            where.append(f"kind = ANY(${len(args)}::text[])")
        if after is not None:
            args.append(after)
            where.append(f"id > ${len(args)}")
        if before is not None:
            args.append(before)
            where.append(f"id < ${len(args)}")
        cond = " AND ".join(where)
        n = len(args)
        if after is not None or offset is not None:
            sql = (
                f"SELECT {MESSAGE_COLUMNS} FROM message WHERE {cond}"
                f" ORDER BY id LIMIT ${n + 1} OFFSET ${n + 2}"
            )
            rows = await self._read(sql, *args, limit, offset or 0)
        else:
            sql = (
                f"SELECT {MESSAGE_COLUMNS} FROM message WHERE {cond}"
                f" ORDER BY id DESC LIMIT ${n + 1}"
            )
            rows = (await self._read(sql, *args, limit))[::-1]
        return [row_to_message(r) for r in rows]

    async def count_messages(self, conversation_id: str) -> int:
        rows = await self._read(
            "SELECT COUNT(*) FROM message WHERE conversation_id = $1", conversation_id
        )
        return int(rows[0][0])

    async def load_memory(self, conversation_id: str) -> list[MemoryEntry]:
        rows = await self._read(
            "SELECT pos, body FROM working_memory WHERE conversation_id = $1 ORDER BY pos",
            conversation_id,
        )
        return [MemoryEntry(pos=int(r[0]), message=ChatMessage.from_json(r[1])) for r in rows]

    async def rewind(self, conversation_id: str, from_pos: int) -> int:
        async def fn(conn: asyncpg.Connection) -> int:
            done = await conn.execute(
                "DELETE FROM working_memory WHERE conversation_id = $1 AND pos >= $2",
                conversation_id,
                from_pos,
            )
            return int(done.split()[-1])

        removed: int = await self._write(fn, conversation_id=conversation_id)
        return removed

    async def compact(self, conversation_id: str, upto: int, summary: ChatMessage) -> None:
        async def fn(conn: asyncpg.Connection) -> None:
            await conn.execute(
                "DELETE FROM working_memory WHERE conversation_id = $1 AND pos <= $2",
                conversation_id,
                upto,
            )
            await conn.execute(
                "INSERT INTO working_memory (conversation_id, pos, message_id, body)"
                " VALUES ($1, $2, $3, $4)",
                conversation_id,
                upto,
                summary.message_id,
                nul_free_json(summary.to_json()),
            )

        await self._write(fn, conversation_id=conversation_id)
