"""The IRC transport runs the conformance suite against real IRC servers (miniircd, ngircd).

People are raw-socket IRC clients (``IRCTestClient``): they join the channels,
address the bot as ``agentik: ...``, send private messages, type ``!stop``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest_asyncio

from agentik.bot.bridge import Bridge
from agentik.transports.base import Transport
from agentik.transports.irc.transport import IRCTransport
from agentik.transports.testing import Place, TransportConformance, TransportHarness

from ircservers import IRCServerProcess, IRCTestClient, ParsedLine

pytest_plugins = ["ircservers"]

NICK = "agentik"
CHANNELS = {"a": "#conf-a", "b": "#conf-b"}


class IRCHarness(TransportHarness):
    """One real IRC server; each person is an IRC client in both channels."""

    transport_type = "irc"
    place_kinds = frozenset({"channel", "direct"})

    def __init__(self, server: IRCServerProcess) -> None:
        super().__init__(sink_factory=Bridge)
        self.server = server
        self.clients: dict[str, IRCTestClient] = {}
        self.transport: IRCTransport | None = None

    def make_transport(self, *, name: str, extra: dict[str, Any] | None = None) -> Transport:
        settings = {
            "host": self.server.host, "port": self.server.port, "tls": False, "nick": NICK,
            "channels": list(CHANNELS.values()), "reconnect_min": 0.2, "reconnect_max": 1.0,
            "flood_burst": 10, "flood_rate": 200.0,
        }  # fmt: skip
        return IRCTransport(name=name, settings={**settings, **(extra or {})})

    async def client(self, user: str) -> IRCTestClient:
        client = self.clients.get(user)
        if client is None:
            client = await IRCTestClient.connect(self.server.port, user)
            for channel in CHANNELS.values():
                await client.join(channel)
            self.clients[user] = client
        return client

    async def ready(self, transport: Transport) -> None:
        assert isinstance(transport, IRCTransport)
        self.transport = transport
        await self.client(self.users[0])  # watches both channels from the start
        async with asyncio.timeout(self.timeout):
            await transport.registered.wait()
            for channel in CHANNELS.values():
                await transport.wait_joined(channel)
        assert transport.nick == NICK, f"the bot got the nick {transport.nick!r}"

    async def _send(self, user: str, target: str, text: str) -> None:
        client = await self.client(user)
        client.privmsg(target, text)
        # PING/PONG: the server has taken the line before another client speaks.
        await client.sync()

    async def say(self, place: Place, text: str, *, user: str, addressed: bool) -> None:
        if place.kind == "direct":
            await self._send(place.name, NICK, text)
        else:
            await self._send(user, CHANNELS[place.name], f"{NICK}: {text}" if addressed else text)

    async def command(self, place: Place, command: str, *, user: str, prefix: str) -> None:
        # On IRC people just type "!stop" in the channel.
        target = NICK if place.kind == "direct" else CHANNELS[place.name]
        await self._send(place.name if place.kind == "direct" else user, target, prefix + command)

    def received(self, place: Place) -> list[str]:
        if place.kind == "direct":
            viewer, target = self.clients.get(place.name), place.name
        else:
            viewer, target = self.clients.get(self.users[0]), CHANNELS[place.name]

        def from_bot(line: ParsedLine) -> bool:
            return (
                line.command in ("PRIVMSG", "NOTICE")
                and (line.nick or "").lower() == NICK
                and (line.target or "").lower() == target.lower()
            )

        def text(line: ParsedLine) -> str:
            # In channels the bot starts each answer with the asker's nick
            # (address_asker, tested in test_security_irc.py); the suite
            # compares the answers themselves.
            if place.kind != "direct" and line.command == "PRIVMSG":
                for user in self.users:
                    if line.text.startswith(f"{user}: "):
                        return line.text[len(user) + 2 :]
            return line.text

        return [text(line) for line in viewer.received if from_bot(line)] if viewer else []

    async def close_peers(self) -> None:
        for client in self.clients.values():
            await client.quit()
        self.clients.clear()


class TestIRCConformance(TransportConformance):
    @pytest_asyncio.fixture
    async def transport_harness(self, irc_server):
        return IRCHarness(irc_server)
