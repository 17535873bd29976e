"""The HTTP transport: the REST + SSE API server inside the bot's event loop.

Unlike chat transports, API clients do not talk through the bridge's
incoming-message path: they create conversations, post messages, follow
events and interrupt turns directly on the :class:`~agentik.core.Agent`.

**How the transport gets the agent.**  ``HttpTransport(..., agent=agent)``
when used as a library; otherwise :meth:`HttpTransport.start` takes it from
its sink's :class:`~agentik.transports.base.AgentHost`
(:func:`~agentik.transports.base.host_of`: the bot's
:class:`~agentik.bot.bridge.Bridge` is one, and an
:class:`~agentik.transports.base.AgentAccess` sink gives its agent through a
:class:`~agentik.transports.base.BasicHost`), which also says which tools the
instance allows (``host.allowed_tools(self)``, the bridge's ``allowed_tools``
key); they bound every turn posted through it (the turn's
:class:`~agentik.core.turnsettings.TurnSettings`).  Without an agent from
either, starting is a configuration error.  Posted messages pass the host's
admission :attr:`~agentik.transports.base.AgentHost.gate`, as chat messages
do.

**Serving.**  Starlette routes (:mod:`.api`) served by uvicorn's ``Server``
on a socket we bind ourselves, as a task of the running loop: no loop of its
own, no lifespan, no signal handlers (the bot owns SIGINT/SIGTERM), no
access log.  :mod:`.server` adds what a socket open to anyone needs: a
deadline for request heads, head size and count limits, a connection cap,
and an accept loop that backs off quietly when file descriptors run out.
:meth:`aclose` ends every event stream, lets in-flight requests finish (at
most ``_GRACE`` seconds) and closes the socket.

**Exposure.**  Without tokens there is no authentication, so the server
only listens on a loopback address, and says so at start-up.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

from agentik.core import Agent
from agentik.core.errors import ConfigError
from agentik.transports.base import (
    ChannelCaps,
    MessageSink,
    OutgoingMessage,
    Transport,
    host_of,
)

from .auth import TokenTable, load_tokens
from .settings import HttpSettings

if TYPE_CHECKING:
    from .api import ApiContext, MetricsSource

# The routes (.api: Starlette) and the server (.server: uvicorn, httptools) are imported
# when the transport starts, not with it: registering the transport (every bot does, to
# know the type) or configuring one that is disabled costs neither (docs/operations.md,
# "What a started bot imports").

__all__ = ["HttpTransport"]

log = logging.getLogger(__name__)

#: Seconds in-flight requests get to finish when the transport closes.
_GRACE = 5


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _web_page(prefix: str) -> str:
    """The page, its API prefix filled in and the version of its static files (its
    script's URL names it, and the libraries it loads: what ``/static/`` serves as
    immutable, see :func:`.api.static_version`)."""
    from .api import static_version

    page = resources.files(__package__).joinpath("static/index.html").read_text("utf-8")
    page = page.replace("__AGENTIK_STATIC_VERSION__", static_version())
    return page.replace("__AGENTIK_PREFIX__", prefix)


class HttpTransport(Transport):
    """The ``type = "http"`` transport (see the module docstring)."""

    type = "http"
    settings_model = HttpSettings
    options: HttpSettings
    caps = ChannelCaps(streaming="deltas", formatting="markdown")

    def __init__(
        self,
        *,
        name: str,
        settings: dict[str, Any] | None = None,
        agent: Agent | None = None,
        environ: Mapping[str, str] | None = None,
        metrics: MetricsSource | None = None,
    ) -> None:
        super().__init__(name=name, settings=settings)
        env = os.environ if environ is None else environ
        where = f"transports.{name}"
        #: The agent served; set here or taken from the sink at :meth:`start`.
        self.agent = agent
        self.port = self.options.port
        if env.get("AGENTIK_PORT"):
            raw = env["AGENTIK_PORT"].strip()
            if not raw.isdigit() or not 0 <= int(raw) <= 65535:
                raise ConfigError(f"AGENTIK_PORT: not a port number: {raw!r} ({where}.port)")
            self.port = int(raw)
        self.tokens: TokenTable = load_tokens(self.options.tokens, where=where, environ=env)
        #: What ``/metrics`` serves; set here or taken from the sink (the bot's bridge).
        self.metrics = metrics
        self.metrics_token = _metrics_token(self.options.metrics_token_env, where, env)
        self.host = self.options.host
        #: Without tokens a non-loopback address would expose an open API.
        self.loopback_only = not self.tokens.enabled and not _is_loopback(self.host)
        if self.loopback_only:
            self.host = "127.0.0.1"
        #: ``http://host:port`` once listening (the real port when ``port = 0``).
        self.url: str | None = None
        self._ctx: ApiContext | None = None
        self._server: Any = None
        self._serving: asyncio.Future[Any] | None = None
        #: The A2A SDK's request handler, when A2A is served (closed with the server).
        self._a2a: Any = None

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self, sink: MessageSink) -> None:
        # The bot's bridge is an AgentHost; another sink gets the defaults of a BasicHost.
        host = host_of(sink)
        agent = self.agent
        if agent is None:
            agent = host.agent
        if agent is None:
            raise ConfigError(
                f"transports.{self.name}: the http transport needs the agent "
                "(pass agent=..., or start it with an AgentAccess sink such as the bot's bridge)"
            )
        self.agent = agent
        allowed = host.allowed_tools(self)
        o = self.options
        from .api import ApiContext, build_app

        self._ctx = ApiContext(
            agent=agent,
            settings=o,
            tokens=self.tokens,
            instance=self.name,
            allowed_tools=allowed,
            # Its gate is read at each call: a reload gives the bridge a new policy (an
            # admin added by SIGHUP decides on the web page without a restart).  A sink
            # that is no host has no rules.
            host=host,
            page=_web_page(o.prefix) if o.web_ui else None,
            # The host's budgets, when it has them.
            budgets=host.gate.budgets,
            metrics=(self.metrics or host.metrics) if o.metrics else None,
            metrics_token=self.metrics_token,
        )
        if self._ctx.budgets is not None and self._ctx.budgets.enabled:
            # Turns of this API have no renderer: their tokens are counted from events.
            self._ctx.budgets.watch(agent)
        app = build_app(self._ctx)
        if o.a2a.enabled:
            app.router.routes.extend(self._a2a_routes(app.state.api))
        sock = self._bind()
        try:
            await self._serve(app, sock)
        except BaseException:
            sock.close()
            raise
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}"
        page = f" (web page {self.url}/)" if o.web_ui else ""
        scrape = f", metrics at {self.url}/metrics" if self._ctx.metrics is not None else ""
        log.info(
            "transport %s: HTTP API on %s%s%s%s", self.name, self.url, o.prefix or "/", page,
            scrape, extra={
                "event": "startup", "transport": self.name, "url": self.url + (o.prefix or "/"),
                "web_page": f"{self.url}/" if o.web_ui else None, "tokens": len(self.tokens),
                "metrics": f"{self.url}/metrics" if self._ctx.metrics is not None else None,
            },
        )  # fmt: skip
        if not self.tokens.enabled:
            note = (
                f" (host {o.host!r} was replaced: an API without tokens only listens on loopback)"
                if self.loopback_only
                else ""
            )
            log.warning(
                "transport %s: no tokens configured: the HTTP API on %s needs no authentication "
                "and is reachable from this machine only%s",
                self.name,
                self.url,
                note,
            )

    def _a2a_routes(self, api: Any) -> list[Any]:
        """The A2A routes (``[transports.<name>.a2a]``), from the a2a extra's SDK."""
        try:
            from .a2a import a2a_routes
        except ImportError as exc:
            raise ConfigError(
                f"transports.{self.name}.a2a.enabled: A2A needs the a2a extra"
                f" (pip install -e '.[a2a]' in the checkout): {exc}"
            ) from None
        routes, self._a2a = a2a_routes(api)
        return routes

    def _bind(self) -> socket.socket:
        from .server import listen_tcp

        host, port = self.host, self.port
        try:
            return listen_tcp(host, port, self.options.backlog)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ConfigError(
                f"transports.{self.name}.port: cannot listen on {host}:{port}: {reason}"
            ) from None

    async def _serve(self, app: Any, sock: socket.socket) -> None:
        from .server import ApiServer, Limits

        server = ApiServer.create(app, Limits.of(self.options), name=self.name, grace=_GRACE)
        server.open_api = not self.tokens.enabled
        self._server = server
        self._serving = self.spawn(server.serve(sockets=[sock]), name=f"agentik-http:{self.name}")
        try:
            await server.wait_started(self._serving)
        except RuntimeError as exc:
            raise ConfigError(
                f"transports.{self.name}: the HTTP server did not start: {exc}"
            ) from None

    async def serve(self) -> None:
        await self.closed.wait()

    def stop_accepting(self) -> None:
        """The bot is stopping: new messages and event streams get 503 (and
        ``/ready`` too) at once; the streams open now go on until :meth:`aclose`,
        so their followers see the conversations end with the shutdown."""
        if self._ctx is not None:
            self._ctx.closing = True

    @property
    def open_connections(self) -> int:
        """HTTP connections open now (idle keep-alive ones included); 0 when not serving."""
        return 0 if self._server is None else len(self._server.server_state.connections)

    async def aclose(self) -> None:
        ctx, server, serving = self._ctx, self._server, self._serving
        if ctx is not None:
            ctx.closing = True
            # End every event stream: their responses finish cleanly.
            for stream in list(ctx.streams):
                await stream.subscription.aclose()
        if server is not None and not await server.stop(serving):
            log.warning("transport %s: the HTTP server did not stop cleanly", self.name)
        if self._a2a is not None:
            # The SDK's running tasks (their turns were stopped with the agent's).
            await self._a2a.aclose()
            self._a2a = None
        await self.cancel_tasks()
        self._server = self._serving = None
        self.closed.set()

    # -- output ---------------------------------------------------------------------------
    async def send(self, message: OutgoingMessage) -> None:
        """API clients read events, not bridge messages: nothing is sent this way."""
        log.debug("transport %s: ignoring %s for %s", self.name, message.kind, message.channel_key)


def _metrics_token(env_name: str | None, where: str, env: Mapping[str, str]) -> bytes | None:
    """The value of ``metrics_token_env``; errors name the key (never the value)."""
    if env_name is None:
        return None
    value = env.get(env_name, "").strip()
    if not value:
        raise ConfigError(
            f"{where}.metrics_token_env: environment variable {env_name} is not set or empty"
        )
    if len(value) < 16:
        raise ConfigError(
            f"{where}.metrics_token_env: the token in {env_name} is too short (use at least"
            " 16 characters, e.g. from `openssl rand -hex 32`)"
        )
    return value.encode("utf-8")
