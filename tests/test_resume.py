"""Messages a crash or a shutdown left unanswered are taken up once at the next start."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest

from agentik.bot.bridge import Bridge
from agentik.core import Agent, MemoryStore, SQLiteStore
from agentik.core.messages import ChatMessage, NewMessage
from agentik.core.store.base import ConversationRecord, TurnEnd
from agentik.core.store.migrations import apply_migrations
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.transports.testing.fake import FakeTransport

TIMEOUT = 60


def user_texts(request) -> list[str]:
    return [m.content for m in request.messages if m.role == "user"]


async def cut_off(db_path: str, texts: list[str], channel: str = "stdio:resume") -> list[str]:
    """Send ``texts`` to one conversation and shut down while the first answer streams."""
    held = Reply(text="a partial answer that never ends", hold_after=2)
    async with Agent(llm=ScriptedModel([held]), store=SQLiteStore(db_path)) as agent:
        conv = await agent.conversation_for_channel(channel)
        runs = [await conv.send(t, author="alice") for t in texts]
        async with asyncio.timeout(TIMEOUT):
            await held.held.wait()
    return runs


async def test_a_turn_cut_off_mid_answer_is_resumed_once_with_its_own_run_id(db_path):
    [run] = await cut_off(db_path, ["what is 2+2?"])
    # The shutdown kept the partial answer, marked interrupted, but did not end the turn.
    con = sqlite3.connect(db_path)
    rows = con.execute("SELECT kind, status, content FROM message WHERE run_id = ?", (run,))
    assert rows.fetchall() == [
        ("user", "complete", "what is 2+2?"),
        ("assistant", "interrupted", "a partial "),
    ]
    con.close()

    model = ScriptedModel(["4"])
    async with Agent(llm=model, store=SQLiteStore(db_path)) as agent:
        pending = await agent.pending_turns()
        assert [(m.content, m.run_id) for m in pending] == [("what is 2+2?", run)]
        conv = await agent.conversation_for_channel("stdio:resume")
        events = conv.events(profile="chat")
        assert conv.resume(pending) == [run]
        assert conv.resume(pending) == []  # a second call does not double up
        ended = None
        async with asyncio.timeout(TIMEOUT):
            async for e in events:
                if e.kind == "turn_ended":
                    ended = e
                    break
        assert ended.run_id == run and ended.text == "4"
        await conv.wait_idle()
        assert await agent.pending_turns() == []
        # The model saw the question again after its cut-off partial answer.
        [request] = model.requests
        assert [(m.role, m.content) for m in request.messages] == [
            ("user", "what is 2+2?"),
            ("assistant", "a partial "),
            ("user", "what is 2+2?"),
        ]
        log = [(m.kind, m.status, m.content) for m in await conv.messages() if m.run_id == run]
        assert log == [
            ("user", "complete", "what is 2+2?"),
            ("assistant", "interrupted", "a partial "),
            ("assistant", "complete", "4"),
        ]

    # Started again: nothing is pending, nothing is answered twice.
    again = ScriptedModel()
    async with Agent(llm=again, store=SQLiteStore(db_path)) as agent:
        assert await agent.pending_turns() == []
    assert again.requests == []


async def test_queued_messages_that_never_ran_are_answered_in_order(db_path):
    runs = await cut_off(db_path, ["one", "two", "three"])
    model = ScriptedModel(["first", "second", "third"])
    async with Agent(llm=model, store=SQLiteStore(db_path)) as agent:
        pending = await agent.pending_turns()
        assert [m.run_id for m in pending] == runs
        conv = await agent.conversation_for_channel("stdio:resume")
        conv.resume(pending)
        # A message sent now waits behind the resumed ones.
        later = await conv.send("four", author="bob")
        async with asyncio.timeout(TIMEOUT):
            await conv.wait_idle()
        assert [user_texts(r)[-1] for r in model.requests] == ["one", "two", "three", "four"]
        # Each resumed turn saw the answers before it, the one cut off only once.
        assert user_texts(model.requests[1]) == ["one", "one", "two"]
        answers = {
            m.run_id: m.content
            for m in await conv.messages()
            if m.kind == "assistant" and m.status == "complete"
        }
        assert answers == {
            runs[0]: "first",
            runs[1]: "second",
            runs[2]: "third",
            later: "echo: four",
        }
        assert await agent.pending_turns() == []


async def test_stopped_and_failed_turns_count_as_finished(db_path):
    stopped = Reply(text="words and more words", hold_after=1)
    failing = Reply(text="half of it", fail_after=1)
    async with Agent(llm=ScriptedModel([stopped, failing]), store=SQLiteStore(db_path)) as agent:
        conv = await agent.conversation_for_channel("stdio:finished")
        await conv.send("stop me")
        async with asyncio.timeout(TIMEOUT):
            await stopped.held.wait()
        assert await conv.interrupt()
        await conv.send("fail me")
        async with asyncio.timeout(TIMEOUT):
            await conv.wait_idle()
        assert await agent.pending_turns() == []
    con = sqlite3.connect(db_path)
    assert sorted(o for (o,) in con.execute("SELECT outcome FROM turn_end")) == [
        "error",
        "interrupted",
    ]
    con.close()


async def bridge_restart(db_path, *, resume, max_age=0.0, model=None, transport=None):
    model = model or ScriptedModel()
    agent = await Agent(llm=model, store=SQLiteStore(db_path)).start()
    bridge = Bridge(agent, resume=resume, resume_max_age=max_age)
    fake = transport or FakeTransport(name="chat")
    bridge.attach(fake)
    await fake.start(bridge)
    counts = await bridge.resume_pending()
    return agent, bridge, fake, model, counts


async def leave_unanswered(db_path, channels: list[str]) -> None:
    """People speak in ``channels`` of a fake network; the bot shuts down mid-answer."""
    replies = [Reply(text="never finished here", hold_after=1) for _ in channels]
    agent = await Agent(llm=ScriptedModel(replies), store=SQLiteStore(db_path)).start()
    bridge = Bridge(agent)
    fake = FakeTransport(name="chat")
    bridge.attach(fake)
    await fake.start(bridge)
    for i, channel in enumerate(channels):
        await fake.say(f"agentik: question {i}", channel=channel, user=f"user{i}")
    async with asyncio.timeout(TIMEOUT):
        for r in replies:
            await r.held.wait()
    await bridge.aclose()
    await agent.aclose()
    assert fake.posts == []  # whole-message channel: nothing went out yet


async def close(agent, bridge):
    await bridge.aclose()
    await agent.aclose()


async def test_bridge_answers_each_channel_through_its_transport(db_path):
    await leave_unanswered(db_path, ["ops", "dev"])
    agent, bridge, fake, model, counts = await bridge_restart(db_path, resume="answer")
    try:
        assert counts["answer"] == 2
        async with asyncio.timeout(TIMEOUT):
            await bridge.flush(fake.key(channel="ops"))
            await bridge.flush(fake.key(channel="dev"))
        assert fake.received(channel="ops") == ["echo: question 0"]
        assert fake.received(channel="dev") == ["echo: question 1"]
        assert len(model.requests) == 2
        # Calling it again finds nothing left.
        assert (await bridge.resume_pending())["answer"] == 0
    finally:
        await close(agent, bridge)


async def test_policy_note_posts_a_notice_once_and_never_asks_the_model(db_path):
    await leave_unanswered(db_path, ["ops"])
    agent, bridge, fake, model, counts = await bridge_restart(db_path, resume="note")
    try:
        assert counts["note"] == 1
        async with asyncio.timeout(TIMEOUT):
            await bridge.flush(fake.key(channel="ops"))
        [notice] = fake.received(channel="ops")
        assert notice.startswith("I was restarted and did not answer user0's message from ")
        assert notice.endswith(" UTC; please ask again.")
        assert model.requests == []
        assert await agent.pending_turns() == []
    finally:
        await close(agent, bridge)
    # Recorded: the next start does not repeat it.
    agent, bridge, fake, model, counts = await bridge_restart(db_path, resume="note")
    try:
        assert counts["note"] == 0
        assert fake.posts == [] and model.requests == []
    finally:
        await close(agent, bridge)


async def test_policy_drop_sends_nothing_and_records_the_drop(db_path):
    await leave_unanswered(db_path, ["ops"])
    agent, bridge, fake, model, counts = await bridge_restart(db_path, resume="drop")
    try:
        assert counts["drop"] == 1
        conv = await agent.conversation_for_channel(fake.key(channel="ops"))
        async with asyncio.timeout(TIMEOUT):
            await conv.wait_idle()
        assert await agent.pending_turns() == []
        assert fake.posts == [] and model.requests == []
    finally:
        await close(agent, bridge)
    con = sqlite3.connect(db_path)
    assert con.execute("SELECT outcome FROM turn_end").fetchall() == [("dropped",)]
    con.close()


async def test_messages_older_than_max_age_only_get_the_notice(db_path):
    await leave_unanswered(db_path, ["ops"])
    # A second message in another channel, committed two hours ago.
    async with SQLiteStore(db_path) as store:
        await store.create_conversation(
            ConversationRecord(id="old", created_at=0, updated_at=0),
            channel_key="fake:chat:#old",
        )
        await store.append(
            "old",
            log=[
                NewMessage(
                    kind="user",
                    content="stale question",
                    author="bob",
                    channel="fake:chat:#old",
                    run_id="run_stale",
                    created_at=time.time() - 7200,
                )
            ],
        )
    agent, bridge, fake, model, counts = await bridge_restart(
        db_path, resume="answer", max_age=3600
    )
    try:
        assert (counts["answer"], counts["note"]) == (1, 1)
        async with asyncio.timeout(TIMEOUT):
            await bridge.flush(fake.key(channel="ops"))
            await bridge.flush(fake.key(channel="old"))
        assert fake.received(channel="ops") == ["echo: question 0"]
        [notice] = fake.received(channel="old")
        assert "did not answer bob's message" in notice
        assert [user_texts(r)[-1] for r in model.requests] == ["question 0"]
    finally:
        await close(agent, bridge)


async def test_a_channel_without_its_transport_stays_pending(db_path):
    await leave_unanswered(db_path, ["ops"])
    other = FakeTransport(name="elsewhere")
    agent, bridge, fake, model, counts = await bridge_restart(
        db_path, resume="answer", transport=other
    )
    try:
        assert counts["left"] == 1 and counts["answer"] == 0
        assert [m.content for m in await agent.pending_turns()] == ["question 0"]
        assert model.requests == [] and other.posts == []
    finally:
        await close(agent, bridge)


async def test_memory_store_keeps_the_same_contract():
    store = MemoryStore()
    await store.create_conversation(ConversationRecord(id="c", created_at=0, updated_at=0))
    [a, b] = await store.append(
        "c",
        log=[
            NewMessage(kind="user", content="a", run_id="r1"),
            NewMessage(kind="user", content="b", run_id="r2"),
        ],
    )
    await store.append("c", log=[NewMessage(kind="user", content="ambient")])
    assert [m.run_id for m in await store.pending_turns()] == ["r1", "r2"]
    await store.append("c", ended=TurnEnd("r1", "stop"))
    await store.append("c", ended=TurnEnd("r1", "error"))  # ignored: already ended
    assert [m.id for m in await store.pending_turns()] == [b.id]


async def test_history_from_before_the_upgrade_is_not_resumed(db_path):
    con = sqlite3.connect(db_path, isolation_level=None)
    apply_migrations(con, target=2)
    con.execute("INSERT INTO conversation (id, created_at, updated_at) VALUES ('c', 0, 0)")
    con.execute(
        "INSERT INTO message (conversation_id, kind, content, run_id, created_at)"
        " VALUES ('c', 'user', 'an old question', 'run_old', 0)"
    )
    con.close()
    model = ScriptedModel()
    async with Agent(llm=model, store=SQLiteStore(db_path)) as agent:
        assert await agent.pending_turns() == []


@pytest.mark.parametrize("mode", ["later"])
async def test_resume_refuses_a_message_of_another_conversation(agent, mode):
    a = await agent.create_conversation()
    b = await agent.create_conversation()
    await a.send("hi")
    await a.wait_idle()
    [msg] = await a.messages(kinds=["user"])
    with pytest.raises(ValueError, match="not a user turn"):
        b.resume([msg])
    with pytest.raises(ValueError, match="unknown resume mode"):
        a.resume([msg], mode=mode)  # type: ignore[arg-type]


async def test_a_tool_call_cut_off_by_a_crash_gets_an_error_result_before_the_rerun(db_path):
    # What a turn has committed when the process dies while its tool runs:
    # the message, and the model's tool call, in both logs; no result.
    async with SQLiteStore(db_path) as store:
        await store.create_conversation(
            ConversationRecord(id="c", created_at=0, updated_at=0), channel_key="stdio:tools"
        )
        tc = call("slow_lookup", {"q": "x"}, id="call_1")
        await store.append(
            "c",
            log=[NewMessage(kind="user", content="look it up", run_id="run_1")],
            memory=[ChatMessage(role="user", content="look it up", message_id=-1)],
        )
        await store.append(
            "c",
            log=[
                NewMessage(
                    kind="tool_call",
                    run_id="run_1",
                    tool_call_id="call_1",
                    tool_name="slow_lookup",
                    arguments=tc.arguments,
                )
            ],
            memory=[ChatMessage(role="assistant", content="", tool_calls=(tc,))],
        )
    model = ScriptedModel(["the lookup failed; sorry"])
    async with Agent(llm=model, store=SQLiteStore(db_path)) as agent:
        conv = await agent.conversation_for_channel("stdio:tools")
        assert conv.resume(await agent.pending_turns()) == ["run_1"]
        async with asyncio.timeout(TIMEOUT):
            await conv.wait_idle()
        [request] = model.requests
        roles = [(m.role, m.tool_call_id, m.is_error) for m in request.messages]
        assert roles == [
            ("user", None, False),
            ("assistant", None, False),
            ("tool", "call_1", True),
        ]
        rows = [(m.kind, m.status) for m in await conv.messages() if m.run_id == "run_1"]
        assert rows == [
            ("user", "complete"),
            ("tool_call", "complete"),
            ("tool_result", "interrupted"),
            ("assistant", "complete"),
        ]
        assert await agent.pending_turns() == []


async def test_a_channel_started_over_meanwhile_records_the_old_message_as_superseded(db_path):
    await leave_unanswered(db_path, ["ops"])
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path)) as agent:
        old_id = (await agent.conversation_for_channel("fake:chat:#ops")).id
        await agent.new_conversation_for_channel("fake:chat:#ops")
    agent, bridge, fake, model, counts = await bridge_restart(db_path, resume="answer")
    try:
        assert counts["superseded"] == 1 and counts["answer"] == 0
        async with asyncio.timeout(TIMEOUT):
            await (await agent.get_conversation(old_id)).wait_idle()
        assert await agent.pending_turns() == []
        assert fake.posts == [] and model.requests == []
    finally:
        await close(agent, bridge)


async def test_a_message_said_while_the_bot_starts_is_answered_once_not_taken_up_too(db_path):
    # One message a crash left; the bot restarts, and while its start-up is still
    # under way (another transport connecting) someone speaks on a transport that
    # is up already: that turn is running when recovery looks for unanswered
    # messages, and must not be taken up a second time (the stdio chat printed
    # its first answer twice under load).
    await leave_unanswered(db_path, ["ops"])
    live = Reply(text="answered live", hold_after=1)
    model = ScriptedModel([live, "answered after the restart"])
    agent = await Agent(llm=model, store=SQLiteStore(db_path)).start()
    bridge = Bridge(agent, resume="answer")
    fake = FakeTransport(name="chat")
    bridge.attach(fake)
    try:
        began = time.time()
        await fake.start(bridge)
        await fake.say("agentik: are you there?", channel="dev", user="bob")
        async with asyncio.timeout(TIMEOUT):
            await live.held.wait()  # its turn is mid-answer: no recorded end yet
        assert len(await agent.pending_turns()) == 2  # both look unanswered in the log
        counts = await bridge.resume_pending(before=began)
        assert counts["answer"] == 1  # only the one the crash left
        live.release.set()
        async with asyncio.timeout(TIMEOUT):
            await bridge.flush(fake.key(channel="dev"))
            await bridge.flush(fake.key(channel="ops"))
        assert fake.received(channel="dev") == ["answered live"]
        assert fake.received(channel="ops") == ["answered after the restart"]
        assert len(model.requests) == 2
    finally:
        await close(agent, bridge)
