"""Test rigs: the bots, transports and small predicates that several test files build.

One place for them (sopel's ``tests/factories.py`` is the model): a test file imports
the pieces it needs and keeps only what is its own (its agent's tools, its yield shape).

- :func:`serving` attaches a started agent's :class:`Bridge` to a transport, starts it,
  optionally waits until it joined some channels, and closes transport, bridge and agent
  in that order afterwards: the body every ``irc_bot``/``slack_bot`` had written out.
- :func:`irc_transport` / :func:`slack_transport`: the transports the tests run on a
  real IRC server (network ``testnet``, nick ``agentik``, :data:`FAST` settings) and on
  :class:`fakeslack.FakeSlack`.
- :func:`irc_bot` / :func:`slack_bot`: a scripted-model bot with a SQLite store on one
  IRC server / on the fake Slack.
- :func:`eventually`: wait until a condition holds (polled; the timeout only guards
  against a hang, it is not a timing check).
- :func:`tool_results` / :func:`turn_tool_results`: what a scripted model was told of
  its tool calls.
- :func:`answered` / :func:`bot_texts`: a Slack place answered; what the bot posted there.
- :func:`people`: IRC clients joined to a channel.
- :func:`said_in` / :func:`ask`: the bot's lines in one channel; ask it and wait.
- :func:`joined`, :func:`from_bot`, :func:`said_by_bot`, :func:`free_port`.

Everything here is real (real transports, real SQLite files, real servers); nothing of
agentik is mocked.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent, SQLiteStore
from agentik.core.memory.sqlite import SQLiteMemory
from agentik.core.testing.scripted import ScriptedModel
from agentik.transports.irc.transport import IRCTransport

from ircservers import IRCTestClient, free_port

__all__ = [
    "FAST",
    "WAIT",
    "IRCBot",
    "SlackBot",
    "answered",
    "ask",
    "bot_texts",
    "eventually",
    "free_port",
    "from_bot",
    "irc_bot",
    "irc_transport",
    "joined",
    "people",
    "said_by_bot",
    "said_in",
    "serving",
    "slack_bot",
    "slack_transport",
    "tool_results",
    "turn_tool_results",
]

#: IRC transport settings for tests: no TLS, quick reconnects, a generous flood budget.
FAST = {"tls": False, "reconnect_min": 0.2, "reconnect_max": 1.0, "flood_burst": 10,
        "flood_rate": 200.0}  # fmt: skip
#: Seconds a wait may take before the test gives up (a guard against a hang, not a timing check).
WAIT = 60.0


async def eventually(
    condition: Callable[[], Any | Awaitable[Any]],
    what: str | Callable[[], str] = "the condition",
    *,
    wait: float = WAIT,
    interval: float = 0.01,
) -> Any:
    """Wait until ``condition()`` is true (a coroutine's result is awaited) and return it.

    For a state the code offers no event for: it is polled every ``interval`` seconds.
    ``wait`` only guards against a hang (an :class:`AssertionError` naming ``what``,
    which may be a callable for a message built when it fails), never a timing check.
    """
    deadline = time.monotonic() + wait
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what() if callable(what) else what}")
        await asyncio.sleep(interval)


def tool_results(model: ScriptedModel) -> list[str]:
    """What the model was told of each tool call (the last request's tool messages)."""
    return [m.content or "" for m in model.requests[-1].messages if m.role == "tool"]


def turn_tool_results(model: ScriptedModel, index: int = -1) -> list[str]:
    """The tool results of the current turn as request ``index`` carried them (the tool
    messages after its last user message)."""
    messages = list(model.requests[index].messages)
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    return [m.content or "" for m in messages[last_user:] if m.role == "tool"]


def from_bot(line) -> bool:
    """A PRIVMSG or NOTICE sent by the bot (nick ``agentik``)."""
    return line.command in ("PRIVMSG", "NOTICE") and (line.nick or "").lower() == "agentik"


def said_by_bot(line) -> bool:
    """A PRIVMSG (not a NOTICE) sent by the bot (nick ``agentik``)."""
    return line.command == "PRIVMSG" and (line.nick or "").lower() == "agentik"


def said_in(channel: str, *words: str, notices: bool = False) -> Callable[[Any], bool]:
    """A line the bot sent to ``channel`` (a PRIVMSG; a NOTICE too when ``notices``)
    holding every one of ``words``."""
    said = from_bot if notices else said_by_bot
    return lambda m: said(m) and m.params[0] == channel and all(w in m.text for w in words)


async def ask(client: IRCTestClient, channel: str, text: str) -> None:
    """Address the bot (``agentik: text``) in ``channel`` and wait for its answer (the
    scripted model's ``echo: text``)."""
    client.privmsg(channel, f"agentik: {text}")
    await client.wait_for(said_in(channel, "echo:", text))


async def joined(transport: IRCTransport, channel: str, wait: float = WAIT) -> None:
    """Wait until ``transport`` has joined ``channel``."""
    await transport.wait_joined(channel, wait)


async def people(port: int, *nicks: str, channel: str = "#ops") -> list[IRCTestClient]:
    """IRC clients for ``nicks`` on the server at ``port``, each joined to ``channel``."""
    clients = [await IRCTestClient.connect(port, nick) for nick in nicks]
    for c in clients:
        await c.join(channel)
    return clients


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
    db: str | Path | None = None,
    joined_to: Iterable[str] = (),
    wait: float = WAIT,
    **settings: Any,
) -> AsyncIterator[IRCBot]:
    """A bot answering with a :class:`ScriptedModel` (or ``llm``) on a SQLite store
    (``db``, by default ``tmp_path/irc.db``; with SQLite memory when ``memory``), on one
    IRC server.

    ``bridge_kw`` go to the :class:`Bridge` (an ``access`` policy in them is loaded
    first, as the bot does at start), ``agent_kw`` to the :class:`Agent`, ``settings``
    to the IRC transport; it waits until the bot joined each of ``joined_to``. Yields
    ``(transport, model, agent, bridge)``.
    """
    model = ScriptedModel()
    store = SQLiteStore(str(db or tmp_path / "irc.db"))
    if memory:
        agent_kw = {"memory": SQLiteMemory(store), **(agent_kw or {})}
    agent = Agent(llm=llm or model, store=store, **(agent_kw or {}))
    await agent.start()
    bridge_kw = bridge_kw or {}
    if bridge_kw.get("access") is not None:
        await bridge_kw["access"].load(agent.store)  # as the bot does at start
    bridge = Bridge(agent, **bridge_kw)
    transport = irc_transport(port, **settings)
    async with serving(agent, bridge, transport, options, joined_to=joined_to, wait=wait):
        yield IRCBot(transport, model, agent, bridge)


class SlackBot(NamedTuple):
    transport: Any  # SlackTransport (imported lazily, as in slack_transport)
    model: Any
    agent: Agent
    bridge: Bridge


@asynccontextmanager
async def slack_bot(
    slack: Any,
    tmp_path: Path,
    *,
    model: Any = None,
    store: Any = None,
    tools: Iterable[Any] = (),
    options: ChannelOptions | None = None,
    bridge_kw: dict[str, Any] | None = None,
    agent_kw: dict[str, Any] | None = None,
    **settings: Any,
) -> AsyncIterator[SlackBot]:
    """A bot answering with a :class:`ScriptedModel` (or ``model``, any LLM) on a SQLite
    store (``store``, by default ``tmp_path/slack.db``), on the fake Slack ``slack``
    (:mod:`fakeslack`).

    ``tools`` and ``agent_kw`` go to the :class:`Agent`, ``bridge_kw`` to the
    :class:`Bridge` (an ``access`` policy in them is loaded first), ``settings`` to the
    Slack transport (see :func:`slack_transport`). Yields ``(transport, model, agent,
    bridge)``.
    """
    model = model if model is not None else ScriptedModel()
    agent = Agent(
        llm=model,
        store=store if store is not None else SQLiteStore(str(tmp_path / "slack.db")),
        tools=list(tools),
        **(agent_kw or {}),
    )
    await agent.start()
    bridge_kw = bridge_kw or {}
    if bridge_kw.get("access") is not None:
        await bridge_kw["access"].load(agent.store)  # as the bot does at start
    bridge = Bridge(agent, **bridge_kw)
    transport = slack_transport(slack, tmp_path, **settings)
    async with serving(agent, bridge, transport, options) as transport:
        yield SlackBot(transport, model, agent, bridge)


def bot_texts(slack: Any, channel: str) -> list[str]:
    """What the bot posted in the fake Slack's ``channel``, oldest first."""
    return [
        m["text"]
        for (ch, _), m in sorted(slack.messages.items(), key=lambda kv: kv[0][1])
        if ch == channel and m.get("user") == slack.bot_user_id
    ]


async def asked_and_answered(model: Any, requests: int, bridge: Bridge, key: str) -> None:
    """Wait until ``model`` got its ``requests``-th request, the turn that made it (in
    ``key``) ended, and every answer asked for in ``key`` is sent.  (A turn's request
    may go out before its message is stored; the channel waits for its answer only
    once it is: the request alone does not say the answer is waited for yet.)"""
    await eventually(lambda: len(model.requests) >= requests, f"model request {requests}")
    await eventually(lambda: not bridge.busy(key), f"the turn in {key} to end")
    await bridge.flush(key)


async def answered(slack: Any, bridge: Bridge, key: str) -> None:
    """Wait until the bridge took the first message for ``key`` and every answer is sent
    (for a place whose conversation has no answer yet)."""

    async def taken() -> Any:
        ch = bridge.open_channel(key)
        return ch is not None and (
            ch.pending or await ch.conversation.messages(kinds=["assistant"], limit=1)
        )

    await eventually(taken, f"the bridge to take a message in {key}")
    await bridge.flush(key)
