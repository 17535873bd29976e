"""The running bot: configuration → plugins → agent → bridge → transports."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from .gcpause import collector_paused

# Their objects live as long as the process: no collection while they load (see there);
# their dataclasses' methods are compiled once, not at every start (core.dataclasscode).
with collector_paused(freeze=True):
    from agentik.core.dataclasscode import dataclass_code_cached as _dataclass_code_cached

    with _dataclass_code_cached():
        from agentik.core import Agent, AgentikError, ConfigError
        from agentik.core.budgets import Budgets
        from agentik.core.health import Health, status_of, watch_model, without_reasons
        from agentik.core.plugins import Registry
        from agentik.transports.base import Transport, TransportFailed

        from .bridge import Bridge, options_from
        from .builder import AgentBuilder, wire_transport
        from .config import Config, TransportSection, load_config
        from .health import HealthServer, load_token, sd_notify
        from .logs import STATUS_LOGGER, log_event
        from .metrics import Metrics
        from .ownership import Ownership
        from .parts import access_policy, load_registry, make_transport
        from .reload import prepare
        from .webhooks import Webhooks

if TYPE_CHECKING:  # imported when workers share a database (Bot.start)
    from agentik.core.cluster.conversations import TurnQueue

__all__ = ["Bot", "load_registry"]

log = logging.getLogger(__name__)
#: Lines shown at the default log level (see :data:`agentik.bot.logs.STATUS_LOGGER`).
status_log = logging.getLogger(STATUS_LOGGER)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a bot imports and builds its parts;
    the first time in a process, then move what exists to the collector's permanent
    generation (:func:`gc.freeze`).

    Importing a large package (the openai SDK, uvicorn) creates tens of thousands of
    long-lived objects (modules, classes, pydantic schemas), and every few thousand
    allocations the collector walks the objects it tracks looking for cycles: during
    a build those walks cost as much CPU as a third of the build itself (a full
    collection of the ~110,000 objects took 30-70 ms), and each full collection
    while the bot runs walked them all again.  Frozen, they are never walked (nor
    written to, which keeps a forked process's pages shared); what is created later is
    collected as before.  Only the first build freezes: the objects of the imports
    live as long as the process, and a cycle that was garbage then (a build leaves
    some hundred objects) stays frozen with them, once.  Restored on the way out as it
    was (a caller that disabled the collector keeps it so).
    """
    global _frozen
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if not _frozen:
            _frozen = True
            gc.freeze()
        gc.enable()


#: Whether a build has frozen the objects of the imports (see :func:`_collector_paused`).
_frozen = False


class Bot:
    """An agent with its transports.  ``async with Bot(config) as bot: await bot.serve()``."""

    def __init__(
        self,
        config: Config,
        *,
        registry: Registry | None = None,
        only: list[str] | None = None,
        transports: dict[str, Transport] | None = None,
    ) -> None:
        self.config = config
        with _collector_paused(), _dataclass_code_cached():  # plugins, the LLM client: see there
            self.registry = registry or load_registry(config)
            self.agent: Agent = AgentBuilder.from_config(config, self.registry).build()
        budgets = config.budgets
        self.bridge = Bridge(
            self.agent,
            resume=config.agent.resume,
            resume_max_age=config.agent.resume_max_age,
            access=access_policy(config),
            budgets=Budgets(budgets, self.agent.store) if budgets.enabled else None,
            channel_settings=config.channels,
            settings_role=config.agent.settings_role,
            announce=config.memory.announce,
            links=config.links,
        )
        # One comparison of roles everywhere: approvals' approvers use the policy's.
        self.agent.approvals.at_least = self.bridge.access.at_least
        #: Prometheus metrics (``GET /metrics`` on the HTTP transport; ``metrics.render()``).
        self.metrics = Metrics(self.agent)
        self.bridge.metrics = self.metrics
        if self.bridge.budgets is not None:
            self.bridge.budgets.on_refusal = self.metrics.budget_refused
        #: States of transports, MCP servers and the model (``/health``, ``/ready``).
        self.health = self.agent.health
        self.health.grace = config.health.ready_grace
        self.transports: dict[str, Transport] = dict(transports or {})
        #: Transport types this bot runs (``agentik chat``: only the terminal); None: all.
        self.only = only
        #: The ``[transports.<name>]`` section of each transport made from the
        #: configuration (a reload compares them with the new file's).
        self.sections: dict[str, TransportSection] = {}
        sections = {n: s for n, s in config.transports.items() if s.enabled}
        for name, section in sections.items():
            if only is not None and section.type not in only:
                continue
            if name not in self.transports:
                self.transports[name] = make_transport(self.registry, name, section, config.source)
                self.sections[name] = section
        for transport in self.transports.values():
            self._attach(transport)
        self._started: list[Transport] = []
        # The instance each supervisor task serves (a reload or a restart replaces it).
        self._serving: dict[str, Transport] = {}
        # Set when the set of transports changed (a reload): serve() follows.
        self._transports_changed = asyncio.Event()
        # Set by SIGHUP: serve() reloads the configuration file.
        self._hup = asyncio.Event()
        self._hup_installed = False
        self.listener: HealthServer | None = None
        self._watchers: list[asyncio.Task[None]] = []
        self._notified_ready = False
        self._unsubscribe: Callable[[], None] | None = None
        self._stopping = False
        # When the stop must be over (loop time; set when it begins) and the step it is
        # at (what bot/stopguard.py names if it never ends).
        self._stop_deadline: float | None = None
        self.closing_at = ""
        #: Set to make :meth:`serve` stop (its SIGTERM handler does; ``agentik run``
        #: installs one before the transports start, so a stop asked for while they
        #: connect is carried out in order once they are, or cut short, as it must).
        self.stop_requested = asyncio.Event()
        # Transports that have been ready at least once (the ready line says "again" after).
        self._ready_once: set[str] = set()
        # Transports whose start failed when the bot started: their supervisor's first failure.
        self._start_errors: dict[str, BaseException] = {}
        #: Which connections this worker owns (one at a time across workers sharing a
        #: PostgreSQL database: :mod:`agentik.bot.ownership`).
        self.ownership = Ownership(self, config.cluster)
        if self.ownership.shared:
            # A relayed copy for a connection another worker owns goes through the
            # outbox to that worker (:mod:`agentik.bot.links`).
            self.bridge.serves = self.ownership.serves
        #: The conversation leases and the turn queue (several workers on a shared store:
        #: :mod:`agentik.core.cluster.conversations`); ``None`` on SQLite or memory.
        self.turn_queue: TurnQueue | None = None
        #: ``[[webhooks]]``: run events POSTed as signed JSON through the store's outbox
        #: (its secrets are read now: a missing one stops the start with its key).
        self.webhooks = Webhooks(
            self.agent, config.webhooks, worker=self.ownership.worker,
            resolve=config.resolve_path,
        )  # fmt: skip

    def _attach(self, transport: Transport, options: Any = None) -> None:
        """Attach ``transport`` to the bridge and follow its health."""
        if options is None:
            found = self.sections.get(transport.name)
            options = options_from(found, transport) if found else None
        self.bridge.attach(transport, options)
        wire_transport(transport, self.agent.store,
                       claim_seconds=self.config.cluster.lease_seconds)  # fmt: skip
        transport.on_health = self._on_transport_health
        self.health.report(
            f"transport:{transport.name}", transport.health.state, transport.health.reason,
            type=transport.type,
        )  # fmt: skip
        self.metrics.transport_state(transport.name, transport.health.state)

    def report_health(self, transport: Transport) -> None:
        """Report ``transport``'s current state (one just put in :attr:`transports`)."""
        if self.ownership.serves(transport):  # (not one waiting for its lease)
            self._on_transport_health(transport, transport.health)

    def _on_transport_health(self, transport: Transport, health: Health) -> None:
        if self.transports.get(transport.name) is transport:
            before = self.health.components().get(f"transport:{transport.name}")
            self.health.report(f"transport:{transport.name}", health.state, health.reason)
            self.metrics.transport_state(transport.name, health.state)
            if health.state == "connected" and (before is None or before.state != "connected"):
                self._say_ready(transport)

    def _say_ready(self, transport: Transport) -> None:
        """One line at the default log level when a transport is up (again)."""
        name = transport.name
        again = name in self._ready_once
        self._ready_once.add(name)
        detail = _describe(transport)
        log_event(
            status_log, logging.INFO, "transport_ready", "%s %s %s%s",
            transport.type, name, "connected again" if again else "ready",
            f": {detail}" if detail else "", transport=name, type=transport.type,
        )  # fmt: skip

    def _on_health_change(self, component: str, health: Health) -> None:
        """sd_notify: ``READY=1`` the first time every transport is ready; ``STATUS=`` always."""
        if not component.startswith("transport:"):
            return
        states = ", ".join(
            f"{name} {h.state}" + (f" ({h.reason})" if h.reason and h.state != "connected" else "")
            for name, h in sorted(self.health.transports().items())
        )
        message = f"STATUS={states}"
        if not self._notified_ready and self.health.ready():
            self._notified_ready = True
            message = "READY=1\n" + message
        sd_notify(message)

    async def _start_listener(self) -> None:
        settings = self.config.health
        if not settings.listen:
            return
        listen = settings.listen
        if listen.startswith("unix:"):
            listen = "unix:" + self.config.resolve_path(listen[5:])
        token = load_token(settings, resolve=self.config.resolve_path)
        self.listener = HealthServer(
            listen, health=self.health_response, ready=self.ready_response,
            status=self.status_response, token=token,
        )  # fmt: skip
        self.listener.route("/metrics", self.metrics_response)
        with _collector_paused():
            # The listener's web server (uvicorn, Starlette) is imported the first time
            # one starts; here, so that its import runs with the collector paused.
            import agentik.transports.http.server  # noqa: F401
        await self.listener.start()

    # -- the listener's answers (also used by tests and plugins) ----------------------------
    def status(self) -> dict[str, Any]:
        """What ``/status`` answers: version, uptime, components, busy conversations,
        the cluster (this worker, the workers, who owns which connection)."""
        return {**status_of(self.agent, self.health), "cluster": self.cluster_view()}

    def cluster_view(self) -> dict[str, Any]:
        """The ``cluster`` section of ``/health`` and ``/status``: this worker, the workers,
        the connection owners; with several workers, the turn queue and the
        conversation leases held here."""
        view = self.ownership.view()
        if self.turn_queue is not None:
            view.update(self.turn_queue.view())
        return view

    async def health_response(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        running = self.agent.state.value == "running"
        body = {"status": "ok" if running else "unavailable", **self._detail(request)}
        if self._authorized(request):  # worker ids name hosts
            body["cluster"] = self.cluster_view()
        return JSONResponse(body, status_code=200 if running else 503)

    async def ready_response(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        detail = self._detail(request)
        ready = detail["ready"] and self.agent.state.value == "running" and not self._stopping
        status = "stopping" if self._stopping else "ready" if ready else "not ready"
        body = {"status": status, **detail, "ready": ready}
        return JSONResponse(body, status_code=200 if ready else 503)

    def _detail(self, request: Any) -> dict[str, Any]:
        """Components' states; reasons only for an authorized caller (or with no token)."""
        detail = self.health.detail()
        if not self._authorized(request):
            return without_reasons(detail)
        return detail

    def _authorized(self, request: Any) -> bool:
        """Whether the caller may see details (there is no token, or it sent it)."""
        listener = self.listener
        return listener is None or listener.authorized(request.headers.get("authorization"))

    async def status_response(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse(self.status())

    async def metrics_response(self, request: Any) -> Any:
        from starlette.responses import Response

        body, content_type = self.metrics.render()
        return Response(body, media_type=content_type)

    async def __aenter__(self) -> Bot:
        # SIGHUP from now on asks for a reload (carried out by serve()): one sent
        # while the transports connect is not the default "terminate".
        if hasattr(signal, "SIGHUP"):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._hup.set)
                self._hup_installed = True
        await self.agent.start()
        try:
            self.metrics.start()
            self._log_model()
            self._unsubscribe = self.health.subscribe(self._on_health_change)
            self.health.add_provider(self._mcp_health)
            self._watchers.append(
                asyncio.create_task(
                    watch_model(
                        self.agent, self.health, getattr(self.agent.llm, "name", "") or "llm"
                    ),
                    name="agentik-health:model",
                )
            )
            await self._start_listener()
            # Roles given in chat by earlier runs apply from the first message.
            await self.bridge.access.load(self.agent.store)
            # Linked channels (configured and made in chat) share their conversations.
            await self.bridge.links.load()
            # A connection another worker owns waits for its lease (its supervisor).
            ownership = self.ownership
            await ownership.start()
            # Events become deliveries from here on; what an earlier run left is sent.
            await self.webhooks.start()
            if ownership.shared and "queue" in self.agent.store.capabilities:
                # Only workers load the queue's modules (0.3 MB a lone bot need not hold).
                with _collector_paused(), _dataclass_code_cached():
                    from agentik.core.cluster.conversations import TurnQueue
                # Before the transports start: the HTTP API submits through it.
                self.turn_queue = TurnQueue(self.agent, ownership.worker, self.config.cluster,
                                            on_round=self.metrics.turn_queue)  # fmt: skip
                self.agent.turn_queue = self.turn_queue
                # Slack's HTTP mode (any worker receives an event): its turns too.
                self.bridge.chat_queue.start(self.turn_queue)
            # A message said from here on is this process's (its turn runs at once),
            # never one a crash left: recovery takes up only older ones.
            began = time.time()
            serving = [t for t in self.transports.values() if ownership.serves(t)]
            for transport in self.transports.values():
                if not ownership.serves(transport):
                    ownership.standby(transport)
            # All at once: one that is slow to connect (or cannot) holds up no other;
            # one that cannot start is retried by its supervisor (see _first_start).
            starts = asyncio.ensure_future(
                asyncio.gather(*(self._first_start(t) for t in serving), return_exceptions=True)
            )
            # A stop asked for meanwhile (SIGTERM while a server takes its time to
            # answer) cuts the starts short: serve() then stops at once, in order.
            stopper = asyncio.ensure_future(self.stop_requested.wait())
            try:
                waiting: set[asyncio.Future[Any]] = {starts, stopper}
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopper.cancel()
                if not starts.done():
                    starts.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await starts
            try:
                outcomes = starts.result()
            except asyncio.CancelledError:  # cut short by the stop above
                outcomes = []
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome  # a configuration error, once every start has ended
            # What a killed process left in the outbox goes out first, once;
            # then messages a crash left unanswered get their turns (these run
            # in the background, rendered after the redelivered pieces).
            if not ownership.shared:
                await self.bridge.redeliver()
                await self.bridge.resume_pending(before=began)
            else:  # what this worker serves; another worker's connections are its own
                transport_for = self.bridge.transport_for
                await self.bridge.redeliver(
                    transports={n for n, t in self.transports.items() if ownership.recovers(t)}
                )
                await self.bridge.resume_pending(
                    only=lambda key: ownership.recovers(transport_for(key)), before=began
                )
                # Linked channels of the connections it serves follow the turns other
                # workers run (taken over later: see the ownership's take-over).
                await self.bridge.links.served()
                if self.turn_queue is not None:
                    # Turns queued for conversations nobody holds (a dead worker's) too.
                    await self.turn_queue.start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _first_start(self, transport: Transport) -> None:
        """Start ``transport`` when the bot starts; a failure stops no other transport.

        A :class:`~agentik.core.ConfigError` (an empty token, a port in use) is the
        configuration's fault: the bot does not start (``agentik run`` exits 2).  A
        :class:`TransportFailed` (a token the server rejects) marks the transport
        ``failed`` with its one-line reason; anything else (the server unreachable)
        marks it ``reconnecting`` and its supervisor retries with ``[supervision]``
        backoff.  Either way the other transports start and run.
        """
        try:
            await self.start_transport(transport)
        except ConfigError:
            raise
        except TransportFailed as exc:
            self._start_errors[transport.name] = exc
            transport.set_health("failed", str(exc) or "failed")
        except Exception as exc:
            self._start_errors[transport.name] = exc
            transport.set_health("reconnecting", f"could not start: {_why(exc)}")

    async def start_transport(self, transport: Transport, options: Any = None) -> None:
        """Start ``transport`` (attached to the bridge first when ``options`` are given).

        A transport whose start fails is closed again (no task of it is left behind).
        """
        if options is not None:
            self._attach(transport, options)
        if self.ownership.exclusive(transport) and not await self.ownership.claim(transport.name):
            self.ownership.standby(transport)  # another worker owns its connection
            return
        try:
            await transport.start(self.bridge)
        except BaseException:
            with contextlib.suppress(Exception):
                await transport.aclose()
            raise
        self._started.append(transport)
        if not transport.reports_health and transport.health.state == "starting":
            transport.set_health("connected")
        await self.agent.hooks.call("transport_start", transport=transport)

    async def stop_transport(self, transport: Transport) -> None:
        """Disconnect ``transport`` cleanly (an IRC QUIT, ...)."""
        try:
            await transport.aclose()
        except Exception:
            log.exception("closing transport %s failed", transport.name)
        if transport in self._started:
            self._started.remove(transport)
        await self.agent.hooks.call("transport_stop", transport=transport)

    def _fresh(self, name: str, old: Transport) -> Transport:
        """A new instance of transport ``name`` (a restart after a failure)."""
        section = self.sections.get(name)
        if section is not None:
            return make_transport(self.registry, name, section, self.config.source)
        return type(old)(name=name, settings=old.settings)

    def _mcp_health(self) -> list[tuple[str, Health]]:
        """MCP servers' states, read from their toolsets when asked."""
        states = {"connected": "connected", "restarting": "reconnecting", "failed": "failed"}
        out: list[tuple[str, Health]] = []
        for toolset in self.agent.toolsets:
            status = getattr(toolset, "status", None)
            if not callable(status) or not hasattr(toolset, "refresh"):
                continue
            for server in status():
                state = states.get(server.get("state"), "starting")
                reason = server.get("error") if state != "connected" else None
                if server.get("state") == "lazy":
                    reason = "lazy: starts when a tool is first used"
                out.append((
                    f"mcp:{server['name']}",
                    Health(state, reason, since=server.get("since") or self.health.started),  # type: ignore[arg-type]
                ))  # fmt: skip
        return out

    # -- what connection ownership uses (agentik.bot.ownership.OwnershipHost) ---------------
    def serving(self, name: str) -> Transport | None:
        """The instance the supervision of transport ``name`` serves now."""
        return self._serving.get(name)

    def start_failed(self, name: str) -> bool:
        """Whether transport ``name`` could not start with the bot (its supervision retries)."""
        return name in self._start_errors

    async def start_supervised(self, transport: Transport) -> None:
        """Start ``transport`` as the bot starts its transports (:meth:`_first_start`)."""
        await self._first_start(transport)

    async def replace_stopped(self, name: str) -> Transport:
        """Stop transport ``name``'s instance and put a fresh one, attached, in its place
        (its open channels carry on through it)."""
        current = self.transports[name]
        await self._stop(current)
        fresh = self._fresh(name, current)
        self.transports[name] = fresh
        self._attach(fresh)
        self.bridge.rebind(name, fresh)
        return fresh

    async def _supervise(self, name: str) -> None:
        """Serve transport ``name`` (:meth:`_serve_transport`); a connection one worker
        at a time owns only while this worker holds its lease (:mod:`.ownership`)."""
        if self.ownership.exclusive(self.transports[name]):
            await self.ownership.supervise(name, self._serve_transport)
        else:
            await self._serve_transport(name)

    async def _serve_transport(self, name: str) -> None:
        """Serve transport ``name``; restart it with backoff when its task fails.

        A :class:`TransportFailed` (a refused login, a configuration the server
        rejects) is permanent: no restart.  A start that fails for want of a
        connection (an ``OSError``: the server unreachable) is retried for as
        long as it takes, with the same backoff, like a lost connection.  Any
        other exception is retried after
        ``backoff_initial`` seconds, doubling up to ``backoff_max``; the
        ``max_restarts + 1``-th failure within ``window`` seconds marks it
        ``failed`` for good.  Either way the other transports keep running.
        A reload that removes or replaces the instance ends this task quietly
        (``serve()`` starts one for the new instance).
        """
        policy = self.config.supervision
        failures: deque[float] = deque()
        restarting = False
        unreachable = 0  # failed starts in a row for want of a connection
        while True:
            transport = self.transports[name]
            self._serving[name] = transport
            starting = False
            try:
                first = self._start_errors.pop(name, None)
                if first is not None:
                    starting = True
                    raise first
                if restarting:
                    starting = True
                    await self.start_transport(transport)
                    starting = False
                    unreachable = 0
                await transport.serve()
                if self.transports.get(name) is not transport:
                    return  # a reload stopped it
                if transport.health.state != "failed":
                    return  # finished on its own (a terminal at end of input)
                raise TransportFailed(transport.health.reason or "failed")
            except asyncio.CancelledError:
                raise
            except (TransportFailed, ConfigError) as exc:
                if self.transports.get(name) is not transport:
                    return
                transport.set_health("failed", str(exc) or "failed")
                if not isinstance(exc, TransportFailed):
                    raise TransportFailed(f"transport {name}: {exc}") from None
                raise
            except Exception as exc:
                if self.transports.get(name) is not transport:
                    return
                why = _why(exc)
                # A connection that failed is one line; anything else is a bug worth a trace.
                expected = isinstance(exc, OSError | TimeoutError)
                log.log(
                    logging.WARNING if expected else logging.ERROR,
                    "transport %s failed: %s", name, why, exc_info=None if expected else exc,
                )  # fmt: skip
            if expected and starting:
                # It could not connect (the server unreachable): like a lost
                # connection, retried for as long as it takes, with backoff.
                unreachable += 1
                delay = policy.backoff(unreachable)
                transport.set_health("reconnecting", f"retrying in {delay:g} s after: {why}")
                await self._stop(transport)
                await asyncio.sleep(delay)
                if self.transports.get(name) is not transport:
                    return
                fresh = self._fresh(name, transport)
                fresh.set_health("reconnecting", f"retrying after: {why}")
                self.transports[name] = fresh
                self._attach(fresh)
                self.bridge.rebind(name, fresh)
                restarting = True
                continue
            now = time.monotonic()
            failures.append(now)
            while failures and now - failures[0] > policy.window:
                failures.popleft()
            if len(failures) > policy.max_restarts:
                reason = (
                    f"gave up after {len(failures)} failures in {policy.window:g} s: {why}"
                    if policy.max_restarts
                    else why
                )
                transport.set_health("failed", reason)
                await self._stop(transport)
                raise TransportFailed(f"transport {name}: {reason}")
            delay = policy.backoff(len(failures))
            transport.set_health("reconnecting", f"restarting in {delay:g} s after: {why}")
            log.warning(
                "transport %s: restarting in %g s (failure %d of at most %d in %g s)",
                name, delay, len(failures), policy.max_restarts + 1, policy.window,
            )  # fmt: skip
            await self._stop(transport)
            await asyncio.sleep(delay)
            if self.transports.get(name) is not transport:
                return  # a reload replaced or removed it meanwhile
            try:
                fresh = self._fresh(name, transport)
            except Exception as exc:
                reason = f"cannot be restarted: {exc}"
                transport.set_health("failed", reason)
                raise TransportFailed(f"transport {name}: {reason}") from None
            fresh.set_health("reconnecting", f"restarting after: {why}")
            self.transports[name] = fresh
            self._attach(fresh)
            self.bridge.rebind(name, fresh)
            restarting = True

    async def _stop(self, transport: Transport) -> None:
        if transport in self._started:
            await self.stop_transport(transport)

    async def reload(self, config: Config) -> str:
        """Put ``config`` in force without a restart (see :mod:`agentik.bot.reload`).

        Raises :class:`~agentik.core.ConfigError` (naming the key), and changes
        nothing, when ``config`` cannot be used.  Returns the summary line.
        """
        plan = await prepare(self, config)
        summary = await plan.apply(self)
        self._transports_changed.set()
        return summary

    async def reload_file(self) -> bool:
        """Read the configuration file again and :meth:`reload` it (SIGHUP).

        A file that cannot be read or used is refused with the error logged; the
        running configuration stays.  Returns whether the new one is in force.
        """
        source = self.config.source
        if source == "<string>":
            log.warning("reload: the configuration did not come from a file; nothing to reload")
            return False
        log.info("reloading the configuration from %s", source)
        try:
            new = await asyncio.to_thread(load_config, source)
            if self.only is not None and not any(
                s.enabled and s.type in self.only for s in new.transports.values()
            ):
                # `agentik chat` added its terminal to a file without one: keep it.
                added = {n: s for n, s in self.sections.items() if n not in new.transports}
                new = new.model_copy(update={"transports": {**new.transports, **added}})
            summary = await self.reload(new)
        except ConfigError as exc:
            log.error("reload refused, the running configuration is kept: %s", exc)
            return False
        except Exception as exc:
            log.error(
                "reload failed, the running configuration is kept: %s",
                str(exc) or type(exc).__name__,
                exc_info=exc,
            )
            return False
        status_log.info("%s", summary)
        return True

    async def serve(self) -> None:
        """Run until every transport finishes, or SIGTERM/SIGINT (when unhandled).

        SIGHUP reloads the configuration file (:meth:`reload_file`).

        A transport that fails for good (its ``serve()`` raises) is logged at
        ERROR while the others keep running; once every transport has finished,
        any failure is raised as :class:`TransportFailed` (``agentik run`` exits 1).
        """
        if not self.transports:
            raise ConfigError(f"{self.config.source}: transports: no transport is enabled")
        stop = self.stop_requested
        loop = asyncio.get_running_loop()
        installed: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            if sig == signal.SIGINT and any(t.type == "stdio" for t in self.transports.values()):
                continue  # the terminal transport owns Ctrl-C
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
                installed.append(sig)
        hup = self._hup
        waiters: dict[asyncio.Future[Any], str] = {}
        pending: set[asyncio.Future[Any]] = set()
        retired: list[asyncio.Future[Any]] = []

        def follow() -> None:
            """One supervisor per running transport (a reload adds, removes and
            replaces some; a supervisor's own restarts keep their task)."""
            for waiter, name in list(waiters.items()):
                if waiter.done():
                    continue
                current = self.transports.get(name)
                if current is None or current is not self._serving.get(name):
                    del waiters[waiter]
                    pending.discard(waiter)
                    waiter.cancel()
                    retired.append(waiter)
            live = {n for w, n in waiters.items() if not w.done()}
            for name, transport in self.transports.items():
                if name not in live:
                    self._serving[name] = transport
                    waiter = asyncio.ensure_future(self._supervise(name))
                    waiters[waiter] = name
                    pending.add(waiter)

        follow()
        stopper = asyncio.ensure_future(stop.wait())
        reloader = asyncio.ensure_future(hup.wait())
        changed = asyncio.ensure_future(self._transports_changed.wait())
        failures: list[str] = []
        try:
            while pending:
                done, _ = await asyncio.wait(
                    {*pending, stopper, reloader, changed}, return_when=asyncio.FIRST_COMPLETED
                )
                if stopper in done:
                    await self.shutdown()
                    return
                if reloader in done:
                    hup.clear()
                    reloader = asyncio.ensure_future(hup.wait())
                    await self.reload_file()
                if self._transports_changed.is_set():
                    self._transports_changed.clear()
                    changed.cancel()
                    changed = asyncio.ensure_future(self._transports_changed.wait())
                    follow()
                for waiter in done:
                    if waiter not in pending:
                        continue
                    pending.discard(waiter)
                    exc = None if waiter.cancelled() else waiter.exception()
                    if exc is None:
                        continue
                    failures.append(str(exc) or type(exc).__name__)
                    log.error(
                        "transport %s failed: %s%s", waiters[waiter], failures[-1],
                        f" ({len(pending)} other transport(s) keep running)" if pending else "",
                        exc_info=None if isinstance(exc, AgentikError) else exc,
                    )  # fmt: skip
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)
            for w in (stopper, reloader, changed, *waiters, *retired):
                w.cancel()
            await asyncio.gather(stopper, reloader, changed, *waiters, *retired,
                                 return_exceptions=True)  # fmt: skip
        if failures:
            if len(failures) == 1 and len(self.transports) == 1:
                raise TransportFailed(failures[0])
            raise TransportFailed(
                f"every transport has stopped, {len(failures)} on an error: " + "; ".join(failures)
            )

    @property
    def started(self) -> tuple[Transport, ...]:
        """The transport instances started and not yet stopped, in start order (a reload
        or a restart replaces an instance)."""
        return tuple(self._started)

    @property
    def stopping(self) -> bool:
        """Whether a stop has begun (``/ready`` answers 503 from then on)."""
        return self._stopping

    async def shutdown(self) -> None:
        """The orderly stop of SIGTERM/SIGINT, within ``[supervision] stop_timeout``.

        At once: ``/ready`` answers 503 and ``STOPPING=1`` goes to systemd.  Then
        every transport says goodbye (an IRC QUIT, the Slack socket closed, the
        HTTP API closed): no new message reaches the bot, so no new turn starts.
        (The HTTP API stays open to the followers of its event streams, refusing
        new messages with 503, until :meth:`aclose`.)
        Running (and queued) turns get ``drain_timeout`` seconds to finish; what
        still runs then is cut (interrupted: the partial answer is kept and, like
        every answer written after the goodbye, delivered from the outbox on the
        next start; a message whose turn never ran is resumed then).  Then, once
        what they wrote is committed, the connections' leases are released
        (several workers: another takes them over, and delivers those answers
        once).  Reflection
        (``[memory] reflect_on_shutdown``) gets what is left of ``stop_timeout``
        less a few seconds for closing the store; :meth:`aclose` follows.
        """
        if self._stopping:
            return
        self._stopping = True
        self.ownership.draining = True  # no connection lease is taken from now on
        loop = asyncio.get_running_loop()
        policy = self.config.supervision
        deadline = self._stop_deadline = loop.time() + policy.stop_timeout
        self.closing_at = "goodbye on the transports"
        sd_notify("STOPPING=1")
        status_log.info(
            "stopping: goodbye on %d transport(s), turns get %g s, everything %g s",
            len(self._started), min(policy.drain_timeout, policy.stop_timeout),
            policy.stop_timeout,
        )  # fmt: skip
        # All at once: an IRC QUIT waiting for the server keeps no API open meanwhile.
        # A transport that can refuse new work while it stays open (the HTTP API:
        # 503 to new messages and streams) does so, and closes in aclose(): clients
        # following events see the conversations end with the shutdown.
        goodbye: list[Transport] = []
        for transport in list(reversed(self._started)):
            refuse = getattr(transport, "stop_accepting", None)
            if callable(refuse):
                refuse()
            else:
                goodbye.append(transport)
        await self._bounded(
            "goodbye on the transports",
            asyncio.gather(*(self.stop_transport(t) for t in goodbye)),
            deadline - _CLOSING,
        )
        if self.turn_queue is not None:
            await self.turn_queue.drain()  # no new turn starts; queued ones wait for another
        self.closing_at = "draining the turns"
        drain_end = min(loop.time() + policy.drain_timeout, deadline)
        # Until none is busy: a message a closing transport handed over late (a Slack
        # event its library dispatched after the socket closed) starts a turn after the
        # others: it is waited for too, or the next owner would find it unanswered and
        # answer it again.
        cut: list[Any] = []
        while busy := [c for c in self.agent.services.conversations() if c.busy]:
            if loop.time() >= drain_end:
                cut = busy
                break
            waiting = [asyncio.ensure_future(c.wait_idle()) for c in busy]
            await asyncio.wait(waiting, timeout=max(0.0, drain_end - loop.time()))
            for waiter in waiting:
                waiter.cancel()
        if cut:
            log.warning(
                "stopping: %d turn(s) still running after %g s are cut short",
                len(cut), policy.drain_timeout,
            )  # fmt: skip
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.1, deadline - loop.time() - _CLOSING)):
                    await asyncio.gather(*(c.interrupt() for c in cut), return_exceptions=True)
        # Only now the connections' leases go (another worker takes each at its next
        # heartbeat): what the turns wrote, answers included, is committed first, so
        # the new owner's recovery finds them answered (not a message to answer again)
        # and delivers their pieces from the outbox once.
        await self._bounded("recording what was delivered", self.bridge.settle(),
                            deadline - _CLOSING)  # fmt: skip
        await self._bounded("committing what the turns wrote", self.agent.store.settle(),
                            deadline - _CLOSING)  # fmt: skip
        await self._bounded("releasing the connection leases", self.ownership.drain(),
                            deadline - _CLOSING)  # fmt: skip
        left = deadline - loop.time() - _CLOSING
        if left <= 0:
            log.warning("stopping: no time left to reflect on conversations")
            return
        self.closing_at = "reflecting on conversations"
        try:
            async with asyncio.timeout(left):
                await self.agent.wind_down()
        except TimeoutError:
            log.warning("stopping: reflection cut short after %.0f s; left for later", left)

    async def _bounded(self, step: str, work: Awaitable[object], until: float) -> None:
        """Await ``work`` (the stop's ``step``) until loop time ``until`` (at least a
        moment): one that overruns is logged and left behind, and the stop goes on."""
        self.closing_at = step
        loop = asyncio.get_running_loop()
        timeout = asyncio.timeout(max(_MOMENT, until - loop.time()))
        try:
            async with timeout:
                await work
        except TimeoutError:
            if not timeout.expired():
                raise  # the step's own error, not our bound
            log.error(
                "stopping: %s did not finish within [supervision] stop_timeout; left behind",
                step,
            )

    async def aclose(self) -> None:
        """Stop transports, renderers and the agent; nothing is left running.

        Bounded by ``[supervision] stop_timeout`` from when the stop began (here,
        unless :meth:`shutdown` began it): a step that overruns is logged and left
        behind, the store's close (last) keeps :data:`_STORE` seconds of it.
        """
        loop = asyncio.get_running_loop()
        if self._stop_deadline is None:
            self._stop_deadline = loop.time() + self.config.supervision.stop_timeout
        deadline = self._stop_deadline
        others = deadline - _STORE
        if not self._stopping:
            sd_notify("STOPPING=1")
            # Reflect on what has not been yet (bounded by [memory] reflect_on_shutdown),
            # while the transports can still announce it.
            await self._bounded("reflecting on conversations", self.agent.wind_down(),
                                deadline - _CLOSING)  # fmt: skip
        if self._hup_installed:
            self._hup_installed = False
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        for transport in reversed(self._started):
            try:
                await self._bounded(f"closing transport {transport.name}", transport.aclose(),
                                    others)  # fmt: skip
            except Exception:
                log.exception("closing transport %s failed", transport.name)
            await self._bounded(
                f"transport_stop hooks of {transport.name}",
                self.agent.hooks.call("transport_stop", transport=transport), others,
            )  # fmt: skip
        self._started.clear()
        if self.turn_queue is not None:  # its leases go: another worker takes the turns
            await self._bounded("closing the turn queue", self.turn_queue.aclose(), others)
        await self._bounded("closing the connection leases", self.ownership.aclose(), others)
        if self.listener is not None:
            await self._bounded("closing the health listener", self.listener.aclose(), others)
            self.listener = None
        await self._bounded("closing the renderers", self.bridge.aclose(), others)
        await self._bounded("closing the metrics", self.metrics.aclose(), others)
        await self._bounded("closing the webhooks", self.webhooks.aclose(), others)
        await self._bounded("closing the agent and its store", self.agent.aclose(), deadline)
        for task in self._watchers:
            task.cancel()
        await self._bounded("ending the watchers",
                            asyncio.gather(*self._watchers, return_exceptions=True),
                            deadline)  # fmt: skip
        self._watchers.clear()
        self.closing_at = "exiting (the interpreter's own exit)"
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _log_model(self) -> None:
        """One start-up line per model: backend, model and endpoint (never a secret),
        shown at the default log level (what the bot talks to is half of what it does)."""
        models = {"": self.agent.llm, **self.agent.profiles}
        for profile, llm in models.items():
            url = _public_url(getattr(llm, "base_url", None))
            log_event(
                status_log, logging.INFO, "startup", "model%s: %s %s%s",
                f" profile {profile}" if profile else "", llm.name or type(llm).__name__,
                llm.model or "(default model)", f" at {url}" if url else "",
                backend=llm.name or type(llm).__name__, model=llm.model or None, url=url,
                profile=profile or None,
            )  # fmt: skip
        tools = self.agent.tools
        log_event(
            log, logging.INFO, "startup", "%d tools: %s", len(tools),
            ", ".join(sorted(t.name for t in tools)) or "none", tools=len(tools),
        )  # fmt: skip


#: Seconds of ``stop_timeout`` kept for closing the store and the rest after reflection.
_CLOSING = 3.0
#: Of those, the seconds kept for the agent's close (its store's last commit) when an
#: earlier step of :meth:`Bot.aclose` overruns.
_STORE = 1.5
#: The least time a step of the stop gets, even past the deadline (a close that has
#: nothing to wait for takes microseconds; one that hangs is cut after this).
_MOMENT = 0.2


def _describe(transport: Transport) -> str:
    """Where ``transport`` is: its listening URL, its server, its channels (no secret)."""
    url = getattr(transport, "url", None)
    if isinstance(url, str) and url:
        return f"listening on {url}"
    where = getattr(transport, "where", None)  # Slack: team and bot user
    if isinstance(where, str) and where:
        return f"connected to {where}"
    if transport.type == "irc":
        nick = getattr(transport, "nick", None) or ""
        server = getattr(transport, "_where", "")
        options = getattr(transport, "options", None)
        channels = [c.partition(" ")[0] for c in getattr(options, "channels", ())]
        return f"{server} as {nick}, channels {', '.join(channels) or 'none'}"
    return ""


def _why(exc: BaseException) -> str:
    """One line saying what went wrong: the message (with the type when it is terse)."""
    text = " ".join(str(exc).split())
    if isinstance(exc, AgentikError | ConnectionError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _public_url(url: object) -> str | None:
    """``url`` without user info, query or fragment (where credentials hide)."""
    if not isinstance(url, str) or not url:
        return None
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = host + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return None
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
