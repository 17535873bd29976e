"""Which requests a browser may make: ``Host`` and ``Origin`` checks.

Without tokens the API needs no login and listens on loopback, so what keeps
a web page the local user opens from driving it is this module:

- **DNS rebinding.**  A page on ``evil.example`` can re-point that name at
  ``127.0.0.1`` and then read the API as "its own" site; its requests still
  say ``Host: evil.example``.  Only loopback ``Host`` values (``127.0.0.1``,
  ``localhost``, ``[::1]``, any port) and ``allowed_hosts`` are answered.
- **Cross-site requests (CSRF).**  A page on another site can send a POST
  (a form, or ``fetch`` with ``no-cors``) without the API's consent; browsers
  mark it with an ``Origin`` header.  A request whose ``Origin`` is neither the
  server's own (the ``Host`` it names, or a loopback origin on this port),
  nor in ``allowed_origins`` / ``cors_origins`` is refused, whatever its
  method (event streams and reads included).

With tokens, a browser cannot send the token on another site's behalf, so
both checks only run when their allow-list is set.  ``/health`` and ``/ready`` are never
checked (it says nothing, and load balancers probe it under any name).
Refusals are 403 JSON errors: ``host_not_allowed``, ``origin_not_allowed``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .hosts import is_loopback, parse_authority, parse_origin
from .settings import HttpSettings

__all__ = ["Guard", "GuardMiddleware", "is_loopback", "parse_authority", "parse_origin"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Guard:
    """The Host and Origin policy of one server."""

    check_host: bool
    any_host: bool
    hosts: frozenset[tuple[str, int | None]]
    check_origin: bool
    origins: frozenset[tuple[str, str, int]]

    @classmethod
    def from_settings(cls, settings: HttpSettings, *, tokens: bool) -> Guard:
        """The policy for ``settings``; ``tokens``: requests must carry one."""
        hosts = {parse_authority(h) for h in settings.allowed_hosts if h != "*"}
        origins = {
            parse_origin(o) for o in [*settings.allowed_origins, *settings.cors_origins] if o != "*"
        }
        return cls(
            check_host=not tokens or bool(settings.allowed_hosts),
            any_host="*" in settings.allowed_hosts,
            hosts=frozenset(h for h in hosts if h is not None),
            check_origin=not tokens or bool(settings.allowed_origins),
            origins=frozenset(o for o in origins if o is not None),
        )

    def host_allowed(self, host_header: str | None) -> bool:
        if not self.check_host or self.any_host or host_header is None:
            # No Host at all: an HTTP/1.0 client, never a browser.
            return True
        parsed = parse_authority(host_header)
        if parsed is None:
            return False
        host, port = parsed
        if is_loopback(host):
            return True
        return (host, port) in self.hosts or (host, None) in self.hosts

    def origin_allowed(self, origin: str | None, host_header: str | None, port: int | None) -> bool:
        if not self.check_origin or origin is None:
            return True
        parsed = parse_origin(origin)
        if parsed is None:  # "null", or garbage
            return False
        if parsed in self.origins:
            return True
        _, host, origin_port = parsed
        if is_loopback(host) and origin_port == port:
            return True
        # Same origin: the page was served by the host this request names
        # (possibly through a TLS proxy, so the scheme may differ).
        own = parse_authority(host_header) if host_header is not None else None
        if own is None:
            return False
        own_host, own_port = own
        return host == own_host and (
            own_port == origin_port or (own_port is None and origin_port in (80, 443))
        )


def _single(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> tuple[int, str | None]:
    count, value = 0, None
    for key, raw in headers:
        if key.lower() == name:
            count += 1
            value = raw.decode("latin-1")
    return count, value


class GuardMiddleware:
    """ASGI middleware refusing what :class:`Guard` does not allow, before any route runs."""

    #: Distinct refused values logged (once each), so a hostile page cannot flood the log.
    LOG_DISTINCT = 32

    def __init__(self, app: Any, guard: Guard) -> None:
        self.app = app
        self.guard = guard
        self._logged: set[tuple[str, str]] = set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in ("/health", "/ready"):
            refusal = self._refusal(scope)
            if refusal is not None:
                await _send_error(send, 403, *refusal)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Any) -> tuple[str, str] | None:
        headers = scope.get("headers") or []
        hosts, host = _single(headers, b"host")
        origins, origin = _single(headers, b"origin")
        if hosts > 1 or not self.guard.host_allowed(host):
            shown = host if hosts == 1 else None
            self._note("Host", shown)
            return (
                "host_not_allowed",
                f"this server does not answer to Host {_shown(shown)}: it answers to loopback"
                " names (127.0.0.1, localhost, [::1]) and its allowed_hosts",
            )
        server = scope.get("server")
        port = server[1] if server else None
        if origins > 1 or not self.guard.origin_allowed(origin, host, port):
            shown = origin if origins == 1 else None
            self._note("Origin", shown)
            return (
                "origin_not_allowed",
                f"requests from web pages of origin {_shown(shown)} are refused: only the"
                " server's own pages and its allowed_origins may call this API",
            )
        return None

    def _note(self, what: str, value: str | None) -> None:
        key = (what, value or "")
        if key in self._logged or len(self._logged) >= self.LOG_DISTINCT:
            return
        self._logged.add(key)
        log.warning(
            "HTTP API: refused a request with %s %s (add it to allowed_%ss if it is yours)",
            what,
            _shown(value),
            what.lower(),
        )


def _shown(value: str | None) -> str:
    if value is None:
        return "(several)"
    return repr(value[:100] + ("…" if len(value) > 100 else ""))


async def _send_error(send: Any, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
