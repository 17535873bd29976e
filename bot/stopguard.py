"""The last word on a stop: ``agentik run`` exits within ``stop_timeout``, whatever hangs.

:meth:`Bot.shutdown <agentik.bot.app.Bot.shutdown>` and :meth:`Bot.aclose
<agentik.bot.app.Bot.aclose>` bound every step of an orderly stop by
``[supervision] stop_timeout`` (a step that overruns is logged and left behind, the
next step goes on).  Two things no ``asyncio`` timeout can bound remain: code that
blocks the event loop itself (a plugin's synchronous hook, a C call that does not
return), and the interpreter's own exit, which waits for every worker thread of the
default executor (a thread stuck in a call to a library or a dead socket).

:class:`StopGuard` is a daemon thread armed when the stop begins.  If the process is
still there :data:`GRACE` seconds after ``stop_timeout``, it logs at CRITICAL what
the stop was doing (the step :meth:`Bot.aclose` had reached), writes every thread's
stack to stderr (:mod:`faulthandler`: what hung, for the bug report) and ends the
process with exit status :data:`EXIT_STUCK`.  The connection leases were released
by then (the drain comes first), so another worker has taken over already.

Only the command line arms it (``agentik run``); a :class:`~agentik.bot.app.Bot`
used as a library never ends its host process.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
from collections.abc import Callable

__all__ = ["EXIT_STUCK", "GRACE", "StopGuard"]

log = logging.getLogger("agentik.bot")

#: Seconds after ``stop_timeout`` before a stuck stop ends the process (within the
#: 5 s between the default ``stop_timeout`` of 25 s and systemd's ``TimeoutStopSec``
#: of 30 s, so the unit's own SIGKILL never has to come).
GRACE = 2.0

#: Exit status of a stop that had to be cut (sysexits' EX_SOFTWARE: our fault, not
#: the configuration's).
EXIT_STUCK = 70


class StopGuard:
    """A daemon thread that ends the process if a stop overruns (see the module)."""

    def __init__(self, *, exit: Callable[[int], object] = os._exit) -> None:
        self._exit = exit
        self._armed = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.seconds = 0.0
        self.doing: Callable[[], str] = lambda: "stopping"

    @property
    def armed(self) -> bool:
        return self._armed.is_set()

    def arm(self, seconds: float, doing: Callable[[], str] | None = None) -> None:
        """Give the stop ``seconds`` (``stop_timeout``) plus :data:`GRACE`; the
        first call counts, later ones change nothing.  ``doing()`` names the step
        the stop is at (for the log line)."""
        if self._armed.is_set():
            return
        self.seconds = max(0.0, seconds) + GRACE
        if doing is not None:
            self.doing = doing
        self._armed.set()
        self._thread = threading.Thread(target=self._watch, name="agentik-stop-guard", daemon=True)
        self._thread.start()

    def disarm(self) -> None:
        """The stop finished (the process is about to return from ``main``)."""
        self._done.set()

    def _watch(self) -> None:
        if self._done.wait(self.seconds):
            return
        try:
            step = self.doing()
        except Exception:  # a diagnostic must not stop the exit
            step = "stopping"
        log.critical(
            "stop still not finished %.0f s after it began (stop_timeout + %.0f s), at: %s;"
            " exiting now with status %d (the stacks of every thread follow on stderr)",
            self.seconds, GRACE, step, EXIT_STUCK,
        )  # fmt: skip
        for handler in logging.getLogger().handlers + log.handlers:
            try:
                handler.flush()
            except Exception:
                pass
        try:
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
        except Exception:
            pass
        self._exit(EXIT_STUCK)
