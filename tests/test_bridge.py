"""The bridge: when to answer, commands, rendering to a channel's limits."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent, OpenAIBackend, SQLiteStore, tool
from agentik.core.errors import ContextTooLong
from agentik.core.testing import openai_server as fake
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.transports.base import ChannelCaps
from agentik.transports.testing import MemoryTransport
from agentik.transports.text import fit_prefix, split_lines, split_text

from rigs import eventually


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
    t = await make(busy="queue")  # "again" waits for its own turn (DMs steer by default)
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


async def test_messages_handed_over_as_tasks_keep_their_order(rig):
    # IRC hands each message to the bridge as a task of its own; reading the
    # channel's settings (and budgets) from SQLite must not let a later message
    # overtake an earlier one, even while a turn runs.
    model, agent, bridge, make = rig
    t = await make()
    gate = asyncio.Event()
    model.enqueue(Reply(text="first", gate=gate))
    words = [f"message {i}" for i in range(12)]
    tasks = [asyncio.create_task(t.inject(w, channel_key="mem:#order", direct=True)) for w in words]
    await asyncio.gather(*tasks)
    gate.set()
    await bridge.flush("mem:#order")
    assert [r.messages[-1].content for r in model.requests] == words
    assert answers(t) == ["first", *(f"echo: {w}" for w in words[1:])]


def test_split_text_respects_limits_and_characters():
    text = "€" * 50 + " tail"
    pieces = split_lines(text, max_bytes=10)
    assert all(len(p.encode()) <= 10 for p in pieces)
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
    assert split_text("a\nb\nc", max_chars=3) == ["a\nb", "c"]
    assert split_text("hello", max_bytes=None) == ["hello"]
    assert split_lines("one two three", max_chars=1)[:3] == ["o", "n", "e"]


def test_fit_prefix_is_the_longest_prefix_within_the_limits():
    # Each character counts its UTF-8 bytes (a lone surrogate 3), whether the text
    # is ASCII, fits whole, or has to be cut inside.
    def longest(text: str, max_bytes: int, max_chars: int | None) -> int:
        n = 0
        for i in range(len(text) + 1):
            head = text[:i]
            if len(head.encode("utf-8", "surrogatepass")) <= max_bytes and (
                max_chars is None or i <= max_chars
            ):
                n = i
        return n

    for text in ["", "plain ascii line", "é€😀 mixed", "\ud800 lone", "ab" * 40 + "€"]:
        for max_bytes in (0, 1, 3, 5, 16, 200):
            for max_chars in (None, 0, 4, 300):
                got = fit_prefix(text, max_bytes=max_bytes, max_chars=max_chars)
                assert got == longest(text, max_bytes, max_chars), (text, max_bytes, max_chars)


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
        while (reaper := bridge.channels.reaper) is not None:
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
        # No event for releases: polled.
        await eventually(lambda: bridge.released_channels >= 1, "a channel released")
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


# -- manners in shared channels ----------------------------------------------------------------
def sent_to(t, key, kind):
    return [m.text for m in t.sent if m.channel_key == key and m.kind == kind]


def with_lookup(agent):
    @tool(parameters={"type": "object", "properties": {"q": {"type": "string"}}})
    async def lookup(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    agent.add_tool(lookup)


def script_lookup(model):
    model.enqueue(Reply(tool_calls=[call("lookup", {"q": "cats"})]), "Cats are great.")


async def test_a_shared_channel_sees_answers_only_by_default_a_direct_one_tool_lines(rig):
    model, agent, bridge, make = rig
    with_lookup(agent)
    t = await make(answer="all")  # events left at its default, "auto"
    script_lookup(model)
    await t.inject("cats?", channel_key="mem0:#room", author="alice", addressed=True)
    await bridge.flush("mem0:#room")
    assert sent_to(t, "mem0:#room", "answer") == ["Cats are great."]
    assert sent_to(t, "mem0:#room", "notice") == []  # the tool ran, unannounced
    assert model.requests[-1].messages[-1].content == "found cats"
    script_lookup(model)
    await t.inject("cats?", channel_key="mem0:alice", author="alice", direct=True)
    await bridge.flush("mem0:alice")
    assert sent_to(t, "mem0:alice", "notice") == ['⚙ lookup(q="cats")']
    assert sent_to(t, "mem0:alice", "answer") == ["Cats are great."]


@pytest.mark.parametrize(
    ("events", "shared", "direct"),
    [
        ("chat", ['⚙ lookup(q="cats")'], ['⚙ lookup(q="cats")']),
        ("answers", [], []),
        ("debug", ['⚙ lookup(q="cats")', "⚙ lookup →"], ['⚙ lookup(q="cats")', "⚙ lookup →"]),
    ],
)
async def test_an_explicit_events_profile_applies_to_every_channel(rig, events, shared, direct):
    model, agent, bridge, make = rig
    with_lookup(agent)
    t = await make(answer="all", events=events)
    for key, is_direct, expected in (("mem0:#room", False, shared), ("mem0:bob", True, direct)):
        script_lookup(model)
        await t.inject("cats?", channel_key=key, author="bob", direct=is_direct)
        await bridge.flush(key)
        tool_lines = [n for n in sent_to(t, key, "notice") if n.startswith("⚙")]
        assert [n[: len(e)] for n, e in zip(tool_lines, expected, strict=False)] == expected
        assert len(tool_lines) == len(expected)
        assert sent_to(t, key, "answer") == ["Cats are great."]


class ThreadedTransport(MemoryTransport):
    """Keys ``thr:<channel>:<thread>`` are threads, as Slack's are."""

    def in_thread(self, channel_key: str) -> bool:
        return channel_key.count(":") >= 2


async def test_a_thread_gets_tool_lines_with_auto_its_channel_does_not(rig):
    model, agent, bridge, make = rig
    with_lookup(agent)
    t = ThreadedTransport(name="thr")
    bridge.attach(t, ChannelOptions(command_prefix="!", answer="all"))
    await t.start(bridge)
    for key in ("thr:#room:1700.1", "thr:#room"):
        script_lookup(model)
        await t.inject("cats?", channel_key=key, author="alice", addressed=True)
        await bridge.flush(key)
    assert sent_to(t, "thr:#room:1700.1", "notice") == ['⚙ lookup(q="cats")']
    assert sent_to(t, "thr:#room", "notice") == []
    assert sent_to(t, "thr:#room", "answer") == ["Cats are great."]


async def test_a_failing_tool_shows_no_internals_where_tool_lines_show(rig):
    model, agent, bridge, make = rig

    @tool
    async def backup() -> str:
        """Back up."""
        raise OSError(2, "No such file or directory", "/srv/agentik/backups/2026")

    agent.add_tool(backup)
    t = await make(answer="all")
    for key, direct in (("mem0:alice", True), ("mem0:#ops", False)):
        model.enqueue(Reply(tool_calls=[call("backup")]), "The backup failed.")
        await t.inject("back up", channel_key=key, author="alice", direct=direct)
        await bridge.flush(key)
    (failed,) = [n for n in sent_to(t, "mem0:alice", "notice") if "failed" in n]
    assert failed.startswith("⚙ backup failed: error: tool backup failed (internal error, ref ")
    assert "/srv" not in failed and "Errno" not in failed
    assert sent_to(t, "mem0:#ops", "notice") == []  # shared: no tool lines at all
    assert sent_to(t, "mem0:#ops", "answer") == ["The backup failed."]


class IRCLike(MemoryTransport):
    """A line-streaming transport with IRC's default cap (the class attribute IRC sets)."""

    default_max_answer_lines = 4


async def test_the_transport_default_caps_long_answers_and_more_shows_the_rest(rig):
    model, agent, bridge, make = rig
    t = IRCLike(name="irclike", caps=ChannelCaps(streaming="lines", max_bytes=400))
    bridge.attach(t, ChannelOptions(command_prefix="!", answer="all"))  # cap left unset
    await t.start(bridge)
    assert bridge.options_for(t).max_answer_lines == 4
    model.enqueue(Reply(text="\n".join(f"line {i}" for i in range(10))))
    await t.inject("count to ten", channel_key="irclike:#room", author="alice")
    await bridge.flush("irclike:#room")
    assert answers(t) == [f"line {i}" for i in range(4)]
    assert t.texts("notice") == ["… 6 more lines: !more"]
    await t.inject("!more", channel_key="irclike:#room", author="bob")
    assert answers(t)[4:] == [f"line {i}" for i in range(4, 8)]
    assert t.texts("command") == ["… 2 more lines: !more"]
    await t.inject("!more", channel_key="irclike:#room", author="bob")
    assert answers(t)[8:] == ["line 8", "line 9"]
    # 0 stays available: no cap.
    uncapped = IRCLike(name="uncapped", caps=ChannelCaps(streaming="lines"))
    bridge.attach(uncapped, ChannelOptions(answer="all", max_answer_lines=0))
    await uncapped.start(bridge)
    model.enqueue(Reply(text="\n".join(f"line {i}" for i in range(10))))
    await uncapped.inject("count", channel_key="uncapped:#room", author="alice")
    await bridge.flush("uncapped:#room")
    assert answers(uncapped) == [f"line {i}" for i in range(10)]
    assert uncapped.texts("notice") == []


def test_max_answer_lines_defaults_to_four_on_irc_and_zero_elsewhere():
    from agentik.bot.bridge import options_from
    from agentik.bot.config import parse_config
    from agentik.transports.irc.transport import IRCTransport

    config = parse_config(
        {
            "transports": {
                "libera": {"type": "irc", "host": "127.0.0.1"},
                "quiet": {"type": "irc", "host": "127.0.0.1", "max_answer_lines": 0},
                "long": {"type": "irc", "host": "127.0.0.1", "max_answer_lines": 12},
                "mem": {"type": "memory"},
            }
        },
        env={},
    )
    sections = config.transports
    assert sections["libera"].max_answer_lines is None  # unset in the file
    caps = {
        name: options_from(
            sections[name], IRCTransport(name=name, settings=sections[name].settings)
        )
        for name in ("libera", "quiet", "long")
    }
    caps["mem"] = options_from(sections["mem"], MemoryTransport(name="mem"))
    assert {name: o.max_answer_lines for name, o in caps.items()} == {
        "libera": 4,
        "quiet": 0,
        "long": 12,
        "mem": 0,
    }
    assert {o.events for o in caps.values()} == {"auto"}


ERROR_LINE = re.compile(r"^error: (?P<what>[^()]+) \(ref (?P<ref>[0-9a-f]{6})\)$")


async def test_model_failures_are_one_short_line_and_the_log_has_the_details(
    db_path, caplog, openai_server
):
    caplog.set_level(logging.WARNING)
    llm = OpenAIBackend(
        model="fake-model", base_url=openai_server.base_url, api_key="sk-test-secret",
        max_retries=0, timeout=60,
    )  # fmt: skip
    leaky = "upstream http://10.0.0.7:8000/v1 failed reading /opt/models/big.gguf"
    openai_server.enqueue(
        fake.Reply.error(500, leaky),
        fake.Reply.error(401, f"Incorrect API key provided; see {openai_server.base_url}/keys"),
        fake.Reply.error(500, leaky),
    )
    async with Agent(llm=llm, store=SQLiteStore(db_path)) as agent:
        bridge = Bridge(agent)
        t = MemoryTransport(name="net")
        bridge.attach(t, ChannelOptions(answer="all"))
        await t.start(bridge)
        asked = [
            ("net:#room", False),  # HTTP 500 with a URL and a path in its message
            ("net:#room", False),  # HTTP 401
            ("net:alice", True),  # a direct conversation gets the same short line
        ]
        for key, direct in asked:
            await t.inject("hello?", channel_key=key, author="alice", direct=direct)
            await bridge.flush(key)
        await openai_server.close()  # connection refused from now on
        await t.inject("still there?", channel_key="net:#room", author="alice")
        await bridge.flush("net:#room")
        await bridge.aclose()
    lines = t.texts("error")
    assert [ERROR_LINE.match(line)["what"] for line in lines] == [
        "the model is unavailable right now",
        "the model is refusing the request",
        "the model is unavailable right now",
        "the model is unavailable right now",
    ]
    host = openai_server.base_url.split("//")[1].split("/")[0]
    for line in lines:
        # The reference is random hex: it may read "500" by chance, so it is left out.
        said = line.replace(ERROR_LINE.match(line)["ref"], "")
        for leak in ("http", "10.0.0.7", "/opt", "500", "401", host, "API key", "sk-test"):
            assert leak not in said, line
    # Each line's reference finds the ERROR log line with the whole story.
    details = []
    for line in lines:
        ref = ERROR_LINE.match(line)["ref"]
        (record,) = [r for r in caplog.records if f"error ref {ref} " in r.getMessage()]
        assert record.levelname == "ERROR"
        details.append(record.getMessage())
    assert "HTTP 500" in details[0] and leaky in details[0] and "net:#room" in details[0]
    assert "HTTP 401" in details[1] and "Incorrect API key" in details[1]
    assert "net:alice" in details[2]
    assert (
        "LLMConnectionError" in details[3]
        and f"could not reach the model at http://{host}" in (details[3])
    )
    assert "sk-test-secret" not in caplog.text


async def test_a_model_that_does_not_answer_in_time_is_one_short_line(
    db_path, caplog, openai_server
):
    caplog.set_level(logging.ERROR)
    # The read timeout of the client; the reply is held until the test releases it.
    llm = OpenAIBackend(
        model="fake-model", base_url=openai_server.base_url, api_key="x", max_retries=0,
        timeout=1.0,
    )  # fmt: skip
    held = fake.Reply.text("too late", hold_after=0)
    openai_server.enqueue(held)
    try:
        async with Agent(llm=llm, store=SQLiteStore(db_path)) as agent:
            bridge = Bridge(agent)
            t = MemoryTransport(name="net")
            bridge.attach(t, ChannelOptions(answer="all"))
            await t.start(bridge)
            await t.inject("hello?", channel_key="net:#room", author="alice")
            await bridge.flush("net:#room")
            await bridge.aclose()
    finally:
        held.release()
    (line,) = t.texts("error")
    match = ERROR_LINE.match(line)
    assert match["what"] == "the model did not answer in time"
    (record,) = [r for r in caplog.records if f"error ref {match['ref']} " in r.getMessage()]
    assert f"LLMTimeout: the model at {openai_server.base_url} timed out" in record.getMessage()


async def test_a_conversation_too_long_for_the_model_says_what_to_do(rig):
    model, agent, bridge, make = rig
    t = await make(answer="all")
    refusal = ContextTooLong("prompt of 9000 tokens exceeds n_ctx 8192 (/models/big.gguf)")
    # Refused, the context shrunk, refused again: the turn ends with the error.
    model.enqueue(Reply(fail_after=0, error=refusal), Reply(fail_after=0, error=refusal))
    await t.inject("hello", channel_key="mem0:#room", author="alice")
    await bridge.flush("mem0:#room")
    (line,) = t.texts("error")
    assert ERROR_LINE.match(line)["what"] == (
        "this conversation no longer fits the model's context; try !compact or !new"
    )


async def test_slack_threads_get_tool_lines_a_whole_channel_does_not(tmp_path):
    # The real Slack transport against the local fake: by default every
    # conversation in a channel is a thread under the mention (tool lines
    # welcome); with conversation_per = "channel" answers go to the channel itself.
    from agentik.transports.slack.transport import SlackTransport

    from fakeslack import FakeSlack

    def tool_lines(slack, channel):
        return [
            p
            for p in slack.calls_to("chat.postMessage")
            if p.get("channel") == channel and "⚙" in (p.get("text") or "")
        ]

    model = ScriptedModel()
    store = SQLiteStore(str(tmp_path / "s.db"))
    async with FakeSlack() as slack, Agent(llm=model, store=store) as agent:
        with_lookup(agent)
        slack.add_user("U1", "alice")
        bridge = Bridge(agent)
        base = {
            "bot_token": slack.bot_token, "app_token": slack.app_token, "api_url": slack.api_url,
            "streaming": "edit", "edit_interval": 0.05,
        }  # fmt: skip
        mentions = {}
        for name, channel, per in (("threads", "C1", "thread"), ("whole", "C9", "channel")):
            transport = SlackTransport(
                name=name,
                settings={**base, "state_file": str(tmp_path / f"{name}.sqlite3"),
                          "conversation_per": per},
            )  # fmt: skip
            bridge.attach(transport, ChannelOptions(command_prefix="!"))
            await transport.start(bridge)
            try:
                script_lookup(model)
                event = mentions[channel] = slack.app_mention_event(
                    channel, f"<@{slack.bot_user_id}> cats?"
                )
                await slack.push_event(event)
                await slack.wait_for_call(
                    "chat.update",
                    lambda p, c=channel: (
                        p.get("channel") == c and "Cats are great." in (p.get("text") or "")
                    ),
                )
            finally:
                await transport.aclose()
        await bridge.aclose()
        (notice,) = tool_lines(slack, "C1")
        assert notice["text"] == '_⚙ lookup(q="cats")_'
        assert notice["thread_ts"] == mentions["C1"]["ts"]  # in the thread under the mention
        assert tool_lines(slack, "C9") == []
