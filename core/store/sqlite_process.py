"""The store's end of the SQLite writer process (:mod:`.sqlite_writer`).

:class:`WriterProcess` starts ``python -I -S`` on :mod:`.sqlite_writer` (no
``agentik`` import, no site packages: about 10 ms), sends it the writing
connection's settings, then batches; it reads each batch's results on the
event loop (a pipe in the selector: no thread, so no GIL hand-off) and calls
the batch's ``done`` there.

If the process dies, the batch in flight fails with a :class:`StoreError`
that says so (it may or may not have committed: the error cannot know), and
:attr:`WriterProcess.alive` turns false: the store then writes from its thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import marshal
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from ..errors import StoreError
from . import sqlite_writer

__all__ = ["WriterProcess"]

log = logging.getLogger(__name__)

Done = Callable[[Any, BaseException | None], None]

_HEADER = sqlite_writer.HEADER  # the frames' length prefix, as the process writes it
#: Seconds the process may take to open the database (it waits out another
#: process's lock for ``busy_timeout``), and to finish its last batch when closed.
_START_WAIT = 30.0
_STOP_WAIT = 30.0
#: glibc's malloc in the process: a batch of large rows (20 KB tool outputs, up to
#: ``max_batch`` of them) is freed once written, and these give it back to the
#: system rather than keeping the high-water mark for good (about 37 MB after a
#: burst of 512 such rows without them; see docs/operations.md, "The database").
_MALLOC = {
    "MALLOC_MMAP_THRESHOLD_": "65536",  # a fixed threshold: no dynamic raise after a free
    "MALLOC_TRIM_THRESHOLD_": "131072",
    "MALLOC_ARENA_MAX": "1",
}
#: Reaping the processes that died on their own (the loop keeps weak references).
_REAPING: set[asyncio.Task[None]] = set()


def _command() -> list[str]:
    here = os.path.dirname(os.path.abspath(sqlite_writer.__file__))
    # Appended, so the standard library's modules come first (this folder has a
    # ``copy.py`` of its own); the module is imported from its own file, not as
    # part of the package, whose ``__init__`` would import the rest of agentik.
    code = f"import sys; sys.path.append({here!r}); import sqlite_writer; sqlite_writer.main()"
    return [sys.executable, "-I", "-S", "-c", code]


class _Replies(asyncio.Protocol):
    """Reads the process's frames; each one answers the oldest batch sent."""

    def __init__(self, owner: WriterProcess) -> None:
        self._owner = owner
        self._buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        while len(buf) >= _HEADER:
            size = int.from_bytes(buf[:_HEADER], "big")
            if len(buf) < _HEADER + size:
                break
            try:
                value = marshal.loads(memoryview(buf)[_HEADER : _HEADER + size])
            except Exception as exc:
                value = (None, ("error", "StoreError", f"a reply that is not data: {exc!r}", 0, 0))
            del buf[: _HEADER + size]
            self._owner._reply(value)

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner._lost()


class WriterProcess:
    """One writer process for one database file."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        self._write: asyncio.WriteTransport | None = None
        self._read: asyncio.ReadTransport | None = None
        self._waiting: collections.deque[Done] = collections.deque()
        self._ended = asyncio.get_running_loop().create_future()
        self.alive = True

    @property
    def pid(self) -> int:
        return self._proc.pid

    @classmethod
    async def start(cls, settings: dict[str, Any]) -> WriterProcess:
        """Start it, open the database there; raises what opening it raised."""
        # A vfork and exec (about a millisecond): not worth a thread, and an asyncio
        # subprocess would read its replies in a task, a task switch a batch.
        proc = subprocess.Popen(  # noqa: ASYNC220
            _command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            env={**os.environ, **_MALLOC},
        )
        self = cls(proc)
        try:
            loop = asyncio.get_running_loop()
            assert proc.stdin is not None and proc.stdout is not None
            self._write, _ = await loop.connect_write_pipe(asyncio.Protocol, proc.stdin)
            self._read, _ = await loop.connect_read_pipe(lambda: _Replies(self), proc.stdout)
            opened = loop.create_future()
            self._send(settings, lambda value, exc: opened.set_result(exc or value))
            async with asyncio.timeout(_START_WAIT):
                error = await opened
            if error is not None:
                raise error
        except BaseException:
            await self.stop(kill=True)
            raise
        return self

    def _send(self, value: Any, done: Done) -> None:
        if not self.alive or self._write is None:
            done(None, StoreError("the SQLite writer process has exited"))
            return
        data = sqlite_writer.frame(value)
        self._waiting.append(done)
        self._write.write(data)

    def submit(self, items: list[tuple[Any, ...]], restore: str | None, done: Done) -> bool:
        """Run a batch there; ``done(results, None)`` (a job that failed alone: its
        result is a :class:`~.sqlite_writer.Failed`) or ``done(None, error)``.  False
        if the batch is not plain data (a subclass of ``str`` somewhere, say): the
        caller runs it in its thread."""
        try:
            self._send((items, restore), done)
        except ValueError:
            return False
        return True

    def _reply(self, value: Any) -> None:
        if not self._waiting:
            log.error("SQLite writer process: a reply nobody asked for")
            return
        done = self._waiting.popleft()
        if value is None:  # (the database opened)
            done(None, None)
        elif isinstance(value, tuple) and value and value[0] == "error":
            done(None, sqlite_writer.error_in(value))
        elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple):
            done(None, sqlite_writer.error_in(value[1]))  # the whole batch failed
        elif isinstance(value, tuple) and len(value) == 2:
            results, failures = value
            for index, error in failures.items():
                results[index] = sqlite_writer.Failed(sqlite_writer.error_in(error))
            done(results, None)
        else:
            done(None, StoreError(f"the SQLite writer process answered {type(value).__name__}"))

    def _lost(self) -> None:
        was_alive = self.alive
        self.alive = False
        if not self._ended.done():
            self._ended.set_result(None)
        if self._waiting:
            code = self._proc.poll()
            err = StoreError(
                "the SQLite writer process exited"
                + (f" (exit status {code})" if code is not None else "")
                + "; the batch it was writing may or may not have committed"
            )
            while self._waiting:
                self._waiting.popleft()(None, err)
        if was_alive and not self._closing:
            log.error("the SQLite writer process exited; writing from a thread from now on")
            task = asyncio.get_running_loop().create_task(self.stop())  # no zombie left
            _REAPING.add(task)
            task.add_done_callback(_REAPING.discard)

    _closing = False

    async def stop(self, *, kill: bool = False) -> None:
        """Close its pipe (it ends after the batch it is writing) and reap it."""
        self._closing = True
        if kill:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
        if self._write is not None:
            self._write.close()
        elif self._proc.stdin is not None:
            self._proc.stdin.close()
        if self._read is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_STOP_WAIT):
                    await asyncio.shield(self._ended)
        delay = 0.001
        for _ in range(200):
            if self._proc.poll() is not None:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        else:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await asyncio.to_thread(self._proc.wait)
        if self._read is not None:
            self._read.close()
        elif self._proc.stdout is not None:
            self._proc.stdout.close()
        self.alive = False
