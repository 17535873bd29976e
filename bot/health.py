"""Running as a service: the health listener, supervision settings, sd_notify.

* :class:`HealthSettings` (``[health]``) and :class:`HealthServer`: an optional
  listener on its own TCP port or unix socket serving ``/health`` (liveness),
  ``/ready`` (readiness, 503 when not ready) and ``/status`` (what ``agentik
  status`` prints), for bots without the HTTP transport or for probes that
  should not reach the API.  Its routes are a table (:meth:`HealthServer.route`)
  so more can be added (``/metrics``).  It is served by the HTTP transport's
  hardened server (:mod:`agentik.transports.http.server`: head deadline, head
  limits, connection cap, quiet accept backoff).
* :class:`SupervisionSettings` (``[supervision]``): how the bot restarts a
  transport whose task failed (see :meth:`agentik.bot.app.Bot.serve`).
* :func:`sd_notify`: systemd's readiness protocol, one datagram on
  ``$NOTIFY_SOCKET`` (``READY=1``, ``STATUS=…``, ``STOPPING=1``); no dependency.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentik.core.errors import ConfigError
from agentik.core.settings import Blank

__all__ = [
    "HealthServer",
    "HealthSettings",
    "SupervisionSettings",
    "parse_listen",
    "sd_notify",
]

log = logging.getLogger(__name__)

#: Seconds in-flight requests get when the listener closes.
_GRACE = 2
#: The listener's connection limits (:class:`agentik.transports.http.server.Limits`,
#: made when it starts): probes and ``agentik status`` need few connections, small heads.
_LIMITS: dict[str, Any] = {
    "header_timeout": 10.0, "max_header_bytes": 8192, "max_headers": 50,
    "max_connections": 32, "keepalive_timeout": 5, "backlog": 64,
}  # fmt: skip


class HealthSettings(BaseModel):
    """``[health]``: the health listener and readiness."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Serve ``/health``, ``/ready`` and ``/status`` here: ``"127.0.0.1:9090"``,
    #: ``"[::1]:9090"`` or ``"unix:/run/agentik/health.sock"`` (a path relative to
    #: the configuration file's folder).  Unset: no listener (the HTTP transport,
    #: when enabled, serves ``/health``, ``/ready`` and ``/status`` itself).
    listen: Blank = None
    #: The environment variable holding a token the listener asks for
    #: (``Authorization: Bearer <token>``) on every route but ``/health`` and ``/ready``.
    token_env: Blank = None
    #: A file holding that token instead (relative to the configuration file).
    token_file: Blank = None
    #: Seconds a transport may be starting or reconnecting and still count as
    #: ready (0: ``/ready`` answers 503 as soon as a connection is lost).
    ready_grace: float = Field(0.0, ge=0)

    @field_validator("listen")
    @classmethod
    def _valid_listen(cls, value: str | None) -> str | None:
        if value is not None:
            parse_listen(value)
        return value


class SupervisionSettings(BaseModel):
    """``[supervision]``: restarting a transport whose task failed; stopping in time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Restarts allowed within ``window`` seconds; one more failure marks the
    #: transport ``failed`` (the others keep running).  0: never restart.
    max_restarts: int = Field(5, ge=0)
    #: Seconds over which failures are counted.
    window: float = Field(300.0, gt=0)
    #: Seconds before the first restart; doubled after each failure ...
    backoff_initial: float = Field(1.0, gt=0)
    #: ... up to this.
    backoff_max: float = Field(60.0, gt=0)
    #: Seconds a stop (SIGTERM) may take in all, reflection included: keep it below
    #: systemd's ``TimeoutStopSec`` (30 in ``contrib/agentik.service``).
    stop_timeout: float = Field(25.0, gt=0)
    #: Of those, seconds running turns get to finish before they are cut (their
    #: partial answers kept, delivered from the outbox after the next start).
    drain_timeout: float = Field(10.0, ge=0)

    def backoff(self, failures: int) -> float:
        """The pause before restart number ``failures`` (1-based)."""
        return float(min(self.backoff_max, self.backoff_initial * 2 ** max(0, failures - 1)))


def parse_listen(value: str) -> tuple[str, str | int]:
    """``("unix", path)`` or ``(host, port)`` from a ``listen`` value; ConfigError if neither."""
    if value.startswith("unix:"):
        path = value[5:]
        if not path:
            raise ValueError('a unix socket needs a path: "unix:/run/agentik/health.sock"')
        return "unix", path
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f'expected "host:port" or "unix:/path/to/socket", got {value!r}')
    return host, int(port)


def sd_notify(message: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``message`` (``READY=1``, ``STATUS=…``) to systemd's ``$NOTIFY_SOCKET``.

    Returns whether it was sent; no socket set is not an error (not under systemd).
    """
    env = os.environ if environ is None else environ
    path = env.get("NOTIFY_SOCKET")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode("utf-8", "replace"))
    except OSError as exc:
        log.debug("sd_notify to %s failed: %s", path, exc)
        return False
    return True


Handler = Callable[[Any], Awaitable[Any]]


class HealthServer:
    """The health listener (see the module docstring).

    ``routes`` maps a path to ``(handler, public)``: a Starlette request handler
    returning a response; ``public`` routes need no token.  Add routes with
    :meth:`route` (before or after :meth:`start`).
    """

    def __init__(
        self,
        listen: str,
        *,
        health: Handler,
        ready: Handler,
        status: Handler,
        token: str | None = None,
        name: str = "health",
    ) -> None:
        self.listen = listen
        self.name = name
        self._token = token.encode() if token else None
        self.routes: dict[str, tuple[Handler, bool]] = {}
        self.route("/health", health, public=True)
        self.route("/ready", ready, public=True)
        self.route("/status", status)
        #: ``http://host:port`` or ``unix:/path`` once listening.
        self.address: str | None = None
        self._unix_path: str | None = None
        self._server: Any = None
        self._serving: asyncio.Task[Any] | None = None

    def route(self, path: str, handler: Handler, *, public: bool = False) -> None:
        """Serve ``GET path`` with ``handler``; without ``public`` the token is needed."""
        self.routes[path] = (handler, public)

    # -- serving -------------------------------------------------------------------------
    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        from starlette.requests import Request
        from starlette.responses import JSONResponse

        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        found = self.routes.get(scope["path"])
        if found is None:
            response: Any = JSONResponse(
                {"error": {"code": "not_found", "message": "no such path"}}, status_code=404
            )
        elif request.method not in ("GET", "HEAD"):
            response = JSONResponse(
                {"error": {"code": "method_not_allowed", "message": "only GET"}},
                status_code=405,
                headers={"Allow": "GET, HEAD"},
            )
        elif not found[1] and self._token is None and self._rebound(scope):
            response = JSONResponse(
                {
                    "error": {
                        "code": "host_not_allowed",
                        "message": "without a token this listener answers only requests"
                        " addressed to an IP address or localhost (set [health] token_env"
                        " to reach it by name)",
                    }
                },
                status_code=403,
            )
        elif not found[1] and not self.authorized(request.headers.get("authorization")):
            response = JSONResponse(
                {"error": {"code": "unauthorized", "message": "a valid bearer token is required"}},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="agentik"'},
            )
        else:
            try:
                response = await found[0](request)
            except Exception:
                log.exception("health listener: %s failed", scope["path"])
                response = JSONResponse(
                    {"error": {"code": "internal_error", "message": "see the bot's log"}},
                    status_code=500,
                )
        await response(scope, receive, send)

    def _rebound(self, scope: dict[str, Any]) -> bool:
        """Whether a request may come from a web page through DNS rebinding: on TCP,
        a ``Host`` that is a name other than ``localhost``.  A page on ``evil.example``
        can point its name at this listener, and its requests still say
        ``Host: evil.example``; it cannot make a browser send an IP address there."""
        if self._unix_path is not None:
            return False  # no browser reaches a unix socket
        from agentik.transports.http.guard import is_loopback, parse_authority

        hosts = [v.decode("latin-1") for k, v in scope.get("headers") or [] if k == b"host"]
        if not hosts:
            return False  # HTTP/1.0 without Host: never a browser
        if len(hosts) > 1:
            return True
        parsed = parse_authority(hosts[0])
        if parsed is None:
            return True
        host = parsed[0]
        if is_loopback(host) or host.startswith("["):
            return False
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return True
        return False

    def authorized(self, header: str | None) -> bool:
        if self._token is None:
            return True
        scheme, _, value = (header or "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            value.strip().encode(), self._token
        )

    def _bind(self) -> socket.socket:
        try:
            host, port = parse_listen(self.listen)
        except ValueError as exc:
            raise ConfigError(f"health.listen: {exc}") from None
        try:
            if host == "unix":
                path = str(port)
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISSOCK(os.stat(path).st_mode):
                        os.unlink(path)  # left by a killed process
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.bind(path)
                    os.chmod(path, 0o660)
                    sock.listen(_LIMITS["backlog"])
                except BaseException:
                    sock.close()
                    raise
                self._unix_path = path
                self.address = f"unix:{path}"
                return sock
            from agentik.transports.http.server import listen_tcp

            sock = listen_tcp(host, int(port), _LIMITS["backlog"])
        except OSError as exc:
            raise ConfigError(
                f"health.listen: cannot listen on {self.listen}: {exc.strerror or exc}"
            ) from None
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.address = f"http://{shown}:{bound_port}"
        return sock

    async def start(self) -> None:
        """Listen; a ConfigError names ``health.listen`` when the address cannot be used."""
        from agentik.transports.http.server import ApiServer, Limits

        sock = self._bind()
        sock.setblocking(False)
        server = ApiServer.create(self._app, Limits(**_LIMITS), name=self.name, grace=_GRACE)
        self._server = server
        self._serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        try:
            await server.wait_started(self._serving)
        except RuntimeError as exc:
            sock.close()
            raise ConfigError(f"health.listen: the listener did not start: {exc}") from None
        log.info("health listener on %s", self.address)

    async def aclose(self) -> None:
        server, serving = self._server, self._serving
        self._server = self._serving = None
        if server is not None and serving is not None and not await server.stop(serving):
            serving.cancel()
            with contextlib.suppress(BaseException):
                await serving
        if self._unix_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._unix_path)
            self._unix_path = None


def load_token(settings: HealthSettings, *, resolve: Callable[[str], str],
               environ: Mapping[str, str] | None = None) -> str | None:  # fmt: skip
    """The listener's token from ``token_env`` or ``token_file`` (errors name the key)."""
    env = os.environ if environ is None else environ
    if settings.token_env:
        value = env.get(settings.token_env, "").strip()
        if not value:
            raise ConfigError(
                f"health.token_env: the environment variable {settings.token_env} is not set"
            )
        return value
    if settings.token_file:
        path = resolve(settings.token_file)
        try:
            with open(path, encoding="utf-8") as f:
                value = f.read().strip()
        except OSError as exc:
            raise ConfigError(f"health.token_file: cannot read {path}: {exc.strerror}") from None
        if not value:
            raise ConfigError(f"health.token_file: {path} is empty")
        return value
    return None
