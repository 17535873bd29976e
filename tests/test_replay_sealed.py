"""A conversation between turns keeps its replay buffer packed (sealed).

A reconnecting subscriber (``events(after=seq)``, SSE ``Last-Event-ID``) gets
exactly what a live one got — same events, same numbers — whether the turns it
missed are still running or long finished; an idle conversation just holds them
in about a third of the memory (no event objects, no deque).
"""

from __future__ import annotations

import asyncio
import gc

from agentik.core import Agent
from agentik.core.events import EventBase, EventsLost, TextDelta
from agentik.core.services import event_weight
from agentik.core.store.sqlite import SQLiteStore
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.core.tools.base import tool


@tool(parameters={"type": "object", "properties": {"city": {"type": "string"}}})
async def forecast(city: str) -> str:
    """The weather in ``city``."""
    return f"sunny in {city}"


async def _take(sub, n: int) -> list:
    out = []
    async with asyncio.timeout(60):
        async for e in sub:
            out.append(e)
            if len(out) == n:
                break
    await sub.aclose()
    return out


async def _until_last(sub, agent) -> list:
    """The agent-wide replay (the buffer's own event objects), up to the last event."""
    out = []
    async with asyncio.timeout(60):
        async for e in sub:
            out.append(e)
            if e.stream_seq >= agent.services.last_stream_seq and not isinstance(e, EventsLost):
                break
    await sub.aclose()
    return out


async def test_a_reconnecting_subscriber_gets_what_a_live_one_got_after_the_turns_ended(db_path):
    model = ScriptedModel()
    model.enqueue(
        Reply(text="Let me look.", tool_calls=[call("forecast", {"city": "Oslo"}, id="c1")]),
        "It is sunny in Oslo, and warm for the season.",
        "Tomorrow too.",
    )
    async with Agent(llm=model, store=SQLiteStore(db_path), tools=[forecast]) as agent:
        conv = await agent.conversation_for_channel("irc:net:#room")
        live_sub = conv.events()
        await conv.send("weather in Oslo?", author="alice")
        await conv.wait_idle()
        await conv.send("and tomorrow?", author="alice")
        await conv.wait_idle()
        seq = conv.parts.events.seq
        live = await _take(live_sub, seq)
        assert [e.seq for e in live] == list(range(1, seq + 1))
        assert any(isinstance(e, TextDelta) for e in live)
        # Every turn ended: a subscriber reconnecting from anywhere gets the rest, equal.
        for after in (0, 1, seq // 2, seq - 1):
            replayed = await _take(conv.events(after=after), seq - after)
            assert replayed == live[after:]
        # A third turn runs after the seal: replay spans sealed and fresh events.
        model.enqueue("Still sunny.")
        await conv.send("and the day after?", author="alice")
        await conv.wait_idle()
        total = conv.parts.events.seq
        replayed = await _take(conv.events(after=seq - 2), total - (seq - 2))
        assert replayed[:2] == live[seq - 2 :]
        assert [e.seq for e in replayed] == list(range(seq - 1, total + 1))
        assert "".join(e.text for e in replayed if isinstance(e, TextDelta)) == "Still sunny."


async def test_the_buffer_bound_still_counts_events_one_by_one(db_path):
    # event_buffer keeps the last N events: sealed or not, the oldest leave one
    # at a time, and a subscriber asking for older ones is told events_lost.
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path), event_buffer=16) as agent:
        conv = await agent.conversation_for_channel("irc:net:#room")
        for i in range(5):
            await conv.send(f"hello {i}", author="alice")
            await conv.wait_idle()
        last = conv.parts.events.seq
        assert last > 16
        replayed = await _take(conv.events(after=0), 17)
        assert isinstance(replayed[0], EventsLost)
        assert replayed[0].oldest_seq == last - 15
        assert [e.seq for e in replayed[1:]] == list(range(last - 15, last + 1))
        assert agent.services.buffered == 16


async def test_many_short_turns_replay_whole_and_weigh_what_they_hold(db_path):
    # Between turns a conversation packs each turn's events together with the
    # turns before it (a few short turns a blob): from any point a reconnecting
    # subscriber gets exactly what a live one got, the oldest events still leave
    # one at a time, and the budget weighs exactly the events held.
    store = SQLiteStore(db_path)
    async with Agent(llm=ScriptedModel(), store=store, event_buffer=40, event_budget=45) as agent:
        conv = await agent.conversation_for_channel("irc:net:#room")
        live_sub = conv.events()
        for i in range(9):
            await conv.send(f"hello {i}", author="alice")
            await conv.wait_idle()
        seq = conv.parts.events.seq
        assert seq > 40
        live = await _take(live_sub, seq)
        held = live[seq - 40 :]
        for after in range(seq - 40, seq):
            assert await _take(conv.events(after=after), seq - after) == live[after:]
        replayed = await _take(conv.events(after=0), 41)
        assert isinstance(replayed[0], EventsLost) and replayed[1:] == held
        assert agent.services.buffered == 40
        assert agent.services.buffered_bytes == sum(event_weight(e) for e in held)
        texts = "".join(e.text for e in held if isinstance(e, TextDelta))
        assert texts.endswith("echo: hello 8")
        # Another channel's turn passes the agent's budget: the first one's buffer,
        # packed in several turns, leaves it whole, weight and all.
        other = await agent.conversation_for_channel("irc:net:#other")
        other_sub = other.events()
        await other.send("hi", author="bob")
        await other.wait_idle()
        theirs = await _take(other_sub, other.parts.events.seq)
        assert agent.services.buffered == len(theirs)
        assert agent.services.buffered_bytes == sum(event_weight(e) for e in theirs)


async def test_idle_conversations_hold_no_event_objects(db_path):
    # What a bot with many quiet channels keeps: their events packed, not as
    # objects (the agent-wide stream keeps its own last event_buffer x 4).
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path), event_buffer=16) as agent:
        convs = []
        for i in range(30):
            conv = await agent.conversation_for_channel(f"irc:net:#c{i}")
            await conv.send(f"hello there number {i}", author="alice")
            await conv.wait_idle()
            convs.append(conv)
        gc.collect()
        ours = {c.id for c in convs}
        deltas = [
            o for o in gc.get_objects() if isinstance(o, TextDelta) and o.conversation_id in ours
        ]
        # 30 conversations x 5 deltas were published; only those among the agent-wide
        # buffer's last 64 events are objects still.
        wide = {id(e) for e in await _until_last(agent.events(after=0), agent)}
        assert len(deltas) < 30 and all(id(d) in wide for d in deltas)
        replayed = await _take(convs[0].events(after=0), convs[0].parts.events.seq)
        text = "".join(e.text for e in replayed if isinstance(e, TextDelta))
        assert text == "echo: hello there number 0"
        assert agent.services.buffered == sum(c.parts.events.seq for c in convs)


async def _live_until_last(sub, agent) -> list:
    """What a live agent-wide subscriber got, up to the last event published."""
    out = []
    async with asyncio.timeout(60):
        while not out or out[-1].stream_seq < agent.services.last_stream_seq:
            out.append(await anext(sub))
    return out


async def test_the_agent_wide_replay_gets_what_a_live_subscriber_got(db_path):
    # The agent-wide stream (the HTTP API's /agentik/events) packs its buffer in
    # blobs as it goes (it is never idle); a reconnecting client still gets events
    # equal to the live ones, and the bound still counts them one by one.
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path), event_buffer=64) as agent:
        live_sub = agent.events()
        convs = [await agent.conversation_for_channel(f"irc:net:#c{i}") for i in range(4)]
        for i in range(60):
            await convs[i % 4].send(f"hello {i}", author="alice")
            await convs[i % 4].wait_idle()
        live = await _live_until_last(live_sub, agent)
        last = agent.services.last_stream_seq
        assert [e.stream_seq for e in live] == list(range(1, last + 1))
        assert last > 2 * 256  # many times the buffer's 64 x 4 events went by
        replayed = await _until_last(agent.events(after=0), agent)
        assert isinstance(replayed[0], EventsLost)
        assert replayed[0].oldest_seq == last - 255
        assert replayed[1:] == live[-256:]
        for back in (1, 100, 200, 256):
            assert await _until_last(agent.events(after=last - back), agent) == live[-back:]


async def test_a_busy_agent_wide_stream_keeps_few_event_objects(db_path):
    # 4,096 recent events kept for replay cost ~0.9 MB as objects (~3 KB per channel
    # of a 300-channel bot); packed, only the newest and the oldest blob's are objects.
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path)) as agent:
        ours = set()
        for i in range(150):
            conv = await agent.conversation_for_channel(f"irc:net:#c{i}")
            await conv.send(f"hello there number {i}", author="alice")
            await conv.wait_idle()
            ours.add(conv.id)
        del conv
        gc.collect()
        published = agent.services.last_stream_seq
        assert published > 1000
        objects = [
            o for o in gc.get_objects() if isinstance(o, EventBase) and o.conversation_id in ours
        ]
        assert len(objects) <= 2 * 128
        replayed = await _until_last(agent.events(after=0), agent)
        assert [e.stream_seq for e in replayed] == list(range(1, published + 1))
        text = "".join(e.text for e in replayed[:20] if isinstance(e, TextDelta))
        assert text.startswith("echo: hello there number 0")


async def test_a_redacted_answer_is_not_replayed_from_a_packed_agent_wide_blob(db_path):
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path), event_buffer=64) as agent:
        conv = await agent.conversation_for_channel("irc:net:#room")
        await conv.send("the code is hunter2", author="alice")
        await conv.wait_idle()
        other = await agent.conversation_for_channel("irc:net:#other")
        while agent.services.last_stream_seq < 160:  # the turn's events are packed by now
            await other.send("more", author="bob")
            await other.wait_idle()
        replayed = await _until_last(agent.events(after=0), agent)
        assert any("hunter2" in getattr(e, "text", "") for e in replayed)
        [answer] = [m for m in await conv.messages() if m.kind == "assistant"]
        await agent.redact(conv.id, answer.id, by="admin:carol")
        replayed = await _until_last(agent.events(after=0), agent)
        last = agent.services.last_stream_seq
        assert last < 256  # all of them still held: none is missing after the edit
        assert [e.stream_seq for e in replayed] == list(range(1, last + 1))
        assert any(isinstance(e, TextDelta) and e.conversation_id == conv.id for e in replayed)
        assert not any("hunter2" in getattr(e, "text", "") for e in replayed)
        # It packs again as events arrive.
        await other.send("after", author="bob")
        await other.wait_idle()
        again = await _until_last(agent.events(after=0), agent)
        assert not any("hunter2" in getattr(e, "text", "") for e in again)
