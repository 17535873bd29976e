"""The soul: a persona text appended to the system prompt.

It comes from a file (``SOUL.md`` or any path) or an ``http(s)://`` URL,
fetched once when the agent starts.  None is used by default.  A soul that
cannot be read stops start-up with an error naming the file or URL: a bot
should not silently run with a different persona than configured.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError

__all__ = ["MAX_SOUL_BYTES", "fetch_soul", "is_url", "read_soul"]

#: Largest soul accepted (bytes).
MAX_SOUL_BYTES = 256 * 1024


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def read_soul(path: str | os.PathLike[str]) -> str:
    """The persona in file ``path`` (stripped)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"agent.soul: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    return _text(data, repr(str(path)))


def _text(data: bytes, where: str) -> str:
    """The persona ``data`` read from ``where``, checked for size and UTF-8."""
    if len(data) > MAX_SOUL_BYTES:
        raise ConfigError(f"agent.soul: {where} is larger than {MAX_SOUL_BYTES} bytes")
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"agent.soul: {where} is not UTF-8 text: {exc}") from None


#: Seconds to fetch a soul URL.
FETCH_SECONDS = 15.0


async def fetch_soul(url: str) -> str:
    """The persona served at ``url`` (a plain-text or Markdown document)."""
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_SECONDS)) as session,
            session.get(url) as resp,
        ):
            if resp.status != 200:
                raise ConfigError(f"agent.soul: {url} answered HTTP {resp.status}")
            data = await resp.content.read(MAX_SOUL_BYTES + 1)
    except ConfigError:
        raise
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise ConfigError(
            f"agent.soul: cannot fetch {url}: {type(exc).__name__}: {exc}".rstrip(": ")
        ) from None
    return _text(data, url)
