"""Scheduled jobs that run once across the workers sharing a database.

Each *firing* of a job is named by a **slot** that every worker computes alike, and
runs only on the worker that claims it (:meth:`Store.job_claim
<agentik.core.store.base.Store.job_claim>`: one insert of ``(job, slot)`` that only
one can win).  :func:`run_once` claims, runs and records the outcome; the claims
are the job's history (:meth:`Store.job_history`), pruned after
:data:`KEEP_SECONDS`.

How slots are chosen (docs/operations.md, "Notifications and scheduled jobs"):

* an **interval** job fires at the boundaries of its interval (:func:`interval_slot`:
  ``floor(time / interval)``), so every worker wakes for the same slot;
* a job that follows **data** is named by what it covers (idle reflection: the
  conversation and the last audit-log id reflected on);
* **start-up** runs are named by the :data:`STARTUP_WINDOW` they start in: workers
  started together (a deploy) run it once;
* a firing one worker decided alone (an operator's trigger, a worker's own turn
  count) is its own slot (:func:`own_slot`): it always runs, there.

A firing whose job failed (or was cancelled) may be claimed again by whoever fires
the same slot; one whose worker died mid-job may be, once it is ``stale_after``
seconds old.  So a firing runs exactly once when nothing dies, and at least once
when a worker dies between the job's effect and its record (only jobs that fire a
slot again are retried at all: an interval's missed firing waits for the next).

On an engine one process uses (SQLite, the in-memory store) the same path runs:
every claim succeeds once.  An engine without claims (a plugin's, without the
``jobs`` capability) runs every firing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..store.base import Store

__all__ = [
    "KEEP_SECONDS",
    "STARTUP_WINDOW",
    "WORKER",
    "interval_slot",
    "next_interval",
    "own_slot",
    "run_once",
    "startup_slot",
]

log = logging.getLogger(__name__)

#: This process, as claims name it: host, pid and a random part (a pid is reused).
WORKER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
#: Claims older than this are pruned (30 days).
KEEP_SECONDS = 30 * 86_400
#: Workers started within the same window of this many seconds share one start-up run.
STARTUP_WINDOW = 600.0
#: Prune at most once an hour per store.
_PRUNE_EVERY = 3600.0
_DETAIL_MAX = 500


def interval_slot(interval: float, now: float | None = None) -> str:
    """The slot of an interval job at ``now`` (default: the wall clock): the number of
    the interval it falls in, the same on every worker."""
    t = time.time() if now is None else now
    return f"every{interval:g}:{math.floor(t / interval)}"


def next_interval(interval: float, now: float | None = None) -> tuple[float, str]:
    """The seconds from ``now`` to the start of the next interval (every worker wakes
    then) and that interval's slot (named here: a clock read on waking might still
    be a hair before the boundary)."""
    t = time.time() if now is None else now
    n = math.floor(t / interval) + 1
    return max(0.0, n * interval - t), f"every{interval:g}:{n}"


def startup_slot(now: float | None = None, window: float = STARTUP_WINDOW) -> str:
    """The slot of a start-up run: the :data:`STARTUP_WINDOW` it starts in."""
    t = time.time() if now is None else now
    return f"start:{math.floor(t / window)}"


def own_slot(kind: str = "own") -> str:
    """A slot no other worker computes: a firing this worker decided alone."""
    return f"{kind}:{WORKER}:{uuid.uuid4().hex[:8]}"


def _detail(value: Any) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else repr(value)
    return text[:_DETAIL_MAX]


#: When each store's old job claims were last pruned (by this process).
_pruned: weakref.WeakKeyDictionary[Store, float] = weakref.WeakKeyDictionary()


async def _prune(store: Store, now: float) -> None:
    if now - _pruned.get(store, 0.0) < _PRUNE_EVERY:
        return
    _pruned[store] = now
    try:
        await store.job_prune(now - KEEP_SECONDS)
    except Exception as exc:
        log.warning("pruning old job claims failed: %s", exc)


async def run_once(
    store: Store,
    name: str,
    slot: str,
    fn: Callable[[], Awaitable[Any]],
    *,
    worker: str = WORKER,
    stale_after: float | None = None,
) -> bool:
    """Run ``fn()`` if this worker claims ``slot`` of job ``name``; whether it ran here.

    The outcome is recorded (ok, or the error) and ``fn``'s exception re-raised; a
    cancelled ``fn`` is recorded as failed (the slot may be claimed again).
    ``stale_after``: see :meth:`Store.job_claim <agentik.core.store.base.Store.job_claim>`.
    """
    if "jobs" not in store.capabilities:
        await fn()
        return True
    now = time.time()
    if not await store.job_claim(name, slot, worker, now=now, stale_after=stale_after):
        log.debug("job %s slot %s: claimed by another worker", name, slot)
        return False
    await _prune(store, now)
    try:
        result = await fn()
    except BaseException as exc:
        detail = "cancelled" if isinstance(exc, asyncio.CancelledError) else f"{exc!r}"
        with contextlib.suppress(Exception):
            await asyncio.shield(
                store.job_finish(name, slot, worker, ok=False, detail=_detail(detail),
                                 now=time.time())
            )  # fmt: skip
        raise
    await store.job_finish(name, slot, worker, ok=True, detail=_detail(result), now=time.time())
    return True
