"""Mining when a conversation ends (not only after a compaction), the memory jobs'
interval fallback, and ``Agent.aclose()`` publishing the ends of its conversations:
a real SQLite file, the scripted model answering by role."""

from __future__ import annotations

import asyncio

from test_compaction import Brain, chat, make_agent
from test_reflection import Recorder, ended, transcript

from agentik.core.background import MINED, REFLECTED, BackgroundPolicy, MemoryWorker
from agentik.core.store.sqlite import SQLiteStore


async def test_closing_a_conversation_mines_its_uncompacted_turns_once(db_path):
    """Before: a conversation closed before its context filled was never mined."""
    brain = Brain(facts="- Alice deploys on Tuesdays.", reflection="Alice talked deploys.")
    worker = MemoryWorker(BackgroundPolicy(reflection_debounce=0, mining_debounce=0))
    async with make_agent(brain, db_path, worker=worker, budget=100_000) as agent:
        conv = await agent.create_conversation(title="deploys")
        await chat(conv, 2, size=0)
        assert brain.requests("summary") == []  # nothing was ever compacted
        await conv.aclose()
        await asyncio.wait_for(worker.wait_for("mining"), 60)
        await asyncio.wait_for(worker.wait_for("reflection"), 60)
        (request,) = brain.requests("mining")
        assert "question 0" in transcript(request) and "question 1" in transcript(request)
        scope = f"channel:conversation:{conv.id}"
        texts = sorted(n.text for n in await agent.memory.list([scope]))
        assert "Alice deploys on Tuesdays." in texts and len(texts) == 2
        fact = next(n for n in await agent.memory.list([scope]) if n.author == "agentik:mining")
        assert fact.text == "Alice deploys on Tuesdays."
        record = await agent.store.get_conversation(conv.id)
        assert record.meta[MINED] == record.meta[REFLECTED] > 0

        # Opened again, one more turn, closed again: only the new turn is mined.
        again = await agent.get_conversation(conv.id)
        await chat(again, 1, start=2, size=0)
        await again.aclose()
        await asyncio.wait_for(worker.wait_for("mining", 2), 60)
        second = transcript(brain.requests("mining")[1])
        assert "question 2" in second and "question 0" not in second
        # The same fact again is not saved twice.
        facts = [n for n in await agent.memory.list([scope]) if n.author == "agentik:mining"]
        assert len(facts) == 1


async def test_a_mined_line_that_quotes_a_known_note_is_not_saved_again(db_path):
    """A model that mines the memory tools' or recall's way of showing a note
    (``#12 [scope] text``) names a note already kept: it is not saved a second time
    with the reference in front; a new fact beside it is."""
    brain = Brain(facts="")
    worker = MemoryWorker(BackgroundPolicy(reflection=False, mining_debounce=0))
    async with make_agent(brain, db_path, worker=worker, budget=100_000) as agent:
        conv = await agent.create_conversation(title="deploys")
        scope = f"channel:conversation:{conv.id}"
        known = await agent.memory.save(scope, "Alice deploys on Tuesdays.", author="alice")
        brain.facts = f"- #{known.id} [{scope}] Alice deploys on Tuesdays.\n- Bob owns the build."
        await chat(conv, 1, size=0)
        await conv.aclose()
        await asyncio.wait_for(worker.wait_for("mining"), 60)
        texts = sorted(n.text for n in await agent.memory.list([scope]))
        assert texts == ["Alice deploys on Tuesdays.", "Bob owns the build."]


async def test_reset_and_idle_mine_and_a_summary_is_not_mined_again(db_path):
    """``!new`` (a channel's reset) and idleness end conversations: both mine.  After a
    compaction, the end mines the turns after the summary, not the summary again."""
    brain = Brain(facts="- Bob owns the build.")
    policy = BackgroundPolicy(
        reflection=False, mining_debounce=0, reflect_after_idle=0.05, reflection_debounce=0
    )
    worker = MemoryWorker(policy)
    async with make_agent(brain, db_path, worker=worker, keep=1, budget=100_000) as agent:
        rec = Recorder(agent)
        conv = await agent.conversation_for_channel("net:#b")
        await chat(conv, 3, size=0)
        assert await conv.compact_now() is not None
        await asyncio.wait_for(worker.wait_for("mining"), 60)  # the summary's
        await rec.wait(ended("idle"))
        await asyncio.wait_for(worker.wait_for("mining", 2), 60)  # the end's
        at_end = transcript(brain.requests("mining")[1])
        assert "question 2" in at_end and "earlier summary" not in at_end
        assert "question 0" not in at_end

        await chat(conv, 1, start=3, size=0)
        await agent.new_conversation_for_channel("net:#b")
        await rec.wait(ended("reset"))
        await asyncio.wait_for(worker.wait_for("mining", 3), 60)
        at_reset = transcript(brain.requests("mining")[2])
        assert "question 3" in at_reset and "question 2" not in at_reset
        notes = await agent.memory.list(["channel:net:#b"])
        assert [n.text for n in notes] == ["Bob owns the build."]
        await rec.aclose()


async def test_the_interval_covers_a_conversation_that_never_goes_idle(db_path):
    """``jobs_interval``: a busy conversation is reflected on and mined without
    ending (no ``conversation_ended``), each time only what is new; a firing with
    nothing new asks the model nothing."""
    brain = Brain(facts="- Carol reviews on Mondays.", reflection="Carol is reviewing.")
    policy = BackgroundPolicy(
        mining_debounce=0, reflection_debounce=0, reflect_after_idle=0, jobs_interval=0.2
    )
    worker = MemoryWorker(policy)
    async with make_agent(brain, db_path, worker=worker, budget=100_000) as agent:
        rec = Recorder(agent)
        conv = await agent.conversation_for_channel("net:#busy")
        await chat(conv, 1, size=0)
        await asyncio.wait_for(worker.wait_for("mining"), 60)
        await asyncio.wait_for(worker.wait_for("reflection"), 60)
        await chat(conv, 1, start=1, size=0)
        await asyncio.wait_for(worker.wait_for("mining", 2), 60)
        await asyncio.wait_for(worker.wait_for("reflection", 2), 60)
        second = transcript(brain.requests("reflection")[1])
        assert "question 1" in second and "question 0" not in second
        assert "question 1" in transcript(brain.requests("mining")[1])
        # Quiet now: later firings find nothing new and ask nothing.
        runs = worker.interval_runs
        async with asyncio.timeout(60), worker.changed:
            await worker.changed.wait_for(lambda: worker.interval_runs >= runs + 2)
        assert len(brain.requests("mining")) == len(brain.requests("reflection")) == 2
        assert not any(e.kind == "conversation_ended" for e in rec.events)
        await rec.aclose()


async def test_two_workers_on_one_database_run_an_interval_job_once(db_path):
    """Two agents sharing the database, both having seen the same span (the second
    opened the conversation after the first's turns): its jobs run on one."""
    brains = [Brain(facts="- Dan likes rust.", reflection="Dan talked.") for _ in range(2)]
    policy = BackgroundPolicy(mining_debounce=0, reflection_debounce=0, reflect_after_idle=0)
    workers = [MemoryWorker(policy), MemoryWorker(policy)]
    first = await make_agent(brains[0], db_path, worker=workers[0], budget=100_000).start()
    second = await make_agent(brains[1], db_path, worker=workers[1], budget=100_000).start()
    try:
        conv = await first.conversation_for_channel("net:#two")
        await chat(conv, 1, size=0)
        other = await second.conversation_for_channel("net:#two")
        assert other.id == conv.id
        started = await asyncio.gather(
            workers[0].run_interval(first), workers[1].run_interval(second, [conv.id])
        )
        assert started == [2, 2]  # both captured the span ...
        for w in workers:
            await asyncio.wait_for(w.wait_for("mining"), 60)
            await asyncio.wait_for(w.wait_for("reflection"), 60)
        asked = [len(b.requests(k)) for b in brains for k in ("mining", "reflection")]
        assert sum(asked) == 2  # ... and one of them ran each job
        notes = await first.memory.list(["channel:net:#two"])
        assert sorted(n.author for n in notes) == ["agentik:mining", "agentik:reflection"]
    finally:
        await second.aclose()
        await first.aclose()


async def test_agent_aclose_publishes_each_open_conversation_end_once(db_path):
    """``Agent.aclose()`` (a library user's, without a bot's wind-down): every
    conversation open in memory publishes ``conversation_ended`` (``shutdown``) on
    the agent's stream and its own before they end, once, and after it reflected
    and mined; one closed before keeps its ``closed`` end only.  Profiles filter
    the event like any other."""
    brain = Brain(facts="- Erin tests on staging.", reflection="Erin tested.")
    worker = MemoryWorker(BackgroundPolicy(mining_debounce=0, reflection_debounce=0))
    agent = await make_agent(brain, db_path, worker=worker, budget=100_000).start()
    lifecycle = agent.events(kinds={"conversation_ended"})
    quiet = agent.events(kinds={"turn_ended"})
    a = await agent.conversation_for_channel("net:#a")
    b = await agent.create_conversation(title="b")
    c = await agent.create_conversation(title="c")
    await chat(a, 1, size=0)
    await chat(c, 1, size=0)
    own = a.events(after=0)
    await c.aclose()
    await agent.aclose()
    ends = [(e.conversation_id, e.reason) async for e in lifecycle]
    assert sorted(ends) == sorted([(c.id, "closed"), (a.id, "shutdown"), (b.id, "shutdown")])
    assert [e.kind async for e in quiet] == ["turn_ended", "turn_ended"]
    seen = [e async for e in own]
    assert [(e.reason, e.channel_key) for e in seen if e.kind == "conversation_ended"] == [
        ("shutdown", "net:#a")
    ]
    # The end at shutdown reflected on and mined a's turn (c's close did c's).
    assert worker.finished["reflection"] >= 2 and worker.finished["mining"] >= 2
    store = SQLiteStore(db_path)
    async with store:
        record = await store.get_conversation(a.id)
    assert record.meta[REFLECTED] == record.meta[MINED] > 0
