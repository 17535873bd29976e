"""Per-turn settings as a value (issue 30): a frozen ``TurnSettings`` passed with each
message and carried by the queued turn, so the same conversation reached from two
front ends gives each turn its own persona, tools and model, whatever the order;
steering joins a running turn only with equal settings; a child run gets its spec's
settings from the parent TURN's; and each run records where it came from.

Everything is real: the scripted model records each request, conversations are on
real SQLite files, the cross-front-end test runs a real IRC server and the real HTTP
transport, both attached to one bridge."""

from __future__ import annotations

import asyncio
import warnings

import httpx
import pytest

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.bot.chansettings import ChannelSettings
from agentik.core import Agent, SQLiteStore, TurnOrigin, TurnPolicy, TurnSettings, tool
from agentik.core.agents import AgentSpec
from agentik.core.hookspecs import hookimpl
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.core.turnsettings import DEFAULT_SETTINGS
from agentik.transports.base import restrict_tools
from agentik.transports.http.transport import HttpTransport
from agentik.transports.testing.fake import FakeTransport
from helpers import collect_turn

from ircservers import IRCTestClient
from rigs import WAIT, irc_transport, joined, said_in

pytest_plugins = ["ircservers"]

PIRATE = "Talk like a pirate."
TOKEN = "ops-0123456789abcdef"


@tool
async def secret() -> str:
    """Secret."""
    return "s"


@tool
async def public_info() -> str:
    """Public."""
    return "p"


def names(request) -> list[str]:
    return sorted(t.name for t in request.tools)


def last_user(request) -> str:
    return next(str(m.content) for m in reversed(request.messages) if m.role == "user")


@pytest.fixture
async def two_models(tmp_path):
    """An agent on a main model with a second model profile ``small``."""
    main, small = ScriptedModel(model="main"), ScriptedModel(model="small")
    agent = Agent(
        llm=main,
        store=SQLiteStore(str(tmp_path / "turns.db")),
        tools=[secret, public_info],
        profiles={"small": small},
    )
    async with agent:
        yield agent, main, small


@pytest.mark.parametrize("pirate_first", [True, False])
async def test_queued_turns_each_run_with_their_own_settings_whatever_the_order(
    two_models, pirate_first
):
    agent, main, small = two_models
    pirate = TurnSettings(system_addition=PIRATE, policy=TurnPolicy(allowed_tools=("public_*",)))
    plain = TurnSettings(llm_profile="small")
    conv = await agent.create_conversation()
    # The first turn waits until released: the others are queued behind it, back to back.
    hold = asyncio.Event()
    first, second = (pirate, plain) if pirate_first else (plain, pirate)
    (main if pirate_first else small).enqueue(Reply(text="first", gate=hold))
    sub = conv.events(kinds={"turn_ended"})
    runs = [
        await conv.send("one", settings=first),
        await conv.send("two", settings=second),
        await conv.send("three", settings=first),
    ]
    assert conv.queued == 2
    hold.set()
    for run_id in runs:
        await collect_turn(sub, run_id=run_id, wait=WAIT)
    await sub.aclose()
    asked = {last_user(r): (m, r) for m in (main, small) for r in m.requests}
    assert set(asked) == {"one", "two", "three"}
    for text, settings in (("one", first), ("two", second), ("three", first)):
        model, request = asked[text]
        if settings is pirate:
            assert model is main and PIRATE in (request.system or "")
            assert names(request) == ["public_info"]
        else:
            assert model is small and PIRATE not in (request.system or "")
            assert names(request) == ["public_info", "secret"]
    # Nothing was written into the shared conversation.
    assert conv.settings == DEFAULT_SETTINGS and conv.llm_profile is None


async def test_steering_joins_only_a_turn_with_equal_settings(tmp_path):
    started, release = asyncio.Event(), asyncio.Event()

    @tool
    async def slow() -> str:
        """A slow lookup."""
        started.set()
        await release.wait()
        return "found"

    model = ScriptedModel()
    model.enqueue(Reply(tool_calls=[call("slow", id="s1")]), "done")
    async with Agent(llm=model, store=SQLiteStore(str(tmp_path / "s.db")), tools=[slow]) as agent:
        conv = await agent.create_conversation()
        persona = TurnSettings(system_addition=PIRATE)
        sub = conv.events(kinds={"turn_ended"})
        run_id = await conv.send("look it up", settings=persona)
        await asyncio.wait_for(started.wait(), WAIT)
        # Equal settings (the origin is not compared): it joins the running turn.
        same = TurnSettings(system_addition=PIRATE, origin=TurnOrigin("web", speaker_id="bob"))
        joined_ = await conv.submit("and quickly", busy="steer", settings=same)
        assert joined_.steered and joined_.run_id == run_id
        # Another persona: not steered, queued as its own turn with its own settings.
        other = await conv.submit("plain please", busy="steer", settings=TurnSettings())
        assert not other.steered and other.run_id != run_id
        assert await conv.steer("no turn can take me", settings=TurnSettings()) is None
        release.set()
        await collect_turn(sub, run_id=run_id, wait=WAIT)
        await collect_turn(sub, run_id=other.run_id, wait=WAIT)
        await sub.aclose()
    after_tool = model.requests[1]
    assert PIRATE in (after_tool.system or "")
    assert "and quickly" in [str(m.content) for m in after_tool.messages if m.role == "user"]
    own = model.requests[2]
    assert last_user(own) == "plain please" and PIRATE not in (own.system or "")


async def test_a_child_run_gets_its_specs_settings_and_the_parent_keeps_its_own(tmp_path):
    @tool
    async def fetch() -> str:
        """Fetch a page."""
        return "page"

    main, small = ScriptedModel(model="main"), ScriptedModel(model="small")
    helper = AgentSpec(description="Helps.", system_prompt="You are the helper.", tools=("fetch",))
    # The parent's turn runs on ``small`` (its settings): it calls the helper, whose
    # spec names no model, so the child runs on the parent TURN's model too.
    small.enqueue(
        Reply(tool_calls=[call("agent__helper", {"task": "look"}, id="p1")]),
        "child answer",
        "parent done",
    )
    agent = Agent(
        llm=main, store=SQLiteStore(str(tmp_path / "c.db")), tools=[fetch, secret],
        agents={"helper": helper}, uses=("helper",), profiles={"small": small},
    )  # fmt: skip
    async with agent:
        conv = await agent.create_conversation()
        parent = TurnSettings(system_addition=PIRATE, llm_profile="small")
        sub = conv.events(kinds={"turn_ended"})
        first = await conv.send("delegate", settings=parent)
        await collect_turn(sub, run_id=first, wait=WAIT)
        second = await conv.send("and now?", settings=TurnSettings())
        await collect_turn(sub, run_id=second, wait=WAIT)
        await sub.aclose()
    parent_first, child, parent_after = small.requests
    assert PIRATE in (parent_first.system or "") and "agent__helper" in names(parent_first)
    assert last_user(child) == "look"
    assert (child.system or "").startswith("You are the helper.")
    assert PIRATE not in (child.system or "") and names(child) == ["fetch"]
    assert PIRATE in (parent_after.system or "")  # the parent turn's own, after the child
    # The parent's next turn has its own settings: the main model, no persona.
    [next_turn] = main.requests
    assert last_user(next_turn) == "and now?" and PIRATE not in (next_turn.system or "")


class SeesOrigin:
    """A plugin reading where the run it is asked about came from."""

    def __init__(self) -> None:
        self.seen: list[TurnOrigin | None] = []

    @hookimpl
    def before_llm_request(self, conversation, run_id):
        node = conversation.agent.runs.get(run_id)
        self.seen.append(node.origin if node is not None else None)


async def test_the_origin_is_recorded_on_the_message_the_event_and_the_run(tmp_path):
    model, plugin = ScriptedModel(), SeesOrigin()
    store = SQLiteStore(str(tmp_path / "o.db"))
    async with Agent(llm=model, store=store, hooks=[plugin]) as agent:
        conv = await agent.create_conversation()
        origin = TurnOrigin(
            transport="libera", channel_key="irc:libera:#x", speaker_id="alice",
            display_name="Alice", verified=True,
        )  # fmt: skip
        sub = conv.events(kinds={"turn_started", "turn_ended"})
        run_id = await conv.send("hi", author="Alice", settings=TurnSettings(origin=origin))
        started, _ = await collect_turn(sub, run_id=run_id, wait=WAIT)
        await sub.aclose()
        assert started.kind == "turn_started" and started.origin == origin.to_dict()
        [message] = await conv.messages(kinds=["user"])
        assert TurnOrigin.of(message) == origin and message.run_id == run_id
        assert plugin.seen == [origin]  # a hook sees it on the run
        # A library call without settings says nothing of its origin.
        run_id = await conv.send("again")
        await conv.wait_idle()
        last = (await conv.messages(kinds=["user"]))[-1]
        assert last.run_id == run_id and TurnOrigin.of(last) is None


async def test_the_deprecated_conversation_knobs_change_only_its_default_settings(two_models):
    agent, main, small = two_models
    conv = await agent.create_conversation()
    with pytest.warns(DeprecationWarning, match="Conversation.policy is deprecated"):
        conv.policy = TurnPolicy(allowed_tools=("public_*",))
    with pytest.warns(DeprecationWarning, match="Conversation.system_addition"):
        conv.system_addition = PIRATE
    with pytest.warns(DeprecationWarning, match="Conversation.llm_profile"):
        conv.llm_profile = "small"
    assert conv.settings.llm_profile == "small" and conv.system_addition == PIRATE
    with pytest.warns(DeprecationWarning, match="restrict_tools is deprecated"):
        restrict_tools(conv, ("secret",), default=agent.policy)
    assert conv.policy is not None and conv.policy.allowed_tools == ("secret",)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reading is not deprecated noise
        assert conv.system_prompt is None and conv.recall is None
    await conv.send("default")  # no settings: the conversation's default
    await conv.send("given", settings=TurnSettings())  # given settings win
    await conv.wait_idle()
    [on_default] = small.requests
    assert PIRATE in (on_default.system or "") and names(on_default) == ["secret"]
    [given] = main.requests
    assert PIRATE not in (given.system or "") and names(given) == ["public_info", "secret"]


# -- two front ends, one conversation ------------------------------------------------------


async def test_irc_and_http_turns_in_one_conversation_each_get_their_front_ends_settings(
    irc_server, tmp_path
):
    """An IRC channel with a persona, a tools list and a model profile, and the HTTP
    API posting into that channel's (cached) conversation: each turn runs with its
    own front end's settings, in either order, and records where it came from."""
    main, small = ScriptedModel(model="main"), ScriptedModel(model="small")
    agent = Agent(
        llm=main, store=SQLiteStore(str(tmp_path / "bot.db")), tools=[secret, public_info],
        profiles={"small": small},
    )  # fmt: skip
    await agent.start()
    key = "irc:testnet:#ops"
    bridge = Bridge(
        agent,
        channel_settings={key: ChannelSettings(persona=PIRATE, tools=("public_*",), model="small")},
    )
    irc = irc_transport(irc_server.port, channels=["#ops"])
    # A token without a ``channels`` limit may post into another transport's conversation.
    http = HttpTransport(
        name="web",
        settings={"port": 0, "tokens": [{"name": "ops", "env": "OPS_TOKEN"}]},
        environ={"OPS_TOKEN": TOKEN},
    )
    bridge.attach(irc, ChannelOptions(command_prefix="!"))
    bridge.attach(http, None)
    await irc.start(bridge)
    await http.start(bridge)
    alice = None
    try:
        await joined(irc, "#ops")
        alice = await IRCTestClient.connect(irc_server.port, "alice")
        await alice.join("#ops")
        alice.privmsg("#ops", "agentik: from irc one")
        await alice.wait_for(said_in("#ops", "echo:", "from irc one"))
        conv = await agent.conversation_for_channel(key)
        assert conv.busy is False
        api = http.url + http.options.prefix
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=api, headers=auth, timeout=WAIT) as client:
            r = await client.post(
                f"/conversations/{conv.id}/messages", json={"content": "from http", "author": "web"}
            )
            assert r.status_code == 202, r.text
            http_run = r.json()["run_id"]
            await conv.wait_idle()
            alice.privmsg("#ops", "agentik: from irc two")
            await alice.wait_for(said_in("#ops", "echo:", "from irc two"))
        on_small = {last_user(r): r for r in small.requests}
        on_main = {last_user(r): r for r in main.requests}
        # The channel's turns: its persona, its tools, its model — before and after HTTP's.
        for text in ("from irc one", "from irc two"):
            request = on_small[text]
            assert "Channel instructions for irc:testnet:#ops" in (request.system or "")
            assert names(request) == ["public_info"]
        # The HTTP turn: the API's own (the agent's) — no persona, every tool, main model.
        assert set(on_main) == {"from http"}
        assert "Channel instructions" not in (on_main["from http"].system or "")
        assert names(on_main["from http"]) == ["public_info", "secret"]
        # Each user message records its origin.
        users = {m.content: m for m in await conv.messages(kinds=["user"])}
        irc_origin = TurnOrigin.of(users["from irc one"])
        assert irc_origin is not None
        assert (irc_origin.transport, irc_origin.channel_key) == ("testnet", key)
        assert irc_origin.display_name == "alice"
        http_origin = TurnOrigin.of(users["from http"])
        assert users["from http"].run_id == http_run
        assert http_origin == TurnOrigin(
            transport="web", channel_key="http:web:ops", speaker_id="ops",
            display_name="web", verified=True,
        )  # fmt: skip
    finally:
        if alice is not None:
            await alice.close()
        await http.aclose()
        await irc.aclose()
        await bridge.aclose()
        await agent.aclose()


async def test_a_resumed_turn_gets_its_channels_settings_as_they_are_at_resume_time(tmp_path):
    """A restart takes an unanswered message up with the settings its front end gives
    now (the channel's persona was configured meanwhile); its origin stays recorded."""
    db = str(tmp_path / "resume.db")
    held = Reply(text="never finished here", hold_after=1)
    agent = await Agent(llm=ScriptedModel([held]), store=SQLiteStore(db)).start()
    bridge = Bridge(agent)
    fake = FakeTransport(name="chat")
    bridge.attach(fake)
    await fake.start(bridge)
    await fake.say("agentik: the question", channel="ops", user="carol")
    await asyncio.wait_for(held.held.wait(), WAIT)
    await bridge.aclose()
    await agent.aclose()

    key = fake.key(channel="ops")
    model = ScriptedModel()
    agent = await Agent(llm=model, store=SQLiteStore(db)).start()
    bridge = Bridge(agent, channel_settings={key: ChannelSettings(persona=PIRATE)})
    fake = FakeTransport(name="chat")
    bridge.attach(fake)
    await fake.start(bridge)
    try:
        conv = await agent.conversation_for_channel(key)
        sub = conv.events(kinds={"turn_started"})
        assert (await bridge.resume_pending())["answer"] == 1
        started = await asyncio.wait_for(anext(sub), WAIT)
        await sub.aclose()
        await asyncio.wait_for(bridge.flush(key), WAIT)
        [request] = model.requests
        assert "Channel instructions for fake:chat:#ops" in (request.system or "")
        assert PIRATE in (request.system or "")
        recorded = TurnOrigin.of((await conv.messages(kinds=["user"]))[0])
        assert recorded is not None and (recorded.transport, recorded.channel_key) == ("chat", key)
        assert started.origin == recorded.to_dict()
    finally:
        await bridge.aclose()
        await agent.aclose()
