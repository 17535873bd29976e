"""A live event stream with a bounded replay buffer.

One :class:`EventBus` per conversation (keyed by ``seq``) and one for the whole
agent (keyed by ``stream_seq``).  Publishing is synchronous and never blocks:
each subscriber has a bounded queue; a subscriber that falls further behind
than that is sent :class:`~agentik.core.events.EventsLost` and its stream
ends, so a slow reader can never slow the agent down.

A conversation's replay buffer is a :class:`ReplayBuffer`: between turns its
events are *sealed* (packed, about a third of what the event objects hold),
and a replay unpacks them into events equal to the ones published.  The
agent-wide stream's buffer is one too, sealed every ``seal_every`` events
(it has no "between turns": every conversation publishes into it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import operator
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from .events import Event, EventsLost
from .streamprofiles import StreamProfile

__all__ = ["EventBus", "ReplayBuffer", "Subscription"]

log = logging.getLogger(__name__)


class Subscription(AsyncIterator[Event]):
    """An async iterator over the events of one bus; ``aclose()`` to leave.

    Ends (``StopAsyncIteration``) when the bus closes, or after an
    ``EventsLost`` event when the subscriber fell too far behind.

    A consumer that should hold no task while nothing happens sets
    :attr:`notify` and drains with :meth:`take` instead of iterating.
    """

    __slots__ = (
        "_bus",
        "_closed",
        "_last_key",
        "_max_pending",
        "_pending",
        "_profile",
        "_waiter",
        "notify",
        "tag",
    )

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
        #: Called with this subscription (on the publisher's stack: it must not
        #: raise, nor block) when an event becomes pending; ``None``: nobody is told.
        #: One callback may serve many subscriptions: :attr:`tag` tells them apart.
        self.notify: Callable[[Subscription], None] | None = None
        #: The consumer's own: what this subscription is for (``None`` until set).
        self.tag: object = None

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
        notify = self.notify
        if notify is not None and self._pending:
            notify(self)

    def take(self) -> Event | None:
        """The next pending event, without waiting (``None``: none is pending now;
        :attr:`ended` tells whether more may come)."""
        pending = self._pending
        if not pending:
            return None
        event = pending.popleft()
        if not pending:
            self._pending = None
        self._last_key = self._bus._key(event)
        return event

    @property
    def last_key(self) -> int:
        """The key of the last event taken (or, before any, where it started)."""
        return self._last_key

    @property
    def ready(self) -> bool:
        """Whether an event is pending (:meth:`take` returns it)."""
        return bool(self._pending)

    @property
    def ended(self) -> bool:
        """No event is pending and none will come (the bus closed, or this
        subscriber was cut off or left)."""
        return self._closed and not self._pending

    def _end(self) -> None:
        self._closed = True
        self._bus._leave(self)
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


class _Kind:
    """How events of one class are packed: its number in this process, its
    fields but ``kind`` and ``conversation_id`` (in order), its ``kind``, and a
    getter of those fields' values as one tuple (a quarter of packing's cost was
    reading them one ``getattr`` at a time)."""

    __slots__ = ("cls", "code", "fields", "get", "kind")

    def __init__(self, cls: type, code: int) -> None:
        self.cls = cls
        self.code = code
        fields = dataclasses.fields(cls)
        kind = next((f.default for f in fields if f.name == "kind"), dataclasses.MISSING)
        # ``kind`` is the class's own (a field default): packed only if it is not.
        self.kind = None if kind is dataclasses.MISSING else kind
        left_out = ("conversation_id",) if self.kind is None else ("kind", "conversation_id")
        self.fields = tuple(f.name for f in fields if f.name not in left_out)
        names = self.fields
        # attrgetter of two names or more gives a tuple (of one, the bare value).
        self.get: Callable[[Any], tuple[Any, ...]] = (
            operator.attrgetter(*names)
            if len(names) > 1
            else lambda e: tuple(getattr(e, n) for n in names)
        )


# The event classes packed so far, by class and by number (blobs never leave the process).
_KINDS: dict[type, _Kind] = {}
_BY_CODE: list[_Kind] = []
# The preset dictionary later blobs are compressed against: the pickle of the first
# blob this process packed that is at most _ZDICT_MOST bytes (fixed once set, since
# blobs compressed with it need it back; blobs never leave the process).  A turn's
# events repeat the last turn's shape, field values and strings: a short turn's
# blob takes ~220 bytes with it, ~450 without.
_ZDICT: bytes | None = None
_ZDICT_MOST = 4096
# A blob and the dictionary together at most this big are compressed with a small
# window (see :func:`_pack`; decompressing reads the window size from the blob).
_SMALL = 8192
# Set once, even by agents running in several threads.
_ZDICT_LOCK = threading.Lock()
# A conversation's seal packs its new events with the last blob's while the two
# hold at most this many (about three short turns): fewer, fuller blobs, each
# still small to unpack (see :meth:`ReplayBuffer.seal`).
_MERGE_MOST = 32


def _kind(cls: type) -> _Kind:
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _KINDS[cls] = _Kind(cls, len(_BY_CODE))
        _BY_CODE.append(kind)
    return kind


def _pack(events: Iterable[Event]) -> bytes:
    """``events`` as one compact blob: each one's class number and field values,
    pickled together (shared strings — the conversation and run ids — once) and
    compressed (zlib's fastest level, against :data:`_ZDICT` once there is one:
    a short turn's ten events take ~220 bytes).  Its first byte says which."""
    global _ZDICT
    import pickle  # here: a bot that never seals a buffer never loads them
    import zlib

    rows: list[tuple[Any, ...]] = []
    conversation_id = None
    for e in events:
        if conversation_id is None:
            conversation_id = e.conversation_id
        kind = _kind(type(e))
        # The conversation's id once per blob (``None`` in a row: the blob's).
        own = None if e.conversation_id == conversation_id else e.conversation_id
        rows.append((kind.code, own, *kind.get(e)))
    raw = pickle.dumps((conversation_id, rows), pickle.HIGHEST_PROTOCOL)
    zdict = _ZDICT
    if zdict is None:
        if len(raw) <= _ZDICT_MOST:
            with _ZDICT_LOCK:
                if _ZDICT is None:
                    _ZDICT = raw
        return b"\0" + zlib.compress(raw, 1)
    if len(raw) + len(zdict) <= _SMALL:
        # An 8 KB window and smaller tables: zlib's defaults (32 KB, memLevel 8)
        # set up ~256 KB of state per compressor, which took 30-40 us of a short
        # turn's ~40 us seal on the event loop; a blob this small compresses alike.
        packer = zlib.compressobj(1, zlib.DEFLATED, 13, 5, zdict=zdict)
    else:
        packer = zlib.compressobj(1, zdict=zdict)
    return b"\1" + packer.compress(raw) + packer.flush()


def _unpack(data: bytes) -> list[Event]:
    """The events of a blob made by :func:`_pack`, equal to the ones packed."""
    import pickle
    import zlib

    out: list[Event] = []
    setattr_ = object.__setattr__
    # Only blobs this process packed are ever unpickled.
    if data[0]:
        assert _ZDICT is not None  # set before the first blob that uses it
        unpacker = zlib.decompressobj(zdict=_ZDICT)
        raw = unpacker.decompress(memoryview(data)[1:]) + unpacker.flush()
    else:
        raw = zlib.decompress(memoryview(data)[1:])
    conversation_id, rows = pickle.loads(raw)
    for code, own, *values in rows:
        kind = _BY_CODE[code]
        event = object.__new__(kind.cls)
        if kind.kind is not None:
            setattr_(event, "kind", kind.kind)
        setattr_(event, "conversation_id", conversation_id if own is None else own)
        for name, value in zip(kind.fields, values, strict=True):
            setattr_(event, name, value)
        out.append(event)
    return out


class _Sealed:
    """Events packed together: how many, the first and last one's keys, their weight.

    ``data`` is the blob, or the events themselves when they could not be packed
    (an event of a plugin's that does not pickle: kept as they are, never retried)."""

    __slots__ = ("count", "data", "first", "last", "weight")

    def __init__(
        self, data: bytes | tuple[Event, ...], count: int, first: int, last: int, weight: int
    ) -> None:
        self.data = data
        self.count = count
        self.first = first
        self.last = last
        self.weight = weight

    def events(self) -> list[Event]:
        data = self.data
        return _unpack(data) if isinstance(data, bytes) else list(data)


class ReplayBuffer:
    """A conversation's replay buffer: its last ``maxlen`` events, oldest first.

    It behaves as a ``deque(maxlen=...)`` of events (``append``, ``popleft``,
    ``clear``, ``len``, iteration, indexing).  :meth:`seal` packs the events
    held so far into one compact blob (a conversation seals its buffer when it
    has no turn left to run): an idle conversation holds its events in about a
    third of the memory, and no deque.  Iterating, indexing or replaying
    (:meth:`after`) unpacks sealed events into events equal to the ones
    published — same kinds, fields, ``seq`` and ``stream_seq`` — so a
    reconnecting subscriber cannot tell.  The oldest events leave one at a time,
    as from a deque: the blob they are in is unpacked first (``head``).

    ``key`` is the bus's sequence number; ``weigh`` what an event weighs
    (:func:`~agentik.core.services.event_weight`), kept per blob.
    ``seal_every``: also seal by itself each time that many events were
    appended since the last seal, in blobs of that many (the agent-wide
    stream's buffer, which is never idle: at most twice that many events are
    objects, the oldest ones unpacked to leave and the newest).
    """

    __slots__ = (
        "_count",
        "_head",
        "_key",
        "_live",
        "_live_weight",
        "_seal_every",
        "_sealed",
        "_weigh",
        "maxlen",
    )

    def __init__(
        self,
        maxlen: int,
        *,
        key: Callable[[Event], int],
        weigh: Callable[[Event], int] | None = None,
        seal_every: int | None = None,
    ) -> None:
        if seal_every is not None and seal_every < 1:
            raise ValueError(f"seal_every must be at least 1 (or None), not {seal_every!r}")
        self.maxlen: int | None = maxlen
        self._key = key
        self._weigh = weigh
        self._seal_every = seal_every
        self._count = 0
        # Oldest first: unpacked events of a blob partly pushed out, the sealed
        # blobs, then the events published since the last seal (each None when empty).
        self._head: deque[Event] | None = None
        self._sealed: list[_Sealed] | None = None
        self._live: deque[Event] | None = None
        # What the events in ``_live`` weigh (each weighed once, as it comes).
        self._live_weight = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def append(self, event: Event, weight: int | None = None) -> None:
        """Add ``event`` (``weight``: what ``weigh`` gives for it, if the caller has it)."""
        live = self._live
        if live is None:
            live = self._live = deque()
        live.append(event)
        weigh = self._weigh
        if weigh is not None:
            self._live_weight += weigh(event) if weight is None else weight
        self._count += 1
        if self.maxlen is not None and self._count > self.maxlen:
            self.popleft()
        every = self._seal_every
        if every is not None and self._live is not None and len(self._live) >= every:
            self.seal()

    def _fill_head(self) -> deque[Event] | None:
        """The oldest events, unpacked (the first blob's, when no head is left)."""
        head = self._head
        if not head:
            sealed = self._sealed
            if not sealed:
                return None
            head = self._head = deque(sealed.pop(0).events())
            if not sealed:
                self._sealed = None
        return head

    def popleft(self) -> Event:
        """Take out the oldest event."""
        head = self._fill_head()
        if head:
            event = head.popleft()
            if not head:
                self._head = None
        else:
            live = self._live
            if not live:
                raise IndexError("pop from an empty replay buffer")
            event = live.popleft()
            if self._weigh is not None:
                self._live_weight -= self._weigh(event)
        self._count -= 1
        return event

    def clear(self) -> None:
        self._head = self._sealed = self._live = None
        self._count = self._live_weight = 0

    def seal(self) -> None:
        """Pack the events published since the last seal into one blob (into blobs
        of ``seal_every`` events, if set).  Without ``seal_every`` (a conversation's
        buffer, sealed after each turn) they join the last blob while the two hold
        at most :data:`_MERGE_MOST` events: a blob costs ~150 bytes of its own (the
        object, its numbers, zlib's frame), and a turn's rows compress against the
        turn before's."""
        live = self._live
        if not live:
            return
        events = list(live)
        weight = self._live_weight
        self._live = None
        self._live_weight = 0
        sealed = self._sealed
        if sealed is None:
            sealed = self._sealed = []
        every = self._seal_every
        if every is None:
            last = sealed[-1] if sealed else None
            if (
                last is not None
                and isinstance(last.data, bytes)
                and last.count + len(events) <= _MERGE_MOST
            ):
                sealed[-1] = self._blob(last.events() + events, last.weight + weight)
            else:
                sealed.append(self._blob(events, weight))
            return
        # One blob (the usual case) weighs what the live events weigh.
        whole = weight if len(events) <= every else None
        for start in range(0, len(events), every):
            sealed.append(self._blob(events[start : start + every], whole))

    def _blob(self, events: list[Event], weight: int | None = None) -> _Sealed:
        data: bytes | tuple[Event, ...]
        try:
            data = _pack(events)
        except Exception:  # an event of a plugin's that does not pickle: kept as they are
            log.debug("could not seal a replay buffer", exc_info=True)
            data = tuple(events)
        weigh = self._weigh
        return _Sealed(
            data,
            len(events),
            self._key(events[0]),
            self._key(events[-1]),
            weight if weight is not None else sum(map(weigh, events)) if weigh is not None else 0,
        )

    @property
    def sealed(self) -> int:
        """How many of the events are sealed (packed)."""
        sealed = self._sealed or ()
        return sum(b.count for b in sealed if isinstance(b.data, bytes))

    def weight(self) -> int:
        """What the events weigh in all (``weigh`` of each; sealed ones as packed)."""
        weigh = self._weigh
        if weigh is None:
            return 0
        total = sum(b.weight for b in self._sealed) if self._sealed else 0
        if self._head:
            total += sum(map(weigh, self._head))
        return total + self._live_weight

    def first_key(self) -> int:
        """The key of the oldest event (0 when empty)."""
        if self._head:
            return self._key(self._head[0])
        if self._sealed:
            return self._sealed[0].first
        if self._live:
            return self._key(self._live[0])
        return 0

    def _parts(self) -> tuple[list[Event], list[_Sealed], list[Event]]:
        """Copies of the three parts, oldest first (an edit meanwhile leaves them be)."""
        return list(self._head or ()), list(self._sealed or ()), list(self._live or ())

    def after(self, after: int) -> Iterator[Event]:
        """The events whose key is above ``after``, oldest first (a blob of older
        events is not unpacked)."""
        key = self._key
        head, sealed, live = self._parts()
        yield from (e for e in head if key(e) > after)
        for blob in sealed:
            if blob.last > after:
                yield from (e for e in blob.events() if key(e) > after)
        yield from (e for e in live if key(e) > after)

    def __iter__(self) -> Iterator[Event]:
        head, sealed, live = self._parts()
        yield from head
        for blob in sealed:
            yield from blob.events()
        yield from live

    def _unseal(self) -> deque[Event]:
        """Every event unpacked, in :attr:`_live` (an edit: redaction)."""
        if not self._head and not self._sealed and self._live is not None:
            return self._live  # nothing sealed: as it is
        events = deque(self)
        self._head = self._sealed = None
        self._live = events
        weigh = self._weigh
        self._live_weight = sum(map(weigh, events)) if weigh is not None else 0
        return events

    def __getitem__(self, index: int) -> Event:
        if index == 0:
            head = self._fill_head()
            if head:
                return head[0]
        if not self._head and not self._sealed and self._live is not None:
            return self._live[index]
        return list(self)[index]

    def __setitem__(self, index: int, event: Event) -> None:
        live = self._unseal()
        weigh = self._weigh
        if weigh is not None:
            self._live_weight += weigh(event) - weigh(live[index])
        live[index] = event


class EventBus:
    """Fan-out of events to subscribers, with a replay buffer of ``buffer`` events.

    ``key`` extracts the sequence number (``seq`` or ``stream_seq``);
    ``lost`` builds the ``EventsLost`` notice for a subscriber (a subclass may
    override :meth:`_lost` instead: a conversation's stream).  ``weigh``: a
    conversation's bus, whose buffer is a sealable :class:`ReplayBuffer` (its
    events weighed with ``weigh``); ``seal_every``: a :class:`ReplayBuffer` that
    seals by itself every that many events (the agent-wide bus); with neither,
    a plain ``deque``.
    """

    __slots__ = (
        "_by_kind",
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
        lost: Callable[[Event | None, int, int], EventsLost] | None = None,
        buffer: int = 1024,
        max_pending: int = 4096,
        weigh: Callable[[Event], int] | None = None,
        seal_every: int | None = None,
    ) -> None:
        self._key = key
        self._lost_factory = lost
        self.buffer: deque[Event] | ReplayBuffer = (
            deque(maxlen=buffer)
            if weigh is None and seal_every is None
            else ReplayBuffer(buffer, key=key, weigh=weigh, seal_every=seal_every)
        )
        # A tuple, replaced when someone joins or leaves: publishing iterates it
        # without a copy, and a bus with none or one costs no set (216 bytes).
        self._subscribers: tuple[Subscription, ...] = ()
        # Per event kind, the subscribers whose profile carries it (filled as kinds
        # are published, dropped when someone joins or leaves; ``None`` until it
        # publishes to two subscribers, so a conversation's bus holds no dict): most
        # subscribers follow a few kinds, and a turn's events went through every profile.
        self._by_kind: dict[str, tuple[Subscription, ...]] | None = None
        self._max_pending = max_pending
        self._closed = False
        self.last_key = 0

    def _lost(self, event: Event | None, after: int, oldest: int) -> EventsLost:
        """The ``events_lost`` notice for a subscriber (``lost``'s, or a subclass's own)."""
        if self._lost_factory is None:
            raise TypeError("an EventBus needs lost= or a _lost() of its own")
        return self._lost_factory(event, after, oldest)

    def _leave(self, sub: Subscription) -> None:
        if sub in self._subscribers:
            self._subscribers = tuple(s for s in self._subscribers if s is not sub)
            self._by_kind = None

    def _oldest_key(self) -> int:
        buffer = self.buffer
        if isinstance(buffer, ReplayBuffer):
            return buffer.first_key()
        return self._key(buffer[0]) if buffer else 0

    def seal(self) -> None:
        """Pack the replay buffer's events (see :class:`ReplayBuffer`; a plain
        ``deque`` keeps its events as they are)."""
        if isinstance(self.buffer, ReplayBuffer):
            self.buffer.seal()

    def publish(self, event: Event, weight: int | None = None) -> None:
        """Record ``event`` in the replay buffer and hand it to every subscriber
        (``weight``: what ``weigh`` gives for it, if the caller has it)."""
        buffer = self.buffer
        if weight is not None and isinstance(buffer, ReplayBuffer):
            buffer.append(event, weight)
        else:
            buffer.append(event)
        self.last_key = self._key(event)
        subscribers = self._subscribers
        if len(subscribers) < 2:  # most streams have none (a child run's) or one (a channel)
            if subscribers:
                subscribers[0]._push(event)
            return
        kind = event.kind
        by_kind = self._by_kind
        if by_kind is None:
            by_kind = self._by_kind = {}
        subs = by_kind.get(kind)
        if subs is None:
            subs = by_kind[kind] = tuple(
                s for s in subscribers if s._profile is None or s._profile.carries(kind)
            )
        for sub in subs:
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
            first = self._oldest_key() if self.buffer else self.last_key + 1
            # Events after ``after`` exist but the buffer starts later: a gap.
            gap = (self.last_key > after and first > after + 1) or after > self.last_key
            if gap:
                sub._queue().append(self._lost(None, after, self._oldest_key()))
            buffer = self.buffer
            if isinstance(buffer, ReplayBuffer):
                missed = list(buffer.after(after))
            else:
                missed = [e for e in buffer if self._key(e) > after]
            # The replay itself never counts as falling behind: the queue
            # bound applies to what arrives on top of it.
            sub._max_pending += len(missed)
            for event in missed:
                sub._push(event)
        if self._closed:
            sub._end()
        else:
            self._subscribers = (*self._subscribers, sub)
            self._by_kind = None
        return sub

    def close(self) -> None:
        """End every subscription (after they drain what they already have)."""
        self._closed = True
        for sub in self._subscribers:
            sub._end()
