"""A bot killed mid-turn (SIGKILL) loses no committed user message."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
import textwrap

from agentik.core import Agent, OpenAIBackend, SQLiteStore
from agentik.core.store.migrations import MIGRATIONS
from agentik.core.testing.openai_server import Reply

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from agentik.core import Agent, OpenAIBackend, SQLiteStore

    async def main(db, base_url):
        llm = OpenAIBackend(model="fake-model", base_url=base_url, max_retries=0)
        async with Agent(llm=llm, store=SQLiteStore(db)) as agent:
            conv = await agent.conversation_for_channel("stdio:crash")
            print("CONV", conv.id, flush=True)
            i = 0
            while True:
                run_id = await conv.send(f"message {i}")
                print("SENT", i, run_id, flush=True)
                i += 1
                await asyncio.sleep(0.01)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def test_sigkill_mid_turn_loses_no_committed_message(openai_server, db_path):
    # Every answer stops mid-stream (held until released, never), so the kill
    # lands in the middle of a turn however fast or slow the machine is.
    openai_server.default = lambda body: Reply.text("a slow answer " * 20, chunks=40, hold_after=5)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        db_path,
        openai_server.base_url,
        stdout=asyncio.subprocess.PIPE,
    )
    sent: list[tuple[int, str]] = []
    conv_id = None
    try:
        async with asyncio.timeout(60):
            while len(sent) < 25 or not openai_server.requests:
                line = (await proc.stdout.readline()).decode().split()
                assert line, "child exited early"
                if line[0] == "CONV":
                    conv_id = line[1]
                else:
                    sent.append((int(line[1]), line[2]))
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL

    con = sqlite3.connect(db_path)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    latest = max(m.number for m in MIGRATIONS)  # numbers may have gaps until issue 19 merges
    assert con.execute("SELECT MAX(number) FROM schema_migrations").fetchone() == (latest,)
    stored = dict(con.execute("SELECT run_id, content FROM message WHERE kind = 'user'").fetchall())
    con.close()
    for i, run_id in sent:
        assert stored.get(run_id) == f"message {i}"

    # The bot comes back: same conversation, and every message reaches the model.
    openai_server.default = lambda body: Reply.text("back", chunks=1)
    before = len(openai_server.requests)
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url)
    async with Agent(llm=llm, store=SQLiteStore(db_path)) as agent:
        conv = await agent.conversation_for_channel("stdio:crash")
        assert conv.id == conv_id
        await conv.send("after the crash")
        await conv.wait_idle()
    request = openai_server.requests[before]
    users = [m["content"] for m in request["messages"] if m["role"] == "user"]
    assert users[-1] == "after the crash"
    assert [f"message {i}" for i, _ in sent] == [u for u in users if u.startswith("message")][
        : len(sent)
    ]
