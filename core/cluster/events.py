"""Events and waits across workers (issue 32): a turn's events reach SSE clients on
every worker with the same ``seq``, and a decision made on one worker wakes the turn
waiting on another.

Only an agent on a store several processes share (:attr:`Store.shared
<agentik.core.store.base.Store.shared>`: PostgreSQL) has a :class:`ClusterEvents`;
on SQLite and the in-memory store nothing here runs (no rows, no work per event).

**Events.**  The worker running a turn keeps each event its conversations emit
(:meth:`ClusterEvents.add`, on the publisher's stack: an append, nothing more) and
writes them in batches (:meth:`~agentik.core.store.base.Store.run_events_add`, one
statement through the store's ordered writer) every ``flush_seconds`` and at the
end of each turn, then announces on the topic ``events`` the conversations and the
highest ``seq`` written (ids only, after the commit).  The JSON written is
:func:`~agentik.core.events.event_to_json`'s, the one form the SSE stream sends.
``seq`` continues across workers and restarts: before a turn starts, the
conversation's stream continues after the highest stored ``seq``
(:meth:`ClusterEvents.resume`), and the turn's last batch is written before the next
turn may start (:meth:`ClusterEvents.flushed`), so two workers never number two
events alike.

An SSE client gets a :class:`ClusterSubscription`: the conversation's local stream
(a turn running on this worker: as fast as on one process) merged with the stored
events (a turn running on another worker: read when a notification says there are
new ones, or at the notifier's resync), delivered in ``seq`` order with no gap and
no duplicate.  A gap that stays (a worker died before writing its last batch) is
reported as ``events_lost`` after ``gap_seconds`` and the stream goes on.

**The agent-wide stream.**  Its ids are positions in the stored events (``pos``,
:meth:`~agentik.core.store.base.Store.run_events_since`), the same on every worker: an
SSE client of ``/agentik/events`` gets every stored event of every worker in position
order, one reader per worker (:class:`_StoredTail`) reading them when a notification
(or this worker's own write) says there are new ones; a client resuming with
``Last-Event-ID`` on any worker reads what it missed from the store, then follows.
A temporary conversation's events are never stored: they reach this worker's clients
live, without an id.

**Waits.**  Approvals and questions are stored rows.  A decision or an answer
recorded by a worker whose process holds no waiter for it is announced on the
topic ``decisions`` (``a:<serial>``, ``q:<id>``); the worker whose turn waits
re-reads the row and resolves its future; at every resync it re-reads every
pending wait of its own.  The rules (who may decide, the deadline, ``!stop``) are
checked where the decision is made, as on one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..events import Event, EventsLost, event_from_dict, event_from_json, event_to_json
from ..services import event_weight, profile_of

if TYPE_CHECKING:
    from ..approvals import Approval, Approvals
    from ..conversation import Conversation
    from ..eventbus import Subscription
    from ..questions import Questions
    from ..services import AgentServices, ConversationEvents
    from ..store.base import Store
    from ..streamprofiles import StreamProfile
    from .notify import Notice

#: An edit of one event: its replacement, or ``None`` to keep it
#: (:func:`~agentik.core.redaction.replay_edit` makes them).
EventEdit = Callable[[Event], "Event | None"]

__all__ = [
    "DECISIONS_TOPIC",
    "EVENTS_TOPIC",
    "REDACTIONS_TOPIC",
    "AgentStream",
    "ClusterEvents",
    "ClusterSubscription",
    "EventsAgent",
    "conversation_lease",
    "running_turn",
]

#: Stored events looked through for the turn running in a conversation.
_RECENT_EVENTS = 500

log = logging.getLogger(__name__)

#: The topic announcing new stored events: ids ``<highest seq>:<conversation id>``.
EVENTS_TOPIC = "events"
#: The topic announcing decided waits: ``a:<approval serial>``, ``q:<question id>``.
DECISIONS_TOPIC = "decisions"
#: The topic announcing redacted messages: ``<message id>:<conversation id>``.
REDACTIONS_TOPIC = "redactions"
#: Events kept per conversation, and for how long, by the retention job.
KEEP_EVENTS = 4096
KEEP_SECONDS = 24 * 3600.0


def conversation_lease(conversation_id: str) -> str:
    """The name of the lease of the worker running a conversation's turns."""
    return f"conv:{conversation_id}"


class EventsAgent(Protocol):
    """What :class:`ClusterEvents` uses of its :class:`~agentik.core.agent.Agent`."""

    store: Store
    services: AgentServices[Conversation]
    approvals: Approvals
    questions: Questions

    @property
    def stream_profiles(self) -> Mapping[str, StreamProfile]: ...

    async def scrub_redacted(self, conversation_id: str, message_id: int) -> None: ...


class ClusterEvents:
    """An agent's events and waits on a shared store (see the module's doc)."""

    def __init__(
        self,
        agent: EventsAgent,
        *,
        flush_seconds: float = 0.05,
        gap_seconds: float = 5.0,
        page: int = 500,
        feed_keep: int = 4096,
        feed_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.agent = agent
        self.store = agent.store
        self.notifier = agent.store.notifier()
        self.flush_seconds = flush_seconds
        self.gap_seconds = gap_seconds
        self.page = page
        self._pending: list[tuple[Event, bool]] = []
        # Events kept so far, and of those the ones whose batch was written (or failed).
        self._kept = 0
        self._done = 0
        # Set after each batch (for flushed()); None while nobody waits.
        self._changed: asyncio.Event | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._writer: asyncio.Task[None] | None = None
        self._followers: dict[str, set[ClusterSubscription]] = {}
        self._everything: set[AgentStream] = set()
        #: The stored events, as this worker's agent-wide streams get them.
        self.feed = _StoredTail(self, keep=feed_keep, max_bytes=feed_bytes)
        self._subs: list[Any] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Batches and events written so far (status, benchmarks).
        self.batches = 0
        self.written = 0

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Keep the agent's events, follow the topics, relay the waits' decisions."""
        agent = self.agent
        agent.services.event_sink = self
        agent.approvals.elsewhere = self._approval_elsewhere
        agent.approvals.decided = self._decided
        agent.questions.shared = True
        agent.questions.decided = self._decided
        self._subs = [
            self.notifier.subscribe(EVENTS_TOPIC, self._on_events),
            self.notifier.subscribe(DECISIONS_TOPIC, self._on_decisions),
            self.notifier.subscribe(REDACTIONS_TOPIC, self._on_redactions),
        ]
        task = asyncio.get_running_loop().create_task(
            self._prune_hourly(), name="agentik-run-events-prune"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Write what is pending; stop following."""
        with contextlib.suppress(Exception):
            await self.flushed()
        for sub in self._subs:
            sub.close()
        self._subs = []
        for follower in [f for fs in self._followers.values() for f in fs]:
            follower._end()
        for stream in list(self._everything):
            stream._end()
        self.feed.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.agent.services.event_sink is self:
            self.agent.services.event_sink = None

    async def prune(self, *, now: float | None = None) -> int:
        """Forget stored events older than :data:`KEEP_SECONDS` and all but the newest
        :data:`KEEP_EVENTS` of each conversation (the retention job's, and hourly
        here: a bot without retention rules keeps them bounded too); how many."""
        now = time.time() if now is None else now
        n: int = await self.store.run_events_prune(keep=KEEP_EVENTS, before=now - KEEP_SECONDS)
        return n

    async def _prune_hourly(self) -> None:
        from .jobs import run_once

        while True:
            now = time.time()
            await asyncio.sleep(3600.0 - now % 3600.0 + random.random())
            slot = str(int(time.time() // 3600.0))
            try:
                await run_once(self.store, "run_events_prune", slot, self.prune)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("could not prune the run events: %s", exc)

    # -- writing -------------------------------------------------------------------------
    def add(self, stream: ConversationEvents, event: Event, *, wide: bool = True) -> None:
        """Keep ``event`` of ``stream`` for the next batch (called for every event a
        conversation's stream publishes: no I/O, no serialisation here; ``wide``: it
        is on the agent-wide stream).  A temporary conversation's are never written
        (it is never stored): this worker's agent-wide streams get them as they come."""
        if getattr(stream.owner, "temp", False):
            if wide and self.feed.active:
                self.feed.unstored(event)
            return
        self._pending.append((event, wide))
        self._kept += 1
        if self._timer is None and self._writer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.flush_seconds, self._kick)

    def _kick(self) -> None:
        self._timer = None
        if self._writer is None and self._pending:
            self._writer = asyncio.get_running_loop().create_task(
                self._write(), name="agentik-run-events"
            )

    async def _write(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    await self._write_batch(batch)
                finally:
                    self._done += len(batch)
                    changed, self._changed = self._changed, None
                    if changed is not None:
                        changed.set()
        finally:
            self._writer = None
            if self._pending and self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self.flush_seconds, self._kick)
            changed, self._changed = self._changed, None
            if changed is not None:
                changed.set()

    async def _write_batch(self, batch: list[tuple[Event, bool]]) -> None:
        rows = [(e.conversation_id, e.seq, e.ts, event_to_json(e)) for e, _ in batch]
        top: dict[str, int] = {}
        for e, _ in batch:
            # (An agent-wide-only event has seq 0: its conversation is announced all the same.)
            if e.seq >= top.get(e.conversation_id, 0):
                top[e.conversation_id] = e.seq
        try:
            await self.store.run_events_add(rows, wide=[w for _, w in batch])
        except Exception as exc:  # SSE clients elsewhere see a gap (events_lost)
            log.warning("could not write %d run events: %s", len(rows), exc)
            self.feed.failed()
            return
        self.batches += 1
        self.written += len(rows)
        self.feed.poke()
        await self.notifier.publish(EVENTS_TOPIC, *(f"{s}:{c}" for c, s in top.items()))

    async def flushed(self) -> None:
        """Return once every event kept so far is written (and announced); events
        kept meanwhile (other conversations streaming) are not waited for."""
        target = self._kept
        while self._done < target:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._kick()
            writer = self._writer
            if writer is None:
                return  # (nothing left to write)
            changed = self._changed = self._changed or asyncio.Event()
            await changed.wait()

    async def resume(self, events: ConversationEvents) -> None:
        """A turn starts here: its conversation's events continue after the highest
        ``seq`` any worker stored."""
        last = await self.store.run_events_last(events.conversation_id)
        if last > events.seq:
            events.seq = last

    # -- following -----------------------------------------------------------------------
    async def subscribe(
        self,
        conv: Conversation,
        *,
        after: int | None,
        profile: str | StreamProfile = "debug",
        max_pending: int | None = None,
        from_turn: bool = False,
    ) -> ClusterSubscription:
        """An SSE client's subscription to ``conv``'s events (``after``: its
        ``Last-Event-ID``): replayed from the stored events and this worker's
        buffer, then followed.  ``profile`` and ``from_turn`` (no ``after``: the
        running turn's events from its start first, whichever worker runs it): as
        :meth:`Conversation.events`'s."""
        wanted = profile_of(self.agent.stream_profiles, profile, None)
        if after is None and from_turn:
            since = conv.running_since
            if since is None and (found := await running_turn(self.store, conv.id)):
                since = found[1]
            if since is not None:
                after = since - 1
        # Every event, unfiltered: the order is checked on ``seq``, the profile after.
        local = conv.events(after=after, profile="debug")
        if after is None:
            stored = await self.store.run_events_last(conv.id)
            after = max(stored, local.last_key)
        sub = ClusterSubscription(self, conv.id, local, after, wanted, max_pending or 4096)
        self._followers.setdefault(conv.id, set()).add(sub)
        sub._start()
        return sub

    async def subscribe_all(
        self,
        *,
        after: int | None,
        profile: str | StreamProfile = "debug",
        max_pending: int | None = None,
    ) -> AgentStream:
        """An SSE client's subscription to the agent-wide stream (``after``: its
        ``Last-Event-ID``, a position of the stored events, which every worker
        numbers alike): what it missed read from the store, then every worker's
        events as they are stored (see :class:`AgentStream`)."""
        wanted = profile_of(self.agent.stream_profiles, profile, None)
        stream = AgentStream(self, wanted, max_pending or 4096, after)
        self._everything.add(stream)
        try:
            await stream._start()
        except BaseException:
            stream._end()
            raise
        return stream

    def _leave(self, sub: ClusterSubscription) -> None:
        subs = self._followers.get(sub.conversation_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._followers[sub.conversation_id]

    def _on_events(self, notice: Notice) -> None:
        if not notice.local:
            # Another worker stored events (or a resync: maybe): the agent-wide
            # streams' reader reads them (this worker's own: after writing them).
            self.feed.poke()
        if notice.resync:
            for subs in list(self._followers.values()):
                for sub in list(subs):
                    sub.poke(None)
            return
        for one in notice.ids:
            seq, _, cid = one.partition(":")
            for sub in list(self._followers.get(cid, ())):
                sub.poke(int(seq) if seq.isdigit() else None)

    # -- redaction -----------------------------------------------------------------------
    async def redacted(
        self, conversation_id: str, message_id: int, edit: Callable[[], EventEdit]
    ) -> int:
        """Message ``message_id`` was redacted here (this worker's replay buffers are
        scrubbed already): its stored events are rewritten with ``edit`` (numbers
        kept), and the other workers are told to scrub their buffers.  How many
        stored events changed."""
        await self.flushed()
        self.feed.scrub(edit())
        one = edit()
        changed: list[tuple[str, int, float, str]] = []
        after = 0
        while True:
            rows = await self.store.run_events_after(conversation_id, after, limit=self.page)
            for seq, data in rows:
                try:
                    event = event_from_json(data)
                except ValueError:
                    continue
                new = one(event)
                if new is not None and new is not event:
                    changed.append((conversation_id, seq, new.ts, event_to_json(new)))
            if len(rows) < self.page:
                break
            after = rows[-1][0]
        await self.store.run_events_add(changed, replace=True)
        await self.notifier.publish(REDACTIONS_TOPIC, f"{message_id}:{conversation_id}")
        return len(changed)

    async def _on_redactions(self, notice: Notice) -> None:
        if notice.resync or notice.local:
            return  # (a resync: nothing to re-read; redactions are rare and announced)
        for one in notice.ids:
            mid, _, cid = one.partition(":")
            if mid.isdigit():
                await self.agent.scrub_redacted(cid, int(mid))
                if self.feed.ring:
                    await self._scrub_feed(cid, int(mid))

    async def _scrub_feed(self, conversation_id: str, message_id: int) -> None:
        """Another worker redacted a message: what it said leaves the feed's ring too."""
        from ..redaction import replay_edit

        rows = await self.store.messages(conversation_id, after=message_id - 1, limit=1)
        if rows and rows[0].id == message_id:
            row = rows[0]
            self.feed.scrub(replay_edit(row.kind, row.run_id, row.tool_call_id, row.content)())

    # -- waits ---------------------------------------------------------------------------
    async def _decided(self, wait_id: str) -> None:
        await self.notifier.publish(DECISIONS_TOPIC, wait_id)

    async def _approval_elsewhere(self, a: Approval) -> bool:
        """Whether a turn on another worker may be waiting for ``a``: pending, not
        expired, and its conversation not left by a worker that died (its lease, when
        one is kept, held)."""
        if a.state != "pending" or a.expires_at <= time.time():
            return False
        try:
            lease = await self.store.lease_get(conversation_lease(a.conversation_id))
        except NotImplementedError:
            return True
        return lease is None or lease.expires_in > 0

    async def _on_decisions(self, notice: Notice) -> None:
        approvals, questions = self.agent.approvals, self.agent.questions
        if notice.resync:
            await approvals.settle_from_store(None)
            await questions.settle_from_store(None)
            return
        for one in notice.ids:
            kind, _, key = one.partition(":")
            if not key.isdigit():
                continue
            if kind == "a":
                await approvals.settle_from_store(int(key))
            elif kind == "q":
                await questions.settle_from_store(int(key))


class _EventQueue(AsyncIterator[Event]):
    """What both merged streams are to their SSE client: a bounded queue of events
    to iterate.  A client more than ``_max_pending`` events behind is told
    (:meth:`_overflow`'s ``events_lost``) and cut off; ``aclose()`` leaves."""

    _max_pending: int

    def __init__(self) -> None:
        self._out: deque[Event] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        #: Called with this stream when an event becomes waiting (it must not raise nor
        #: block), as a local :class:`~agentik.core.eventbus.Subscription`'s: a consumer
        #: that holds no task while nothing happens drains it with :meth:`take`.
        self.notify: Callable[[Any], None] | None = None
        #: The consumer's own: what this stream is for (``None`` until set).
        self.tag: object = None

    def _overflow(self, event: Event) -> EventsLost:
        """The ``events_lost`` the client gets instead of its backlog (``event``: the
        one that did not fit)."""
        raise NotImplementedError

    def _end(self) -> None:
        raise NotImplementedError

    def _push(self, event: Event) -> None:
        out = self._out
        if len(out) >= self._max_pending:
            # Too slow: drop the backlog, say so (from the last event it received), end.
            lost = self._overflow(event)
            out.clear()
            out.append(lost)
            self._end()
            return
        out.append(event)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
        notify = self.notify
        if notify is not None and self._out:
            notify(self)

    @property
    def ended(self) -> bool:
        """No event is waiting and none will come (it was closed or cut off)."""
        return self._closed and not self._out

    @property
    def ready(self) -> bool:
        """Whether an event is waiting (:meth:`take` returns it), as on a local
        :class:`~agentik.core.eventbus.Subscription`."""
        return bool(self._out)

    def take(self) -> Event | None:
        """The next waiting event, without waiting (``None``: none now)."""
        return self._out.popleft() if self._out else None

    def __aiter__(self) -> _EventQueue:
        return self

    async def __anext__(self) -> Event:
        while not self._out:
            if self._closed:
                raise StopAsyncIteration
            waiter = self._waiter
            if waiter is None or waiter.done():
                waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter
        return self._out.popleft()

    async def aclose(self) -> None:
        self._out.clear()
        self._end()


async def running_turn(store: Store, conversation_id: str) -> tuple[str, int] | None:
    """The turn running in the conversation as its stored events say — the last
    top-level turn started (among the latest events) whose end is not recorded —
    as its run id and the ``seq`` of its ``turn_started``; ``None`` when none runs.
    Whichever worker runs it (its events are stored in batches: a turn just started
    may not show yet)."""
    last = await store.run_events_last(conversation_id)
    rows = await store.run_events_after(
        conversation_id, max(0, last - _RECENT_EVENTS), limit=_RECENT_EVENTS
    )
    for seq, text in reversed(rows):
        try:
            event = json.loads(text)
        except ValueError:
            continue
        if event.get("kind") != "turn_started" or event.get("parent_run_id"):
            continue
        run = event.get("run_id")
        if not isinstance(run, str) or await store.turn_ended(conversation_id, run):
            return None
        return run, seq
    return None


class ClusterSubscription(_EventQueue):
    """One SSE client's events of one conversation on a shared store: the local
    stream merged with the stored events, in ``seq`` order (see the module's doc).

    Iterate it; ``aclose()`` to leave.  ``profile`` filters (and may trim) what the
    client gets, as on a local subscription; ``max_pending`` bounds how far the
    client may fall behind before it is told (``events_lost``) and cut off.
    """

    def __init__(
        self,
        hub: ClusterEvents,
        conversation_id: str,
        local: Subscription,
        after: int,
        profile: StreamProfile | None,
        max_pending: int,
    ) -> None:
        super().__init__()
        self.hub = hub
        self.conversation_id = conversation_id
        self.local = local
        #: The ``seq`` of the last event taken in order (delivered or filtered out).
        self.last = after
        self._profile = None if profile is None or profile.passes_everything else profile
        self._max_pending = max_pending
        self._held: dict[int, Event] = {}
        self._fetch: asyncio.Task[None] | None = None
        self._again = False
        self._gap: asyncio.TimerHandle | None = None

    def _start(self) -> None:
        self.local.notify = self._on_local
        self._on_local(self.local)
        self.poke(None)

    # -- the two sources -----------------------------------------------------------------
    def _on_local(self, sub: Subscription) -> None:
        while (event := sub.take()) is not None:
            if event.kind != "events_lost":  # the stored events cover what it lost
                self._offer(event)
        if sub.ended and not self._closed:
            # The conversation closed here (deleted, the agent stopping): so does this.
            self._end()

    def poke(self, upto: int | None) -> None:
        """New events may be stored (up to ``upto``; ``None``: maybe any)."""
        if self._closed or (upto is not None and upto <= self.last):
            return
        if self._fetch is not None:
            self._again = True
            return
        self._fetch = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        store, page = self.hub.store, self.hub.page
        try:
            while True:
                self._again = False
                cursor = self.last
                while not self._closed:
                    rows = await store.run_events_after(self.conversation_id, cursor, limit=page)
                    for seq, data in rows:
                        if seq > self.last and seq not in self._held:
                            try:
                                event = event_from_json(data)
                            except ValueError:  # a kind this version does not know
                                log.debug("skipped a stored event: %s", data[:80])
                                continue
                            self._offer(event)
                    if len(rows) < page:
                        break
                    cursor = rows[-1][0]
                if not self._again or self._closed:
                    break
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the next notification or resync reads again
            log.warning("conversation %s: could not read stored events: %s",
                        self.conversation_id, exc)  # fmt: skip
        finally:
            self._fetch = None
        self._watch_gap()

    # -- ordering ------------------------------------------------------------------------
    def _offer(self, event: Event) -> None:
        seq = event.seq
        if seq <= self.last or self._closed:
            return
        if seq != self.last + 1:
            self._held.setdefault(seq, event)
            self.poke(None)  # the ones between may be stored already
            return
        self._take(event)
        held = self._held
        while held and (nxt := held.pop(self.last + 1, None)) is not None:
            self._take(nxt)
        if held:
            for old in [s for s in held if s <= self.last]:
                del held[old]
        self._watch_gap()

    def _watch_gap(self) -> None:
        if self._held and self._gap is None and not self._closed:
            self._gap = asyncio.get_running_loop().call_later(self.hub.gap_seconds, self._give_up)
        elif not self._held and self._gap is not None:
            self._gap.cancel()
            self._gap = None

    def _give_up(self) -> None:
        """Events between the last taken and the next held never came: say so, go on."""
        self._gap = None
        if not self._held or self._closed:
            return
        first = min(self._held)
        lost = EventsLost(
            conversation_id=self.conversation_id, seq=self.last, ts=time.time(),
            requested_after=self.last, oldest_seq=first,
        )  # fmt: skip
        self._push(lost)
        self.last = first - 1
        self._offer(self._held.pop(first))

    def _take(self, event: Event) -> None:
        self.last = event.seq
        profile = self._profile
        if profile is not None:
            admitted = profile.admit(event)
            if admitted is None:
                return
            event = admitted
        self._push(event)

    def _overflow(self, event: Event) -> EventsLost:
        last = self._out[0].seq - 1 if self._out else self.last
        return EventsLost(
            conversation_id=self.conversation_id, seq=last, ts=time.time(),
            requested_after=last, oldest_seq=last + 1,
        )  # fmt: skip

    def _end(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.hub._leave(self)
        if self._gap is not None:
            self._gap.cancel()
            self._gap = None
        if self._fetch is not None and self._fetch is not asyncio.current_task():
            self._fetch.cancel()
        self.local.notify = None
        loop = asyncio.get_running_loop()
        task = loop.create_task(self.local.aclose())
        self.hub._tasks.add(task)
        task.add_done_callback(self.hub._tasks.discard)
        self._wake()


class _StoredTail:
    """The stored events as this worker's agent-wide streams get them: one reader per
    worker (not one per client) follows the positions (``pos``) of every worker's
    stored events, from the last stored when its first stream opened, each event read
    and parsed once, its position as its ``stream_seq`` (the SSE ``id``).  It keeps the
    latest in a ring (``keep`` events, about ``max_bytes``): a stream that caught up
    from the store takes what was read meanwhile from it.  It stops when its last
    stream closes (a resuming client reads what it missed from the store)."""

    def __init__(self, hub: ClusterEvents, *, keep: int, max_bytes: int) -> None:
        self.hub = hub
        self.keep = keep
        self.max_bytes = max_bytes
        #: Whether it follows now (a stream is open).
        self.active = False
        #: The highest position read (every stored event up to it was read).
        self.cursor = 0
        #: The events read, oldest first: every one with a position in (``floor``,
        #: ``cursor``], and what they weigh.
        self.ring: deque[Event] = deque()
        self.floor = 0
        self.weight = 0
        self.streams: set[AgentStream] = set()
        self._starting: asyncio.Task[None] | None = None
        # Streams waiting for it to start.
        self._waiting = 0
        self._fetch: asyncio.Task[None] | None = None
        self._again = False

    async def attach(self, stream: AgentStream) -> None:
        """``stream`` opens: follow from now on, if not yet."""
        while not self.active:
            if self._starting is None or self._starting.done():
                self._starting = asyncio.get_running_loop().create_task(self._start())
            starting = self._starting
            self._waiting += 1
            try:
                await asyncio.shield(starting)
            finally:
                self._waiting -= 1
                if self._starting is starting and starting.done():
                    self._starting = None
        self.streams.add(stream)

    async def _start(self) -> None:
        last, _ = await self.hub.store.run_events_position()
        if not self._waiting:
            return  # (every stream that asked went away meanwhile)
        self.cursor = self.floor = last
        self.active = True
        self.poke()  # (what a notification announced while this read was on its way)

    def detach(self, stream: AgentStream) -> None:
        self.streams.discard(stream)
        if not self.streams:
            self.stop()

    def stop(self) -> None:
        """Stop following (no stream left; the hub closing)."""
        if self.streams:
            return
        self.active = False
        self.ring.clear()
        self.weight = 0
        if self._fetch is not None and self._fetch is not asyncio.current_task():
            self._fetch.cancel()
        self._fetch = None

    def unstored(self, event: Event) -> None:
        """An event that is not stored (a temporary conversation's): to every stream now."""
        for stream in list(self.streams):
            stream._unstored(event)

    def failed(self) -> None:
        """This worker could not store a batch: its events are missing from every
        stream; this worker's streams are told."""
        for stream in list(self.streams):
            stream._lost(self.cursor)

    def poke(self) -> None:
        """New events may be stored: read them."""
        if not self.active:
            return
        if self._fetch is not None:
            self._again = True
            return
        task = self._fetch = asyncio.get_running_loop().create_task(
            self._read(), name="agentik-agent-wide-tail"
        )
        # (The hub's closing waits for it.)
        self.hub._tasks.add(task)
        task.add_done_callback(self.hub._tasks.discard)

    async def _read(self) -> None:
        store, page = self.hub.store, self.hub.page
        try:
            while self.active:
                self._again = False
                while self.active:
                    rows = await store.run_events_since(self.cursor, limit=page)
                    for pos, data in rows:
                        if pos <= self.cursor or not self.active:
                            continue
                        self.cursor = pos
                        event = _parse(data, pos)
                        if event is None:
                            continue
                        self._keep(event)
                        for stream in list(self.streams):
                            stream._stored(event)
                    if len(rows) < page:
                        break
                if not self._again:
                    break
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the next notification reads again
            log.warning("could not read stored events for the agent-wide stream: %s", exc)
        finally:
            if self._fetch is asyncio.current_task():
                self._fetch = None

    def _keep(self, event: Event) -> None:
        ring = self.ring
        ring.append(event)
        self.weight += event_weight(event)
        while len(ring) > self.keep or (self.weight > self.max_bytes and len(ring) > 1):
            old = ring.popleft()
            self.weight -= event_weight(old)
            self.floor = old.stream_seq

    def scrub(self, edit: EventEdit) -> None:
        """Rewrite kept events (a redaction), their numbers kept."""
        ring = self.ring
        for i, event in enumerate(ring):
            new = edit(event)
            if new is not None and new is not event:
                ring[i] = new
        self.weight = sum(event_weight(e) for e in ring)


def _parse(data: str, pos: int) -> Event | None:
    """A stored event with its position as its ``stream_seq`` (``None``: a kind this
    version does not know)."""
    try:
        fields = json.loads(data)
        fields["stream_seq"] = pos
        return event_from_dict(fields)
    except (ValueError, TypeError, KeyError):
        log.debug("skipped a stored event: %s", data[:80])
        return None


class AgentStream(_EventQueue):
    """One SSE client's agent-wide stream on a shared store: every worker's stored
    events in position order, each once, the position its ``stream_seq`` (the SSE
    ``id``, the same on every worker).

    Opened with ``after`` (a ``Last-Event-ID``), it first reads the events above it
    from the store, a page at a time as the client takes them (however long the gap,
    the client is not cut off for it), then takes what this worker's
    :class:`_StoredTail` read meanwhile and follows it.  An ``after`` below what the
    retention pruned gets ``events_lost`` first, then what is still stored; one above
    every stored position (another database's, a numbering from before) gets
    ``events_lost`` and the events from now on.  A temporary conversation's events
    (never stored) come live, without an id, and are not replayed.
    """

    def __init__(
        self,
        hub: ClusterEvents,
        profile: StreamProfile | None,
        max_pending: int,
        after: int | None = None,
    ) -> None:
        super().__init__()
        self.hub = hub
        self._profile = None if profile is None or profile.passes_everything else profile
        self._max_pending = max_pending
        self._after = after
        #: The position of the last event taken (delivered or filtered out).
        self.last = 0
        #: Reading what it missed from the store (the tail's events wait meanwhile).
        self._catching = False

    async def _start(self) -> None:
        tail = self.hub.feed
        after = self._after
        if after is None:
            await tail.attach(self)
            self.last = tail.cursor  # (no await since it joined: from its next event on)
            return
        # Before any await: what the tail reads meanwhile waits for the catching up.
        self.last, self._catching = after, True
        await tail.attach(self)
        last, pruned = await self.hub.store.run_events_position()
        newest = max(last, tail.cursor)
        if after > newest:
            # Not a position of these events: say so, go on from now.
            self._lost(after, oldest=newest + 1)
            self.last, self._catching = tail.cursor, False
        elif after < pruned:
            self._lost(after, oldest=pruned + 1)

    async def _catch_up(self) -> None:
        """Read the next page of what the client missed; past the end of what is
        stored, take what the tail read meanwhile and follow it."""
        # (A page fits in the client's queue: catching up never cuts it off.)
        tail, page = self.hub.feed, max(1, min(self.hub.page, self._max_pending // 2))
        rows = await self.hub.store.run_events_since(self.last, limit=page)
        for pos, data in rows:
            if self._closed or not self._catching:
                return
            if pos <= self.last:
                continue
            self.last = pos
            event = _parse(data, pos)
            if event is not None:
                self._deliver(event)
        if len(rows) >= page or self._closed:
            return
        if self.last < tail.floor and not rows:
            # Read by the tail, gone from its ring and from the store (pruned or
            # deleted meanwhile): lost.
            self._lost(self.last, oldest=tail.floor + 1)
            self.last = tail.floor
        if self.last >= tail.floor:
            self._catching = False
            for event in list(tail.ring):
                if event.stream_seq > self.last:
                    self.last = event.stream_seq
                    self._deliver(event)

    async def __anext__(self) -> Event:
        while not self._out:
            if self._closed:
                raise StopAsyncIteration
            if self._catching:
                await self._catch_up()
                continue
            waiter = self._waiter
            if waiter is None or waiter.done():
                waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter
        return self._out.popleft()

    def _stored(self, event: Event) -> None:
        """An event the tail read (in position order)."""
        if self._closed or self._catching or event.stream_seq <= self.last:
            return
        self.last = event.stream_seq
        self._deliver(event)

    def _unstored(self, event: Event) -> None:
        if not self._catching:
            self._deliver(dataclasses.replace(event, stream_seq=0))

    def _lost(self, after: int, *, oldest: int | None = None) -> None:
        self._push(
            EventsLost(
                conversation_id="", seq=0, stream_seq=after, ts=time.time(),
                requested_after=after, oldest_seq=after + 1 if oldest is None else oldest,
            )
        )  # fmt: skip

    def _deliver(self, event: Event) -> None:
        if self._closed:
            return
        profile = self._profile
        if profile is not None:
            admitted = profile.admit(event)
            if admitted is None:
                return
            event = admitted
        self._push(event)

    def _overflow(self, event: Event) -> EventsLost:
        last = self._out[0].stream_seq - 1 if self._out and self._out[0].stream_seq else self.last
        return EventsLost(
            conversation_id="", seq=0, stream_seq=last, ts=time.time(),
            requested_after=last, oldest_seq=last + 1,
        )  # fmt: skip

    def _end(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._catching = False
        self.hub._everything.discard(self)
        self.hub.feed.detach(self)
        self._wake()
