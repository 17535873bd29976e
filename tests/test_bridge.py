"""The bridge: when to answer, commands, rendering to a channel's limits."""

from __future__ import annotations

import asyncio

import pytest

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent, SQLiteStore, tool
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.transports.base import ChannelCaps
from agentik.transports.testing import MemoryTransport
from agentik.transports.text import split_lines, split_text


@pytest.fixture
async def rig(db_path):
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(db_path))
    await agent.start()
    bridge = Bridge(agent)
    transports: list[MemoryTransport] = []

    async def make(caps=None, **options):
        t = MemoryTransport(name=f"mem{len(transports)}", caps=caps)
        bridge.attach(t, ChannelOptions(**{"command_prefix": "!", **options}))
        await t.start(bridge)
        transports.append(t)
        return t

    yield model, agent, bridge, make
    await bridge.aclose()
    await agent.aclose()


def answers(t):
    return t.texts("answer")


async def test_direct_messages_are_always_answered(rig):
    model, agent, bridge, make = rig
    t = await make()
    await t.inject("hello bot", channel_key="mem:alice", author="alice", direct=True)
    await bridge.flush("mem:alice")
    assert answers(t) == ["echo: hello bot"]


async def test_shared_channel_answers_only_when_addressed(rig):
    model, agent, bridge, make = rig
    t = await make()
    await t.inject("just chatting", channel_key="mem:#room", author="bob")
    await t.inject("what time is it?", channel_key="mem:#room", author="alice", addressed=True)
    await bridge.flush("mem:#room")
    assert answers(t) == ["echo: what time is it?"]
    assert len(model.requests) == 1


async def test_answer_policies(rig):
    model, agent, bridge, make = rig
    everything = await make(answer="all")
    await everything.inject("anyone?", channel_key="all:#room", author="bob")
    await bridge.flush("all:#room")
    assert answers(everything) == ["echo: anyone?"]
    dm_only = await make(answer="direct")
    await dm_only.inject("hey", channel_key="dm:#room", author="bob", addressed=True)
    await dm_only.inject("psst", channel_key="dm:bob", author="bob", direct=True)
    await bridge.flush("dm:bob")
    assert answers(dm_only) == ["echo: psst"]


async def test_several_people_reach_the_model_with_their_names(rig):
    model, agent, bridge, make = rig
    t = await make(answer="all")
    await t.inject("I like tea", channel_key="mem:#room", author="alice")
    await t.inject("I prefer coffee", channel_key="mem:#room", author="bob")
    await bridge.flush("mem:#room")
    last = model.requests[-1].messages
    assert [(m.author, m.content) for m in last if m.role == "user"] == [
        ("alice", "I like tea"),
        ("bob", "I prefer coffee"),
    ]


async def test_lines_mode_splits_to_the_byte_limit(rig):
    model, agent, bridge, make = rig
    t = await make(caps=ChannelCaps(streaming="lines", max_bytes=40))
    text = "first line is short\n" + "ünïcödé wörds " * 20 + "\n\n```\ncode block\n```"
    model.enqueue(Reply(text=text))
    await t.inject("go", channel_key="mem:#x", direct=True)
    await bridge.flush("mem:#x")
    lines = answers(t)
    assert all(len(line.encode()) <= 40 for line in lines)
    assert lines[0] == "first line is short"
    assert " ".join(lines[1:-3]).split() == ("ünïcödé wörds " * 20).split()
    assert lines[-3:] == ["```", "code block", "```"]


async def test_long_answers_are_capped_and_more_shows_the_rest(rig):
    model, agent, bridge, make = rig
    t = await make(caps=ChannelCaps(streaming="lines"), max_answer_lines=3)
    model.enqueue(Reply(text="\n".join(f"line {i}" for i in range(8))))
    await t.inject("count", channel_key="mem:#x", direct=True)
    await bridge.flush("mem:#x")
    assert answers(t) == ["line 0", "line 1", "line 2"]
    assert "5 more lines: !more" in t.texts("notice")[-1]
    await t.inject("!more", channel_key="mem:#x", direct=True)
    assert answers(t)[3:] == ["line 3", "line 4", "line 5"]
    await t.inject("!more", channel_key="mem:#x", direct=True)
    assert answers(t)[6:] == ["line 6", "line 7"]
    await t.inject("!more", channel_key="mem:#x", direct=True)
    assert t.texts("command")[-1] == "nothing more"


async def test_message_mode_splits_long_answers_into_messages(rig):
    model, agent, bridge, make = rig
    t = await make(caps=ChannelCaps(streaming="message", max_chars=100))
    text = "\n".join(f"paragraph {i}: " + "word " * 10 for i in range(10))
    model.enqueue(Reply(text=text))
    await t.inject("write", channel_key="mem:#x", direct=True)
    await bridge.flush("mem:#x")
    pieces = answers(t)
    assert len(pieces) > 1 and all(len(p) <= 100 for p in pieces)
    assert "\n".join(pieces).split() == text.split()


async def test_stop_interrupts_and_help_lists_commands(rig):
    model, agent, bridge, make = rig
    t = await make(caps=ChannelCaps(streaming="deltas"))
    slow = Reply(text="word " * 200, hold_after=5)  # mid-answer until stopped
    model.enqueue(slow)
    await t.inject("talk", channel_key="mem:#x", direct=True)
    await slow.held.wait()
    await t.wait_for(lambda m: m.kind == "delta")
    await t.inject("!stop", channel_key="mem:#x", direct=True)
    await bridge.flush("mem:#x")
    assert "(interrupted)" in t.texts("notice")
    await t.inject("!stop", channel_key="mem:#x", direct=True)
    assert t.texts("command")[-1] == "nothing to stop"
    await t.inject("!help", channel_key="mem:#x", direct=True)
    help_text = t.texts("command")[-1]
    for name in ("!new", "!stop", "!more", "!status", "!help"):
        assert name in help_text


async def test_new_starts_a_fresh_conversation(rig):
    model, agent, bridge, make = rig
    t = await make()
    await t.inject("remember 42", channel_key="mem:#x", direct=True)
    await bridge.flush("mem:#x")
    old = (await agent.conversation_for_channel("mem:#x")).id
    await t.inject("!new", channel_key="mem:#x", direct=True)
    assert old in t.texts("command")[-1]
    await t.inject("what did I say?", channel_key="mem:#x", direct=True)
    await bridge.flush("mem:#x")
    assert [m.content for m in model.requests[-1].messages] == ["what did I say?"]
    assert (await agent.conversation_for_channel("mem:#x")).id != old
    assert (await agent.get_conversation(old)).id == old  # kept in history


async def test_status_and_unknown_commands(rig):
    model, agent, bridge, make = rig
    t = await make()
    await t.inject("!status", channel_key="mem:#x", direct=True)
    status = t.texts("command")[-1]
    assert "model scripted" in status and "idle" in status
    await t.inject("!frobnicate", channel_key="mem:#x", direct=True)
    assert "unknown command !frobnicate" in t.texts("command")[-1]
    before = len(t.sent)
    await t.inject("!frobnicate", channel_key="mem:#room", author="x")  # not addressed
    assert len(t.sent) == before


async def test_tool_calls_show_one_notice_each_and_errors_a_short_line(rig):
    model, agent, bridge, make = rig

    @tool(parameters={"type": "object", "properties": {"q": {"type": "string"}}})
    async def lookup(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    agent.add_tool(lookup)
    model.enqueue(Reply(tool_calls=[call("lookup", {"q": "cats"})]), "Cats are great.")
    model.enqueue(Reply(text="half", fail_after=1))
    t = await make()
    await t.inject("cats?", channel_key="mem:#x", direct=True)
    await t.inject("again", channel_key="mem:#x", direct=True)
    await bridge.flush("mem:#x")
    assert t.texts("notice")[0] == '⚙ lookup(q="cats")'
    assert answers(t)[0] == "Cats are great."
    errors = t.texts("error")
    assert len(errors) == 1 and errors[0].startswith("error: ")


async def test_huge_input_is_refused_with_a_message(rig):
    model, agent, bridge, make = rig
    t = await make(max_input_chars=1000)
    await t.inject("x" * 5000, channel_key="mem:#x", direct=True)
    assert "message too long (5000 characters; the limit is 1000)" in t.texts("error")[0]
    assert model.requests == []


async def test_messages_during_a_turn_are_answered_in_order(rig):
    model, agent, bridge, make = rig
    t = await make()
    gate = asyncio.Event()
    model.enqueue(Reply(text="first", gate=gate))
    await t.inject("one", channel_key="mem:#x", direct=True)
    await t.inject("two", channel_key="mem:#x", direct=True)
    await t.inject("three", channel_key="mem:#x", direct=True)
    gate.set()
    await bridge.flush("mem:#x")
    assert answers(t) == ["first", "echo: two", "echo: three"]


def test_split_text_respects_limits_and_characters():
    text = "€" * 50 + " tail"
    pieces = split_lines(text, max_bytes=10)
    assert all(len(p.encode()) <= 10 for p in pieces)
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
    assert split_text("a\nb\nc", max_chars=3) == ["a\nb", "c"]
    assert split_text("hello", max_bytes=None) == ["hello"]
    assert split_lines("one two three", max_chars=1)[:3] == ["o", "n", "e"]


async def test_debug_profile_shows_tool_results_reasoning_and_usage(rig):
    model, agent, bridge, make = rig

    @tool
    async def clock() -> str:
        """The time."""
        return "noon"

    agent.add_tool(clock)
    model.enqueue(Reply(reasoning="need the time", tool_calls=[call("clock")]), "It is noon.")
    t = await make(events="debug")
    await t.inject("time?", channel_key="mem:#x", direct=True)
    await bridge.flush("mem:#x")
    notices = t.texts("notice")
    assert "(thinking) need the time" in notices
    assert any(n.startswith("⚙ clock → (") and n.endswith("noon") for n in notices)
    assert notices[-1].startswith("turn run_") and "1 tool calls" in notices[-1]
    chat = await make()
    model.enqueue(Reply(reasoning="hidden", text="shown"))
    await chat.inject("x", channel_key="chat:#x", direct=True)
    await bridge.flush("chat:#x")
    assert chat.texts("notice") == [] and chat.texts("answer") == ["shown"]


async def test_ambient_context_is_recorded_without_answering(rig):
    model, agent, bridge, make = rig
    t = await make(ambient=True, ambient_lines=2)
    for who, text in [("bob", "deploy at 5?"), ("carol", "no, at 6"), ("bob", "ok 6 then")]:
        await t.inject(text, channel_key="mem:#ops", author=who)
    assert model.requests == [] and t.sent == []
    await t.inject("when is the deploy?", channel_key="mem:#ops", author="alice", addressed=True)
    await bridge.flush("mem:#ops")
    ctx = [(m.author, m.content) for m in model.requests[0].messages]
    assert ctx == [("carol", "no, at 6"), ("bob", "ok 6 then"), ("alice", "when is the deploy?")]


async def test_a_transport_instance_can_limit_the_tools_of_its_channels(rig):
    model, agent, bridge, make = rig

    @tool
    async def time__now() -> str:
        """The time."""
        return "noon"

    @tool
    async def shell__run() -> str:
        """Runs commands."""
        return "no"

    agent.add_tool(time__now)
    agent.add_tool(shell__run)
    public = await make(allowed_tools=("time__*",))
    private = await make()
    await public.inject("hi", channel_key="pub:#x", direct=True)
    await bridge.flush("pub:#x")
    await private.inject("hi", channel_key="priv:#x", direct=True)
    await bridge.flush("priv:#x")
    offered = [sorted(t.name for t in r.tools) for r in model.requests]
    assert offered == [["time__now"], ["shell__run", "time__now"]]


async def test_idle_channels_are_released_and_reopen_with_the_same_conversation(db_path):
    model = ScriptedModel()
    async with Agent(llm=model, store=SQLiteStore(db_path)) as agent:
        bridge = Bridge(agent, idle_seconds=0.2)
        t = MemoryTransport(name="mem")
        bridge.attach(t, ChannelOptions(answer="all"))
        await t.start(bridge)
        for i in range(20):
            await t.inject(f"hello {i}", channel_key=f"mem:#c{i}", author="alice")
        for i in range(20):
            await bridge.flush(f"mem:#c{i}")
        first = (await agent.conversation_for_channel("mem:#c0")).id
        # A reaper ends once it has released every channel (a slow machine may
        # release early ones before the last opens: then a new reaper follows).
        while (reaper := bridge._reaper) is not None:
            await asyncio.wait_for(reaper, 60)
        assert bridge.open_channels == 0
        assert bridge.released_channels == 20  # every channel was held, then released
        renderers = [t for t in asyncio.all_tasks() if t.get_name().startswith("agentik-render")]
        assert renderers == []
        # The next message reopens the channel on the same conversation, with its history.
        await t.inject("again", channel_key="mem:#c0", author="alice")
        await bridge.flush("mem:#c0")
        assert t.texts("answer")[-1] == "echo: again"
        assert (await agent.conversation_for_channel("mem:#c0")).id == first
        assert [m.content for m in model.requests[-1].messages if m.role == "user"] == [
            "hello 0",
            "again",
        ]
        await bridge.aclose()


async def test_a_channel_with_a_running_turn_is_not_released(db_path):
    gate = asyncio.Event()
    slow = Reply(text="slow answer", gate=gate)
    model = ScriptedModel([slow])
    async with Agent(llm=model, store=SQLiteStore(db_path)) as agent:
        bridge = Bridge(agent, idle_seconds=0.1)
        t = MemoryTransport(name="mem")
        bridge.attach(t, ChannelOptions(answer="all"))
        await t.start(bridge)
        await t.inject("question", channel_key="mem:#busy", author="alice")
        await slow.started.wait()
        # Another channel goes idle and is released: the reaper has looked at
        # both channels after their idle time, and kept the busy one.
        await t.inject("hi", channel_key="mem:#idle", author="bob")
        await bridge.flush("mem:#idle")
        async with asyncio.timeout(60):
            while bridge.released_channels < 1:  # noqa: ASYNC110 - no event for releases
                await asyncio.sleep(0.01)
        assert bridge.open_channels == 1
        gate.set()
        await bridge.flush("mem:#busy")
        assert t.texts("answer") == ["echo: hi", "slow answer"]
        await bridge.aclose()


async def test_command_replies_are_split_to_a_small_channel(rig):
    model, agent, bridge, make = rig
    t = await make(caps=ChannelCaps(streaming="message", max_chars=80))
    await t.inject("!help", channel_key="mem:#tiny", direct=True)
    replies = t.texts("command")
    assert len(replies) > 1 and all(len(r) <= 80 for r in replies)
    listed = " ".join(replies)
    for command in ("!new", "!stop", "!more", "!status", "!help"):
        assert command in listed
