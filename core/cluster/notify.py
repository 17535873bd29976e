"""Notifications between the processes sharing one database: they signal, they don't carry.

A change written through a store is announced on a *topic* with the *ids* of what
changed (a channel key, an identity): never the data.  A subscriber re-reads the
rows it cares about.  Three rules (issue 32):

* **After the commit.**  :meth:`Notifier.publish` is called once the write returned
  (committed), never inside its transaction: under many writers a ``NOTIFY`` inside
  each transaction serialises every commit on the server's notification queue.  A
  write rolled back publishes nothing.
* **Ids only.**  PostgreSQL's payload limit (8000 bytes) is kept by splitting ids
  over several notifications (:data:`PAYLOAD_MAX`); an id too long for one is sent
  as a *resync* of its topic.
* **A lost notification only delays.**  Every subscriber also receives a *resync*
  (:attr:`Notice.resync`: re-read everything, or drop every cached entry) every
  ``poll_seconds``, and at once after the listening connection was lost and
  reconnected.  Code that follows a topic handles both and never depends on a
  notification arriving.

Subscribing is a callback registry: :meth:`Notifier.subscribe` takes
``callback(notice)``, a function or a coroutine function (run as a task the notifier
owns), and returns a :class:`Subscription` to ``close()``.  A process receives its
own notifications too (:attr:`Notice.local` tells them apart, where deduplicating
matters; the caches of :mod:`agentik.core.access` and :mod:`agentik.bot.chansettings`
do not bother: re-reading is cheap and idempotent).

The store decides which notifier it has (:meth:`Store.notifier
<agentik.core.store.base.Store.notifier>`): :class:`LocalNotifier` delivers within
the process (SQLite, the in-memory store: one process per database), and
:class:`PostgresNotifier` uses ``LISTEN``/``NOTIFY`` on channels ``agentik_<topic>``:
one dedicated connection listens (not one of the pool's: a pooled connection goes
back to the pool and stops listening), ``NOTIFY`` goes through the pool.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import inspect
import json
import logging
import random
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncpg

__all__ = [
    "PAYLOAD_MAX",
    "POLL_SECONDS",
    "Callback",
    "LocalNotifier",
    "Notice",
    "Notifier",
    "PostgresDatabase",
    "PostgresNotifier",
    "Subscription",
    "channel_name",
    "payloads",
]

log = logging.getLogger(__name__)

#: Bytes of one notification's payload at most (PostgreSQL refuses 8000 and more).
PAYLOAD_MAX = 7900
_TOPIC = re.compile(r"[a-z][a-z0-9_]{0,40}\Z")


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


_PREFIX = "agentik_"


#: Seconds between two resyncs of every subscriber, by default (the polling fallback:
#: a lost notification delays a change by this much at most).  The configuration's
#: ``[cluster] poll_seconds`` (the store takes it: ``PostgresStore(notify_poll=...)``).
POLL_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Notice:
    """What a subscriber receives: ``ids`` of what changed on ``topic``; or, with
    ``resync``, no ids: anything may have changed (re-read, or drop every entry)."""

    topic: str
    ids: tuple[str, ...] = ()
    resync: bool = False
    #: Published through this same notifier (this process's own change).
    local: bool = False


Callback = Callable[[Notice], Awaitable[None] | None]


def channel_name(topic: str) -> str:
    """The PostgreSQL channel of ``topic`` (``agentik_<topic>``); ``ValueError`` for a
    topic that is not a short lowercase identifier."""
    if not _TOPIC.match(topic):
        raise ValueError(f"a topic is a short lowercase identifier, not {topic!r}")
    return _PREFIX + topic


def payloads(origin: str, ids: tuple[str, ...], limit: int = PAYLOAD_MAX) -> list[str]:
    """The notifications' payloads carrying ``ids`` (JSON, each at most ``limit`` bytes
    in UTF-8): as few as fit; no ids, or an id too long for one, is a resync."""
    whole = _dumps({"o": origin, "all": True})
    if not ids:
        return [whole]
    out: list[str] = []
    batch: list[str] = []
    size = len(_dumps({"o": origin, "i": []}).encode())
    for one in ids:
        cost = len(_dumps(one).encode()) + 1  # the comma
        if size + cost > limit:
            if not batch:  # this id alone does not fit: everything may have changed
                return [whole]
            out.append(_dumps({"o": origin, "i": batch}))
            batch, size = [], len(_dumps({"o": origin, "i": []}).encode())
            if size + cost > limit:
                return [whole]
        batch.append(one)
        size += cost
    out.append(_dumps({"o": origin, "i": batch}))
    return out


class Subscription:
    """One callback following one topic; :meth:`close` stops it."""

    __slots__ = ("callback", "notifier", "topic")

    def __init__(self, notifier: Notifier, topic: str, callback: Callback) -> None:
        self.notifier = notifier
        self.topic = topic
        self.callback = callback

    def close(self) -> None:
        self.notifier._unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Notifier(abc.ABC):
    """Publish ids on a topic; subscribe a callback to a topic (see the module's doc)."""

    def __init__(self) -> None:
        self._subs: dict[str, list[Subscription]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: This notifier's own name, in its payloads (:attr:`Notice.local`).
        self.origin = uuid.uuid4().hex[:12]

    def subscribe(self, topic: str, callback: Callback) -> Subscription:
        """Call ``callback(notice)`` for every notice of ``topic`` until ``close()``."""
        channel_name(topic)
        sub = Subscription(self, topic, callback)
        self._subs.setdefault(topic, []).append(sub)
        self._subscribed(topic)
        return sub

    def _subscribed(self, topic: str) -> None:  # noqa: B027 - optional hook
        """A subscription to ``topic`` was added (an engine starts listening)."""

    def _unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.topic, [])
        with contextlib.suppress(ValueError):
            subs.remove(sub)
        if not subs:
            self._subs.pop(sub.topic, None)

    @property
    def topics(self) -> frozenset[str]:
        """The topics with at least one subscriber."""
        return frozenset(self._subs)

    @abc.abstractmethod
    async def publish(self, topic: str, *ids: str) -> None:
        """Announce that the rows named by ``ids`` changed on ``topic`` (no ids: anything
        may have; subscribers resync).  Call it after the write committed.  It never
        raises for a notification it could not send (the polling fallback covers it)."""

    async def listening(self) -> None:  # noqa: B027 - optional hook
        """Return once notifications of every subscribed topic are received (an engine
        that listens over a connection: once it does)."""

    def resync(self, topic: str | None = None) -> None:
        """Deliver a resync to the subscribers of ``topic`` (``None``: of every topic)."""
        for t in [topic] if topic is not None else list(self._subs):
            self._deliver(Notice(t, (), resync=True))

    def _deliver(self, notice: Notice) -> None:
        for sub in list(self._subs.get(notice.topic, ())):
            try:
                result = sub.callback(notice)
            except Exception:
                log.exception("a subscriber of %r failed", notice.topic)
                continue
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(self._guarded(notice.topic, result))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _guarded(topic: str, result: Awaitable[None]) -> None:
        try:
            await result
        except Exception:
            log.exception("a subscriber of %r failed", topic)

    async def settled(self) -> None:
        """Wait until the callbacks' tasks started so far have finished."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        """Stop delivering: the callbacks' tasks still running are cancelled."""
        self._subs.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class LocalNotifier(Notifier):
    """Delivery within the process, at once: for a database one process uses."""

    async def publish(self, topic: str, *ids: str) -> None:
        channel_name(topic)
        self._deliver(Notice(topic, tuple(ids), resync=not ids, local=True))


class PostgresDatabase(Protocol):
    """What :class:`PostgresNotifier` needs of its store
    (:class:`~agentik.core.store.postgres.PostgresStore` is it)."""

    dsn: str
    connect_timeout: float

    @property
    def where(self) -> str: ...

    @property
    def started(self) -> bool: ...

    async def notify(self, channel: str, payloads: Sequence[str]) -> None: ...


class PostgresNotifier(Notifier):
    """``LISTEN``/``NOTIFY`` on a :class:`~agentik.core.store.postgres.PostgresStore`'s
    database (see the module's doc).

    One connection of its own listens, opened when the first topic is subscribed
    (and the store started); lost, it is opened again with backoff (0.1 s doubling
    to 5 s, with jitter) and every subscriber gets a resync.  Every ``poll_seconds``
    every subscriber gets a resync too.
    """

    def __init__(self, store: PostgresDatabase, *, poll_seconds: float = POLL_SECONDS):
        super().__init__()
        self.store = store
        self.poll_seconds = poll_seconds
        self._task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None
        self._listening: set[str] = set()
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._ready = asyncio.Event()
        self._closed = False
        #: How many times the listening connection was opened (tests, status).
        self.connections = 0

    def __repr__(self) -> str:
        return f"<PostgresNotifier {self.store.where} topics={sorted(self.topics)}>"

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        """Listen from now on, if anything is subscribed (the store calls it once started)."""
        if self._closed or self._task is not None or not self._subs:
            return
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="agentik-postgres-listen"
        )

    def _subscribed(self, topic: str) -> None:
        self._ready.clear()
        self._changed.set()
        if self.store.started:
            with contextlib.suppress(RuntimeError):  # no running loop: the store starts it
                self.start()

    async def listening(self) -> None:
        while not (self._ready.is_set() and self.topics <= self._listening):
            if self._closed or not self.topics:
                return
            self._ready.clear()
            await self._ready.wait()

    async def aclose(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await super().aclose()

    # -- publishing ---------------------------------------------------------------------
    async def publish(self, topic: str, *ids: str) -> None:
        channel = channel_name(topic)
        try:
            await self.store.notify(channel, payloads(self.origin, tuple(ids)))
        except Exception as exc:  # the polling fallback delivers it late
            log.warning("PostgreSQL %s: NOTIFY %s failed: %s", self.store.where, channel, exc)

    # -- listening ----------------------------------------------------------------------
    def _received(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        topic = channel.removeprefix(_PREFIX)
        try:
            body = json.loads(payload)
            ids = tuple(str(i) for i in body.get("i", ()))
            resync = bool(body.get("all")) or not ids
            local = body.get("o") == self.origin
        except (ValueError, AttributeError, TypeError):
            ids, resync, local = (), True, False  # not ours to read: re-read everything
        self._deliver(Notice(topic, ids, resync=resync, local=local))

    async def _listen_new(self, conn: asyncpg.Connection) -> None:
        async with self._lock:
            for topic in sorted(self.topics - self._listening):
                await conn.add_listener(channel_name(topic), self._received)
                self._listening.add(topic)

    async def _run(self) -> None:
        import asyncpg

        delay = 0.1
        missed = False  # a connection was lost, or could not be opened: resync once back
        while not self._closed:
            try:
                conn = await asyncpg.connect(self.store.dsn, timeout=self.store.connect_timeout)
            except Exception as exc:
                log.warning(
                    "PostgreSQL %s: cannot open the listening connection (%s); again in %.1fs",
                    self.store.where, exc, delay,
                )  # fmt: skip
                missed = True
                await asyncio.sleep(delay * (1 + random.random() / 2))
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.1
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _c, lost=lost: lost.set())
            self._conn = conn
            self.connections += 1
            try:
                await self._listen_new(conn)
                if missed:
                    # Whatever was notified while nobody listened is lost: re-read.
                    log.info("PostgreSQL %s: listening again; resync", self.store.where)
                    self.resync()
                missed = True  # from now on, losing this connection misses notifications
                await self._listen(conn, lost)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("PostgreSQL %s: the listening connection failed: %s",
                            self.store.where, exc)  # fmt: skip
            finally:
                self._conn = None
                self._listening.clear()
                self._ready.clear()
                with contextlib.suppress(Exception):
                    conn.terminate()

    async def _listen(self, conn: asyncpg.Connection, lost: asyncio.Event) -> None:
        """Listen until the connection is lost: new topics as they are subscribed, a
        resync every ``poll_seconds``."""
        loop = asyncio.get_running_loop()
        due = loop.time() + self.poll_seconds
        while not lost.is_set() and not conn.is_closed():
            if self.topics - self._listening:
                await self._listen_new(conn)
            self._ready.set()
            self._changed.clear()
            waits = [
                asyncio.ensure_future(lost.wait()),
                asyncio.ensure_future(self._changed.wait()),
            ]
            try:
                await asyncio.wait(waits, timeout=max(0.0, due - loop.time()),
                                   return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            finally:
                for w in waits:
                    w.cancel()
            if loop.time() >= due:
                due = loop.time() + self.poll_seconds
                if not conn.is_closed():
                    self.resync()  # the polling fallback
