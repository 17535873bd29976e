"""Reflection on every conversation end (reset, deleted, idle, shutdown), once per
span; mining's ``mine_min_turns``; the announce line; ``!memory`` and ``!forget``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
from collections.abc import Callable

import pytest
from test_compaction import Brain, chat, make_agent

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core.access import AccessPolicy
from agentik.core.background import REFLECTED, REFLECTION_PROMPT, BackgroundPolicy, MemoryWorker
from agentik.core.errors import NotFound
from agentik.core.memory import user_scope
from agentik.core.testing.scripted import Reply
from agentik.transports.irc.transport import IRCTransport
from agentik.transports.testing import MemoryTransport
from agentik.transports.testing.fake import FakeTransport
from helpers import AGENTIK

from ircservers import IRCTestClient
from rigs import eventually, joined

pytest_plugins = ["ircservers"]

KINDS = {"conversation_started", "turn_ended", "conversation_ended", "memory_noted"}


class Recorder:
    """Every event of ``KINDS`` the agent publishes, in order; waits for one."""

    def __init__(self, agent) -> None:
        self.events: list = []
        self.changed = asyncio.Condition()
        self._sub = agent.events(kinds=KINDS)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for e in self._sub:
            async with self.changed:
                self.events.append(e)
                self.changed.notify_all()

    async def wait(self, test: Callable[[object], bool], count: int = 1) -> None:
        async with asyncio.timeout(60), self.changed:
            await self.changed.wait_for(lambda: sum(map(test, self.events)) >= count)

    def kinds(self) -> list[str]:
        out = []
        for e in self.events:
            out.append(f"{e.kind}:{e.reason}" if e.kind == "conversation_ended" else e.kind)
        return out

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._sub.aclose()


def ended(reason: str) -> Callable[[object], bool]:
    return lambda e: e.kind == "conversation_ended" and e.reason == reason


async def until(predicate: Callable[[], bool]) -> None:
    """Wait for a condition nothing signals (the bridge's released count)."""
    await eventually(predicate, "the condition (the bridge signals no release)")


def transcript(request) -> str:
    return request.messages[0].content


async def test_idle_reflects_once_per_span_with_events_in_order(db_path):
    brain = Brain(reflection="Alice is planning the release.")
    policy = BackgroundPolicy(mining=False, reflection_debounce=0, reflect_after_idle=0.05)
    worker = MemoryWorker(policy)
    agent = await make_agent(brain, db_path, worker=worker, budget=100_000).start()
    rec = Recorder(agent)
    # The bridge releases the idle channel too; reflection follows reflect_after_idle.
    bridge = Bridge(agent, idle_seconds=0.05)
    t = MemoryTransport(name="net")
    bridge.attach(t, ChannelOptions(command_prefix="!", answer="all"))
    await t.start(bridge)
    try:
        await t.inject("first topic: the release", channel_key="net:#a", author="alice")
        await rec.wait(ended("idle"))
        await asyncio.wait_for(worker.wait_for("reflection"), 60)
        await until(lambda: bridge.released_channels >= 1)
        notes = await agent.memory.list(["channel:net:#a"])
        assert [n.text.split(": ", 1)[1] for n in notes] == ["Alice is planning the release."]
        assert notes[0].author == "agentik:reflection"
        assert "first topic" in transcript(brain.requests("reflection")[0])
        await rec.wait(lambda e: e.kind == "memory_noted")
        assert rec.kinds() == [
            "conversation_started",
            "turn_ended",
            "conversation_ended:idle",
            "memory_noted",
        ]
        conv = await agent.conversation_for_channel("net:#a")
        started = rec.events[0]
        assert started.conversation_id == conv.id and started.channel_key == "net:#a"
        # The span reflected on is remembered in the conversation's metadata.
        record = await agent.store.get_conversation(conv.id)
        assert record.meta[REFLECTED] > 0

        # A new turn in the same conversation: only it is reflected on next time.
        await t.inject("second topic: the party", channel_key="net:#a", author="alice")
        await rec.wait(ended("idle"), 2)
        await asyncio.wait_for(worker.wait_for("reflection", 2), 60)
        second = transcript(brain.requests("reflection")[1])
        assert "second topic" in second and "first topic" not in second

        # !new ends it once more, with nothing new: no third reflection.
        await t.inject("!new", channel_key="net:#a", author="alice")
        await rec.wait(ended("reset"))
        await asyncio.wait_for(worker.wait_for("reflection", 3), 60)
        assert worker.done[-1][2] == 0
        assert len(brain.requests("reflection")) == 2
        # The new conversation started, bound to the channel; the old one ended.
        await rec.wait(lambda e: e.kind == "conversation_started", 2)
        assert [k for k in rec.kinds() if k.startswith("conversation")] == [
            "conversation_started",
            "conversation_ended:idle",
            "conversation_ended:idle",
            "conversation_started",
            "conversation_ended:reset",
        ]
        new = await agent.conversation_for_channel("net:#a")
        assert new.id != conv.id and rec.events[-2].conversation_id == new.id
        assert rec.events[-1].conversation_id == conv.id
    finally:
        await rec.aclose()
        await t.aclose()
        await bridge.aclose()
        await agent.aclose()


async def test_delete_reflects_on_what_the_conversation_said_before_it_goes(db_path):
    brain = Brain(reflection="Bob wants the report on Monday.")
    worker = MemoryWorker(BackgroundPolicy(mining=False, reflection_debounce=0))
    async with make_agent(brain, db_path, worker=worker, budget=100_000) as agent:
        rec = Recorder(agent)
        conv = await agent.create_conversation(title="report")
        await chat(conv, 2, size=0)
        conv_id = conv.id
        await agent.delete_conversation(conv_id)
        with pytest.raises(NotFound):
            await agent.get_conversation(conv_id)
        await asyncio.wait_for(worker.wait_for("reflection"), 60)
        await rec.wait(ended("deleted"))
        (request,) = brain.requests("reflection")
        assert "question 0" in transcript(request) and "question 1" in transcript(request)
        notes = await agent.memory.list([f"channel:conversation:{conv_id}"])
        assert len(notes) == 1 and "Bob wants the report on Monday." in notes[0].text
        assert [k for k in rec.kinds() if k.startswith("conversation")] == [
            "conversation_started",
            "conversation_ended:deleted",
        ]
        await rec.aclose()


async def test_a_library_user_closing_a_conversation_gets_its_end_and_a_reflection(db_path):
    """The seed: ``Conversation.aclose()`` publishes ``conversation_ended``; it
    published nothing, so a library user who closes conversations got no event and
    no reflection.  Its own subscribers see the end before their stream stops, and
    a conversation that already ended (deleted) is not ended twice."""
    brain = Brain(reflection="Alice prefers tea.")
    worker = MemoryWorker(BackgroundPolicy(mining=False, reflection_debounce=0))
    async with make_agent(brain, db_path, worker=worker, budget=100_000) as agent:
        rec = Recorder(agent)
        conv = await agent.create_conversation(title="drinks")
        await chat(conv, 2, size=0)
        own = conv.events(after=0)
        await conv.aclose()
        await rec.wait(ended("closed"))
        seen = [e async for e in own]
        assert seen[-1].kind == "conversation_ended" and seen[-1].reason == "closed"
        await asyncio.wait_for(worker.wait_for("reflection"), 60)
        (request,) = brain.requests("reflection")
        assert "question 0" in transcript(request) and "question 1" in transcript(request)
        notes = await agent.memory.list([f"channel:conversation:{conv.id}"])
        assert len(notes) == 1 and "Alice prefers tea." in notes[0].text
        # Still there: closing is not deleting; it opens again and goes on.
        again = await agent.get_conversation(conv.id)
        assert again.title == "drinks"
        await agent.delete_conversation(again.id)
        await rec.wait(ended("deleted"))
        await again.aclose()  # already ended: no second end
        marker = await agent.create_conversation(title="after")
        await rec.wait(
            lambda e: e.kind == "conversation_started" and e.conversation_id == marker.id
        )
        assert [k for k in rec.kinds() if k.startswith("conversation_ended")] == [
            "conversation_ended:closed",
            "conversation_ended:deleted",
        ]
        await rec.aclose()


async def test_shutdown_reflection_is_bounded_by_its_budget(db_path):
    brain = Brain()
    slow = Reply(text="never finished", hold_after=0)  # held until released: never

    def answer(request):
        if (request.system or "").startswith(REFLECTION_PROMPT[:40]):
            return slow
        return brain.answer(request)

    brain.model.default = answer
    policy = BackgroundPolicy(mining=False, reflection_debounce=0, reflect_on_shutdown=0.2)
    worker = MemoryWorker(policy)
    agent = await make_agent(brain, db_path, worker=worker, budget=100_000).start()
    rec = Recorder(agent)
    try:
        conv = await agent.conversation_for_channel("net:#slow")
        await chat(conv, 1, size=0)
        # The model never answers the reflection; shutdown is not held hostage.
        await asyncio.wait_for(agent.wind_down(), 60)
        assert slow.held.is_set()
        await rec.wait(ended("shutdown"))
        assert await agent.memory.list(["channel:net:#slow"]) == []
        # Cut short: the span is not marked reflected, the next shutdown takes it again.
        record = await agent.store.get_conversation(conv.id)
        assert REFLECTED not in record.meta
    finally:
        slow.release.set()
        await rec.aclose()
        await agent.aclose()


async def test_agentik_run_reflects_on_sigterm(miniircd, openai_server, tmp_path):
    """SIGTERM: the bot reflects on the conversation that had turns, then exits."""
    db = tmp_path / "bot.db"
    config = tmp_path / "bot.toml"
    config.write_text(
        f"""
[llm]
base_url = "{openai_server.base_url}"
model = "fake-model"
[storage]
path = "{db}"
[memory]
reflect_after_idle = "2h"
reflect_on_shutdown = "60s"
[transports.local]
type = "irc"
host = "127.0.0.1"
port = {miniircd.port}
tls = false
nick = "agentik"
channels = ["#e2e"]
"""
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "run", "-c", str(config), env=env, stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    alice = None
    try:
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        await alice.join("#e2e")
        await alice.wait_for(lambda m: m.command == "JOIN" and m.nick == "agentik", timeout=60)
        alice.privmsg("#e2e", "agentik: remember that I drink tea")
        await alice.wait_for(lambda m: m.command == "PRIVMSG" and m.nick == "agentik", timeout=60)
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if alice is not None:
            await alice.close()
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT text, author FROM memory_note WHERE author = ?",
            ("agentik:reflection",),
        ).fetchall()
        metas = [m for (m,) in con.execute("SELECT meta FROM conversation")]
    finally:
        con.close()
    (text, _), *more = rows
    assert not more
    # The fake model echoes the transcript it was given: the conversation's words.
    assert "remember that I drink tea" in text
    assert any(REFLECTED in m for m in metas)


async def test_min_turns_skips_a_short_span_and_mines_a_long_one(db_path):
    brain = Brain(facts="- Alice ships on Fridays.")
    policy = BackgroundPolicy(mining_debounce=0, reflection=False, mine_min_turns=3)
    worker = MemoryWorker(policy)
    async with make_agent(brain, db_path, worker=worker, keep=1, budget=100_000) as agent:
        conv = await agent.conversation_for_channel("net:#m")
        await chat(conv, 2, size=0)
        short = await conv.compact_now()
        assert short is not None and short.user_turns == 1
        await asyncio.wait_for(worker.wait_for("mining"), 60)
        assert worker.done[-1][2] == 0 and brain.requests("mining") == []
        await chat(conv, 4, start=2, size=0)
        long = await conv.compact_now()
        assert long is not None and long.user_turns == 4
        await asyncio.wait_for(worker.wait_for("mining", 2), 60)
        assert len(brain.requests("mining")) == 1
        notes = await agent.memory.list(["channel:net:#m"])
        assert [n.text for n in notes] == ["Alice ships on Fridays."]


async def test_announce_line_in_an_irc_channel_once(miniircd, tmp_path):
    brain = Brain(reflection="Alice drinks tea.")
    worker = MemoryWorker(BackgroundPolicy(mining=False, reflection_debounce=0))
    agent = await make_agent(brain, str(tmp_path / "irc.db"), worker=worker, budget=100_000).start()
    bridge = Bridge(agent, announce=True)
    bot = IRCTransport(
        name="testnet",
        settings={"host": "127.0.0.1", "port": miniircd.port, "nick": "agentik", "tls": False,
                  "channels": ["#tea"], "flood_burst": 10, "flood_rate": 200.0},
    )  # fmt: skip
    bridge.attach(bot, ChannelOptions(command_prefix="!"))
    await bot.start(bridge)
    alice = None
    try:
        await joined(bot, "#tea")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        await alice.join("#tea")
        alice.privmsg("#tea", "agentik: I drink tea every morning")
        await alice.wait_for(lambda m: m.nick == "agentik" and "answer to" in m.text)
        alice.privmsg("#tea", "!new")
        line = await alice.wait_for(lambda m: m.nick == "agentik" and "noted" in m.text)
        assert line.params[0] == "#tea"
        assert line.text == "noted 1 reflection — !memory to review"
        # !memory shows it; by then the announcement has had every chance to repeat.
        alice.privmsg("#tea", "!memory")
        listed = await alice.wait_for(
            lambda m: m.nick == "agentik" and "Alice drinks tea" in m.text
        )
        assert listed.text.startswith("#") and "[here]" in listed.text
        await alice.sync()
        assert [m.text for m in alice.received if m.nick == "agentik" and "noted" in m.text] == [
            "noted 1 reflection — !memory to review"
        ]
    finally:
        if alice is not None:
            await alice.close()
        await bot.aclose()
        await bridge.aclose()
        await agent.aclose()


@pytest.fixture
async def chatroom(db_path):
    from agentik.core.access import AccessSettings

    brain = Brain()
    agent = await make_agent(brain, db_path, budget=100_000).start()
    access = AccessPolicy(AccessSettings(admins=("chat:boss",)), {"chat": "fake"})
    bridge = Bridge(agent, access=access)
    fake = FakeTransport(name="chat")
    bridge.attach(fake, ChannelOptions(command_prefix="!", max_answer_lines=2))
    await fake.start(bridge)
    yield agent, bridge, fake
    await fake.aclose()
    await bridge.aclose()
    await agent.aclose()


async def test_memory_lists_and_forget_deletes_with_a_role_check(chatroom):
    agent, bridge, fake = chatroom
    here = f"channel:{fake.key(channel='ops')}"
    mem = agent.memory
    glob = await mem.save("global", "The office closes at six.", author="x")
    chan = await mem.save(here, "Deploys happen on Tuesdays.", author="x")
    elsewhere = await mem.save(f"channel:{fake.key(channel='dev')}", "Dev secret plan.", author="x")
    bobs = await mem.save(user_scope("chat:bob"), "Bob prefers short answers.", author="x")
    carols = await mem.save(user_scope("chat:carol"), "Carol is on call.", author="x")
    # carol speaks here: her notes are visible in this channel (as the model sees them).
    await fake.say("agentik: hello", user="carol", channel="ops")
    await bridge.flush(fake.key(channel="ops"))

    def commands() -> list[str]:
        return fake.texts("command")

    await fake.say("!memory", user="bob", channel="ops")
    lines = commands()
    assert lines[0].startswith("4 memory notes here")
    # Most recent first, capped at two lines; the rest waits for !more.
    assert lines[1:3] == [f"#{carols.id} [chat:carol] Carol is on call.",
                          f"#{bobs.id} [you] Bob prefers short answers."]  # fmt: skip
    assert lines[3] == "… 2 more lines: !more"
    await fake.say("!more", user="bob", channel="ops")
    rest = [m.text for m in fake.sent[-3:]]
    assert f"#{chan.id} [here] Deploys happen on Tuesdays." in rest
    assert f"#{glob.id} [global] The office closes at six." in rest
    assert not any("Dev secret plan" in t for t in fake.texts())

    async def forget(who: str, note: int) -> str:
        await fake.say(f"!forget {note}", user=who, channel="ops")
        return commands()[-1]

    assert await forget("bob", elsewhere.id) == f"no memory note {elsewhere.id} here"
    assert await forget("bob", glob.id) == (
        f"note {glob.id} is a global note: only admins may forget it"
    )
    assert await forget("bob", carols.id) == (
        f"note {carols.id} is someone else's note: only admins may forget it"
    )
    assert await forget("bob", bobs.id) == f"forgot note {bobs.id}"
    assert await forget("bob", chan.id) == f"forgot note {chan.id}"
    assert await forget("boss", glob.id) == f"forgot note {glob.id}"
    assert await forget("boss", carols.id) == f"forgot note {carols.id}"
    assert await forget("bob", 999) == "no memory note 999 here"
    assert await forget("bob", "x") == "usage: !forget N (the note's id, from !memory)"
    # Deleted, not purged: each deletion is a version naming who did it.
    assert await mem.get(glob.id) is None
    assert (await mem.history(glob.id))[-1].author == "chat:boss"
    assert (await mem.history(bobs.id))[-1].author == "chat:bob"
    assert (await mem.get(elsewhere.id)) is not None
    await fake.say("!memory", user="bob", channel="ops")
    assert commands()[-1] == "no memory notes here"


async def test_cli_rm_reflect_reflects_before_deleting(openai_server, tmp_path):
    from agentik.core import Agent, SQLiteStore
    from agentik.core.testing.scripted import ScriptedModel

    db = tmp_path / "cli.db"
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(str(db))) as agent:
        conv = await agent.conversation_for_channel("irc:net:#cli")
        await conv.send("the build server is called hopper", author="alice")
        await conv.wait_idle()
        conv_id = conv.id
    config = tmp_path / "bot.toml"
    config.write_text(
        f'[llm]\nbase_url = "{openai_server.base_url}"\nmodel = "fake-model"\n'
        f'[storage]\npath = "{db}"\n[memory]\nreflection_debounce = 0\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "conversations", "rm", conv_id, "--reflect", "-c", str(config), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == f"deleted {conv_id}"
    con = sqlite3.connect(db)
    try:
        (left,) = con.execute(
            "SELECT count(*) FROM conversation WHERE id = ?", (conv_id,)
        ).fetchone()
        notes = con.execute(
            "SELECT scope, text FROM memory_note WHERE author = 'agentik:reflection'"
        ).fetchall()
    finally:
        con.close()
    assert left == 0
    # The fake model echoes the transcript it was given: read before the rows went.
    ((scope, text),) = notes
    assert scope == "channel:irc:net:#cli" and "the build server is called hopper" in text
