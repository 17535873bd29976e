"""Events: the only thing transports see of a running turn.

Every event is a small frozen dataclass with a ``kind`` discriminator and the
same envelope:

``conversation_id``
    the conversation the event belongs to;
``run_id`` / ``parent_run_id``
    the turn (run) that produced it; ``parent_run_id`` is set for child runs
    (sub-agents) and ``None`` otherwise;
``seq``
    per-conversation sequence number, strictly increasing from 1 within one
    agent process (on a store several workers share: across workers and
    restarts, :mod:`agentik.core.cluster.events`); a subscriber reconnects with
    ``events(after=seq)``;
``stream_seq``
    agent-wide sequence number (for :meth:`Agent.events`);
``ts``
    wall-clock time (``time.time()``) when the event was published.

``event_to_dict``/``event_from_dict`` (and the JSON twins) round-trip every
event losslessly, so the same shapes go to transports, the HTTP API and logs.

Subscribers choose a *profile* (:mod:`agentik.core.streamprofiles`):
``chat`` (text and short tool notices), ``debug`` (everything),
``metrics`` (usage and lifecycle: per-request ``usage`` and
``status_changed`` are in ``metrics`` and ``debug``, not in ``chat``) or
one declared in the configuration.

**Plugins' own events.**  A plugin declares an event kind of its own with
:func:`declare_event` on a subclass of :class:`PluginEvent` whose ``kind``
is a dotted name (``acme.flagged``: never a built-in's); its interception
hooks emit it with the ``emit`` argument they receive.  A declared kind
round-trips through :func:`event_from_dict` like a built-in one, and stream
profiles name it like any kind (``[profiles.x] kinds = ["acme.flagged"]``;
``debug`` carries it, ``chat`` and ``metrics`` do not).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeVar, cast, get_args

from .compat import moved_attribute
from .errors import PluginError
from .messages import Usage

__all__ = [
    "EVENTS_BY_KIND",
    "EVENT_TYPES",
    "PROFILES",  # noqa: F822 - moved to streamprofiles, resolved by __getattr__
    "ApprovalRequested",
    "ApprovalResolved",
    "ChildRunLinked",
    "Compacted",
    "ConversationEnded",
    "ConversationStarted",
    "Error",
    "Event",
    "EventBase",
    "EventsLost",
    "Interrupted",
    "MemoryNoted",
    "PluginEvent",
    "PromptRendered",
    "QuestionAnswered",
    "QuestionAsked",
    "QuestionProgress",
    "ReasoningDelta",
    "ReasoningStarted",
    "RequestUsage",
    "ResponseStarted",
    "RunStreamEnd",
    "StatusChanged",
    "StatusState",
    "TextDelta",
    "TodoUpdated",
    "ToolCallEnded",
    "ToolCallStarted",
    "ToolProgress",
    "TurnEnded",
    "TurnStarted",
    "declare_event",
    "declared_event",
    "event_from_dict",
    "event_from_json",
    "event_to_dict",
    "event_to_json",
    "plugin_event_kinds",
]

#: Why a turn ended: the model finished (``stop``), hit its output limit or
#: the turn's ``max_answer_chars`` (``length``), was interrupted, ran out of
#: its time budget, failed, a plugin aborted it (``aborted``, from the
#: ``after_response`` hook), or the model kept calling tools after the turn's
#: tool calls were used up (``tool_limit``), a token budget of the run or of its
#: run tree was used up (``token_budget``), or a child run was refused because
#: the run tree is as deep as allowed (``depth_limit``, recorded for the refused
#: child in the run tree).
_P = TypeVar("_P", bound="PluginEvent")

StopReason = Literal[
    "stop",
    "length",
    "interrupted",
    "time_budget",
    "error",
    "aborted",
    "tool_limit",
    "token_budget",
    "depth_limit",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class EventBase:
    """Envelope shared by all events (see the module docstring)."""

    kind: str = field(default="", init=False)
    conversation_id: str
    run_id: str | None = None
    parent_run_id: str | None = None
    seq: int = 0
    stream_seq: int = 0
    ts: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnStarted(EventBase):
    """A turn began; ``message_id`` is the audit-log id of the user message."""

    kind: Literal["turn_started"] = field(default="turn_started", init=False)
    message_id: int | None = None
    author: str | None = None
    #: Where the turn came from (:class:`~agentik.core.turnsettings.TurnOrigin` as a
    #: dict: ``transport``, ``channel_key``, ``speaker_id``, ``display_name``,
    #: ``verified``); ``None``: not said (a library call without settings).
    origin: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ReasoningStarted(EventBase):
    """The model started emitting reasoning ("thinking") text."""

    kind: Literal["reasoning_started"] = field(default="reasoning_started", init=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class ReasoningDelta(EventBase):
    """A piece of reasoning text."""

    kind: Literal["reasoning_delta"] = field(default="reasoning_delta", init=False)
    text: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ResponseStarted(EventBase):
    """The model started emitting answer text (sent once per model request)."""

    kind: Literal["response_started"] = field(default="response_started", init=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class TextDelta(EventBase):
    """A piece of answer text, in order."""

    kind: Literal["text_delta"] = field(default="text_delta", init=False)
    text: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCallStarted(EventBase):
    """A tool call began; ``arguments`` is the model's raw JSON text."""

    kind: Literal["tool_call_started"] = field(default="tool_call_started", init=False)
    call_id: str
    name: str
    arguments: str = "{}"


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCallEnded(EventBase):
    """A tool call finished: ``result`` is the text given back to the model."""

    kind: Literal["tool_call_ended"] = field(default="tool_call_ended", init=False)
    call_id: str
    name: str
    result: str = ""
    is_error: bool = False
    duration: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildRunLinked(EventBase):
    """A child run (sub-agent) was started for the tool call ``call_id``.

    Emitted by the parent run (``run_id``) in the parent's conversation;
    ``agent`` is the called agent's name and ``child_conversation_id`` the
    conversation the child runs in (its events are also relayed into the
    parent's stream, carrying ``run_id = child_run_id``).
    """

    kind: Literal["child_run_linked"] = field(default="child_run_linked", init=False)
    child_run_id: str
    call_id: str | None = None
    agent: str | None = None
    child_conversation_id: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class RunStreamEnd(EventBase):
    """No more events will appear for the run ``run_id`` (after its ``turn_ended``)."""

    kind: Literal["run_stream_end"] = field(default="run_stream_end", init=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnEnded(EventBase):
    """The turn is over; ``text`` is the full final answer as recorded."""

    kind: Literal["turn_ended"] = field(default="turn_ended", init=False)
    stop_reason: StopReason = "stop"
    usage: Usage = dataclasses.field(default_factory=Usage)
    text: str = ""
    tool_calls: int = 0
    duration: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Interrupted(EventBase):
    """The turn was interrupted; ``partial_text`` was kept, marked interrupted."""

    kind: Literal["interrupted"] = field(default="interrupted", init=False)
    partial_text: str = ""
    reason: str = "interrupt"


@dataclass(frozen=True, kw_only=True, slots=True)
class Error(EventBase):
    """Something failed during the turn; ``message`` is safe to show a user."""

    kind: Literal["error"] = field(default="error", init=False)
    message: str
    error_type: str = ""
    retryable: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class EventsLost(EventBase):
    """Sent to one subscriber only: events after ``requested_after`` are gone.

    The replay buffer no longer reaches back that far (or the sequence is
    from an earlier process, or the subscriber fell too far behind).  The
    subscriber should resynchronise from :meth:`Conversation.messages`.
    ``oldest_seq`` is the oldest event still buffered (0 if none).
    """

    kind: Literal["events_lost"] = field(default="events_lost", init=False)
    requested_after: int = 0
    oldest_seq: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Compacted(EventBase):
    """The working memory was compacted (the audit log is untouched).

    ``messages`` older entries were replaced by ``summary``; the estimated
    context size went from ``tokens_before`` to ``tokens_after``.
    ``reason`` is ``budget`` (a request passed compaction's trigger),
    ``forced`` (``!compact``), ``window`` (the context did not fit the
    model's real window, even after compaction or with compaction off: the
    oldest turns were dropped) or ``refused`` (the model refused a request
    as too large; the context was shrunk for one retry) or ``tool`` (the model
    asked for it with ``compact_context``).  ``fallback`` is
    true when messages were dropped rather than summarised (summarising
    failed, or trimming); ``summary`` is then the notice left in their place.
    """

    kind: Literal["compacted"] = field(default="compacted", init=False)
    messages: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    summary: str = ""
    reason: str = "budget"
    fallback: bool = False
    #: User messages among the ``messages`` summarised (mining's ``mine_min_turns``).
    user_turns: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class ConversationEnded(EventBase):
    """The conversation ended, for ``reason``: ``reset`` (its channel moved on to a
    new one, ``!new``), ``deleted`` (emitted before its rows go), ``idle`` (no turn
    for ``[memory] reflect_after_idle``; a later message goes on in the same
    conversation), ``closed`` (a library user closed it, ``Conversation.aclose()``,
    while the agent runs) or ``shutdown`` (the bot stopped with turns not yet
    reflected on, or ``Agent.aclose()`` closed it: once per conversation).
    ``channel_key`` is the channel it was bound to, if any."""

    kind: Literal["conversation_ended"] = field(default="conversation_ended", init=False)
    reason: str = "reset"
    channel_key: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ConversationStarted(EventBase):
    """A conversation was created; ``channel_key`` is the channel it is bound to, if any.

    Published on the agent's stream only (``seq`` 0): a conversation's own
    stream starts with its first turn."""

    kind: Literal["conversation_started"] = field(default="conversation_started", init=False)
    channel_key: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryNoted(EventBase):
    """Background memory work saved ``count`` notes (``note_ids``) from this
    conversation: ``source`` is ``reflection`` or ``mining``.  A channel with
    ``announce`` on is told ("noted 3 facts — !memory to review")."""

    kind: Literal["memory_noted"] = field(default="memory_noted", init=False)
    count: int = 0
    note_ids: tuple[int, ...] = ()
    source: str = "reflection"
    channel_key: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ApprovalRequested(EventBase):
    """The turn waits for a person to approve the tool call ``call_id`` (``name``).

    ``approval_id`` is the short id people answer with (``!approve 3f2``);
    ``arguments`` are shown masked and cut; ``asker`` asked for the turn;
    ``approvers`` is the role that may decide; the request expires at
    ``expires_at`` (``timeout`` seconds after it was made).  ``resumed``: the
    same request again, after a restart.
    """

    kind: Literal["approval_requested"] = field(default="approval_requested", init=False)
    approval_id: str
    call_id: str
    name: str
    arguments: str = "{}"
    asker: str | None = None
    asker_id: str | None = None
    approvers: str = "admin"
    expires_at: float = 0.0
    timeout: float = 0.0
    resumed: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class ApprovalResolved(EventBase):
    """An approval ended: ``decision`` is ``approved``, ``denied``, ``expired`` or
    ``cancelled`` (the turn was stopped); ``approver`` decided, giving ``reason``."""

    kind: Literal["approval_resolved"] = field(default="approval_resolved", init=False)
    approval_id: str
    call_id: str
    name: str
    decision: Literal["approved", "denied", "expired", "cancelled"]
    approver: str | None = None
    approver_id: str | None = None
    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class QuestionAsked(EventBase):
    """The model asked the channel a question (the builtin ``ask_user`` tool,
    call ``call_id``); the turn waits for the answer.

    ``question_id`` is its id (``question`` table, migration 10); ``to`` the
    person asked (``None``: anyone may answer), ``choices`` the answers
    offered (may be empty), ``answer_from`` who may answer (``asked`` or
    ``anyone``); it expires at ``expires_at`` (``timeout`` seconds after it
    was asked).  ``resumed``: the same question again, after a restart.
    """

    kind: Literal["question_asked"] = field(default="question_asked", init=False)
    question_id: int
    call_id: str
    question: str
    to: str | None = None
    choices: tuple[str, ...] = ()
    answer_from: str = "asked"
    expires_at: float = 0.0
    timeout: float = 0.0
    resumed: bool = False
    #: A form (several questions answered at once): its fields in order, each
    #: ``{"id", "text", "choices", "required"}``; empty for one question.
    form: tuple[dict[str, Any], ...] = ()
    #: A form's fields answered already (their ids; after a restart).
    answered: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class QuestionProgress(EventBase):
    """Part of a form (a multi-question ``ask_user``) was answered: ``answered``
    are the ids of its fields answered so far, ``next`` the first still open
    (``None``: none, the form is about to end), ``by`` who answered this part.
    Carries no answer text (the ``question_answered`` at the end does)."""

    kind: Literal["question_progress"] = field(default="question_progress", init=False)
    question_id: int
    call_id: str
    answered: tuple[str, ...] = ()
    next: str | None = None
    by: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class QuestionAnswered(EventBase):
    """A question ended: ``outcome`` is ``answered`` (by ``answered_by``, with
    ``answer``), ``expired`` (nobody answered in time) or ``cancelled`` (the
    turn was stopped)."""

    kind: Literal["question_answered"] = field(default="question_answered", init=False)
    question_id: int
    call_id: str
    outcome: Literal["answered", "expired", "cancelled"]
    answer: str = ""
    answered_by: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class TodoUpdated(EventBase):
    """The model replaced its checklist (the builtin ``todo`` tool, call ``call_id``).

    ``items``: ``{"text": ..., "status": "pending" | "in_progress" | "done"}``
    in order; ``changed``: the items (by index) that are new or whose status
    changed since the previous list of this conversation.
    """

    kind: Literal["todo_updated"] = field(default="todo_updated", init=False)
    call_id: str
    items: tuple[dict[str, str], ...] = ()
    changed: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolProgress(EventBase):
    """A running tool call reported progress (MCP ``notifications/progress``).

    ``progress`` so far, of ``total`` when known, with the server's
    ``message``; ``elapsed``: seconds since the call started.
    """

    kind: Literal["tool_progress"] = field(default="tool_progress", init=False)
    call_id: str
    name: str
    progress: float
    total: float | None = None
    message: str | None = None
    elapsed: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class PromptRendered(EventBase):
    """What went to the model for request number ``request`` of the run, after the
    ``before_llm_request`` hooks: the ``system`` prompt, the ``messages`` (each
    ``{"role", "content"}``, plus ``name``, ``tool_call_id``, ``tool_calls`` where
    set) and the names of the ``tools`` offered, to ``model`` of ``backend``.

    Emitted only when the agent's ``prompt_events`` is on (``[agent]
    prompt_events``); carried by ``debug``, not by ``chat`` or ``metrics``.
    Known secrets (the built-in scrubber's patterns and ``[[redaction.patterns]]``)
    are replaced with ``[redacted:<kind>]`` in every text.
    """

    kind: Literal["prompt_rendered"] = field(default="prompt_rendered", init=False)
    request: int = 1
    model: str = ""
    backend: str = ""
    system: str | None = None
    messages: tuple[dict[str, Any], ...] = ()
    tools: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class PluginEvent(EventBase):
    """The base of a plugin's own event kinds (see :func:`declare_event`).

    A subclass is a frozen ``kw_only`` dataclass (``slots=True``) that sets
    ``kind`` to a dotted name of its own and adds fields of JSON types
    (``str``, numbers, ``bool``, ``None``, lists, dicts)::

        @declare_event
        @dataclass(frozen=True, kw_only=True, slots=True)
        class Flagged(PluginEvent):
            kind: Literal["acme.flagged"] = field(default="acme.flagged", init=False)
            reason: str
            score: float = 0.0
    """

    kind: str = field(default="", init=False)


#: What a plugin's event kind looks like: dotted words (``acme.flagged``), so it
#: never takes a built-in kind's name (those have no dot).
PLUGIN_KIND = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)+")
_PLUGIN_KINDS: dict[str, type[PluginEvent]] = {}


def declare_event(cls: type[_P]) -> type[_P]:
    """Declare ``cls`` (a :class:`PluginEvent` dataclass) as an event kind: hooks may
    emit it, :func:`event_from_dict` rebuilds it, profiles may name it.

    Raises :class:`~agentik.core.errors.PluginError` for a class that is not a
    ``PluginEvent`` dataclass, a ``kind`` that is not dotted words, or a kind
    another class already declared (declaring the same class again, as a
    re-imported module does, is fine).
    """
    if not (isinstance(cls, type) and issubclass(cls, PluginEvent)):
        raise PluginError(f"declare_event: {cls!r} is not a subclass of PluginEvent")
    if "__dataclass_fields__" not in cls.__dict__:
        raise PluginError(f"declare_event: {cls.__qualname__} must be a dataclass")
    kind = _kind_of(cls)
    if not isinstance(kind, str) or not PLUGIN_KIND.fullmatch(kind):
        raise PluginError(
            f"declare_event: {cls.__qualname__}.kind = {kind!r}: a plugin's event kind is"
            " dotted lowercase words, e.g. 'acme.flagged'"
        )
    known = _PLUGIN_KINDS.get(kind)
    same = known is not None and (known.__module__, known.__qualname__) == (
        cls.__module__,
        cls.__qualname__,
    )
    if known is not None and not same:
        raise PluginError(
            f"event kind {kind!r} is declared by both {known.__module__}.{known.__qualname__}"
            f" and {cls.__module__}.{cls.__qualname__}"
        )
    _PLUGIN_KINDS[kind] = cls
    return cls


def declared_event(cls: type) -> bool:
    """Whether ``cls`` is a declared plugin event class (:func:`declare_event`)."""
    kind = getattr(cls, "__dataclass_fields__", {}).get("kind")
    return kind is not None and _PLUGIN_KINDS.get(kind.default) is cls


def plugin_event_kinds() -> frozenset[str]:
    """The kinds plugins declared so far (:func:`declare_event`)."""
    return frozenset(_PLUGIN_KINDS)


#: What a conversation is doing (:meth:`Conversation.status`): no turn
#: (``idle``), a turn between steps (``running``), a model request streaming
#: (``streaming``), tool calls running (``executing_tools``), or waiting for a
#: person (an approval: ``awaiting_human``).
StatusState = Literal["idle", "running", "streaming", "executing_tools", "awaiting_human"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StatusChanged(EventBase):
    """The conversation's state changed from ``previous`` to ``state``.

    ``tools`` names the tool calls running (in ``executing_tools`` and
    ``awaiting_human``); ``queued`` counts the turns waiting behind this one.
    The last ``idle`` of a turn comes just before its ``turn_ended`` (when no
    other turn is queued).
    """

    kind: Literal["status_changed"] = field(default="status_changed", init=False)
    state: StatusState = "idle"
    previous: StatusState = "idle"
    tools: tuple[str, ...] = ()
    queued: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestUsage(EventBase):
    """The tokens of one model request of the run (``turn_ended`` has the total).

    ``model`` and ``backend`` name what answered it; ``request`` counts the
    run's requests from 1.  The usage is zero when the backend reported none.
    """

    kind: Literal["usage"] = field(default="usage", init=False)
    usage: Usage = dataclasses.field(default_factory=Usage)
    model: str = ""
    backend: str = ""
    request: int = 1


#: Every event, as one union discriminated by ``kind``: a type checker narrows
#: ``event: Event`` to one class on ``if event.kind == "text_delta": ...``.
Event = (
    TurnStarted
    | ReasoningStarted
    | ReasoningDelta
    | ResponseStarted
    | TextDelta
    | ToolCallStarted
    | ToolCallEnded
    | ChildRunLinked
    | RunStreamEnd
    | TurnEnded
    | Interrupted
    | Error
    | EventsLost
    | Compacted
    | ConversationEnded
    | ConversationStarted
    | MemoryNoted
    | ApprovalRequested
    | ApprovalResolved
    | QuestionAsked
    | QuestionAnswered
    | QuestionProgress
    | TodoUpdated
    | ToolProgress
    | StatusChanged
    | RequestUsage
    | PromptRendered
)

#: The event classes of :data:`Event`, in order.
EVENT_TYPES: tuple[type[Event], ...] = get_args(Event)


def _kind_of(cls: type[EventBase]) -> str:
    # ``kind`` is a field with a fixed default; slotted classes keep defaults on the field.
    return cast(str, cls.__dataclass_fields__["kind"].default)


_BY_KIND: dict[str, type[Event]] = {_kind_of(cls): cls for cls in EVENT_TYPES}
#: Each event class by its ``kind`` (read-only): what :func:`event_from_dict` rebuilds.
EVENTS_BY_KIND: Mapping[str, type[Event]] = MappingProxyType(_BY_KIND)


def __getattr__(name: str) -> Any:
    # ``PROFILES`` moved to streamprofiles, which builds on this module (a profile
    # filters events): same object, with a DeprecationWarning.
    if name == "PROFILES":
        return moved_attribute(__name__, "agentik.core.streamprofiles", name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def event_to_dict(event: EventBase) -> dict[str, Any]:
    """Serialise an event to plain JSON types, ``kind`` included (last)."""
    d = {f.name: getattr(event, f.name) for f in dataclasses.fields(event) if f.name != "kind"}
    if isinstance(d.get("usage"), Usage):
        d["usage"] = d["usage"].to_dict()
    for key in ("tools", "messages"):
        if isinstance(d.get(key), tuple):
            d[key] = list(d[key])
    d["kind"] = event.kind
    return d


def event_from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from :func:`event_to_dict` output (unknown keys ignored)."""
    d = dict(data)
    kind = d.pop("kind", None)
    cls: type[EventBase] | None = _BY_KIND.get(kind or "") or _PLUGIN_KINDS.get(kind or "")
    if cls is None:
        raise ValueError(f"unknown event kind: {kind!r}")
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs = {k: v for k, v in d.items() if k in names}
    if "usage" in kwargs and isinstance(kwargs["usage"], dict):
        kwargs["usage"] = Usage.from_dict(kwargs["usage"])
    for key in ("choices", "items", "changed", "tools", "note_ids", "messages", "form", "answered"):
        # JSON has no tuples: these fields come back as lists.
        if isinstance(kwargs.get(key), list):
            kwargs[key] = tuple(kwargs[key])
    return cast("Event", cls(**kwargs))


def event_to_json(event: EventBase) -> str:
    """Serialise an event to compact JSON text."""
    return json.dumps(event_to_dict(event), ensure_ascii=False, separators=(",", ":"))


def event_from_json(text: str) -> Event:
    """Rebuild an event from :func:`event_to_json` output."""
    return event_from_dict(json.loads(text))
