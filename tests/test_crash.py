"""A bot killed mid-turn (SIGKILL) loses no committed user message."""

from __future__ import annotations

import sqlite3

from agentik.core import SQLiteStore
from agentik.core.store.migrations import MIGRATIONS
from helpers import back_after_the_kill, kill_mid_turn

from rigs import eventually


async def test_sigkill_mid_turn_loses_no_committed_message(openai_server, db_path):
    conv_id, sent = await kill_mid_turn(openai_server, "sqlite", db_path)

    con = sqlite3.connect(db_path)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    latest = max(m.number for m in MIGRATIONS)  # numbers may have gaps until issue 19 merges
    assert con.execute("SELECT MAX(number) FROM schema_migrations").fetchone() == (latest,)
    stored = dict(con.execute("SELECT run_id, content FROM message WHERE kind = 'user'").fetchall())
    con.close()
    for i, run_id in sent:
        assert stored.get(run_id) == f"message {i}"

    # The bot comes back: same conversation, and every message reaches the model.
    await back_after_the_kill(openai_server, SQLiteStore(db_path), conv_id, sent)


_ASKING_CHILD = """
import asyncio, sys
from agentik.core import Agent, OpenAIBackend, SQLiteStore

async def main(db, base_url):
    llm = OpenAIBackend(model="fake-model", base_url=base_url, max_retries=0)
    async with Agent(llm=llm, store=SQLiteStore(db, busy_timeout=600)) as agent:
        conv = await agent.conversation_for_channel("stdio:crash")
        await conv.send("first question")
        await conv.wait_idle()
        print("READY", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await conv.send("the unstored question")

asyncio.run(main(*sys.argv[1:3]))
"""


async def test_sigkill_after_the_model_was_asked_but_before_the_message_was_stored(
    openai_server, db_path
):
    """A turn sends its model request while its message's write is still under way
    (here held by another process's write lock).  Killed then, the bot had shown
    nothing of it and stored nothing of it: after the restart the message is not in
    the history, no turn waits to be answered, and the next request does not carry it
    (its sender was never told it was taken: Slack or IRC would send it again)."""
    import asyncio
    import signal
    import sys

    from agentik.core import Agent, OpenAIBackend
    from agentik.core.testing.openai_server import Reply

    openai_server.default = lambda body: Reply.text("an answer", chunks=1)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _ASKING_CHILD, db_path, openai_server.base_url,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    lock = sqlite3.connect(db_path, isolation_level=None, timeout=60)
    try:
        async with asyncio.timeout(60):
            assert (await proc.stdout.readline()).strip() == b"READY"
            lock.execute("BEGIN IMMEDIATE")  # the next write waits for it
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()

            def asked() -> bool:
                return any(
                    m.get("content") == "the unstored question"
                    for body in openai_server.requests for m in body["messages"]
                )  # fmt: skip

            await eventually(asked, "the model asked about the unstored question", wait=60)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        if lock.in_transaction:
            lock.execute("ROLLBACK")
        lock.close()
    assert proc.returncode == -signal.SIGKILL

    before = len(openai_server.requests)
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url)
    async with Agent(llm=llm, store=SQLiteStore(db_path)) as agent:
        assert await agent.pending_turns() == []
        conv = await agent.conversation_for_channel("stdio:crash")
        history = [(m.kind, m.content) for m in await conv.messages()]
        assert history == [("user", "first question"), ("assistant", "an answer")]
        await conv.send("after the crash")
        await conv.wait_idle()
    users = [m["content"] for m in openai_server.requests[before]["messages"]
             if m["role"] == "user"]  # fmt: skip
    assert users == ["first question", "after the crash"]
