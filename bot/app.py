"""The running bot: configuration → plugins → agent → bridge → transports."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from agentik.core import Agent, AgentikError, ConfigError
from agentik.core.access import AccessPolicy
from agentik.core.budgets import Budgets
from agentik.core.health import Health, status_of, watch_model, without_reasons
from agentik.core.plugins import Registry, load_plugins
from agentik.core.settings import is_file_path, setting_fields
from agentik.transports.base import Transport, TransportFailed

from .bridge import Bridge, options_from
from .builder import AgentBuilder
from .config import Config, TransportSection
from .health import HealthServer, load_token, sd_notify

__all__ = ["Bot", "load_registry"]

log = logging.getLogger(__name__)


def load_registry(config: Config, extra: tuple[object, ...] = ()) -> Registry:
    """Load plugins, honouring ``[plugins] load`` unless ``AGENTIK_PLUGINS`` is set."""
    env = dict(os.environ)
    if config.plugins.load is not None and "AGENTIK_PLUGINS" not in env:
        env["AGENTIK_PLUGINS"] = ",".join(config.plugins.load)
    return load_plugins(extra, env=env)


def make_transport(
    registry: Registry, name: str, section: TransportSection, source: str
) -> Transport:
    """Instantiate ``[transports.<name>]``; settings errors name the key."""
    factory = registry.transports.get(section.type)
    if factory is None:
        known = ", ".join(sorted(registry.transports)) or "none"
        raise ConfigError(
            f"{source}: transports.{name}.type: unknown transport {section.type!r}"
            f" (installed: {known})"
        )
    settings = dict(section.settings)
    model = getattr(factory, "settings_model", None)
    if model is not None and source != "<string>":
        # Path keys are relative to the configuration file, as elsewhere.
        base = os.path.dirname(os.path.abspath(source))
        for key, field in setting_fields(model).items():
            value = settings.get(key)
            if isinstance(value, str) and value and is_file_path(field):
                settings[key] = os.path.join(base, os.path.expanduser(value))
    try:
        return factory(name=name, settings=settings)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


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
        )
        # One comparison of roles everywhere: approvals' approvers use the policy's.
        self.agent.approvals.at_least = self.bridge.access.at_least
        #: States of transports, MCP servers and the model (``/health``, ``/ready``).
        self.health = self.agent.health
        self.health.grace = config.health.ready_grace
        self.transports: dict[str, Transport] = dict(transports or {})
        sections = {n: s for n, s in config.transports.items() if s.enabled}
        #: How to make a fresh instance of each transport (a restart after a failure).
        self._factories: dict[str, Callable[[], Transport]] = {}
        self._sections = sections
        for name, section in sections.items():
            if only is not None and section.type not in only:
                continue
            if name not in self.transports:
                self.transports[name] = make_transport(self.registry, name, section, config.source)
                self._factories[name] = functools.partial(
                    make_transport, self.registry, name, section, config.source
                )
        for name, transport in self.transports.items():
            self._factories.setdefault(
                name, functools.partial(type(transport), name=name, settings=transport.settings)
            )
            self._attach(transport)
        self._started: list[Transport] = []
        self.listener: HealthServer | None = None
        self._watchers: list[asyncio.Task[None]] = []
        self._notified_ready = False
        self._unsubscribe: Callable[[], None] | None = None

    def _attach(self, transport: Transport) -> None:
        found = self._sections.get(transport.name)
        self.bridge.attach(transport, options_from(found, transport) if found else None)
        transport.on_health = self._on_transport_health
        self.health.report(
            f"transport:{transport.name}", transport.health.state, transport.health.reason,
            type=transport.type,
        )  # fmt: skip

    def _on_transport_health(self, transport: Transport, health: Health) -> None:
        if self.transports.get(transport.name) is transport:
            self.health.report(f"transport:{transport.name}", health.state, health.reason)

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
        await self.listener.start()

    # -- the listener's answers (also used by tests and plugins) ----------------------------
    def status(self) -> dict[str, Any]:
        """What ``/status`` answers: version, uptime, components, busy conversations."""
        return status_of(self.agent, self.health)

    async def health_response(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        running = self.agent.state.value == "running"
        body = {"status": "ok" if running else "unavailable", **self._detail(request)}
        return JSONResponse(body, status_code=200 if running else 503)

    async def ready_response(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        detail = self._detail(request)
        ready = detail["ready"] and self.agent.state.value == "running"
        body = {"status": "ready" if ready else "not ready", **detail, "ready": ready}
        return JSONResponse(body, status_code=200 if ready else 503)

    def _detail(self, request: Any) -> dict[str, Any]:
        """Components' states; reasons only for an authorized caller (or with no token)."""
        detail = self.health.detail()
        listener = self.listener
        if listener is not None and not listener.authorized(request.headers.get("authorization")):
            return without_reasons(detail)
        return detail

    async def status_response(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse(self.status())

    async def __aenter__(self) -> Bot:
        await self.agent.start()
        try:
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
            for transport in self.transports.values():
                await self._start(transport)
            # What a killed process left in the outbox goes out first, once;
            # then messages a crash left unanswered get their turns (these run
            # in the background, rendered after the redelivered pieces).
            await self.bridge.redeliver()
            await self.bridge.resume_pending()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _start(self, transport: Transport) -> None:
        await transport.start(self.bridge)
        self._started.append(transport)
        if not transport.reports_health and transport.health.state == "starting":
            transport.set_health("connected")
        await self.agent.hooks.call("transport_start", transport=transport)

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

    async def _supervise(self, name: str) -> None:
        """Serve transport ``name``; restart it with backoff when its task fails.

        A :class:`TransportFailed` (a refused login, a configuration the server
        rejects) is permanent: no restart.  Any other exception is retried after
        ``backoff_initial`` seconds, doubling up to ``backoff_max``; the
        ``max_restarts + 1``-th failure within ``window`` seconds marks it
        ``failed`` for good.  Either way the other transports keep running.
        """
        policy = self.config.supervision
        failures: deque[float] = deque()
        restarting = False
        while True:
            transport = self.transports[name]
            try:
                if restarting:
                    await self._start(transport)
                await transport.serve()
                if transport.health.state != "failed":
                    return  # finished on its own (a terminal at end of input)
                raise TransportFailed(transport.health.reason or "failed")
            except asyncio.CancelledError:
                raise
            except (TransportFailed, ConfigError) as exc:
                transport.set_health("failed", str(exc) or "failed")
                if not isinstance(exc, TransportFailed):
                    raise TransportFailed(f"transport {name}: {exc}") from None
                raise
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                log.error("transport %s failed: %s", name, why, exc_info=exc)
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
            try:
                fresh = self._factories[name]()
            except Exception as exc:
                reason = f"cannot be restarted: {exc}"
                transport.set_health("failed", reason)
                raise TransportFailed(f"transport {name}: {reason}") from None
            fresh.set_health("reconnecting", f"restarting after: {why}")
            self.transports[name] = fresh
            self._attach(fresh)
            restarting = True

    async def _stop(self, transport: Transport) -> None:
        if transport not in self._started:
            return
        self._started.remove(transport)
        try:
            await transport.aclose()
        except Exception:
            log.exception("closing transport %s failed", transport.name)
        await self.agent.hooks.call("transport_stop", transport=transport)

    async def serve(self) -> None:
        """Run until every transport finishes, or SIGTERM/SIGINT (when unhandled).

        A transport whose task fails is restarted with backoff (``[supervision]``);
        one that fails for good (:class:`TransportFailed`, or too many failures in
        the window) is marked ``failed`` and logged at ERROR while the others keep
        running; once every transport has finished, any failure is raised as
        :class:`TransportFailed` (``agentik run`` exits 1).
        """
        if not self.transports:
            raise ConfigError(f"{self.config.source}: transports: no transport is enabled")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        installed: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            if sig == signal.SIGINT and any(t.type == "stdio" for t in self.transports.values()):
                continue  # the terminal transport owns Ctrl-C
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
                installed.append(sig)
        waiters: dict[asyncio.Future[Any], str] = {
            asyncio.ensure_future(self._supervise(n)): n for n in self.transports
        }
        stopper = asyncio.ensure_future(stop.wait())
        pending: set[asyncio.Future[Any]] = set(waiters)
        failures: list[str] = []
        try:
            while pending:
                done, _ = await asyncio.wait(
                    {*pending, stopper}, return_when=asyncio.FIRST_COMPLETED
                )
                if stopper in done:
                    return
                for waiter in done:
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
            stopper.cancel()
            for w in waiters:
                w.cancel()
            await asyncio.gather(stopper, *waiters, return_exceptions=True)
        if failures:
            if len(self.transports) == 1:
                raise TransportFailed(failures[0])
            raise TransportFailed(
                f"every transport has stopped, {len(failures)} on an error: " + "; ".join(failures)
            )

    async def aclose(self) -> None:
        """Stop transports, renderers and the agent; nothing is left running."""
        sd_notify("STOPPING=1")
        for transport in reversed(self._started):
            try:
                await transport.aclose()
            except Exception:
                log.exception("closing transport %s failed", transport.name)
            await self.agent.hooks.call("transport_stop", transport=transport)
        self._started.clear()
        if self.listener is not None:
            await self.listener.aclose()
            self.listener = None
        await self.bridge.aclose()
        await self.agent.aclose()
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        self._watchers.clear()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None


def access_policy(config: Config) -> AccessPolicy:
    """The ``[access]`` policy of ``config``, for its transport instances."""
    from agentik.transports.irc.wire import casefold

    types = {name: section.type for name, section in config.transports.items()}
    return AccessPolicy(config.access, types, irc_casefold=casefold)
