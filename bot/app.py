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
        sections = {n: s for n, s in config.transports.items() if s.enabled}
        for name, section in sections.items():
            if only is not None and section.type not in only:
                continue
            if name not in self.transports:
                self.transports[name] = make_transport(self.registry, name, section, config.source)
        for name, transport in self.transports.items():
            found = sections.get(name)
            self.bridge.attach(transport, options_from(found, transport) if found else None)
        self._started: list[Transport] = []

    async def __aenter__(self) -> Bot:
        await self.agent.start()
        try:
            self.metrics.start()
            self._log_model()
            # Roles given in chat by earlier runs apply from the first message.
            await self.bridge.access.load(self.agent.store)
            for transport in self.transports.values():
                await transport.start(self.bridge)
                self._started.append(transport)
                await self.agent.hooks.call("transport_start", transport=transport)
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

    async def serve(self) -> None:
        """Run until every transport finishes, or SIGTERM/SIGINT (when unhandled).

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
        waiters: dict[asyncio.Future[Any], str] = {
            asyncio.ensure_future(t.serve()): n for n, t in self.transports.items()
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
