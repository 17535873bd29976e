"""The database misbehaves under a running bot: locked by another process past
``busy_timeout``.  Clear errors, nothing answered twice, recovery when it clears."""

from __future__ import annotations

import asyncio
import logging
import sqlite3

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
