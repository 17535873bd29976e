"""Waiting for a person: the piece approvals and questions share.

A turn that needs a person — an approval (:mod:`agentik.core.approvals`) or
an answer (:mod:`agentik.core.questions`) — persists what it waits for,
then awaits a future that the person's decision or answer resolves.
:func:`wait_for_person` is that wait: the turn's time budget is paused
around it, the future is shielded (a decision that lands while the turn is
being cancelled is not lost), the deadline is wall-clock time (so a wait
taken over after a restart keeps its original deadline), a ``!stop``
(``interrupted()``) cancels what was waited for, and a shutdown leaves it
pending for the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["wait_for_person"]

T = TypeVar("T")


async def wait_for_person(
    fut: asyncio.Future[T],
    deadline: float,
    *,
    expire: Callable[[], Awaitable[T]],
    cancel: Callable[[], Awaitable[object]],
    interrupted: Callable[[], bool],
    paused: Callable[[bool], None] | None = None,
) -> T:
    """Wait for ``fut`` until ``deadline`` (a ``time.time()`` value).

    At the deadline ``expire()`` gives the outcome.  Cancelled while
    ``interrupted()`` says the turn was stopped, ``cancel()`` records that
    (then the cancellation goes on); cancelled otherwise (a shutdown),
    nothing is recorded.  ``paused(True/False)`` brackets the wait (the
    turn's time budget stops).
    """
    loop = asyncio.get_running_loop()
    if paused is not None:
        paused(True)
    try:
        try:
            async with asyncio.timeout_at(loop.time() + max(0.0, deadline - time.time())):
                return await asyncio.shield(fut)
        except TimeoutError:
            return await expire()
    except asyncio.CancelledError:
        if interrupted():
            with contextlib.suppress(Exception):
                await asyncio.shield(cancel())
        raise
    finally:
        if paused is not None:
            paused(False)
