"""Handing memory back to the system after idle conversations are released.

When a conversation leaves memory (its channel was released, its HTTP client
went away), what it held is freed — but glibc's allocator keeps freed memory
in its arenas for later use instead of returning it, so the process's RSS
stays near its peak (the soak benchmark measured ~20 MB "free but kept" after
an idle phase).  :class:`MemoryTrim` asks glibc to return it
(``malloc_trim(0)``) soon after a release, at most once per ``interval``
seconds, in a worker thread (the event loop never waits for it).  Other C
libraries (musl, macOS) have no such call: there it does nothing.

``AGENTIK_MALLOC_TRIM=0`` in the environment switches it off (an operator
who measures the allocator's own behaviour, or tunes glibc with
``MALLOC_TRIM_THRESHOLD_``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable

__all__ = ["DEFAULT_INTERVAL", "MemoryTrim", "malloc_trim"]

log = logging.getLogger(__name__)

#: Seconds between two trims at most (the agent's default ``memory_trim``).
DEFAULT_INTERVAL = 10.0
#: Seconds after a release before its trim: releases come in bursts (a reaper
#: releasing many idle channels at once), one trim follows them all.
_SETTLE = 1.0


def glibc() -> bool:
    """Whether the C library is glibc (read without loading ``ctypes``)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError):
        return False


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or ``None`` when the C library is not glibc."""
    if not glibc():
        return None
    import ctypes  # only where there is something to trim: it costs start-up time

    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def _rss() -> int:
    """The process's resident set size in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class MemoryTrim:
    """Trims the C heap (glibc) soon after memory was released; see the module docstring.

    ``interval``: seconds between two trims at most (``None`` or ``0``: never trim).
    :attr:`count` is how many trims ran, :attr:`returned` about how many bytes of
    RSS they gave back in all.
    """

    __slots__ = (
        "_active",
        "_handle",
        "_last",
        "_running",
        "_trim",
        "count",
        "interval",
        "returned",
    )

    def __init__(self, interval: float | None = DEFAULT_INTERVAL) -> None:
        off = os.environ.get("AGENTIK_MALLOC_TRIM", "").strip().lower() in ("0", "off", "no")
        self._active = not off and bool(interval) and glibc()
        # glibc's function, looked up by the first release (ctypes loads then).
        self._trim: Callable[[int], int] | None = None
        self.interval = float(interval or 0)
        #: Trims done so far.
        self.count = 0
        #: About how many bytes of RSS the trims gave back, in all.
        self.returned = 0
        self._last = -float("inf")
        self._handle: asyncio.TimerHandle | None = None
        self._running = False

    @property
    def active(self) -> bool:
        """Whether trims happen here (glibc, not switched off)."""
        return self._active

    @property
    def due(self) -> float | None:
        """Seconds until the next trim (``None``: none is scheduled)."""
        handle = self._handle
        if handle is None:
            return None
        return max(0.0, handle.when() - self._loop_time())

    @staticmethod
    def _loop_time() -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return time.monotonic()

    def released(self) -> None:
        """Memory was released (a conversation left memory): trim soon, unless a
        trim is already due or ran less than :attr:`interval` seconds ago (then
        at that point).  Call it on the event loop."""
        if not self._active or self._handle is not None or self._running:
            return
        if self._trim is None:
            self._trim = malloc_trim()
            if self._trim is None:
                self._active = False
                return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        delay = max(_SETTLE, self._last + self.interval - time.monotonic())
        self._handle = loop.call_later(delay, self._start, loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = None
        if self._trim is None or loop.is_closed():
            return
        self._running = True
        try:
            done = loop.run_in_executor(None, self._run)
        except RuntimeError:  # the executor is shut down: the loop is closing
            self._running = False
            return
        done.add_done_callback(self._ran)

    def _run(self) -> int:
        """In a worker thread: trim, and say how much RSS fell."""
        trim = self._trim
        if trim is None:
            return 0
        before = _rss()
        trim(0)
        return max(0, before - _rss())

    def _ran(self, done: asyncio.Future[int]) -> None:
        self._running = False
        self._last = time.monotonic()
        if done.cancelled():
            return
        exc = done.exception()
        if exc is not None:
            log.warning("malloc_trim failed: %s", exc)
            return
        self.count += 1
        self.returned += done.result()
        log.debug("malloc_trim gave back %d bytes", done.result())

    def close(self) -> None:
        """Cancel a trim that is due (the agent is closing)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            with contextlib.suppress(Exception):
                handle.cancel()
