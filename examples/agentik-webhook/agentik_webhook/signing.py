"""Request signing, the same both ways: HMAC-SHA256 over ``"<timestamp>." + body``.

A signed request carries two headers::

    X-Agentik-Timestamp: 1718000000
    X-Agentik-Signature: sha256=<hex digest>

Including the timestamp in what is signed lets the receiver refuse old
requests (replays).  Use :func:`sign` to call the bot, :func:`verify` to
check the answers it POSTs to you.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

__all__ = ["SIGNATURE_HEADER", "TIMESTAMP_HEADER", "sign", "verify"]

TIMESTAMP_HEADER = "X-Agentik-Timestamp"
SIGNATURE_HEADER = "X-Agentik-Signature"


def _digest(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def sign(secret: str, body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
    """The headers that sign ``body`` with ``secret``."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    return {TIMESTAMP_HEADER: ts, SIGNATURE_HEADER: _digest(secret, ts, body)}


def verify(
    secret: str, body: bytes, headers: Mapping[str, str], *, max_skew: float = 300.0
) -> str | None:
    """``None`` if ``headers`` sign ``body`` with ``secret`` recently enough, else why not."""
    ts = headers.get(TIMESTAMP_HEADER, "")
    given = headers.get(SIGNATURE_HEADER, "")
    if not ts or not given:
        return f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER}"
    try:
        age = abs(time.time() - int(ts))
    except ValueError:
        return f"{TIMESTAMP_HEADER} is not a number"
    if age > max_skew:
        return f"{TIMESTAMP_HEADER} is {age:.0f}s away from now (the limit is {max_skew:g}s)"
    if not hmac.compare_digest(given, _digest(secret, ts, body)):
        return "the signature does not match"
    return None
