"""Pausing Python's cyclic garbage collector while a large import graph loads.

Importing agentik (or the openai SDK, uvicorn) creates tens of thousands of objects
that live as long as the process: modules, functions, classes, dataclasses'
generated methods, pydantic schemas.  Every 700 allocations the collector walks the
young objects, every tenth walk the older ones, and now and then all of them, looking
for cycles that cannot be there yet: while ``agentik.bot.cli`` imported (the core and
the bot's modules) those walks took 50-60 ms of CPU, about a twelfth of the import
(124 collections, one of them full), and collected nothing.

:func:`collector_paused` pauses it for a ``with`` block and restores it as it was
(a caller that disabled the collector keeps it so; nested blocks are free).  With
``freeze`` (the entry points, :mod:`agentik.bot.cli` and :mod:`agentik.bot.app`,
whose import means a bot is about to be built, and :class:`~agentik.bot.app.Bot`
freezes what exists after its first build anyway), what the block created moves to
the permanent generation, never walked again; without it, the first collections
after the block walk it all (the first one took 16 ms).  ``agentik.core`` pauses
the collector while it imports too, without freezing: a library does not freeze
its caller's objects.

This module imports nothing of agentik, so that an entry point can pause the
collector before ``agentik.core`` loads.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["collector_paused"]


@contextlib.contextmanager
def collector_paused(*, freeze: bool = False) -> Iterator[None]:
    """Pause the cyclic garbage collector inside the block (restored as it was).

    With ``freeze``, what exists at the end moves to the permanent generation
    (:func:`gc.freeze`), for a program that owns its process (the ``agentik``
    command): otherwise the first collections after the block walk everything the
    block created (it is all still young), and some again as it ages.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        gc.enable()
