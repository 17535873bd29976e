"""Test rigs: the bots, transports and small predicates that several test files build.

One place for them (sopel's ``tests/factories.py`` is the model): a test file imports
the pieces it needs and keeps only what is its own (its agent's tools, its yield shape).

- :func:`serving` attaches a started agent's :class:`Bridge` to a transport, starts it,
  optionally waits until it joined some channels, and closes transport, bridge and agent
  in that order afterwards: the body every ``irc_bot``/``slack_bot`` had written out.
- :func:`irc_transport` / :func:`slack_transport`: the transports the tests run on a
  real IRC server (network ``testnet``, nick ``agentik``, :data:`FAST` settings) and on
  :class:`fakeslack.FakeSlack`.
- :func:`irc_bot`: a scripted-model bot with a SQLite store on one IRC server.
- :func:`joined`, :func:`from_bot`, :func:`said_by_bot`, :func:`free_port`.

Everything here is real (real transports, real SQLite files, real servers); nothing of
agentik is mocked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent, SQLiteStore
from agentik.core.memory.sqlite import SQLiteMemory
from agentik.core.testing.scripted import ScriptedModel
from agentik.transports.irc.transport import IRCTransport

from ircservers import free_port

__all__ = [
    "FAST",
    "WAIT",
    "IRCBot",
    "free_port",
    "from_bot",
    "irc_bot",
    "irc_transport",
    "joined",
    "said_by_bot",
    "serving",
    "slack_transport",
]

#: IRC transport settings for tests: no TLS, quick reconnects, a generous flood budget.
FAST = {"tls": False, "reconnect_min": 0.2, "reconnect_max": 1.0, "flood_burst": 10,
        "flood_rate": 200.0}  # fmt: skip
#: Seconds a wait may take before the test gives up (a guard against a hang, not a timing check).
WAIT = 60.0


def from_bot(line) -> bool:
    """A PRIVMSG or NOTICE sent by the bot (nick ``agentik``)."""
    return line.command in ("PRIVMSG", "NOTICE") and (line.nick or "").lower() == "agentik"


def said_by_bot(line) -> bool:
    """A PRIVMSG (not a NOTICE) sent by the bot (nick ``agentik``)."""
    return line.command == "PRIVMSG" and (line.nick or "").lower() == "agentik"


async def joined(transport: IRCTransport, channel: str, wait: float = WAIT) -> None:
    """Wait until ``transport`` has joined ``channel``."""
    await transport.wait_joined(channel, wait)


def irc_transport(port: int, **settings: Any) -> IRCTransport:
    """An IRC transport (network ``testnet``, nick ``agentik``) for a server on 127.0.0.1."""
    return IRCTransport(
        name="testnet",
        settings={"host": "127.0.0.1", "port": port, "nick": "agentik", **FAST, **settings},
    )


def slack_transport(slack: Any, tmp_path: Path, **settings: Any):
    """A Slack transport against the fake Slack ``slack`` (its state file in ``tmp_path``)."""
    from agentik.transports.slack.transport import SlackTransport

    base = {
        "bot_token": slack.bot_token, "app_token": slack.app_token, "api_url": slack.api_url,
        "state_file": str(tmp_path / "seen.sqlite3"), "edit_interval": 0.05,
    }  # fmt: skip
    return SlackTransport(name="slack", settings={**base, **settings})


@asynccontextmanager
async def serving(
    agent: Agent,
    bridge: Bridge,
    transport: Any,
    options: ChannelOptions | None = None,
    *,
    joined_to: Iterable[str] = (),
    wait: float = WAIT,
) -> AsyncIterator[Any]:
    """``bridge`` (over the started ``agent``) attached to ``transport`` and started.

    Waits until an IRC transport has joined each of ``joined_to``; afterwards closes the
    transport, the bridge and the agent, in that order. Yields the transport.
    """
    bridge.attach(transport, options or ChannelOptions(command_prefix="!"))
    await transport.start(bridge)
    try:
        for channel in joined_to:
            await joined(transport, channel, wait)
        yield transport
    finally:
        await transport.aclose()
        await bridge.aclose()
        await agent.aclose()


class IRCBot(NamedTuple):
    transport: IRCTransport
    model: ScriptedModel
    agent: Agent
    bridge: Bridge


@asynccontextmanager
async def irc_bot(
    port: int,
    tmp_path: Path,
    *,
    options: ChannelOptions | None = None,
    bridge_kw: dict[str, Any] | None = None,
    agent_kw: dict[str, Any] | None = None,
    llm: Any = None,
    memory: bool = False,
    **settings: Any,
) -> AsyncIterator[IRCBot]:
    """A bot answering with a :class:`ScriptedModel` (or ``llm``) on a SQLite store
    (``tmp_path/irc.db``; with SQLite memory when ``memory``), on one IRC server.

    ``bridge_kw`` go to the :class:`Bridge` (an ``access`` policy in them is loaded
    first, as the bot does at start), ``agent_kw`` to the :class:`Agent`, ``settings``
    to the IRC transport. Yields ``(transport, model, agent, bridge)``.
    """
    model = ScriptedModel()
    store = SQLiteStore(str(tmp_path / "irc.db"))
    if memory:
        agent_kw = {"memory": SQLiteMemory(store), **(agent_kw or {})}
    agent = Agent(llm=llm or model, store=store, **(agent_kw or {}))
    await agent.start()
    bridge_kw = bridge_kw or {}
    if "access" in bridge_kw:
        await bridge_kw["access"].load(agent.store)  # as the bot does at start
    bridge = Bridge(agent, **bridge_kw)
    async with serving(agent, bridge, irc_transport(port, **settings), options) as transport:
        yield IRCBot(transport, model, agent, bridge)
