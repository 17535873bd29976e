"""The turn engine's explicit parts: what an agent hands its conversations.

The engine is four classes — :class:`~agentik.core.agent.Agent`,
:class:`~agentik.core.conversation.Conversation`,
:class:`~agentik.core.turn.TurnRunner` and
:class:`~agentik.core.compaction.Compactor` — that talk only through public
methods of these parts, each step getting its state and named dependencies
handed in (as in pydantic-ai's run graph):

* :class:`AgentServices` — one per agent, handed to each conversation:
  stream sequence numbers and the agent-wide event stream, the budget of
  every conversation's replay buffer, the registry of open and busy
  conversations, their lifecycle (``session_start``/``session_end``), and
  the agent's current model, system prompt, hooks, policy, tools and
  compactor (read anew each time, so changing them on the agent takes
  effect at once).
* :class:`ConversationEvents` — a conversation's event stream: it numbers
  each event, keeps the replay buffer and publishes to the agent's stream.
* :class:`~agentik.core.workingmemory.WorkingMemory` — the conversation's
  LLM context (cache, notes, load, compact); the agent's
  :class:`~agentik.core.workingmemory.Transcripts` bounds how many idle
  conversations keep theirs cached.
* :class:`ConversationParts` — the three above plus the conversation, as
  one typed bundle for :class:`~agentik.core.turn.TurnRunner` and
  :class:`~agentik.core.compaction.Compactor`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import itertools
import operator
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

from .errors import ClosedError
from .eventbus import EventBus, ReplayBuffer, Subscription
from .events import Event, EventBase, EventsLost, StatusChanged, TurnEnded, TurnStarted
from .protocols import LiveConversation
from .streamprofiles import BUILTIN_PROFILES, StreamProfile, lookup
from .workingmemory import Transcripts, WorkingMemory

if TYPE_CHECKING:
    from .approvals import Approvals
    from .attachments import AttachmentSettings
    from .checkpoints import CheckpointSettings
    from .compaction import Compactor
    from .hooks import Hooks
    from .llm.base import LLMBackend
    from .memory import MemoryBackend
    from .memtrim import MemoryTrim
    from .observe import RequestStats
    from .questions import Checklists, Questions
    from .runs import AgentSpec, RunNode, RunPolicy, Runs
    from .store.base import RunRecord
    from .tools.base import Tool, TurnPolicy

__all__ = [
    "AgentLike",
    "AgentServices",
    "AgentState",
    "ConversationEvents",
    "ConversationParts",
    "EventSink",
    "event_weight",
    "kinds_of",
    "profile_of",
]

E = TypeVar("E", bound=Event)
#: The conversation type (the agent's :class:`~agentik.core.conversation.Conversation`,
#: which is built on these parts: they name only what they read of it).
C = TypeVar("C", bound=LiveConversation)

#: How many ended conversations' ids the services remember (see ``_ended_ids``).
_ENDED_IDS = 10_000

#: What an event weighs besides its text fields (the object and its numbers).
EVENT_OVERHEAD = 200
#: The agent-wide stream's replay buffer packs its events in blobs of this many
#: (packing and unpacking cost ~4 us an event; a blob's events are objects again
#: only while the oldest of them leave).
STREAM_SEAL_EVERY = 128
# Per event class: the names of its fields that may hold text.
_TEXT_FIELDS: dict[type, tuple[str, ...]] = {}


def event_weight(event: Any) -> int:
    """About what ``event`` holds in memory, in bytes: a fixed overhead and the
    length of its text fields (answers, deltas, tool arguments and results)."""
    cls = type(event)
    names = _TEXT_FIELDS.get(cls)
    if names is None:
        names = _TEXT_FIELDS[cls] = (
            tuple(
                f.name
                for f in dataclasses.fields(cls)
                if isinstance(f.type, str) and "str" in f.type and f.name != "kind"
            )
            if dataclasses.is_dataclass(cls)
            else ()
        )
    weight = EVENT_OVERHEAD
    for name in names:
        value = getattr(event, name, None)
        if type(value) is str:
            weight += len(value)
    return weight


class AgentState(enum.Enum):
    """Lifecycle of an :class:`~agentik.core.agent.Agent`: new → running → closing → closed."""

    NEW = "new"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class AgentLike(Protocol[C]):
    """What the engine's parts use of their :class:`~agentik.core.agent.Agent`:
    :class:`AgentServices`, the conversation and its turns, the run tree
    (:mod:`agentik.core.runs`) and the health checks.  They name this
    protocol, not the agent (which is built on them); mypy checks the agent
    against it.  The agent's other members are for its callers.  ``C`` is the
    conversation type: ``AgentLike[Conversation]`` above the conversation."""

    # -- who it is and how it runs
    @property
    def id(self) -> str: ...
    @property
    def state(self) -> AgentState: ...
    @property
    def services(self) -> AgentServices[C]: ...

    # -- what a turn is made of (read anew at each use)
    @property
    def llm(self) -> LLMBackend: ...
    def llm_for(self, profile: str | None) -> LLMBackend: ...
    @property
    def system_prompt(self) -> str | None: ...
    @property
    def hooks(self) -> Hooks: ...
    @property
    def policy(self) -> TurnPolicy: ...
    @property
    def attachments(self) -> AttachmentSettings: ...
    @property
    def checkpoints(self) -> CheckpointSettings: ...
    @property
    def tools(self) -> list[Tool]: ...
    @property
    def memory(self) -> MemoryBackend: ...
    @property
    def compactor(self) -> Compactor: ...
    @property
    def approvals(self) -> Approvals: ...
    @property
    def questions(self) -> Questions: ...
    @property
    def todos(self) -> Checklists: ...
    @property
    def request_observers(self) -> list[Callable[[RequestStats], None]]: ...
    @property
    def prompt_events(self) -> bool: ...

    # -- events
    @property
    def event_buffer(self) -> int: ...
    @property
    def event_budget(self) -> int: ...
    @property
    def event_bytes(self) -> int: ...
    @property
    def transcript_cache(self) -> int: ...
    @property
    def stream_profiles(self) -> dict[str, StreamProfile]: ...
    def events(
        self,
        *,
        after: int | None = None,
        profile: str | StreamProfile = "debug",
        kinds: Iterable[str] | None = None,
        max_pending: int | None = None,
    ) -> Subscription: ...

    # -- conversations
    async def get_conversation(self, conversation_id: str) -> C: ...
    async def create_child_conversation(
        self, *, title: str, temp: bool, meta: dict[str, Any]
    ) -> C: ...
    def child_run_done(self, child: C) -> None: ...
    async def end_conversation(
        self, conv: C, reason: str, *, channel_key: str | None = None
    ) -> None: ...

    # -- the run tree (agents as tools)
    @property
    def agents(self) -> dict[str, AgentSpec]: ...
    @property
    def uses(self) -> tuple[str, ...]: ...
    @property
    def agent_prompts(self) -> dict[str, str | None]: ...
    @property
    def run_policy(self) -> RunPolicy: ...
    @property
    def runs(self) -> Runs: ...
    def run_started(self, node: RunNode) -> None: ...
    def run_record(self, node: RunNode, *, stop_reason: str) -> RunRecord: ...
    async def store_run_ended(self, node: RunNode, stop_reason: str) -> None: ...
    async def store_run_refused(
        self, parent: RunNode, agent: str, call_id: str | None, stop_reason: str
    ) -> None: ...


class EventSink(Protocol):
    """Where a conversation's events also go on a store several workers share
    (:class:`~agentik.core.cluster.events.ClusterEvents`): kept for a batched write."""

    def add(self, stream: ConversationEvents, event: Event, *, wide: bool = True) -> None:
        """Keep ``event`` of ``stream`` (``wide``: it is on the agent-wide stream too;
        a child run's event relayed into its parent's stream is not)."""

    async def resume(self, events: ConversationEvents) -> None: ...

    async def flushed(self) -> None: ...


class AgentServices(Generic[C]):
    """What an :class:`~agentik.core.agent.Agent` provides to its conversations
    (``C``: their type, :class:`~agentik.core.conversation.Conversation`)."""

    def __init__(self, agent: AgentLike[C]) -> None:
        #: The agent these services belong to (its public face).
        self.agent = agent
        self._stream_seq = itertools.count(1)
        self.last_stream_seq = 0
        # Its replay buffer packs every STREAM_SEAL_EVERY events: 4,096 events of
        # short turns held ~0.9 MB as objects, ~0.15 MB so.
        self._bus = EventBus(
            key=lambda e: e.stream_seq,
            lost=self._lost,
            buffer=agent.event_buffer * 4,
            seal_every=STREAM_SEAL_EVERY,
        )
        # Replay buffers of all conversations, least recently active first.
        self._buffers: OrderedDict[str, ReplayBuffer] = OrderedDict()
        #: Events held in all conversations' replay buffers together.
        self.buffered = 0
        #: Their weight (:func:`event_weight`: about their size in bytes).
        self.buffered_bytes = 0
        #: The weight of the agent-wide stream's replay buffer (a quarter of
        #: ``event_bytes`` at most, besides its ``event_buffer * 4`` events).
        self.stream_bytes = 0
        # Buffers of streams nobody holds any more, to take out (see drop_buffer).
        self._dropped: list[tuple[str, ReplayBuffer]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        # Conversations in use stay here; idle ones are dropped when no
        # caller holds them any more (they reload from the store on demand).
        self.open: weakref.WeakValueDictionary[str, C] = weakref.WeakValueDictionary()
        # Busy conversations stay referenced even if no caller holds them.
        self.busy: dict[str, C] = {}
        # Conversations whose ``session_end`` hooks ran.
        self._ended: weakref.WeakSet[C] = weakref.WeakSet()
        # Conversations whose ``conversation_ended`` (reason ``shutdown``) was published.
        self._down: weakref.WeakSet[C] = weakref.WeakSet()
        # Ids whose last lifecycle event was ``conversation_ended`` (no turn since),
        # the latest ``_ENDED_IDS`` of them: a conversation loaded again after it
        # ended (the wind-down reads it) does not end a second time at shutdown.
        self._ended_ids: dict[str, None] = {}
        #: The transcripts idle conversations keep (the agent's ``transcript_cache``).
        self.transcripts = Transcripts(agent.transcript_cache)
        #: Hands freed memory back to the system after conversations leave memory
        #: (set by the agent; :mod:`~agentik.core.memtrim`).
        self.trim: MemoryTrim | None = None
        #: Every conversation event also goes here (a shared store's workers: see
        #: :mod:`agentik.core.cluster.events`); ``None`` (one process): nowhere.
        self.event_sink: EventSink | None = None

    # -- what the agent is configured with (read anew: changes apply at once) ----------
    @property
    def llm(self) -> LLMBackend:
        return self.agent.llm

    def llm_for(self, profile: str | None) -> LLMBackend:
        """The backend of model profile ``profile`` (a turn's settings'), else :attr:`llm`."""
        return self.agent.llm_for(profile)

    @property
    def system_prompt(self) -> str | None:
        return self.agent.system_prompt

    @property
    def hooks(self) -> Hooks:
        return self.agent.hooks

    @property
    def policy(self) -> TurnPolicy:
        return self.agent.policy

    @property
    def tools(self) -> list[Tool]:
        return self.agent.tools

    @property
    def compactor(self) -> Compactor:
        return self.agent.compactor

    @property
    def approvals(self) -> Approvals:
        """Which tool calls wait for a person's approval (and the pending ones)."""
        return self.agent.approvals

    @property
    def questions(self) -> Questions:
        """The questions turns wait for (``ask_user``)."""
        return self.agent.questions

    @property
    def event_buffer(self) -> int:
        """Events each conversation keeps for reconnecting subscribers."""
        return self.agent.event_buffer

    # -- lifecycle -------------------------------------------------------------------------
    def check_running(self) -> None:
        """Raise :class:`~agentik.core.errors.ClosedError` unless the agent runs."""
        state = self.agent.state
        if state is not AgentState.RUNNING:
            raise ClosedError(f"the agent is {state.value}")

    async def session_start(self, conv: C) -> None:
        """Run the ``session_start`` hooks for a conversation just created."""
        await self.hooks.session_start(conv)

    async def session_end(self, conv: C, reason: str) -> None:
        """Run the ``session_end`` hooks, once per conversation object."""
        if conv in self._ended:
            return
        self._ended.add(conv)
        await self.hooks.session_end(conv, reason)

    def end_unannounced(self, conv: C) -> bool:
        """Whether closing ``conv`` is its end still to be published: the agent
        runs (its own :meth:`~agentik.core.agent.Agent.aclose` is a shutdown,
        reflected on by ``wind_down``) and ``conv`` did not end already
        (``reset``, ``deleted``)."""
        return self.agent.state is AgentState.RUNNING and conv not in self._ended

    def claim_shutdown_end(self, conv: C) -> bool:
        """Whether the caller is to publish ``conversation_ended`` (reason
        ``shutdown``) on ``conv`` now, once per conversation object: the memory
        worker's ``wind_down`` (for what it reflects on) and the conversation's
        own ``aclose()`` while the agent closes both ask.  ``False`` when ``conv``
        ended already (``reset``, ``deleted``, ``closed``) or was claimed."""
        if conv in self._down or conv in self._ended or conv.id in self._ended_ids:
            return False
        self._down.add(conv)
        return True

    # -- the registry of conversations ------------------------------------------------------
    def remember(self, conv: C) -> None:
        """Keep ``conv`` findable while anyone holds it."""
        self.open[conv.id] = conv

    def find(self, conversation_id: str) -> C | None:
        """The conversation with this id if it is in use."""
        return self.open.get(conversation_id)

    def mark_busy(self, conv: C) -> None:
        """``conv`` has turns queued: keep it referenced until :meth:`mark_idle`."""
        self.busy[conv.id] = conv

    def mark_idle(self, conv: C) -> None:
        self.busy.pop(conv.id, None)

    def forget(self, conv: C) -> None:
        """``conv`` closed: drop it from the registry."""
        if self.open.get(conv.id) is conv:
            del self.open[conv.id]
        self.busy.pop(conv.id, None)

    def conversations(self) -> list[C]:
        """Every conversation in use or busy (each once)."""
        return list({**{c.id: c for c in list(self.open.values())}, **self.busy}.values())

    # -- events --------------------------------------------------------------------------------
    def next_stream_seq(self) -> int:
        """The next number of the agent-wide event stream."""
        self.last_stream_seq = next(self._stream_seq)
        return self.last_stream_seq

    @property
    def published_stream_seq(self) -> int:
        """The ``stream_seq`` of the last event put on the agent-wide stream here
        (:meth:`next_stream_seq` may have numbered later ones for a stream of their
        own: another worker's events, :mod:`agentik.core.cluster.events`)."""
        return self._bus.last_key

    def _lost(self, event: EventBase | None, after: int, oldest: int) -> EventsLost:
        return EventsLost(
            conversation_id="",
            stream_seq=after,
            ts=time.time(),
            requested_after=after,
            oldest_seq=oldest,
        )

    def publish(self, event: Event, weight: int | None = None) -> None:
        """Put ``event`` on the agent-wide stream.  Its replay buffer keeps about a
        quarter of the agent's ``event_bytes`` besides its length bound: tool outputs
        travel in events, and 4,096 of them kept by count held 20-64 KB each.
        ``weight``: the event's :func:`event_weight`, if the caller has it already."""
        kind = event.kind
        if kind == "conversation_ended":
            ended = self._ended_ids
            ended[event.conversation_id] = None
            if len(ended) > _ENDED_IDS:
                del ended[next(iter(ended))]
        elif kind == "turn_started":
            self._ended_ids.pop(event.conversation_id, None)
        buffer = self._bus.buffer
        if buffer.maxlen is not None and len(buffer) >= buffer.maxlen:
            self.stream_bytes -= event_weight(buffer[0])
        self._bus.publish(event)
        self.stream_bytes += event_weight(event) if weight is None else weight
        most = self.agent.event_bytes // 4
        while self.stream_bytes > most and len(buffer) > 1:
            self.stream_bytes -= event_weight(buffer.popleft())

    def account(
        self, conversation_id: str, buffer: ReplayBuffer, added: int, weight: int = 0
    ) -> None:
        """Keep the replay buffers of all conversations within the agent's
        ``event_budget`` (events) and ``event_bytes`` (their weight: answers and tool
        outputs travel in events); the least recently active conversations lose
        theirs first.  ``added``/``weight``: what the buffer gained (net of an event
        its length bound pushed out)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._buffers[conversation_id] = buffer
        self._buffers.move_to_end(conversation_id)
        self.buffered += added
        self.buffered_bytes += weight
        agent = self.agent
        budget, most = agent.event_budget, agent.event_bytes
        while (self.buffered > budget or self.buffered_bytes > most) and len(self._buffers) > 1:
            _, oldest = self._buffers.popitem(last=False)
            self._forget(oldest)
            oldest.clear()

    def _forget(self, buffer: ReplayBuffer) -> None:
        self.buffered -= len(buffer)
        self.buffered_bytes -= buffer.weight()

    def drop_buffer(self, conversation_id: str, buffer: ReplayBuffer) -> None:
        """A conversation's event stream is gone: its replay ``buffer`` leaves the budget.

        Called by the garbage collector, which may run in any thread and between
        any two steps of :meth:`account`: the buffer is taken out on the event
        loop, soon after (its events are freed then)."""
        loop = self._loop
        if loop is None or self._buffers.get(conversation_id) is not buffer:
            return
        self._dropped.append((conversation_id, buffer))
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to budget
            loop.call_soon_threadsafe(self._take_dropped)

    def _take_dropped(self) -> None:
        while self._dropped:
            conversation_id, buffer = self._dropped.pop()
            if self._buffers.get(conversation_id) is buffer:
                del self._buffers[conversation_id]
                self._forget(buffer)
                # A conversation left memory: what it held may go back to the system.
                if self.trim is not None:
                    self.trim.released()

    def scrub(self, editor: Callable[[], Callable[[Event], Event | None]]) -> int:
        """Rewrite buffered events in every replay buffer (each conversation's and
        the agent-wide one): ``editor()`` makes the edit for one buffer (oldest
        event first), which returns a replacement, or ``None`` to keep the event
        as it is.  Numbers (``seq``, ``stream_seq``) never change, so
        a reconnecting subscriber sees no gap.  Returns how many were replaced.

        Redaction uses it (:meth:`agentik.core.agent.Agent.redact`): what a
        redacted message said must not be replayed by ``events?after=0``.
        """
        changed = 0
        for buffer in [*self._buffers.values(), self._bus.buffer]:
            edit = editor()
            for i, event in enumerate(buffer):
                new = edit(event)
                if new is not None and new is not event:
                    buffer[i] = new
                    changed += 1
        if changed:
            self.buffered_bytes = sum(buffer.weight() for buffer in self._buffers.values())
            self.stream_bytes = sum(event_weight(e) for e in self._bus.buffer)
        return changed

    def subscribe(
        self,
        *,
        after: int | None,
        profile: StreamProfile | None,
        max_pending: int | None,
    ) -> Subscription:
        """A subscription to the agent-wide stream (``after`` is a ``stream_seq``)."""
        return self._bus.subscribe(after=after, profile=profile, max_pending=max_pending)

    def close(self) -> None:
        """End the agent-wide stream (its subscribers' iterations end)."""
        self._bus.close()


_FIELDS: dict[type, tuple[str, ...]] = {}
#: A conversation's events are numbered by ``seq`` (one getter shared by every stream).
_seq = operator.attrgetter("seq")


def _renumbered(event: Event, conversation_id: str, seq: int) -> Event:
    """A copy of ``event`` with another ``conversation_id`` and ``seq``.

    Events are frozen slotted dataclasses of plain values: the copy shares
    them, and skips ``dataclasses.replace``'s per-call field walk and
    ``__init__`` (a child run relays about ten events).
    """
    cls = type(event)
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(
            f.name for f in dataclasses.fields(cls) if f.name not in ("conversation_id", "seq")
        )
    copy = object.__new__(cls)
    setattr_ = object.__setattr__
    for name in names:
        setattr_(copy, name, getattr(event, name))
    setattr_(copy, "conversation_id", conversation_id)
    setattr_(copy, "seq", seq)
    return copy


class ConversationEvents(EventBus):
    """The event stream of one conversation.

    :meth:`emit` numbers an event (``seq`` per conversation, ``stream_seq``
    agent-wide), keeps it in the replay buffer (``services.event_buffer``
    events, within the agent's budget) and publishes it to this
    conversation's subscribers and the agent's stream.

    The stream holds its ``owner`` (the conversation), so while anyone
    holds the stream — a subscriber — the conversation stays in memory:
    later lookups find the same object, and its subscribers see its turns.
    A conversation creates its stream on first use (idle ones have none).
    When nobody holds it any more (the conversation was dropped: it reloads
    from the store as a new object, with a stream of its own), its replay
    buffer leaves the agent's budget with it.
    ``closed``: the conversation is closing; subscribers end at once.

    It is the conversation's :class:`EventBus` itself: :meth:`subscribe`
    (``after`` is a ``seq``), :meth:`seal` (when no turn is left to run: its
    replay buffer packs the events it holds, which a replay unpacks equal;
    :class:`ReplayBuffer`) and :meth:`close` are the bus's.
    """

    __slots__ = (
        "__weakref__",
        "_services",
        "conversation_id",
        "owner",
        "parent_run_id",
        "relay_to",
        "seq",
        "turn_started",
    )

    def __init__(
        self,
        conversation_id: str,
        services: AgentServices,
        *,
        owner: object = None,
        closed: bool = False,
    ) -> None:
        self.conversation_id = conversation_id
        self.owner = owner
        self._services = services
        #: The number of the last event emitted.
        self.seq = 0
        #: The run id and ``seq`` of the top-level turn started here and not ended yet.
        self.turn_started: tuple[str, int] | None = None
        #: A child run's conversation: the run its events name as their parent,
        #: and the parent conversation's stream they are relayed into
        #: (:mod:`agentik.core.agents`).
        self.parent_run_id: str | None = None
        self.relay_to: ConversationEvents | None = None
        # The stream is its own bus (a bus of its own and the bound method it
        # called back for ``events_lost`` were 190 bytes a conversation).
        super().__init__(key=_seq, buffer=services.event_buffer, weigh=event_weight)
        if closed:
            self.close()

    def __del__(self) -> None:
        # Nothing can replay a dropped stream's buffer: it must not hold events (and
        # a place in the budget) until the budget pushes it out.  (A finalizer, not a
        # weak reference with a callback: that was 110 bytes a conversation.)  The
        # garbage collector may call it in any thread: ``drop_buffer`` allows that.
        buffer = getattr(self, "buffer", None)
        if isinstance(buffer, ReplayBuffer) and buffer:
            self._services.drop_buffer(self.conversation_id, buffer)

    def _lost(self, event: EventBase | None, after: int, oldest: int) -> EventsLost:
        return EventsLost(
            conversation_id=self.conversation_id,
            seq=after,
            ts=time.time(),
            requested_after=after,
            oldest_seq=oldest,
        )

    def emit(self, cls: type[E], run_id: str | None, **fields: Any) -> E:
        """Create an event of type ``cls`` for turn ``run_id`` and publish it.

        In a child run's conversation the event carries the parent run's id
        and is relayed into the parent conversation's stream too.
        """
        services = self._services
        self.seq += 1
        if "parent_run_id" not in fields:
            fields["parent_run_id"] = self.parent_run_id
        event = cls(
            conversation_id=self.conversation_id,
            run_id=run_id,
            seq=self.seq,
            stream_seq=services.next_stream_seq(),
            ts=time.time(),
            **fields,
        )
        if cls is TurnStarted and run_id is not None and fields["parent_run_id"] is None:
            self.turn_started = (run_id, self.seq)
        elif cls is TurnEnded and self.turn_started is not None and self.turn_started[0] == run_id:
            self.turn_started = None  # its last events may follow: it is over all the same
        weight = event_weight(event)  # once: the two buffers weigh it alike
        services.account(self.conversation_id, *self._buffered(event, weight))
        services.publish(event, weight)
        # A child conversation's state is its own: the parent's stream says
        # ``executing_tools`` (the agent tool) while the child runs.
        if self.relay_to is not None and cls is not StatusChanged:
            self.relay_to.relay(event)
        return event

    def _buffered(
        self, event: Event, weight: int, *, wide: bool = True
    ) -> tuple[ReplayBuffer, int, int]:
        """Publish ``event`` (which weighs ``weight``) on this stream: its buffer, and
        the events and weight that buffer gained (net of the oldest event its length
        bound pushed out).  ``wide``: the event is on the agent-wide stream too (the
        event sink's)."""
        buffer = cast(ReplayBuffer, self.buffer)
        gained = weight
        before = len(buffer)
        if buffer.maxlen is not None and before >= buffer.maxlen and before:
            gained -= event_weight(buffer[0])
        self.publish(event, weight)
        sink = self._services.event_sink
        if sink is not None:
            sink.add(self, event, wide=wide)
        return buffer, len(buffer) - before, gained

    def relay(self, event: Event) -> None:
        """Put a descendant run's ``event`` in this stream (renumbered as this
        conversation's; not on the agent-wide stream, which has it already)."""
        self.seq += 1
        copy = _renumbered(event, self.conversation_id, self.seq)
        self._services.account(
            self.conversation_id, *self._buffered(copy, event_weight(copy), wide=False)
        )
        if self.relay_to is not None:
            self.relay_to.relay(event)

    def emit_agent_wide(self, cls: type[E], **fields: Any) -> E:
        """Publish an event about this conversation on the agent's stream only
        (``seq`` 0: it is not part of the conversation's own stream and replay
        buffer, which start with its first turn)."""
        services = self._services
        event = cls(
            conversation_id=self.conversation_id,
            run_id=None,
            seq=0,
            stream_seq=services.next_stream_seq(),
            ts=time.time(),
            **fields,
        )
        services.publish(event)
        sink = services.event_sink
        if sink is not None:
            # (Kept with the conversation's events: the agent-wide stream of every
            # worker reads it there; ``seq`` 0 keeps it out of the conversation's.)
            sink.add(self, event)
        return event


@dataclass(frozen=True, slots=True)
class ConversationParts(Generic[C]):
    """A conversation's engine parts, handed to each turn and compaction as one value."""

    #: The conversation itself: what hooks receive, its id and channel.
    conversation: C
    #: Its LLM context.
    memory: WorkingMemory
    #: Its event stream.
    events: ConversationEvents
    #: What its agent provides (model, system prompt, hooks, compactor).
    services: AgentServices[C]

    @property
    def id(self) -> str:
        return self.memory.conversation_id

    @property
    def channel_key(self) -> str | None:
        return self.conversation.channel_key


def profile_of(
    profiles: Mapping[str, StreamProfile],
    profile: str | StreamProfile,
    kinds: Iterable[str] | None,
) -> StreamProfile:
    """The profile a subscriber asked for: explicit ``kinds`` win, else ``profile``
    (a name among ``profiles`` or a :class:`StreamProfile`); an unknown name raises
    :class:`~agentik.core.streamprofiles.UnknownProfileError` (a ``ValueError``)."""
    if kinds is not None:
        return StreamProfile(name="kinds", kinds=frozenset(kinds))
    return lookup(profiles, profile)


def kinds_of(profile: str, kinds: Iterable[str] | None) -> frozenset[str] | None:
    """The event kinds a subscriber with built-in ``profile`` (or explicit ``kinds``)
    gets; ``None``: all (kept for callers of the fixed profiles)."""
    return profile_of(BUILTIN_PROFILES, profile, kinds).kinds
