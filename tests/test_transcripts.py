"""What idle conversations keep in memory: transcripts and timers.

An idle conversation past the ``transcript_cache`` bound drops its transcript
(the working-memory cache); its next turn loads it from the store, and the
model gets the same request as if it had never been dropped.  Idle
conversations waiting for their idle reflection share one timer.
"""

from __future__ import annotations

import asyncio
import dataclasses

from test_compaction import Brain, make_agent

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent
from agentik.core.background import BackgroundPolicy, MemoryWorker
from agentik.core.messages import ChatMessage
from agentik.core.store.sqlite import SQLiteStore
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.core.tools.base import tool
from agentik.transports.testing import MemoryTransport
from helpers import release_idle_channels


@tool(parameters={"type": "object", "properties": {"city": {"type": "string"}}})
async def forecast(city: str) -> str:
    """The weather in ``city``."""
    return f"sunny in {city}"


def _seen(messages: list[ChatMessage]) -> list[ChatMessage]:
    # What reaches the model (the audit-log id of an entry is the store's business).
    return [dataclasses.replace(m, message_id=None) for m in messages]


async def _requests(db_path: str, transcript_cache: int) -> tuple[list[list[ChatMessage]], int]:
    """Two channels' turns (a tool call, an ambient note, several speakers), with
    one channel going idle behind the other between its turns."""
    model = ScriptedModel()
    model.enqueue(
        Reply(text="Let me look.", tool_calls=[call("forecast", {"city": "Oslo"}, id="c1")]),
        "It is sunny in Oslo.",
        "hello bob",
        "Still sunny tomorrow.",
    )
    async with Agent(
        llm=model, store=SQLiteStore(db_path), tools=[forecast], transcript_cache=transcript_cache
    ) as agent:
        room = await agent.conversation_for_channel("irc:net:#room")
        other = await agent.conversation_for_channel("irc:net:#other")
        await room.send("weather in Oslo?", author="alice", author_id="net:alice")
        await room.wait_idle()
        await other.send("hi", author="bob", author_id="net:bob")
        await other.wait_idle()
        await room.note("it rained yesterday", author="carol")
        await room.send("and tomorrow?", author="alice", author_id="net:alice")
        await room.wait_idle()
        cached = agent.cached_transcripts
    return [_seen(list(r.messages)) for r in model.requests], cached


async def test_a_dropped_transcript_gives_the_model_the_same_request(tmp_path):
    kept, cached = await _requests(str(tmp_path / "kept.db"), 64)
    assert cached == 2  # both channels keep theirs
    dropped, cached = await _requests(str(tmp_path / "dropped.db"), 0)
    assert cached == 0  # nobody keeps one: every turn reads the store
    assert dropped == kept
    last = kept[-1]
    assert [(m.role, m.content) for m in last] == [
        ("user", "weather in Oslo?"),
        ("assistant", "Let me look."),
        ("tool", "sunny in Oslo"),
        ("assistant", "It is sunny in Oslo."),
        ("user", "it rained yesterday"),
        ("user", "and tomorrow?"),
    ]


async def test_idle_conversations_keep_at_most_transcript_cache_transcripts(db_path):
    model = ScriptedModel()
    async with Agent(llm=model, store=SQLiteStore(db_path), transcript_cache=2) as agent:
        convs = [await agent.conversation_for_channel(f"irc:net:#c{i}") for i in range(5)]
        for i, conv in enumerate(convs):
            await conv.send(f"question {i}")
            await conv.wait_idle()
        # The two most recently active keep theirs; the others dropped them ...
        assert agent.cached_transcripts == 2
        # ... and a dropped one's next turn has its whole context, read back.
        await convs[0].send("again")
        await convs[0].wait_idle()
        assert [m.content for m in model.requests[-1].messages] == [
            "question 0",
            "echo: question 0",
            "again",
        ]
        assert agent.cached_transcripts == 2


async def test_idle_reflection_timers_are_one_task_however_many_conversations(db_path):
    # Every conversation with a turn waits reflect_after_idle to be reflected on:
    # one timer serves them all (a task each would cost every one of them).
    brain = Brain(reflection="Alice asked.")
    policy = BackgroundPolicy(mining=False, reflection_debounce=0, reflect_after_idle=3600)
    worker = MemoryWorker(policy)
    async with make_agent(brain, db_path, worker=worker, budget=100_000) as agent:
        for i in range(20):
            conv = await agent.conversation_for_channel(f"net:#c{i}")
            await conv.send(f"hello {i}", author="alice")
            await conv.wait_idle()
        timers = [t for t in asyncio.all_tasks() if t.get_name() == "agentik-reflect-idle"]
        assert len(timers) == 1


async def test_a_shortened_reflect_after_idle_applies_to_the_next_idle_conversation(db_path):
    brain = Brain(reflection="Alice asked.")
    policy = BackgroundPolicy(mining=False, reflection_debounce=0, reflect_after_idle=3600)
    worker = MemoryWorker(policy)
    async with make_agent(brain, db_path, worker=worker, budget=100_000) as agent:
        ended: list[str] = []

        async def listener(conv, reason, key):
            ended.append(f"{key}:{reason}")

        agent.end_listeners.append(listener)
        slow = await agent.conversation_for_channel("net:#slow")
        await slow.send("hello", author="alice")
        await slow.wait_idle()
        # The timer sleeps towards the slow one's hour; a shorter setting wakes it.
        worker.policy = dataclasses.replace(policy, reflect_after_idle=0.01)
        quick = await agent.conversation_for_channel("net:#quick")
        await quick.send("hello", author="alice")
        await quick.wait_idle()
        await asyncio.wait_for(worker.wait_for("reflection"), 60)
        assert ended == ["net:#quick:idle"]


async def test_released_channels_hold_no_conversation_transcript_or_events(db_path):
    # What an operator sees as agentik_loaded_conversations: a channel left idle
    # is released, and with it its conversation, transcript and replay buffer.
    model = ScriptedModel()
    async with Agent(llm=model, store=SQLiteStore(db_path)) as agent:
        # Idle for an hour first: nothing is released while the channels fill up,
        # however slow the machine.
        bridge = Bridge(agent, idle_seconds=3600)
        t = MemoryTransport(name="mem")
        bridge.attach(t, ChannelOptions(answer="all"))
        await t.start(bridge)
        for i in range(20):
            await t.inject(f"hello {i}", channel_key=f"mem:#c{i}", author="alice")
        for i in range(20):
            await bridge.flush(f"mem:#c{i}")
        assert agent.cached_transcripts == 20 and agent.services.buffered > 0
        # Then a short idle time: all of them are released.
        await release_idle_channels(bridge, t, "mem:#c20")
        await asyncio.sleep(0)  # dropped replay buffers are taken out on the event loop
        assert bridge.released_channels == 21
        assert len(agent.services.open) == 0
        assert agent.cached_transcripts == 0
        assert agent.services.buffered == 0
        # The next message reloads its conversation, whole.
        await t.inject("again", channel_key="mem:#c3", author="alice")
        await bridge.flush("mem:#c3")
        assert [m.content for m in model.requests[-1].messages] == [
            "hello 3",
            "echo: hello 3",
            "again",
        ]
        await bridge.aclose()
