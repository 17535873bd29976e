"""The harness: how the conformance suite drives one transport and its peer.

A :class:`TransportHarness` knows three things about a transport that the
suite cannot know: how to build it, how a person on the other side says
something (an IRC client's PRIVMSG, a Slack event, a line on stdin, an HTTP
POST), and what that person sees of the bot's answers.  Everything else —
the agent, the scripted model, the checks — is the suite's, except the bot
side the transport is attached to: the harness is given its
:data:`SinkFactory` (the bot's bridge: ``sink_factory=Bridge``), because the
transport layer does not import the bot that runs on top of it.

Places
    The suite talks about *places*: ``channel("a")`` and ``channel("b")``
    (shared channels: several people, the bot answers when addressed),
    ``direct(user)`` (a private conversation with one person) and
    ``thread(channel("a"), "t")`` (a thread in a channel).  Those are the
    only names it uses, so a harness can prepare them up front (an IRC
    harness configures ``#a`` and ``#b`` to join).  A harness lists the kinds
    it has in :attr:`~TransportHarness.place_kinds`; checks that need a
    missing kind are skipped with a reason.

Nothing here imports pytest: only :mod:`.conformance` does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from agentik.transports.base import MessageSink, Transport

if TYPE_CHECKING:
    from agentik.core import Agent

__all__ = ["ConformanceSink", "Place", "PlaceKind", "SinkFactory", "TransportHarness"]

PlaceKind = Literal["channel", "direct", "thread"]


class ConformanceSink(MessageSink, Protocol):
    """The bot side the suite runs a transport against: where its messages go.

    The bot's :class:`~agentik.bot.bridge.Bridge` is one (its ``attach`` takes
    optional channel options as well).  The transport is started with it, so
    whatever else the transport uses of its host is this object's too.
    """

    def attach(self, transport: Transport) -> None:
        """Register ``transport`` (started next), with its default options."""
        ...

    async def aclose(self) -> None:
        """Stop: called after the transport is closed, before the agent."""
        ...


#: Builds the bot side for an agent; a new one after each simulated restart.
SinkFactory = Callable[["Agent"], ConformanceSink]


@dataclass(frozen=True, slots=True)
class Place:
    """Where people talk: a shared ``channel``, a ``direct`` conversation, a ``thread``.

    ``name`` is the channel's name (``"a"``), the person's name for a direct
    conversation, or the thread's name; ``parent`` is a thread's channel.
    """

    kind: PlaceKind
    name: str
    parent: Place | None = None

    def __str__(self) -> str:
        if self.kind == "thread" and self.parent is not None:
            return f"thread {self.name!r} in {self.parent}"
        return f"{self.kind} {self.name!r}"


class TransportHarness:
    """Base class of conformance harnesses; subclass it for your transport.

    Implement :meth:`make_transport`, :meth:`say` and :meth:`received`;
    override :meth:`ready`, :meth:`command` and :meth:`close_peers` when the
    defaults do not fit.  Call :meth:`notify` whenever the peer receives
    something (optional: waits also poll).
    """

    #: The transport's registered type name (``type = "..."`` in a configuration).
    transport_type: ClassVar[str] = ""
    #: Kinds of places the transport has.
    place_kinds: ClassVar[frozenset[str]] = frozenset({"channel", "direct"})
    #: People who can speak, at least one; the suite uses the first two.
    users: ClassVar[tuple[str, ...]] = ("alice", "bob")
    #: Checks this transport legitimately cannot pass, ``{test name: reason}``;
    #: they are skipped with the reason shown.  Keep it short.
    unsupported: ClassVar[Mapping[str, str]] = {}
    #: Seconds any single wait of the suite may take before it fails.
    timeout: ClassVar[float] = 60.0

    def __init__(self, *, sink_factory: SinkFactory | None = None) -> None:
        #: Builds the bot side the transport is attached to (pass the bot's
        #: ``Bridge``).  ``None`` is deprecated: the suite then imports the bot's
        #: bridge itself, with a :class:`DeprecationWarning`.
        self.sink_factory = sink_factory
        self._changed = asyncio.Event()

    # -- places -----------------------------------------------------------------------
    def channel(self, name: str) -> Place:
        return Place("channel", name)

    def direct(self, user: str) -> Place:
        return Place("direct", user)

    def thread(self, channel: Place, name: str) -> Place:
        return Place("thread", name, channel)

    # -- what a harness implements ------------------------------------------------------
    def make_transport(self, *, name: str, extra: dict[str, Any] | None = None) -> Transport:
        """A new, not yet started transport instance called ``name``.

        ``extra`` are settings to add to the harness's own (the suite passes
        an unknown key to check that it is refused).  Called again after a
        restart: the new instance must talk to the same peer.
        """
        raise NotImplementedError

    async def ready(self, transport: Transport) -> None:
        """Wait until the started ``transport`` can receive and send (connected, joined)."""

    async def say(self, place: Place, text: str, *, user: str, addressed: bool) -> None:
        """``user`` says ``text`` in ``place``, as a person on the peer would.

        ``addressed``: the message is for the bot, the way people address it
        on this protocol (``agentik: ...``, a mention).  Direct conversations
        are always for the bot.  Return once the peer has sent it.
        """
        raise NotImplementedError

    async def command(self, place: Place, command: str, *, user: str, prefix: str) -> None:
        """``user`` types a chat command (``prefix + command``) in ``place``.

        The default addresses the bot with it; override to send it the way
        people do on your protocol (IRC: a plain ``!stop`` in the channel).
        """
        await self.say(place, f"{prefix}{command}", user=user, addressed=True)

    def received(self, place: Place) -> list[str]:
        """The bot's messages in ``place`` as the peer shows them, oldest first.

        One string per message (an edited message shows its latest text;
        a terminal's output is one string per line).  Answers, notices and
        command replies all count.
        """
        raise NotImplementedError

    async def close_peers(self) -> None:
        """Disconnect the peer's clients opened during the test (servers stay)."""

    # -- waiting ------------------------------------------------------------------------
    def notify(self) -> None:
        """Wake the suite's waits: the peer received something."""
        self._changed.set()

    async def wait_for(
        self,
        place: Place,
        predicate: Callable[[list[str]], bool],
        *,
        since: int = 0,
        what: str = "",
    ) -> list[str]:
        """Wait until ``predicate(received(place)[since:])`` holds; return that list.

        Fails with what was received when :attr:`timeout` passes.
        """
        deadline = time.monotonic() + self.timeout
        while True:
            self._changed.clear()
            got = self.received(place)[since:]
            if predicate(got):
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                shown = "\n".join(f"  {t!r}" for t in got[-20:]) or "  (nothing)"
                raise AssertionError(
                    f"waited {self.timeout:g}s for {what or 'a message'} in {place}; "
                    f"received there:\n{shown}"
                )
            # Harnesses that call notify() wake us at once; the others are polled.
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 0.05))
            except TimeoutError:
                pass
