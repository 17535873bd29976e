"""Helper threads that leave the event loop's CPU to the event loop.

A bot's event loop does the work of every message; a few helper threads (the SQLite
writer, the Slack transport's handled-events file) take its writes off it.  Each time
a helper wakes — its queue got a job, or the GIL it waits for was released by the loop
thread's next system call — Linux's scheduler lets it preempt the loop thread on the
CPU the loop runs on, and the loop pays two context switches, a futex call and cold
caches, all charged to whatever system call released the GIL (in
``benchmarks/bench_slack.py --profile`` a ``send``, ``poll`` or ``getpeername`` cost
5-10x in agentik's process what it cost in the bare app's, which has no second thread).

:func:`yield_to_loop` makes the calling thread a *batch* thread (``SCHED_BATCH``: same
share of the CPU, same nice value, but a wake-up never preempts a running thread), so
it runs when the loop waits for the network or on another CPU.  In the Slack benchmark,
with the SQLite writer thread a batch thread, the loop thread was preempted by agentik's
own threads 0.2-0.3 times an answer instead of 5-6, and the bot's CPU per answer was
about 7% less (docs/development.md, eighth pass).
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["yield_to_loop"]


def yield_to_loop() -> None:
    """Make the calling thread one that never preempts the event loop when it wakes.

    Call it first thing in a helper thread's function.  Linux only
    (``SCHED_BATCH``); elsewhere, or when the system refuses, it does nothing.
    """
    policy = getattr(os, "SCHED_BATCH", None)
    setscheduler = getattr(os, "sched_setscheduler", None)
    if policy is None or setscheduler is None:
        return
    with contextlib.suppress(OSError):
        # 0: the calling thread (Linux scheduling attributes are per thread).
        setscheduler(0, policy, os.sched_param(0))
