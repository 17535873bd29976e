"""The database misbehaves under a running bot: locked by another process past
``busy_timeout``.  Clear errors, nothing answered twice, recovery when it clears."""

from __future__ import annotations

import asyncio
import logging
import sqlite3

import pytest

from agentik.core import Agent, SQLiteStore
from agentik.core.testing.scripted import Reply, ScriptedModel

from rigs import eventually

WAIT = 60.0


async def test_a_lock_held_past_busy_timeout_mid_turn_records_the_answer_once_it_clears(
    tmp_path, caplog
):
    """Another process (a backup script, an open ``sqlite3`` shell) holds the
    write lock while a turn ends.  Its answer was produced: once the lock is
    released it is recorded with the turn's end, so a restart does not answer
    the message a second time."""
    db = str(tmp_path / "bot.db")
    gate = asyncio.Event()
    model = ScriptedModel([Reply(text="the answer", gate=gate)])
    agent = Agent(llm=model, store=SQLiteStore(db, busy_timeout=0.2))
    other = sqlite3.connect(db, isolation_level=None, timeout=WAIT)
    async with agent:
        conv = await agent.create_conversation()
        events = conv.events()
        run_id = await conv.send("what is it?", author="alice")
        await eventually(lambda: model.requests, "the turn to ask the model", wait=WAIT)
        await agent.store.run_write(lambda conn: None)  # what the turn queued is in
        other.execute("BEGIN IMMEDIATE")  # held far longer than busy_timeout
        gate.set()

        def refused() -> bool:
            return any("could not record" in r.getMessage() for r in caplog.records)

        async def turn_over() -> None:
            async for e in events:
                if e.kind == "turn_ended" and e.run_id == run_id:
                    return

        caplog.set_level(logging.WARNING)
        ended = asyncio.ensure_future(turn_over())
        await eventually(
            lambda: refused() or ended.done(),
            "the refusal or the turn's end",
            wait=WAIT,
            interval=0.05,
        )
        other.execute("ROLLBACK")
        await asyncio.wait_for(ended, WAIT)
        history = [(m.kind, m.content) for m in await conv.messages()]
        assert history == [("user", "what is it?"), ("assistant", "the answer")]
        assert await agent.pending_turns() == []
    other.close()
    # The next start has nothing to answer again.
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db)) as again:
        assert await again.pending_turns() == []


def _taken(events) -> list:
    """The events pending on the subscription ``events`` now (without waiting)."""
    out = []
    while (e := events.take()) is not None:
        out.append(e)
    return out


async def _asked_while_locked(agent, model, other, text: str):
    """One exchange first, then ``text`` sent while ``other`` holds the write lock,
    until the model got its request: the conversation, its event subscription (opened
    before the send) and the send's task."""
    conv = await agent.create_conversation()
    await conv.send("hi", author="alice")
    await conv.wait_idle()
    events = conv.events()
    other.execute("BEGIN IMMEDIATE")
    sending = asyncio.ensure_future(conv.send(text, author="alice"))
    await eventually(lambda: len(model.requests) == 2, "the model asked", wait=WAIT)
    return conv, events, sending


async def test_a_turn_asks_the_model_while_its_message_is_written_and_shows_nothing_before(
    tmp_path,
):
    """A message's turn sends its model request while the message's own write is still
    under way (here held up by another process's write lock), but nothing of the turn
    shows (not even its start) and nothing of it is written until the message is
    stored; then its start, its answer and its end follow, in that order, and the
    audit log has the question before the answer."""
    db = str(tmp_path / "bot.db")
    model = ScriptedModel([Reply(text="hello"), Reply(text="the answer")])
    agent = Agent(llm=model, store=SQLiteStore(db, busy_timeout=WAIT))
    other = sqlite3.connect(db, isolation_level=None, timeout=WAIT)
    async with agent:
        conv, events, sending = await _asked_while_locked(agent, model, other, "what is it?")
        assert model.requests[1].messages[-1].content == "what is it?"
        await asyncio.sleep(0.05)  # (time for anything the turn would wrongly show)
        assert not sending.done()  # not stored yet
        assert _taken(events) == []  # nothing of the turn shown
        other.execute("ROLLBACK")
        run_id = await asyncio.wait_for(sending, WAIT)
        await conv.wait_idle()
        shown = [e for e in _taken(events) if e.run_id == run_id]
        kinds = [e.kind for e in shown]
        assert kinds[0] == "turn_started" and "turn_ended" in kinds
        assert kinds.index("text_delta") > kinds.index("turn_started")
        started = shown[0]
        history = await conv.messages()
        asked = next(m for m in history if m.content == "what is it?")
        assert started.message_id == asked.id  # its stored id, not a placeholder
        assert [(m.kind, m.content) for m in history][-2:] == [
            ("user", "what is it?"), ("assistant", "the answer")
        ]  # fmt: skip
    other.close()


async def test_a_message_that_cannot_be_stored_gets_no_answer_though_the_model_was_asked(
    tmp_path,
):
    """The message's write fails (the write lock held past ``busy_timeout``) after its
    turn had sent the model request: its sender gets the error, and nothing of that
    turn shows or is written; the model's answer is dropped, and the next message's
    request does not carry the lost one."""
    from agentik.core.errors import StoreError

    db = str(tmp_path / "bot.db")
    gate = asyncio.Event()
    model = ScriptedModel([Reply(text="hello"), Reply(text="never shown", gate=gate),
                           Reply(text="the next answer")])  # fmt: skip
    agent = Agent(llm=model, store=SQLiteStore(db, busy_timeout=0.3))
    other = sqlite3.connect(db, isolation_level=None, timeout=WAIT)
    async with agent:
        conv, events, sending = await _asked_while_locked(agent, model, other, "lost question")
        with pytest.raises(StoreError):
            await asyncio.wait_for(sending, WAIT)
        gate.set()
        other.execute("ROLLBACK")
        await conv.wait_idle()
        assert _taken(events) == []  # no start, no answer, no end of that turn
        await conv.send("next question", author="alice")
        await conv.wait_idle()
        contents = [m.content for m in model.requests[2].messages]
        assert "next question" in contents and "lost question" not in contents
        history = [(m.kind, m.content) for m in await conv.messages()]
        assert history == [
            ("user", "hi"), ("assistant", "hello"),
            ("user", "next question"), ("assistant", "the next answer"),
        ]  # fmt: skip
        assert await agent.pending_turns() == []
    other.close()
