"""One loaded llama.cpp model per process, driven by one worker thread.

A GGUF model is loaded once per process (per file and load settings) and
shared by every backend instance that asks for it: :func:`acquire` returns
the :class:`SharedModel`, counting references; :func:`release` frees the
model when the last user lets go.

Generation never runs on an event loop.  Every request becomes a
:class:`Job` put on the model's queue; the model's single worker thread runs
the jobs one at a time, in order — so turns of all conversations queue for
the model, and the llama.cpp context is only ever touched by that thread.
A job feeds what it produces back to the event loop that asked for it
(``loop.call_soon_threadsafe`` into an :class:`asyncio.Queue`).  Cancelling
a job sets a flag the generation loop checks between two tokens, so the
worker is free again after at most one more token; a job cancelled while it
still waits in the queue is skipped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["Job", "SharedModel", "acquire", "release"]

log = logging.getLogger(__name__)


class Job:
    """One generation request, run by the worker thread.

    ``run(job, llama)`` does the work in the worker thread and reports with
    :meth:`emit`; whatever it raises is handed to the waiting coroutine.
    """

    __slots__ = ("_cancelled", "_loop", "_run", "queue")

    #: Put on the queue once the job is over (after its last item).
    DONE: Any = object()

    def __init__(self, run: Callable[[Job, Any], None], loop: asyncio.AbstractEventLoop) -> None:
        self._run = run
        self._loop = loop
        self._cancelled = threading.Event()
        #: Items for the coroutine, in order; :data:`DONE` or an exception last.
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    @property
    def cancelled(self) -> bool:
        """Whether the coroutine stopped listening; the worker then stops."""
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Ask the worker to stop this job (or to skip it if not started)."""
        self._cancelled.set()

    def emit(self, item: Any) -> bool:
        """Hand ``item`` to the event loop; False once nobody listens."""
        if self._cancelled.is_set():
            return False
        try:
            self._loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody will ever read this
            self._cancelled.set()
            return False
        return True

    def _execute(self, llama: Any) -> None:
        try:
            self._run(self, llama)
        except BaseException as exc:
            self.emit(exc)
        else:
            self.emit(Job.DONE)


class SharedModel:
    """A loaded ``llama_cpp.Llama`` and the one thread that runs its jobs."""

    def __init__(self, key: Hashable, llama: Any, *, label: str) -> None:
        self.key = key
        self.llama = llama
        self.refs = 0
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=f"llamacpp:{label}", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``; it runs after every job submitted before it."""
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.cancelled:
                continue
            job._execute(self.llama)

    def _stop(self) -> None:
        """Finish the running job (it was cancelled), end the thread, free the model."""
        self._jobs.put(None)
        self._thread.join()
        close = getattr(self.llama, "close", None)
        if close is not None:
            close()


_models: dict[Hashable, SharedModel] = {}
_models_lock = threading.Lock()


def acquire(key: Hashable, load: Callable[[], Any], *, label: str = "model") -> SharedModel:
    """The shared model for ``key``, loading it with ``load()`` the first time."""
    with _models_lock:
        shared = _models.get(key)
        if shared is None:
            shared = SharedModel(key, load(), label=label)
            _models[key] = shared
            log.info("loaded %s (pid %d)", label, os.getpid())
        shared.refs += 1
        return shared


def release(shared: SharedModel) -> None:
    """Drop one reference; the last one stops the worker and frees the model.

    Blocks until the worker is idle (at most one token after its job was
    cancelled): call it from a thread, not from the event loop.
    """
    with _models_lock:
        shared.refs -= 1
        if shared.refs > 0:
            return
        if _models.get(shared.key) is shared:
            del _models[shared.key]
    shared._stop()
