"""``FakeTransport``: a chat network that lives in the test, and its harness.

:class:`FakeTransport` is a real :class:`~agentik.transports.base.Transport`
whose "network" is a Python object.  People speak with :meth:`~FakeTransport.say`
(in a channel, a thread, or privately); the transport does what a protocol
adapter does — channel keys, addressed/direct detection with the address
stripped, reply routing — and hands the message to the bridge.  What the
bot sends is kept in :attr:`~FakeTransport.posts`, and like a strict peer the
fake *refuses* a whole message longer than its declared :class:`ChannelCaps`
limits (kept in :attr:`~FakeTransport.refused`), so a bridge or renderer bug
shows up in tests instead of being truncated away.  With
``streaming="deltas"`` it streams into one growing message and, like a real
streaming transport must, continues in a new message when that one is full::

    t = FakeTransport(caps=ChannelCaps(max_chars=200))
    bridge.attach(t)
    await t.start(bridge)
    await t.say("agentik: hello", channel="ops", user="alice")
    await bridge.flush("fake:fake:#ops")
    assert t.received(channel="ops") == ["echo: hello"]

Channel keys: ``fake:<name>:#<channel>``, ``fake:<name>:#<channel>:<thread>``
and ``fake:<name>:@<user>`` for private conversations.

:class:`FakeHarness` is the conformance harness of the fake: the smallest
complete example of a :class:`~.harness.TransportHarness`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from ..base import ChannelCaps, IncomingMessage, OutgoingMessage, Transport
from ..text import fit_prefix
from .harness import Place, SinkFactory, TransportHarness
from .memory import MemoryTransport

__all__ = ["FakeHarness", "FakePost", "FakeTransport"]


@dataclass(frozen=True, slots=True)
class _Where:
    channel: str | None
    thread: str | None
    user: str | None


@dataclass(frozen=True, slots=True)
class FakePost:
    """One message the bot posted: where, what kind, the text (deltas joined)."""

    channel: str | None
    thread: str | None
    user: str | None
    kind: str
    text: str
    run_id: str | None = None


class FakeTransport(MemoryTransport):
    """An in-memory chat network (see the module docstring).

    ``caps`` are the limits it declares *and enforces*; ``nick`` is how
    people address the bot (``nick: ...``, ``nick, ...`` or ``@nick``).
    ``sent`` (from :class:`MemoryTransport`) keeps every outgoing message.
    """

    type = "fake"

    def __init__(
        self,
        *,
        name: str = "fake",
        settings: dict[str, Any] | None = None,
        caps: ChannelCaps | None = None,
        nick: str = "agentik",
        command_prefix: str = "!",
    ) -> None:
        super().__init__(name=name, settings=settings, caps=caps, command_prefix=command_prefix)
        self.nick = nick
        self.posts: list[FakePost] = []
        #: Messages refused because they exceeded the declared limits.
        self.refused: list[OutgoingMessage] = []
        self._open: dict[str | None, int] = {}  # run id -> index of its streamed post
        self._address = re.compile(
            rf"^\s*(?:@{re.escape(nick)}\b[:,]?|{re.escape(nick)}\s*[:,])\s*", re.I
        )

    def key(self, *, channel: str | None = None, thread: str | None = None, user: str = "") -> str:
        """The channel key of a place (a private conversation when ``channel`` is None)."""
        if channel is None:
            return f"fake:{self.name}:@{user}"
        return f"fake:{self.name}:#{channel}" + (f":{thread}" if thread else "")

    async def say(
        self,
        text: str,
        *,
        user: str = "alice",
        channel: str | None = None,
        thread: str | None = None,
    ) -> None:
        """``user`` says ``text`` in ``channel`` (and ``thread``), or privately without one."""
        assert self.sink is not None, "start() the transport first"
        direct = channel is None
        addressed = direct
        match = self._address.match(text)
        if match and not direct:
            text, addressed = text[match.end() :], True
        await self.sink.handle(
            IncomingMessage(
                channel_key=self.key(channel=channel, thread=thread, user=user),
                text=text,
                author_id=user,
                author_name=user,
                direct=direct,
                addressed=addressed,
                reply_to=_Where(channel, thread, user if direct else None),
            ),
            self,
        )

    def _where_of(self, key: str) -> _Where:
        """Where a key points (an answer without ``reply_to``, e.g. resumed after a restart)."""
        place = key.removeprefix(f"fake:{self.name}:")
        if place.startswith("@"):
            return _Where(None, None, place[1:])
        if place.startswith("#"):
            channel, _, thread = place[1:].partition(":")
            return _Where(channel, thread or None, None)
        return _Where(None, None, "")

    def _new_post(self, run_id: str | None, where: _Where) -> int:
        self.posts.append(FakePost(where.channel, where.thread, where.user, "answer", "", run_id))
        self._open[run_id] = len(self.posts) - 1
        return len(self.posts) - 1

    def _fits(self, text: str) -> bool:
        caps = self.caps
        if caps.max_chars is not None and len(text) > caps.max_chars:
            return False
        return caps.max_bytes is None or len(text.encode("utf-8")) <= caps.max_bytes

    async def send(self, message: OutgoingMessage) -> None:
        where = (
            message.reply_to
            if isinstance(message.reply_to, _Where)
            else self._where_of(message.channel_key)
        )
        if message.kind == "delta":
            # Streaming into one growing message; when it is full, continue in
            # a new one (what a real streaming transport must do itself).
            i = self._open.get(message.run_id)
            if i is None:
                i = self._new_post(message.run_id, where)
            text = self.posts[i].text + message.text
            caps = self.caps
            while not self._fits(text):
                n = max(1, fit_prefix(text, max_bytes=caps.max_bytes, max_chars=caps.max_chars))
                cut = text.rfind(" ", 0, n + 1)
                cut = cut if cut > 0 else n
                self.posts[i] = dataclasses.replace(self.posts[i], text=text[:cut])
                text = text[cut:].lstrip(" ")
                i = self._new_post(message.run_id, where)
            self.posts[i] = dataclasses.replace(self.posts[i], text=text)
        elif message.kind == "end":
            self._open.pop(message.run_id, None)
        else:
            if not self._fits(message.text):
                self.refused.append(message)
                raise ValueError(
                    f"fake network: message over the limits ({len(message.text)} chars)"
                )
            self.posts.append(
                FakePost(
                    where.channel,
                    where.thread,
                    where.user,
                    message.kind,
                    message.text,
                    message.run_id,
                )
            )
        await super().send(message)

    def received(
        self, *, channel: str | None = None, thread: str | None = None, user: str | None = None
    ) -> list[str]:
        """Texts the bot posted in a channel (and thread), or privately to ``user``."""
        if channel is None:
            return [p.text for p in self.posts if p.channel is None and p.user == user]
        return [p.text for p in self.posts if p.channel == channel and p.thread == thread]


class FakeHarness(TransportHarness):
    """The conformance harness of :class:`FakeTransport` (a complete, minimal example)."""

    transport_type = "fake"
    place_kinds = frozenset({"channel", "direct", "thread"})

    def __init__(
        self, *, caps: ChannelCaps | None = None, sink_factory: SinkFactory | None = None
    ) -> None:
        super().__init__(sink_factory=sink_factory)
        self.caps = caps or ChannelCaps(max_chars=300, streaming="message")
        self.transports: list[FakeTransport] = []

    def make_transport(self, *, name: str, extra: dict[str, Any] | None = None) -> Transport:
        if extra:
            # The fake has no settings of its own: any key is unknown.
            from agentik.core.errors import ConfigError

            raise ConfigError(f"transports.{name}.{next(iter(extra))}: unknown key")
        transport = FakeTransport(name=name, caps=self.caps)
        self.transports.append(transport)
        return transport

    @property
    def current(self) -> FakeTransport:
        return self.transports[-1]

    async def say(self, place: Place, text: str, *, user: str, addressed: bool) -> None:
        if place.kind == "direct":
            await self.current.say(text, user=place.name)
            return
        channel = place.parent.name if place.parent else place.name
        thread = place.name if place.kind == "thread" else None
        await self.current.say(
            f"{self.current.nick}: {text}" if addressed else text,
            user=user, channel=channel, thread=thread,
        )  # fmt: skip

    def received(self, place: Place) -> list[str]:
        out: list[str] = []
        for t in self.transports:
            if place.kind == "direct":
                out += t.received(user=place.name)
            elif place.kind == "thread":
                assert place.parent is not None
                out += t.received(channel=place.parent.name, thread=place.name)
            else:
                out += t.received(channel=place.name)
        return out
