"""Compaction keeps long conversations in the model's context; background
mining and reflection fill long-term memory from it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent, SQLiteStore
from agentik.core.background import (
    MINING_PROMPT,
    REFLECTION_PROMPT,
    BackgroundPolicy,
    MemoryWorker,
)
from agentik.core.compaction import (
    SUMMARY_PREFIX,
    CompactionPolicy,
    _cut_index,
    estimate_tokens,
)
from agentik.core.errors import LLMTimeout
from agentik.core.hookspecs import hookimpl
from agentik.core.llm.base import LLMRequest
from agentik.core.memory.sqlite import SQLiteMemory
from agentik.core.messages import ChatMessage, ToolCall
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.core.tools.base import tool
from agentik.transports.testing import MemoryTransport

SUMMARY = "alice asked about the release; bob decided Friday; open: who writes notes."


class Brain:
    """A scripted model that answers summary, mining and reflection requests by role."""

    def __init__(self, *, summary: Reply | str = SUMMARY, facts: str = "", reflection: str = ""):
        self.summary, self.facts, self.reflection = summary, facts, reflection
        self.model = ScriptedModel(default=self.answer)

    def answer(self, request: LLMRequest) -> Reply | str:
        system = request.system or ""
        if system.startswith("You maintain the memory"):
            return self.summary
        if system.startswith(MINING_PROMPT[:40]):
            return self.facts or "NONE"
        if system.startswith(REFLECTION_PROMPT[:40]):
            return self.reflection or "NONE"
        last = next(m.content for m in reversed(request.messages) if m.role == "user")
        return f"answer to {last}"

    def requests(self, kind: str) -> list[LLMRequest]:
        prefix = {
            "summary": "You maintain the memory",
            "mining": MINING_PROMPT[:40],
            "reflection": REFLECTION_PROMPT[:40],
        }
        if kind == "turn":
            return [
                r
                for r in self.model.requests
                if not any((r.system or "").startswith(p) for p in prefix.values())
            ]
        return [r for r in self.model.requests if (r.system or "").startswith(prefix[kind])]


def make_agent(brain, path, *, budget=400, keep=2, worker=None, **kw):
    store = SQLiteStore(path)
    return Agent(
        llm=brain.model,
        store=store,
        memory=SQLiteMemory(store),
        system_prompt="You are terse.",
        compaction=CompactionPolicy(context_tokens=budget, trigger=0.8, keep_turns=keep),
        background=[worker] if worker else (),
        **kw,
    )


async def chat(conv, n, *, start=0, size=200):
    for i in range(start, start + n):
        await conv.send(f"question {i} " + "x" * size, author="alice", author_id="net:alice")
        await conv.wait_idle()


def test_estimate_counts_text_messages_and_tools():
    msgs = [ChatMessage(role="user", content="a" * 400), ChatMessage(role="assistant", content="")]
    assert estimate_tokens(msgs) == 100 + 8
    assert estimate_tokens(msgs, system="s" * 40) == 110 + 8
    calls = ChatMessage(
        role="assistant", tool_calls=(ToolCall(id="1", name="add", arguments='{"a":1}'),)
    )
    assert estimate_tokens([calls]) > estimate_tokens([ChatMessage(role="assistant")])


def test_cut_falls_only_on_turn_starts():
    m = [
        ChatMessage(role="system", content="old summary"),
        ChatMessage(role="user", content="note"),
        ChatMessage(role="user", content="q1"),
        ChatMessage(role="assistant", tool_calls=(ToolCall(id="1", name="t"),)),
        ChatMessage(role="tool", content="r", tool_call_id="1"),
        ChatMessage(role="assistant", content="a1"),
        ChatMessage(role="user", content="q2"),
        ChatMessage(role="assistant", content="a2"),
        ChatMessage(role="user", content="q3"),
    ]
    assert _cut_index(m, 2) == 6
    assert _cut_index(m, 3) == 0  # only three turns: nothing to compact
    assert _cut_index(m, 1) == 8


async def test_compaction_triggers_at_the_budget_and_keeps_the_audit_log(db_path):
    brain = Brain()
    async with make_agent(brain, db_path) as agent:
        conv = await agent.create_conversation(title="long")
        events = conv.events(kinds={"compacted"})
        await chat(conv, 6)
        event = await asyncio.wait_for(anext(events), 60)
        assert event.reason == "budget" and not event.fallback
        assert event.tokens_after < event.tokens_before
        assert event.summary == SUMMARY_PREFIX + SUMMARY
        # The summariser got a transcript with the speakers' names.
        summary_request = brain.requests("summary")[0]
        assert "alice: question 0" in summary_request.messages[0].content
        assert summary_request.tools == ()
        # The next turn carries the summary first, then the recent turns verbatim.
        await chat(conv, 1, start=6)
        last = brain.requests("turn")[-1]
        assert last.messages[0].role == "system"
        assert last.messages[0].content.startswith(SUMMARY_PREFIX)
        users = [m.content for m in last.messages if m.role == "user"]
        assert users[-1].startswith("question 6") and len(users) <= 2
        assert estimate_tokens(last.messages, last.system) <= 400
        # The audit log still has every message.
        log = await conv.messages(limit=1000)
        assert [m.content.split(" ")[1] for m in log if m.kind == "user"] == [
            str(i) for i in range(7)
        ]
        assert len(log) == 14


async def test_a_short_conversation_is_never_compacted(db_path):
    brain = Brain()
    async with make_agent(brain, db_path, budget=100_000) as agent:
        conv = await agent.create_conversation()
        await chat(conv, 5)
        assert brain.requests("summary") == []
        assert await conv.compact_now() is not None  # forced works even under budget
        assert brain.requests("summary")


async def test_tool_calls_stay_paired_with_their_results(db_path):
    brain = Brain()

    @tool
    async def lookup(q: str) -> str:
        """Look up."""
        return "result " + q

    async with make_agent(brain, db_path, keep=1, tools=[lookup]) as agent:
        conv = await agent.create_conversation()
        for i in range(4):
            brain.model.enqueue(Reply(tool_calls=[call("lookup", {"q": str(i)})]), f"done {i}")
            await conv.send(f"look {i} " + "y" * 300)
            await conv.wait_idle()
        memory = await conv.working_memory()
        ids = {c.id for m in memory for c in m.tool_calls}
        results = {m.tool_call_id for m in memory if m.role == "tool"}
        assert ids == results  # no call without result, no orphan result
        assert brain.requests("summary")


async def test_failed_summary_drops_the_oldest_turns_and_the_turn_still_runs(db_path, caplog):
    brain = Brain(summary=Reply(text="partial summary", fail_after=1, error=LLMTimeout("slow")))
    caplog.set_level(logging.WARNING, logger="agentik.core.compaction")
    async with make_agent(brain, db_path) as agent:
        conv = await agent.create_conversation()
        events = conv.events(kinds={"compacted", "turn_ended"})
        await chat(conv, 6)
        seen = []
        while not any(e.kind == "compacted" for e in seen):
            seen.append(await asyncio.wait_for(anext(events), 60))
        compacted = next(e for e in seen if e.kind == "compacted")
        assert compacted.fallback
        memory = await conv.working_memory()
        assert "were dropped to fit the model's context" in memory[0].content
        assert "dropping them from the context instead" in caplog.text
        # Every turn got its answer.
        answers = [m for m in await conv.messages(limit=100) if m.kind == "assistant"]
        assert len(answers) == 6 and all(a.status == "complete" for a in answers)


class Recorder:
    """A plugin implementing before_compact (async, to prove async hooks are awaited)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, list[str], str]] = []

    @hookimpl
    async def before_compact(self, conversation, messages, reason):
        await asyncio.sleep(0)
        self.seen.append((conversation.id, [m.content for m in messages], reason))


class Broken:
    @hookimpl
    def before_compact(self, conversation, messages):
        raise RuntimeError("plugin bug")


async def test_before_compact_hook_sees_the_messages_first(db_path, caplog):
    brain = Brain()
    recorder = Recorder()
    async with make_agent(brain, db_path, budget=100_000, hooks=[recorder, Broken()]) as agent:
        conv = await agent.create_conversation()
        await chat(conv, 4)
        event = await conv.compact_now()
    assert event.reason == "forced"
    (conv_id, contents, reason), *_ = recorder.seen
    assert conv_id == conv.id and reason == "forced"
    assert contents[0].startswith("question 0") and len(contents) == event.messages
    assert "failed in hook before_compact" in caplog.text  # logged, compaction went on


async def test_compacted_working_memory_survives_a_restart(db_path):
    brain = Brain()
    async with make_agent(brain, db_path) as agent:
        conv = await agent.conversation_for_channel("net:#long")
        await chat(conv, 6)
        before = await conv.working_memory()
        assert before[0].content.startswith(SUMMARY_PREFIX)
    brain2 = Brain()
    async with make_agent(brain2, db_path) as agent:
        conv = await agent.conversation_for_channel("net:#long")
        assert await conv.working_memory() == before
        await chat(conv, 1, start=6)
        first = brain2.requests("turn")[0]
        assert first.messages[0].content.startswith(SUMMARY_PREFIX)
        assert await conv.count_messages() == 14


async def test_mining_writes_durable_facts_after_a_compaction(db_path):
    brain = Brain(facts="- The release is on Friday.\n- Bob writes the release notes.\n")
    worker = MemoryWorker(BackgroundPolicy(mining_debounce=0, reflection=False))
    async with make_agent(brain, db_path, worker=worker) as agent:
        conv = await agent.conversation_for_channel("net:#rel")
        await chat(conv, 6)
        await asyncio.wait_for(worker.wait_for("mining"), 60)
        notes = await agent.memory.list(["channel:net:#rel"])
        assert sorted(n.text for n in notes) == [
            "Bob writes the release notes.",
            "The release is on Friday.",
        ]
        assert {n.author for n in notes} == {"agentik:mining"}
        assert SUMMARY in brain.requests("mining")[0].messages[0].content
        # Mining the same facts again adds nothing.
        await conv.compact_now()
        await asyncio.wait_for(worker.wait_for("mining", 2), 60)
        assert len(await agent.memory.list(["channel:net:#rel"])) == 2


async def test_mining_failure_is_logged_not_raised(db_path, caplog):
    brain = Brain()
    brain.facts = ""

    def fail(request):
        if (request.system or "").startswith(MINING_PROMPT[:40]):
            return Reply(text="x y", fail_after=0)
        return brain.answer(request)

    brain.model.default = fail
    worker = MemoryWorker(BackgroundPolicy(mining_debounce=0, reflection=False))
    async with make_agent(brain, db_path, worker=worker) as agent:
        conv = await agent.create_conversation()
        await chat(conv, 6)
        await asyncio.wait_for(worker.wait_for("mining"), 60)
        assert worker.done[-1][2] == -1
        assert "background mining" in caplog.text and "failed" in caplog.text
        await chat(conv, 1, start=6)  # the agent carries on
        assert (await conv.messages(limit=2))[-1].content == "answer to question 6 " + "x" * 200


class ManualClock:
    """A debounce clock the test advances: timers fire when told, never by themselves."""

    def __init__(self) -> None:
        self.timers: list[asyncio.Future[None]] = []
        self.changed = asyncio.Condition()

    async def sleep(self, delay: float) -> None:
        timer = asyncio.get_running_loop().create_future()
        async with self.changed:
            self.timers.append(timer)
            self.changed.notify_all()
        await timer

    def pending(self) -> list[asyncio.Future[None]]:
        return [t for t in self.timers if not t.done()]

    def fire(self) -> None:
        for timer in self.pending():
            timer.set_result(None)


async def test_debounce_coalesces_bursts(db_path):
    brain = Brain(facts="- fact one")
    clock = ManualClock()
    # A long debounce on a clock the test controls: however slowly the three
    # compactions arrive, they fall within one debounce period.
    # No idle end (it mines too, and its timer would sleep on the same clock).
    policy = BackgroundPolicy(mining_debounce=30, reflection=False, reflect_after_idle=0)
    worker = MemoryWorker(policy, sleep=clock.sleep)
    # A large budget: exactly the three forced compactions below, none automatic.
    async with make_agent(brain, db_path, worker=worker, keep=1, budget=100_000) as agent:
        conv = await agent.create_conversation()
        compactions = []
        for i in range(3):
            await chat(conv, 2, start=2 * i, size=0)
            compactions.append(await conv.compact_now())
        assert all(c is not None and not c.fallback for c in compactions)
        async with asyncio.timeout(60):
            async with clock.changed:  # each compaction started a debounce timer
                await clock.changed.wait_for(lambda: len(clock.timers) == 3)
        # Each newer one cancelled the one before: one timer is left running.
        assert len(clock.pending()) == 1 and brain.requests("mining") == []
        clock.fire()
        await asyncio.wait_for(worker.wait_for("mining"), 60)
        assert len(brain.requests("mining")) == 1
        assert clock.pending() == [] and [d[0] for d in worker.done] == ["mining"]


@pytest.fixture
async def bot(db_path):
    brain = Brain(reflection="Alice planned the release; open: notes.")
    worker = MemoryWorker(BackgroundPolicy(mining=False, reflection_debounce=0))
    agent = make_agent(brain, db_path, worker=worker, budget=100_000)
    await agent.start()
    bridge = Bridge(agent)
    t = MemoryTransport(name="net")
    bridge.attach(t, ChannelOptions(command_prefix="!", answer="all"))
    await t.start(bridge)
    yield brain, worker, agent, bridge, t
    await bridge.aclose()
    await agent.aclose()


async def test_new_writes_a_reflection_into_the_channel_memory(bot):
    brain, worker, agent, bridge, t = bot
    await t.inject("let's plan the release", channel_key="net:#a", author="alice")
    await bridge.flush("net:#a")
    await t.inject("!new", channel_key="net:#a", author="alice")
    await asyncio.wait_for(worker.wait_for("reflection"), 60)
    notes = await agent.memory.list(["channel:net:#a"])
    assert len(notes) == 1 and "Alice planned the release" in notes[0].text
    assert notes[0].author == "agentik:reflection"
    assert "alice: let's plan the release" in brain.requests("reflection")[0].messages[0].content
    # An empty conversation is not reflected on.
    await t.inject("!new", channel_key="net:#a", author="alice")
    await asyncio.wait_for(worker.wait_for("reflection", 2), 60)
    assert worker.done[-1][2] == 0


async def test_compact_command_reports_what_it_did(bot):
    brain, worker, agent, bridge, t = bot
    await t.inject("!compact", channel_key="net:#c", author="alice")
    assert t.texts("command")[-1] == "nothing to compact yet: the conversation is short"
    for i in range(6):
        await t.inject(f"message {i}", channel_key="net:#c", author="alice")
    await bridge.flush("net:#c")
    await t.inject("!compact", channel_key="net:#c", author="alice")
    reply = t.texts("command")[-1]
    assert reply.startswith("compacted: 8 older messages summarised; context about")


CHILD = """
import asyncio, sys
from agentik.core import Agent, SQLiteStore
from agentik.core.compaction import CompactionPolicy
from agentik.core.memory.sqlite import SQLiteMemory
from agentik.core.testing.scripted import Reply, ScriptedModel, call

def answer(request):
    if (request.system or "").startswith("You maintain the memory"):
        return "SUMMARY: alice counts to six."
    return "ok"

async def main(db):
    model = ScriptedModel(default=answer)
    model.enqueue(Reply(tool_calls=[call("memory_save", {"text": "alice counts in French"})]))
    store = SQLiteStore(db)
    agent = Agent(llm=model, store=store, memory=SQLiteMemory(store),
                  compaction=CompactionPolicy(context_tokens=400, keep_turns=2))
    async with agent:
        conv = await agent.conversation_for_channel("net:#count")
        events = conv.events(kinds={"compacted"})
        for i in range(6):
            await conv.send(f"count {i} " + "z" * 200, author_id="net:alice")
            await conv.wait_idle()
        await anext(events)
        print("READY", flush=True)
        await asyncio.sleep(60)

asyncio.run(main(sys.argv[1]))
"""


async def test_a_killed_process_keeps_memory_and_compacted_context(db_path):
    import signal
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, db_path, stdout=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(60):
            line = await proc.stdout.readline()
        assert line.strip() == b"READY"
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    brain = Brain()
    async with make_agent(brain, db_path, budget=100_000) as agent:
        notes = await agent.memory.list()
        assert [(n.scope, n.text) for n in notes] == [
            ("channel:net:#count", "alice counts in French")
        ]
        conv = await agent.conversation_for_channel("net:#count")
        memory = await conv.working_memory()
        assert memory[0].content == SUMMARY_PREFIX + "SUMMARY: alice counts to six."
        assert await conv.count_messages() == 14  # 6 questions, 6 answers, a call, a result
        await chat(conv, 1, start=6)
        assert brain.requests("turn")[0].messages[0].content.startswith(SUMMARY_PREFIX)


async def test_the_worker_keeps_the_latest_finished_jobs_not_every_one(db_path):
    # A bot mines and reflects on every conversation it has: its list of finished
    # jobs grew by one entry each for as long as it ran (the soak benchmark).
    brain = Brain(facts="- Alice ships on Fridays.")
    policy = BackgroundPolicy(mining_debounce=0, reflection=False)
    worker = MemoryWorker(policy, keep_done=2)
    async with make_agent(brain, db_path, worker=worker, keep=1, budget=100_000) as agent:
        conv = await agent.conversation_for_channel("net:#k")
        for n in range(1, 4):
            await chat(conv, 2, start=2 * n, size=0)
            assert await conv.compact_now() is not None
            await asyncio.wait_for(worker.wait_for("mining", n), 60)
        assert [kind for kind, _, _ in worker.done] == ["mining", "mining"]
        assert worker.finished["mining"] == 3


# -- compact_context: the model asks (issue 35) -------------------------------------------------
class Asker(Brain):
    """A Brain whose model calls ``compact_context`` when a message says "compact"."""

    def answer(self, request: LLMRequest) -> Reply | str:
        system = request.system or ""
        if system.startswith("You maintain the memory"):
            return self.summary
        last = request.messages[-1]
        if last.role == "user" and "compact" in last.content:
            return Reply(tool_calls=[call("compact_context", {})])
        if last.role == "tool":
            return f"compaction: {last.content}"
        return f"answer to {last.content}"


def tool_policy(**kw):
    # A budget so large that compaction never starts by itself.
    return CompactionPolicy(context_tokens=100_000, keep_turns=1, tool=True, **kw)


async def test_the_model_compacts_its_context_with_the_tool_within_the_policy(db_path):
    brain = Asker()
    store = SQLiteStore(db_path)
    agent = Agent(llm=brain.model, store=store, compaction=tool_policy(tool_min_tokens=100))
    async with agent:
        conv = await agent.create_conversation()
        compacted = conv.events(kinds={"compacted"})
        await chat(conv, 4)
        await conv.send("please compact now", author="alice")
        await conv.wait_idle()
        event = await asyncio.wait_for(anext(compacted), 60)
        assert (event.reason, event.fallback) == ("tool", False)
        assert event.messages >= 8 and event.tokens_after < event.tokens_before
        # The model was told, and its next request starts from the summary.
        turns = brain.requests("turn")
        tool_result = [m for m in turns[-1].messages if m.role == "tool"][-1]
        assert tool_result.content.startswith("compacting:")
        await conv.send("and now?", author="alice")
        await conv.wait_idle()
        last = brain.requests("turn")[-1]
        assert last.messages[0].role == "system"
        assert last.messages[0].content.startswith(SUMMARY_PREFIX)
        assert not any(m.content.startswith("question 0") for m in last.messages)
        # Asked again at once: the interval refuses it, the model hears why.
        await conv.send("compact again", author="alice")
        await conv.wait_idle()
        refused = [m for m in brain.requests("turn")[-1].messages if m.role == "tool"][-1]
        assert refused.is_error
        assert "not compacted: it was compacted" in refused.content
        assert len(brain.requests("summary")) == 1
        # The audit log keeps everything.
        log = await conv.messages(limit=1000)
        assert next(m.content for m in log if m.kind == "user").startswith("question 0")


async def test_compact_context_is_off_by_default_and_refuses_a_small_context(db_path):
    brain = Asker()
    async with Agent(llm=brain.model, store=SQLiteStore(db_path)) as agent:
        conv = await agent.create_conversation()
        await conv.send("hello", author="alice")
        await conv.wait_idle()
        assert "compact_context" not in [t.name for t in brain.model.requests[-1].tools]
    brain = Asker()
    agent = Agent(llm=brain.model, store=SQLiteStore(db_path), compaction=tool_policy())
    async with agent:
        conv = await agent.create_conversation()
        await conv.send("compact please", author="alice")
        await conv.wait_idle()
        [result] = [m for m in brain.requests("turn")[-1].messages if m.role == "tool"]
        assert result.is_error
        assert "under the 2000 the policy compacts at the earliest" in result.content
        assert brain.requests("summary") == []
