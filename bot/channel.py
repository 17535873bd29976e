"""The bridge's per-transport settings, :class:`ChannelOptions`, and the state
of a channel it holds open, :class:`OpenChannel`.

Declared here, apart from :mod:`agentik.bot.bridge` (which re-exports it), so
that the configuration (:mod:`agentik.bot.config`, which the bridge imports)
can derive the bridge keys of ``[transports.<name>]`` from it without an
import cycle: each key, its type, default and limits are written once.  The
chat commands (:mod:`agentik.bot.commands`) and the renderer read an open
channel from here without importing the bridge.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass as std_dataclass
from dataclasses import field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from agentik.core.settings import SETTINGS, setting_fields
from agentik.core.turnsettings import DEFAULT_SETTINGS, TurnSettings

if TYPE_CHECKING:
    from agentik.core import Conversation
    from agentik.core.cluster.events import ClusterSubscription
    from agentik.core.eventbus import Subscription
    from agentik.transports.base import Transport

__all__ = [
    "ChannelKnobs",
    "ChannelOptions",
    "OpenChannel",
    "RemoteRun",
    "options_from",
    "resolved_options",
]


# settings_dataclass spelled out (without slots, so that an overlay can combine it
# with other knobs), so type checkers see the keyword constructor.
@dataclass(frozen=True, kw_only=True, config=SETTINGS)
class ChannelKnobs:
    """The bridge's behaviour in a channel: the keys of ``[transports.<name>]`` that
    a channel may set for itself (``[channels."<pattern>"]``, ``!set``), declared
    once here (:class:`ChannelOptions` and the overlay,
    :class:`~agentik.bot.chansettings.ChannelSettings`, inherit them)."""

    answer: Literal["addressed", "all", "direct"] = "addressed"
    #: What of a turn reaches the channel: ``answers`` (the answer, errors,
    #: interruptions), ``chat`` (also one line per tool call), ``debug``
    #: (everything); ``auto``: ``answers`` in shared channels, ``chat`` in
    #: direct conversations and threads.
    events: Literal["auto", "answers", "chat", "debug"] = "auto"
    #: The event stream profile the channel is rendered from (``chat``, ``debug``,
    #: ``metrics`` or a ``[profiles.<name>]``); unset: ``debug`` when ``events`` is
    #: ``debug``, else ``chat``.  Events the profile leaves out never reach the channel.
    profile: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    #: Lines of an answer sent before the rest waits for ``more`` (0: no cap;
    #: ``None``: the transport's ``default_max_answer_lines``, 4 on IRC).
    max_answer_lines: Annotated[int, Field(ge=0)] | None = None
    #: Record what others say in shared channels (without answering) as context.
    ambient: bool = False
    #: How many such lines at most reach the model with the next turn.
    ambient_lines: Annotated[int, Field(ge=1)] = 50
    #: Fetch the image links (http/https) of a message for the bot and give the
    #: images to a model that takes them (``image_in``), stored as attachments;
    #: IRC, where people paste links (:mod:`agentik.transports.imagefetch`;
    #: ``[attachments]`` ``url_*`` bound it).
    image_urls: bool = False
    #: A message that arrives while the bot answers: ``queue`` (its own turn
    #: next), ``steer`` (it joins the running turn at its next model request,
    #: so the answer takes it into account), ``interrupt`` (the running answer
    #: stops, the new message gets a turn); ``auto``: ``steer`` in direct
    #: conversations and threads, ``queue`` in shared channels.
    busy: Literal["auto", "queue", "steer", "interrupt"] = "auto"


# settings_dataclass spelled out, so type checkers see the keyword constructor.
@dataclass(frozen=True, kw_only=True, slots=True, config=SETTINGS)
class ChannelOptions(ChannelKnobs):
    """Per-transport-instance behaviour of the bridge (its :class:`ChannelKnobs`,
    which a channel may override, and these)."""

    command_prefix: str = "!"
    allowed_tools: tuple[str, ...] | None = None
    #: Longest accepted message, in characters.
    max_input_chars: int = 32_000
    #: Seconds between two progress messages of one running tool call (MCP
    #: progress): a new line, or an edit of its line where the transport can
    #: edit; the first is shown at once (0: every progress report).
    progress_interval: Annotated[float, Field(ge=0)] = 10.0


#: The runs of a channel with none pending (shared, never written: see ``asked``).
_NO_RUNS: dict[str, Any] = {}

#: Turns of other workers a following channel remembers (who showed each).
_REMOTE_KEPT = 256


@std_dataclass(slots=True)
class RemoteRun:
    """A turn another worker ran, as a following channel saw it."""

    #: Shown by this channel's renderer (seen from its start), else handed over.
    streamed: bool
    #: The renderer has shown its end.
    ended: bool = False
    #: Rows of the answer handed over at its end, to confirm once its end is shown.
    handed: list[int] = field(default_factory=list)


@std_dataclass(eq=False, slots=True)
class OpenChannel:
    """A channel the bridge holds open: its conversation, renderer task and what
    its answers and commands (``!more``, ``!stop``) need to know.

    A bridge may hold hundreds of these at once, so each costs little: slots, no
    per-channel lock or condition (:meth:`flushed` makes a future only while
    someone waits), empty sets shared until used, no task while it has nothing
    to render.
    """

    key: str
    transport: Transport
    options: ChannelOptions
    conversation: Conversation
    #: What this channel's turns run with (persona, tools, model profile, recall),
    #: computed from its settings in force (``Channels.apply``) and passed with
    #: each message: never written into the shared conversation.
    settings: TurnSettings = DEFAULT_SETTINGS
    #: The channel's ``tools`` setting in force (``None``: the transport's bound).
    tools: tuple[str, ...] | None = None
    #: Its conversation's events: this process's (a local subscription), or, for a
    #: linked channel on a store several workers share, those merged with the events
    #: of the turns other workers run (:attr:`follows`).
    subscription: Subscription | ClusterSubscription | None = None
    #: The task rendering its events: it exists only while the channel has events
    #: to render (``None`` otherwise; :class:`~agentik.bot.channels.Channels`).
    task: asyncio.Task[None] | None = None
    #: Its :class:`~agentik.bot.render.Renderer`: what its answers look like so far,
    #: kept between render tasks (typed loosely: the renderer imports this module).
    renderer: object = None
    #: The unsent rest of a capped answer, for ``more`` (a list: an empty deque
    #: costs every open channel 760 bytes).
    more: list[str] = field(default_factory=list)
    #: The next line of :attr:`more` is inside a code block (a fence opened above it).
    more_in_code: bool = False
    reply_to: object = None
    #: The ``reply_to`` of the message each pending run answers (a transport may
    #: address the asker); runs without one use :attr:`reply_to`.
    run_reply_to: dict[str, object] = field(default_factory=lambda: _NO_RUNS)
    #: Who asked for each pending run (a speaker key), for ``!stop`` of another's answer.
    run_asker: dict[str, str] = field(default_factory=lambda: _NO_RUNS)
    #: Approvals the channel was told it waits on (once each, to queued askers);
    #: replaced, never changed in place (an empty frozenset costs nothing).
    approvals_told: frozenset[str] = frozenset()
    #: The channel is a direct conversation (its last message was direct).
    direct: bool = False
    #: The channel is in a link (:mod:`agentik.bot.links`): its conversation's turns
    #: are rendered in every linked channel, and counted where they were asked.
    linked: bool = False
    #: It follows its conversation's stored events (several workers: a linked channel
    #: whose connection this worker owns): turns another worker runs stream here as
    #: they are written, each shown once (:meth:`shows`, :meth:`handed_over`).
    follows: bool = False
    #: Turns of another worker seen here (:attr:`follows`), by run: who shows each.
    remote: dict[str, RemoteRun] = field(default_factory=lambda: _NO_RUNS)
    last_used: float = field(default_factory=time.monotonic)
    #: See :attr:`pending` (``None`` when empty: an idle channel holds no set).
    _pending: set[str] | None = field(default=None, init=False, repr=False)
    #: Whoever waits in :meth:`flushed` (``None``: nobody, the common case).
    _flush_waiters: list[asyncio.Future[None]] | None = field(default=None, init=False, repr=False)

    def asked(self, run_id: str, reply_to: object, asker: str | None) -> None:
        """Run ``run_id`` answers a message here: where its answer goes, who asked."""
        if self.run_reply_to is _NO_RUNS:
            self.run_reply_to = {}
        self.run_reply_to[run_id] = reply_to
        if asker is not None:
            if self.run_asker is _NO_RUNS:
                self.run_asker = {}
            self.run_asker[run_id] = asker

    def answered(self, run_id: str) -> None:
        """Run ``run_id``'s answer is out: forget where it went and who asked."""
        self.run_reply_to.pop(run_id, None)
        self.run_asker.pop(run_id, None)
        # An emptied dict keeps the table it grew: an idle channel shares an empty one.
        if not self.run_reply_to:
            self.run_reply_to = _NO_RUNS
        if not self.run_asker:
            self.run_asker = _NO_RUNS

    def idle(self, now: float, after: float) -> bool:
        # A channel following other workers' turns is held (they may start at any time).
        return (
            not self.follows
            and not self.pending
            and not self.conversation.busy
            and now - self.last_used >= after
        )

    # -- turns another worker runs (:attr:`follows`) ------------------------------------
    def shows(self, run_id: str, *, started: bool) -> bool:
        """Whether this channel's renderer shows run ``run_id`` (an event of it is due):
        yes for a run seen from its start (``started``: its ``turn_started``); not for
        one whose answer is handed over whole at its end (:meth:`handed_over` came
        first), nor for one seen only from its middle (the channel opened then, e.g. at
        a takeover: the handover brings what the last owner did not send)."""
        seen = self.remote.get(run_id)
        if seen is None:
            seen = self._note(run_id, RemoteRun(streamed=started))
        return seen.streamed

    def streamed(self, run_id: str) -> bool:
        """Whether this channel's renderer shows run ``run_id`` from its start."""
        seen = self.remote.get(run_id)
        return seen is not None and seen.streamed

    def handed_over(self, run_id: str, outbox_id: int) -> Literal["send", "confirm", "later"]:
        """The answer of ``run_id``, written whole at its turn's end by the worker that
        ran it (an outbox row, ``outbox_id``), reached this worker: ``send`` it when
        this channel's renderer does not show the run; else it is the same answer
        (``confirm`` the row now, the run's end is shown), or ``later`` (confirmed once
        the renderer has shown the run's end: :meth:`shown_to_end`)."""
        seen = self.remote.get(run_id)
        if seen is None:
            self._note(run_id, RemoteRun(streamed=False))
            return "send"
        if not seen.streamed:
            return "send"
        if seen.ended:
            return "confirm"
        seen.handed.append(outbox_id)
        return "later"

    def shown_to_end(self, run_id: str) -> list[int]:
        """The renderer has shown run ``run_id``'s end: the rows of its handed-over
        answer that came meanwhile (to confirm: their words were streamed)."""
        seen = self.remote.get(run_id)
        if seen is None or not seen.streamed:
            return []
        seen.ended = True
        rows, seen.handed = seen.handed, []
        return rows

    def _note(self, run_id: str, seen: RemoteRun) -> RemoteRun:
        if self.remote is _NO_RUNS:
            self.remote = {}
        self.remote[run_id] = seen
        while len(self.remote) > _REMOTE_KEPT:
            del self.remote[next(iter(self.remote))]
        return seen

    @property
    def pending(self) -> AbstractSet[str]:
        """The runs asked for here whose answers are not sent yet (changed with
        :meth:`add_pending` / :meth:`discard_pending`, so :meth:`flushed` wakes up)."""
        return self._pending if self._pending is not None else frozenset()

    def add_pending(self, run_ids: Iterable[str]) -> None:
        """Runs whose answers this channel now waits for."""
        if self._pending is None:
            self._pending = set()
        self._pending.update(run_ids)
        if not self._pending:
            self._pending = None

    def discard_pending(self, run_ids: Iterable[str]) -> None:
        """Runs whose answers are sent (or will never be): :meth:`flushed` wakes up
        once none is left."""
        if self._pending is not None:
            self._pending.difference_update(run_ids)
            if not self._pending:
                self._pending = None
        waiters = self._flush_waiters
        if waiters is not None and not self.pending:
            self._flush_waiters = None
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def flushed(self) -> None:
        """Wait until every answer asked for in this channel has been sent."""
        while self.pending:
            waiter = asyncio.get_running_loop().create_future()
            if self._flush_waiters is None:
                self._flush_waiters = []
            self._flush_waiters.append(waiter)
            try:
                await waiter
            finally:
                if self._flush_waiters is not None and waiter in self._flush_waiters:
                    self._flush_waiters.remove(waiter)


def resolved_options(transport: Transport, options: ChannelOptions | None) -> ChannelOptions:
    """``options`` (or the defaults) with what they leave unset taken from ``transport``."""
    opts = options or ChannelOptions(command_prefix=transport.default_command_prefix)
    if opts.max_answer_lines is None:
        opts = dataclasses.replace(opts, max_answer_lines=transport.default_max_answer_lines)
    return opts


def options_from(section: object, transport: Transport) -> ChannelOptions:
    """Build :class:`ChannelOptions` from a ``[transports.<name>]`` section.

    The section's bridge keys are :class:`ChannelOptions`'s own fields (see
    :class:`agentik.bot.config.TransportSection`); a key it lacks keeps its
    default, and an unset ``command_prefix`` or ``max_answer_lines`` is the
    transport's default.
    """
    values = {
        name: getattr(section, name)
        for name in setting_fields(ChannelOptions)
        if hasattr(section, name)
    }
    if values.get("command_prefix") is None:
        values["command_prefix"] = transport.default_command_prefix
    return resolved_options(transport, ChannelOptions(**values))
