"""Reusing the compiled methods of dataclasses from one start to the next.

On Python before 3.13, :func:`dataclasses.dataclass` writes the source of each method
it generates (``__init__``, ``__repr__``, ``__eq__``, a frozen class's ``__setattr__``,
``__delattr__`` and ``__hash__``) and compiles it with :func:`exec`, one call per
method: about 50 µs each.  agentik's modules define some 260 dataclasses (events,
records, settings; pydantic dataclasses go through the same code), about a thousand
methods: measured on Python 3.11, 100-110 ms of CPU at every start, a third of what
importing agentik and building a bot costs over the bare ``openai`` SDK (issue 31;
docs/operations.md, "What a started bot imports").

:func:`dataclass_code_cached` keeps the code objects compiled inside its block, keyed
by a digest (BLAKE2b, 16 bytes) of their source text, in one file beside the bytecode
cache (``__pycache__`` of this package, or under ``PYTHONPYCACHEPREFIX``), and the
next start reads them back instead of compiling again.  The methods are the very
same: the same source compiled with the same flags (none inherited), bound to the
class's globals as before; a class whose fields change has another source, so it is
compiled afresh.  Like a ``.pyc``, the file is only an optimisation, and trusted as
the ``.pyc`` files beside it are (whoever can write one can write the others): written
as bytecode is (not with ``PYTHONDONTWRITEBYTECODE``), atomically, and only when
something new was compiled; one that is unreadable, from another Python, or not ours
is ignored (and replaced); where it cannot be written, every start compiles as before.
It holds what the processes that wrote it used, and is cut back to what the last one
used once it holds more than twice that, so it does not grow with old versions of the
classes.

The code objects are held only while a block runs.  On the way out of the outermost
block (the file written if needed), the process lets them go: each method keeps its
own code, and the rest (the file's unused entries, the wrapper each method was compiled
in) was 1.3 MB of a started bot's memory (issue 31, fifteenth pass).  A later block
reads the file again (about 4 ms) on its first method not seen before.

The block replaces the name ``exec`` in the :mod:`dataclasses` module (the builtin is
what it finds otherwise) while it runs; nested blocks share the outermost one, and the
name is removed on the way out.  Python 3.13 and later compile a class's methods in
one call and are left alone.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import hashlib
import importlib.util
import marshal
import os
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["cache_path", "dataclass_code_cached"]

#: Whether the cache applies: Python 3.13 compiles a class's methods in one call.
ENABLED = sys.version_info < (3, 13)
#: The first bytes of the file: a format of ours, then the interpreter's bytecode
#: magic (marshal's code objects are only readable by the Python that wrote them).
_HEADER = b"agentik-dataclass-code-2\n" + importlib.util.MAGIC_NUMBER

_lock = threading.Lock()
_depth = 0


class _Cache:
    """The code objects of this process: read from the file once, and compiled."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        # Keyed by a digest of the source (16 bytes, not the ~400 of a method's text:
        # a smaller file, read faster, and less memory held).  ``known`` is the file's,
        # read on the first method ``used`` (this block's) does not have.
        self.known: dict[bytes, types.CodeType] | None = None
        self.used: dict[bytes, types.CodeType] = {}
        #: Every key this process used, across blocks: what the file is cut back to.
        self.used_keys: set[bytes] = set()
        self.compiled = 0  # since the file was last written

    def exec(self, source: Any, globals: Any = None, locals: Any = None) -> None:
        """:func:`exec` for the :mod:`dataclasses` module: ``source`` compiled once."""
        if not isinstance(source, str):
            builtins.exec(source, globals, locals)
            return
        key = hashlib.blake2b(source.encode(), digest_size=16).digest()
        code = self.used.get(key)
        if code is None:
            if self.known is None:
                self.known = _read(self.path) if self.path else {}
            code = self.known.get(key)
        if code is None:
            # dont_inherit: the flags of dataclasses' own exec() call (none), never this
            # module's (``from __future__ import annotations`` would turn the generated
            # methods' annotations into strings).
            code = compile(source, "<string>", "exec", dont_inherit=True)
            self.compiled += 1
        self.used[key] = code
        self.used_keys.add(key)
        builtins.exec(code, globals, locals)

    def save(self) -> None:
        """Write what this process used so far (and what the file held), if something
        was compiled since the file was read or written (as bytecode is: not with
        PYTHONDONTWRITEBYTECODE)."""
        if not self.path or not self.compiled or sys.dont_write_bytecode:
            return
        self.compiled = 0
        try:
            # What the file held too (another command, `agentik check`, uses other
            # classes: each would otherwise drop the other's), unless that is mostly
            # stale (classes of an older version): then only what this process used.
            # (``known`` was read: compiling means a method was missing from both.)
            kept = {**(self.known or {}), **self.used}
            if len(kept) > 2 * len(self.used_keys):
                kept = {key: code for key, code in kept.items() if key in self.used_keys}
            data = _HEADER + marshal.dumps(kept)
            folder = os.path.dirname(self.path)
            os.makedirs(folder, exist_ok=True)
            # A name of this process's own, then renamed over the file: a reader sees
            # the old file or the new one, never half of one; mode as a .pyc (umask).
            tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except (OSError, ValueError):
            pass  # a read-only install: the next start compiles, as without the cache

    def release(self) -> None:
        """Let the code objects go (the outermost block is over): the methods hold
        their own; the next block reads the file again if it meets a new one."""
        self.known = None
        self.used = {}


#: This process's cache, made by the first block (the file is read once).
_cache: _Cache | None = None


def cache_path() -> str | None:
    """Where the file lives: beside this package's bytecode (``None``: nowhere)."""
    try:
        # A source file that does not exist, so that no import ever reads the file.
        source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_dataclass_code.py")
        return importlib.util.cache_from_source(source)[: -len(".pyc")] + ".bin"
    except (NotImplementedError, ValueError):  # no cache tag (sys.implementation)
        return None


def _read(path: str) -> dict[bytes, types.CodeType]:
    try:
        with open(path, "rb") as f:
            data = f.read()
        if not data.startswith(_HEADER):
            return {}
        loaded = marshal.loads(data[len(_HEADER) :])
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {
        k: v for k, v in loaded.items() if isinstance(k, bytes) and isinstance(v, types.CodeType)
    }


@contextlib.contextmanager
def dataclass_code_cached() -> Iterator[None]:
    """Inside the block, dataclasses reuse the methods compiled at the last start
    (see the module's doc); the outermost block writes the file if it compiled any."""
    global _depth, _cache
    if not ENABLED:
        yield
        return
    with _lock:
        if _cache is None:
            _cache = _Cache(cache_path())
        cache = _cache
        _depth += 1
        if _depth == 1:
            dataclasses.exec = cache.exec  # type: ignore[attr-defined]
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            outermost = _depth == 0
            if outermost and getattr(dataclasses, "exec", None) == cache.exec:
                del dataclasses.exec  # type: ignore[attr-defined]
        if outermost:
            cache.save()
            with _lock:
                if _depth == 0:  # no block began meanwhile (another thread's)
                    cache.release()
