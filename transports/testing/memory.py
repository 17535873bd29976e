"""``MemoryTransport``: a real :class:`Transport` that lives in memory.

For testing bridges, bots and plugins without a network: ``inject`` feeds
an incoming message through the sink exactly as a protocol adapter would,
and everything the bridge sends lands in ``sent`` (and can be awaited with
``wait_for``)::

    t = MemoryTransport(name="mem", caps=ChannelCaps(streaming="lines", max_bytes=100))
    await bot_bridge_attach_and_start(t)
    await t.inject("hello", channel_key="mem:#room", author="alice", addressed=True)
    answer = await t.wait_for(lambda m: m.kind == "answer")

It is the ``memory`` plugin of the entry-point group ``agentik``
(``type = "memory"`` in a configuration).  ``agentik.core.testing.transport``
is a deprecated alias of this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from agentik.core.hookspecs import hookimpl

from ..base import ChannelCaps, IncomingMessage, MessageSink, OutgoingMessage, Transport

__all__ = ["MemoryTransport"]


class MemoryTransport(Transport):
    """An in-memory transport; ``caps`` and the command prefix are settable."""

    type = "memory"

    def __init__(
        self,
        *,
        name: str = "memory",
        settings: dict[str, Any] | None = None,
        caps: ChannelCaps | None = None,
        command_prefix: str = "!",
    ) -> None:
        super().__init__(name=name, settings=settings)
        self.caps = caps or ChannelCaps(streaming="message")
        self.default_command_prefix = command_prefix  # type: ignore[misc]
        self.sent: list[OutgoingMessage] = []
        self.sink: MessageSink | None = None
        self._changed = asyncio.Condition()

    async def start(self, sink: MessageSink) -> None:
        self.sink = sink

    async def send(self, message: OutgoingMessage) -> None:
        async with self._changed:
            self.sent.append(message)
            self._changed.notify_all()

    async def inject(
        self,
        text: str,
        *,
        channel_key: str = "memory:#test",
        author: str = "tester",
        direct: bool = False,
        addressed: bool = False,
        reply_to: Any = None,
    ) -> None:
        """Deliver ``text`` to the sink as if it arrived from the network."""
        assert self.sink is not None, "start() the transport first"
        await self.sink.handle(
            IncomingMessage(
                channel_key=channel_key,
                text=text,
                author_id=author,
                author_name=author,
                direct=direct,
                addressed=addressed,
                reply_to=reply_to,
            ),
            self,
        )

    async def wait_for(
        self,
        predicate: Callable[[OutgoingMessage], bool],
        *,
        count: int = 1,
        timeout: float = 60.0,  # noqa: ASYNC109 - a test helper's deadline
    ) -> list[OutgoingMessage]:
        """Wait until ``count`` sent messages match ``predicate``; return them."""

        def matches() -> list[OutgoingMessage]:
            return [m for m in self.sent if predicate(m)]

        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: len(matches()) >= count)
        return matches()

    def texts(self, kind: str | None = None) -> list[str]:
        """Texts sent so far, optionally of one kind."""
        return [m.text for m in self.sent if kind is None or m.kind == kind]


@hookimpl
def register_transports(register: Any) -> None:
    register("memory", MemoryTransport)
