"""A live event stream with a bounded replay buffer.

One :class:`EventBus` per conversation (keyed by ``seq``) and one for the whole
agent (keyed by ``stream_seq``).  Publishing is synchronous and never blocks:
each subscriber has a bounded queue; a subscriber that falls further behind
than that is sent :class:`~agentik.core.events.EventsLost` and its stream
ends, so a slow reader can never slow the agent down.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable

from .events import Event, EventsLost
from .streamprofiles import StreamProfile

__all__ = ["EventBus", "Subscription"]


class Subscription(AsyncIterator[Event]):
    """An async iterator over the events of one bus; ``aclose()`` to leave.

    Ends (``StopAsyncIteration``) when the bus closes, or after an
    ``EventsLost`` event when the subscriber fell too far behind.
    """

    __slots__ = ("_bus", "_closed", "_last_key", "_max_pending", "_pending", "_profile", "_waiter")

    def __init__(
        self,
        bus: EventBus,
        profile: StreamProfile | None,
        max_pending: int,
    ) -> None:
        self._bus = bus
        # None: every event as it is (the debug profile needs no filter).
        self._profile = None if profile is None or profile.passes_everything else profile
        self._max_pending = max_pending
        # Events not read yet (``None`` when none: a reader that keeps up holds no
        # deque, which costs 760 bytes empty).
        self._pending: deque[Event] | None = None
        # The future the reader waits on while nothing is pending (an idle
        # subscriber holds none: an ``asyncio.Event`` would hold a deque).
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._last_key = 0

    def _push(self, event: Event) -> None:
        if self._closed:
            return
        if self._profile is not None:
            admitted = self._profile.admit(event)
            if admitted is None:
                return
            event = admitted
        pending = self._queue()
        if len(pending) >= self._max_pending:
            # Too slow: drop the backlog, say so, and end this subscription.
            pending.clear()
            pending.append(self._bus._lost(event, self._last_key, self._bus._oldest_key()))
            self._end()
            return
        pending.append(event)
        self._wake()

    def _queue(self) -> deque[Event]:
        pending = self._pending
        if pending is None:
            pending = self._pending = deque()
        return pending

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _end(self) -> None:
        self._closed = True
        self._bus._subscribers.discard(self)
        self._wake()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        pending = self._pending
        while not pending:
            if self._closed:
                raise StopAsyncIteration
            waiter = self._waiter
            if waiter is None or waiter.done():
                waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
            pending = self._pending
        event = pending.popleft()
        if not pending:
            self._pending = None
        # The last event this subscriber actually received: when it falls
        # behind, everything after it is what it lost.
        self._last_key = self._bus._key(event)
        return event

    async def aclose(self) -> None:
        self._pending = None
        self._end()


class EventBus:
    """Fan-out of events to subscribers, with a replay buffer of ``buffer`` events.

    ``key`` extracts the sequence number (``seq`` or ``stream_seq``);
    ``lost`` builds the ``EventsLost`` notice for a subscriber.
    """

    __slots__ = (
        "_closed",
        "_key",
        "_lost_factory",
        "_max_pending",
        "_subscribers",
        "buffer",
        "last_key",
    )

    def __init__(
        self,
        *,
        key: Callable[[Event], int],
        lost: Callable[[Event | None, int, int], EventsLost],
        buffer: int = 1024,
        max_pending: int = 4096,
    ) -> None:
        self._key = key
        self._lost_factory = lost
        self.buffer: deque[Event] = deque(maxlen=buffer)
        self._subscribers: set[Subscription] = set()
        self._max_pending = max_pending
        self._closed = False
        self.last_key = 0

    def _lost(self, event: Event | None, after: int, oldest: int) -> EventsLost:
        return self._lost_factory(event, after, oldest)

    def _oldest_key(self) -> int:
        return self._key(self.buffer[0]) if self.buffer else 0

    def publish(self, event: Event) -> None:
        """Record ``event`` in the replay buffer and hand it to every subscriber."""
        self.buffer.append(event)
        self.last_key = self._key(event)
        if self._subscribers:  # most streams (a child run's) have none: no copy
            for sub in list(self._subscribers):
                sub._push(event)

    def subscribe(
        self,
        *,
        after: int | None = None,
        kinds: Iterable[str] | None = None,
        max_pending: int | None = None,
        profile: StreamProfile | None = None,
    ) -> Subscription:
        """Subscribe to live events; with ``after``, first replay what was missed.

        ``profile`` filters (and may trim) what this subscriber gets;
        ``kinds`` is a profile of just those kinds.

        If the buffer no longer holds every event after ``after`` (or ``after``
        is ahead of this process's sequence, e.g. from before a restart), the
        subscriber first receives an ``EventsLost`` notice, then whatever the
        buffer still has.  ``max_pending`` bounds this subscriber's queue
        (default: the bus's); past it the subscriber is told and cut off.
        """
        limit = self._max_pending if max_pending is None else max(1, max_pending)
        if kinds is not None:
            profile = StreamProfile(name="kinds", kinds=frozenset(kinds))
        sub = Subscription(self, profile, limit)
        sub._last_key = after if after is not None else self.last_key
        if after is not None:
            # The first event still buffered (one past the last if none is).
            first = self._key(self.buffer[0]) if self.buffer else self.last_key + 1
            # Events after ``after`` exist but the buffer starts later: a gap.
            gap = (self.last_key > after and first > after + 1) or after > self.last_key
            if gap:
                sub._queue().append(self._lost(None, after, self._oldest_key()))
            missed = [e for e in self.buffer if self._key(e) > after]
            # The replay itself never counts as falling behind: the queue
            # bound applies to what arrives on top of it.
            sub._max_pending += len(missed)
            for event in missed:
                sub._push(event)
        if self._closed:
            sub._end()
        else:
            self._subscribers.add(sub)
        return sub

    def close(self) -> None:
        """End every subscription (after they drain what they already have)."""
        self._closed = True
        for sub in list(self._subscribers):
            sub._end()
