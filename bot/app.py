"""The running bot: configuration → plugins → agent → bridge → transports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Any

from agentik.core import Agent, AgentikError, ConfigError
from agentik.core.access import AccessPolicy
from agentik.core.budgets import Budgets
from agentik.core.plugins import Registry, load_plugins
from agentik.core.settings import is_file_path, setting_fields
from agentik.transports.base import Transport, TransportFailed

from .bridge import Bridge, options_from
from .builder import AgentBuilder
from .config import Config, TransportSection
from .logs import log_event
from .metrics import Metrics

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
        #: Prometheus metrics (``GET /metrics`` on the HTTP transport; ``metrics.render()``).
        self.metrics = Metrics(self.agent)
        self.bridge.metrics = self.metrics
        if self.bridge.budgets is not None:
            self.bridge.budgets.on_refusal = self.metrics.budget_refused
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
        for name, transport in self.transports.items():
            found = sections.get(name)
            self.bridge.attach(transport, options_from(found, transport) if found else None)
        self._started: list[Transport] = []
        # Set when the set of transports changed (a reload): serve() follows.
        self._transports_changed = asyncio.Event()
        # Set by SIGHUP: serve() reloads the configuration file.
        self._hup = asyncio.Event()
        self._hup_installed = False

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
            # Roles given in chat by earlier runs apply from the first message.
            await self.bridge.access.load(self.agent.store)
            for transport in self.transports.values():
                await self.start_transport(transport)
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

    async def start_transport(self, transport: Transport, options: Any = None) -> None:
        """Start ``transport`` (attached to the bridge first when ``options`` are given)."""
        if options is not None:
            self.bridge.attach(transport, options)
        await transport.start(self.bridge)
        self._started.append(transport)
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

    async def reload(self, config: Config) -> str:
        """Put ``config`` in force without a restart (see :mod:`agentik.bot.reload`).

        Raises :class:`~agentik.core.ConfigError` (naming the key), and changes
        nothing, when ``config`` cannot be used.  Returns the summary line.
        """
        from .reload import prepare

        plan = await prepare(self, config)
        summary = await plan.apply(self)
        self._transports_changed.set()
        return summary

    async def reload_file(self) -> bool:
        """Read the configuration file again and :meth:`reload` it (SIGHUP).

        A file that cannot be read or used is refused with the error logged; the
        running configuration stays.  Returns whether the new one is in force.
        """
        from .config import load_config

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
        log.info("%s", summary)
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
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        installed: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            if sig == signal.SIGINT and any(t.type == "stdio" for t in self.transports.values()):
                continue  # the terminal transport owns Ctrl-C
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
                installed.append(sig)
        hup = self._hup
        waiters: dict[asyncio.Future[Any], Transport] = {}
        pending: set[asyncio.Future[Any]] = set()
        retired: list[asyncio.Future[Any]] = []

        def follow() -> None:
            """One waiter per running transport (a reload adds and removes some)."""
            running = list(self.transports.values())
            for waiter, transport in list(waiters.items()):
                if not any(t is transport for t in running):
                    del waiters[waiter]
                    pending.discard(waiter)
                    waiter.cancel()
                    retired.append(waiter)
            for transport in running:
                if not any(t is transport for t in waiters.values()):
                    waiter = asyncio.ensure_future(transport.serve())
                    waiters[waiter] = transport
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
                        "transport %s failed: %s%s", waiters[waiter].name, failures[-1],
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

    async def aclose(self) -> None:
        """Stop transports, renderers and the agent; nothing is left running."""
        if self._hup_installed:
            self._hup_installed = False
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        for transport in reversed(self._started):
            try:
                await transport.aclose()
            except Exception:
                log.exception("closing transport %s failed", transport.name)
            await self.agent.hooks.call("transport_stop", transport=transport)
        self._started.clear()
        await self.bridge.aclose()
        await self.metrics.aclose()
        await self.agent.aclose()

    def _log_model(self) -> None:
        """One start-up line per model: backend, model and endpoint (never a secret)."""
        models = {"": self.agent.llm, **self.agent.profiles}
        for profile, llm in models.items():
            url = _public_url(getattr(llm, "base_url", None))
            log_event(
                log, logging.INFO, "startup", "model%s: %s %s%s",
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


def access_policy(config: Config) -> AccessPolicy:
    """The ``[access]`` policy of ``config``, for its transport instances."""
    from agentik.transports.irc.wire import casefold

    types = {name: section.type for name, section in config.transports.items()}
    return AccessPolicy(config.access, types, irc_casefold=casefold)
