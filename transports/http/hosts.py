"""Parsing ``Host`` and ``Origin`` values: what the guard checks and the settings validate.

Below both :mod:`.guard` (which answers requests by them) and :mod:`.settings`
(which validates ``allowed_hosts`` and ``allowed_origins`` with them), so
neither imports the other.
"""

from __future__ import annotations

import ipaddress
import re

__all__ = ["is_loopback", "parse_authority", "parse_origin"]

_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_.-]{0,252})")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def parse_authority(value: str) -> tuple[str, int | None] | None:
    """``host[:port]`` of a ``Host`` header or an origin, lower-cased; ``None`` if malformed.

    ``host`` is a name, an IPv4 address, or ``[IPv6]`` (brackets kept).
    """
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        if end < 0:
            return None
        host, rest = v[: end + 1], v[end + 1 :]
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return None
    else:
        host, sep, port = v.partition(":")
        rest = sep + port
        if not _NAME.fullmatch(host):
            return None
    if not rest:
        return host, None
    digits = rest[1:]
    if not rest.startswith(":") or not (digits.isascii() and digits.isdigit()) or len(digits) > 5:
        return None
    number = int(digits)
    return (host, number) if number <= 65535 else None


def parse_origin(value: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an ``Origin`` value (default port filled in), or ``None``.

    ``null`` (sandboxed frames, ``file:`` pages) and anything with a path are ``None``.
    """
    scheme, sep, authority = value.strip().lower().partition("://")
    if not sep or scheme not in _DEFAULT_PORTS or not authority or "/" in authority:
        return None
    parsed = parse_authority(authority)
    if parsed is None:
        return None
    host, port = parsed
    return scheme, host, _DEFAULT_PORTS[scheme] if port is None else port


def is_loopback(host: str) -> bool:
    """Whether a parsed host (see :func:`parse_authority`) names this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
