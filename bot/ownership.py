"""Connection ownership: one worker at a time holds each chat connection.

Several ``agentik run`` processes (workers) on one PostgreSQL database are one
bot.  A connection-type transport (an IRC network, a Slack Socket Mode app:
:attr:`~agentik.transports.base.Transport.exclusive`) is started only by the
worker holding the lease ``conn:<transport name>``
(:class:`~agentik.core.store.repositories.LeaseRepository`); the others keep
it in standby.  The HTTP API and Slack's HTTP mode are served by every worker.

* **The keeper** (one task) beats every ``[cluster] heartbeat_seconds``: it
  records this worker's heartbeat, renews the leases it holds and tries to take
  the free ones.  A renewal refused (another worker owns it now: a stale epoch)
  stops that transport at once; so does a database silent for too long: a timer
  per lease fires ``heartbeat_seconds`` before the lease could expire in the
  database (counted from when the last good renewal was sent), whatever the
  keeper is waiting on, so the old connection is gone before another worker may
  open its own.
* **Takeover**: a worker that takes a lease starts the transport, sends what the
  outbox holds undelivered for it (pieces already delivered were marked so, by
  their protocol ids: not sent again) and resumes the turns left unanswered in
  its channels (:mod:`agentik.bot.recovery`), once: the old owner is gone.
* **Drain** (SIGTERM): the worker says it is draining, takes no lease, stops its
  connections, keeps (and renews) their leases while its turns finish and what
  they wrote is committed, then releases them (:meth:`Ownership.drain`), so
  another worker takes them at its next heartbeat instead of after expiry, and
  finds those turns answered rather than answering them again.

On a store one process keeps (SQLite, memory) the same code runs on leases kept
in this process (:class:`~agentik.core.store.memory_cluster.MemoryCluster`):
granted at once and held while the process runs, so no keeper beats (an idle
bot does no periodic work for it).  docs/operations.md, "Running several workers".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from agentik.core.cluster import (
    CONNECTION_PREFIX,
    ClusterSettings,
    connection_lease,
    new_worker_id,
)
from agentik.core.store.memory_cluster import MemoryCluster
from agentik.core.store.records import Lease, WorkerBeat, WorkerInfo

from .logs import STATUS_LOGGER, log_event

if TYPE_CHECKING:
    from agentik.core import Agent
    from agentik.core.health import HealthRegistry
    from agentik.transports.base import Transport

    from .bridge import Bridge
    from .metrics import Metrics

__all__ = ["Ownership", "OwnershipHost"]

log = logging.getLogger(__name__)
status_log = logging.getLogger(STATUS_LOGGER)

_T = TypeVar("_T")

#: Workers silent for longer than this (seconds) leave the registry.
FORGET_AFTER = 3600.0


class _LocalCluster(MemoryCluster):
    """Leases and heartbeats in this process: a store one process keeps."""


class OwnershipHost(Protocol):
    """What ownership uses of the bot (:class:`~agentik.bot.app.Bot` is one)."""

    agent: Agent
    bridge: Bridge
    health: HealthRegistry
    metrics: Metrics
    #: Transport instances by name (a restart or a reload replaces one).
    transports: dict[str, Transport]

    @property
    def started(self) -> tuple[Transport, ...]: ...

    def serving(self, name: str) -> Transport | None:
        """The instance the supervision of ``name`` serves now."""
        ...

    def start_failed(self, name: str) -> bool:
        """Whether ``name`` could not start with the bot (its supervision retries)."""
        ...

    async def start_supervised(self, transport: Transport) -> None:
        """Start ``transport``; a failure is left to its supervision (logged, retried)."""
        ...

    async def replace_stopped(self, name: str) -> Transport:
        """Stop ``name``'s instance and put a fresh one, attached, in its place."""
        ...


class Ownership:
    """This worker's identity, heartbeat and connection leases (see the module doc)."""

    def __init__(self, bot: OwnershipHost, settings: ClusterSettings) -> None:
        self.bot = bot
        self.settings = settings
        store = bot.agent.store
        #: Whether the leases are the database's (several workers), not this process's.
        self.shared = bool(getattr(store, "shared", False)) and "leases" in store.capabilities
        self.repo: Any = store if self.shared else _LocalCluster()
        #: This worker's id (``host:pid:suffix``, or ``[cluster] worker_name:suffix``).
        self.worker = new_worker_id(settings.worker_name)
        try:
            ours = version("agentik")
        except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
            ours = ""
        self.info = WorkerInfo(host=socket.gethostname(), pid=os.getpid(),
                               started_at=time.time(), version=ours)  # fmt: skip
        #: Set at the start of a stop: no lease is taken any more.
        self.draining = False
        self._held: dict[str, Lease] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._given_up: set[str] = set()
        self._keeper: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Future[None]] = set()
        #: Instances in standby learning what their channel keys need (Slack: its team).
        self._identifying: set[asyncio.Future[None]] = set()
        self._workers: list[WorkerBeat] = []
        self._leases: list[Lease] = []
        self._seen_at = 0.0
        self._forgot_at = 0.0
        self._warned = False
        #: Whether no other live worker was seen at start (then this one takes up what a
        #: crash left unanswered on the connections nobody owns: the HTTP API).
        self.sole = True

    # -- what the bot asks ---------------------------------------------------------------
    @property
    def ttl(self) -> float:
        return self.settings.lease_seconds

    @property
    def beat(self) -> float:
        return self.settings.heartbeat_seconds

    def exclusive(self, transport: Transport) -> bool:
        """Whether ``transport``'s connection is owned by one worker at a time."""
        return bool(getattr(transport, "exclusive", False))

    def holds(self, name: str) -> bool:
        """Whether this worker holds transport ``name``'s connection lease."""
        return name in self._held

    def serves(self, transport: Transport | None) -> bool:
        """Whether this worker serves ``transport`` now: it is not exclusive, or it
        holds its lease."""
        return transport is not None and (
            not self.exclusive(transport) or self.holds(transport.name)
        )

    def recovers(self, transport: Transport | None) -> bool:
        """Whether this worker, starting, takes up what a crash left on ``transport``:
        a connection it holds; one nobody owns (the HTTP API) only when no other
        worker is alive (one that is may be running those turns now)."""
        if transport is None:
            return False
        if self.exclusive(transport):
            return self.holds(transport.name)
        return not self.shared or self.sole

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """The first heartbeat and a first try at every connection lease (so a worker
        alone starts its connections at once), then the keeper."""
        await self._call(self.repo.worker_beat(self.worker, self.info))
        if self.shared:
            # A draining worker still runs turns: it counts; an unknown answer too.
            beats = await self._call(self.repo.workers())
            self.sole = beats is not None and not any(
                b.worker != self.worker and b.age < self.ttl for b in beats
            )
        await self._round(beat=False)
        self.bot.metrics.worker(self.worker)
        if self.shared:  # (leases kept in this process need no renewal: no one else asks)
            self._keeper = asyncio.create_task(self._keep(), name="agentik-cluster-keeper")
        log_event(
            self._log, logging.INFO, "worker", "worker %s%s: connections %s",
            self.worker, "" if self.shared else " (one process: leases kept in it)",
            ", ".join(self._owned_names()) or "none",
            worker=self.worker, shared=self.shared, owned=self._owned_names(),
        )  # fmt: skip

    async def drain(self) -> None:
        """Stop taking leases; say so; release every lease held (call once the
        connections are stopped)."""
        self.draining = True
        self.info = WorkerInfo(host=self.info.host, pid=self.info.pid,
                               started_at=self.info.started_at, version=self.info.version,
                               draining=True)  # fmt: skip
        await self._call(self.repo.worker_beat(self.worker, self.info))
        for name in list(self._held):
            await self._release(name)
        if self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop the keeper and release what is still held."""
        self.draining = True
        for task in list(self._identifying):
            task.cancel()
        if self._identifying:
            await asyncio.gather(*self._identifying, return_exceptions=True)
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        for name in list(self._held):
            await self._release(name)
        if self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)

    # -- the keeper ----------------------------------------------------------------------
    @property
    def _log(self) -> logging.Logger:
        """Lease changes are shown at the default log level when workers share a
        database; a process on its own logs them at INFO."""
        return status_log if self.shared else log

    def _owned_names(self) -> list[str]:
        return sorted(self._held)

    def _candidates(self) -> list[str]:
        return [n for n, t in self.bot.transports.items() if self.exclusive(t)]

    async def _call(self, aw: Awaitable[_T]) -> _T | None:
        """One store call, bounded by a heartbeat: ``None`` when it failed or took too
        long (logged once until a call works again)."""
        try:
            async with asyncio.timeout(max(self.beat, 0.5)):
                result = await aw
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not self._warned:
                self._warned = True
                log.warning("cluster: a call to the store failed or took too long: %s",
                            str(exc) or type(exc).__name__)  # fmt: skip
            return None
        if self._warned:
            self._warned = False
            log.warning("cluster: the store answers again")
        return result

    async def _keep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("cluster: a heartbeat failed")
            await asyncio.sleep(max(0.0, self.beat - (loop.time() - started)))

    async def _round(self, *, beat: bool = True) -> None:
        """One heartbeat: beat, renew what is held, try what is free, refresh the view."""
        if beat:
            await self._call(self.repo.worker_beat(self.worker, self.info))
        for name in self._candidates():
            held = self._held.get(name)
            sent = time.monotonic()
            if held is not None:
                ok = await self._call(self.repo.lease_renew(connection_lease(name), self.worker,
                                                            held.epoch, self.ttl))  # fmt: skip
                if ok and name in self._held:  # (not stopped meanwhile by its timer)
                    self._arm(name, sent)
                elif ok is False and name in self._held:
                    self._lose(name, f"lease lost (epoch {held.epoch} is stale)")
            elif name not in self._given_up:
                await self.claim(name)
        await self._refresh()

    async def claim(self, name: str) -> bool:
        """Whether this worker holds transport ``name``'s lease, trying to take it
        when it does not (never while draining)."""
        if name in self._held:
            return True
        if self.draining:
            return False
        sent = time.monotonic()
        got = await self._call(self.repo.lease_acquire(connection_lease(name), self.worker,
                                                       self.ttl))  # fmt: skip
        if got is None or self.draining or name in self._held:
            return name in self._held
        self._held[name] = got
        self._given_up.discard(name)
        self._arm(name, sent)
        self._signal(name)
        self.bot.metrics.connection_owned(name, True)
        log_event(
            self._log, logging.INFO, "lease", "worker %s owns %s (epoch %d)",
            self.worker, name, got.epoch, worker=self.worker, transport=name, epoch=got.epoch,
        )  # fmt: skip
        return True

    async def _refresh(self) -> None:
        workers = await self._call(self.repo.workers())
        leases = await self._call(self.repo.leases(CONNECTION_PREFIX))
        if workers is not None and leases is not None:
            self._workers, self._leases, self._seen_at = workers, leases, time.time()
        for name in self._candidates():
            self.bot.metrics.connection_owned(name, self.holds(name))
        if self.shared and workers is not None and time.time() - self._forgot_at > 60:
            self._forgot_at = time.time()
            await self._call(self.repo.workers_forget(FORGET_AFTER))

    def _arm(self, name: str, sent: float) -> None:
        """(Re)set the timer that stops ``name`` before its lease can expire (leases
        kept in this process cannot: no other worker could take them)."""
        old = self._timers.pop(name, None)
        if old is not None:
            old.cancel()
        if not self.shared:
            return
        loop = asyncio.get_running_loop()
        # The database set the expiry to (its now) + ttl, its now being after ``sent``.
        deadline = sent + self.ttl - self.beat
        self._timers[name] = loop.call_at(
            loop.time() + (deadline - time.monotonic()),
            self._lose, name, "the store did not renew the lease in time",
        )  # fmt: skip

    def _lose(self, name: str, why: str) -> None:
        lease = self._held.pop(name, None)
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        if lease is None:
            return
        log.warning("worker %s: %s: %s; stopping it", self.worker, name, why)
        self.bot.metrics.connection_owned(name, False)
        self._signal(name)

    def _signal(self, name: str) -> None:
        event = self._changed.pop(name, None)
        if event is not None:
            event.set()

    async def _wait(self, name: str) -> None:
        """Until ``name``'s lease is taken or lost."""
        await self._changed.setdefault(name, asyncio.Event()).wait()

    async def _release(self, name: str) -> None:
        lease = self._held.pop(name, None)
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        if lease is None:
            return
        self.bot.metrics.connection_owned(name, False)
        # Shielded, and awaited by drain(): a stop that cancels the task releasing it
        # (the supervisor's) still hands the lease over before the process exits.
        task = asyncio.ensure_future(self._let_go(name, lease))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)
        await asyncio.shield(task)

    async def _let_go(self, name: str, lease: Lease) -> None:
        done = await self._call(self.repo.lease_release(connection_lease(name), self.worker,
                                                        lease.epoch))  # fmt: skip
        log_event(
            self._log, logging.INFO, "lease", "worker %s released %s (epoch %d)%s",
            self.worker, name, lease.epoch, "" if done else " (not acknowledged)",
            worker=self.worker, transport=name, epoch=lease.epoch,
        )  # fmt: skip

    # -- serving an owned connection -------------------------------------------------------
    async def supervise(self, name: str, serve: Callable[[str], Awaitable[None]]) -> None:
        """Serve transport ``name`` (with ``serve``: the bot's supervision) while this
        worker holds its lease; in standby while it does not."""
        bot = self.bot
        while True:
            while not self.holds(name):
                await self._wait(name)
            transport = bot.transports[name]
            if transport not in bot.started and not bot.start_failed(name):
                await self._take_over(name, transport)
            serving = asyncio.ensure_future(serve(name))
            lost = asyncio.ensure_future(self._lost(name))
            try:
                await asyncio.wait({serving, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ended = serving.done()
                lost.cancel()
                if not ended:
                    serving.cancel()
                await asyncio.gather(serving, lost, return_exceptions=True)
            if ended:
                if bot.transports.get(name) is not bot.serving(name):
                    # A reload replaced or removed the instance: the new one's supervisor
                    # carries on under the same lease (a removed one's expires).
                    serving.result()
                    return
                if not self.draining:
                    # The connection ended on its own or failed for good: let another try.
                    self._given_up.add(name)
                    await self._release(name)
                # Stopping (the goodbye ended it): the lease stays ours until the turns
                # are done and what they wrote is committed; drain() releases it then.
                serving.result()
                return
            await self._standby(name)

    async def _lost(self, name: str) -> None:
        while self.holds(name):
            await self._wait(name)

    async def _take_over(self, name: str, transport: Transport) -> None:
        """Start ``name`` on this worker; then what its last owner left: undelivered
        pieces, unanswered messages."""
        bot = self.bot
        began = time.time()  # what is said on it from now on is this worker's
        await bot.start_supervised(transport)
        if transport not in bot.started:
            return  # its supervision retries (the start error is recorded)
        bridge = bot.bridge
        sent = await bridge.redeliver(transports={name})
        counts = await bridge.resume_pending(
            only=lambda key: bridge.transport_for(key) is transport, before=began
        )
        # Its linked channels follow the turns other workers run from now on (one
        # running now shows whole at its end: its last owner may have sent part of it).
        await bridge.links.served()
        log_event(
            self._log, logging.INFO, "takeover",
            "worker %s took over %s: %d piece(s) redelivered, %d message(s) resumed",
            self.worker, name, sent, counts.get("answer", 0) + counts.get("note", 0),
            worker=self.worker, transport=name,
        )  # fmt: skip

    async def _standby(self, name: str) -> None:
        """The lease is lost: the connection stops now; a fresh instance waits."""
        self.standby(await self.bot.replace_stopped(name))

    def standby(self, transport: Transport) -> None:
        """``transport`` waits for its lease: not a component of this worker's health
        (``/ready`` does not wait for it; ``/health``'s ``cluster`` shows its owner);
        ``stopped`` in its metrics."""
        self.bot.health.forget(f"transport:{transport.name}")
        self.bot.metrics.transport_state(transport.name, "stopped")
        if self.shared:
            # So this worker can tell which instance a channel key is for while another
            # owns it (a copy or an answer written for it: several Slack apps).
            task = asyncio.ensure_future(self._identify(transport))
            self._identifying.add(task)
            task.add_done_callback(self._identifying.discard)

    async def _identify(self, transport: Transport) -> None:
        try:
            await transport.identify()
        except Exception as exc:  # it only delays copies for it until it is identified
            log.warning("transport %s in standby could not learn its channels' keys: %s",
                        transport.name, exc)  # fmt: skip

    # -- what /health shows ----------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        """The ``cluster`` section of ``/health`` and ``/status``: this worker, the
        workers and the connection leases as last read (``as_of``: when).  One
        process on its own store: itself, and the leases it keeps (no expiry)."""
        if not self.shared:
            return {
                "worker": self.worker, "shared": False, "draining": self.draining,
                "owns": self._owned_names(), "as_of": None,
                "workers": [{"id": self.worker, "host": self.info.host, "pid": self.info.pid,
                             "version": self.info.version, "draining": self.draining,
                             "last_beat_age": 0.0, "alive": True}],
                "connections": {
                    name: {"owner": self.worker, "last_owner": self.worker,
                           "epoch": lease.epoch, "expires_in": None}
                    for name, lease in sorted(self._held.items())
                },
            }  # fmt: skip
        age = time.time() - self._seen_at if self._seen_at else None
        return {
            "worker": self.worker,
            "shared": self.shared,
            "draining": self.draining,
            "owns": self._owned_names(),
            "as_of": self._seen_at or None,
            "workers": [
                {
                    "id": w.worker, "host": w.info.host, "pid": w.info.pid,
                    "version": w.info.version, "draining": w.info.draining,
                    "last_beat_age": round(w.age + (age or 0.0), 3),
                    "alive": w.age + (age or 0.0) < self.ttl,
                }
                for w in self._workers
            ],
            "connections": {
                lease.name[len(CONNECTION_PREFIX):]: {
                    "owner": lease.owner if lease.held else None,
                    "last_owner": lease.owner, "epoch": lease.epoch,
                    "expires_in": round(max(0.0, lease.expires_in - (age or 0.0)), 3),
                }
                for lease in self._leases
            },
        }  # fmt: skip
