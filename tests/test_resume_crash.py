"""kill -9 with unanswered messages: after the restart each is answered exactly once.

A child process runs the bot (``Bot``: the same start-up path as ``agentik
run``) with a fake chat network that prints every delivery, against the fake
OpenAI-compatible server.  Twenty-five people ask in twenty-five channels;
twenty answers have not started streaming, five are mid-stream; the child
is killed with SIGKILL.  A second child on the same database must answer every
one, once: one model request per question, one delivery per channel.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import signal
import sqlite3
import sys
import textwrap

from agentik.core import Agent, SQLiteStore
from agentik.core.testing.openai_server import Reply
from agentik.core.testing.scripted import ScriptedModel

N = 25
MID_STREAM = 5

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from agentik.bot.app import Bot
    from agentik.bot.config import parse_config
    from agentik.transports.base import ChannelCaps
    from agentik.transports.testing.fake import FakeTransport

    class PrintingFake(FakeTransport):
        async def send(self, message):
            await super().send(message)
            print("POST", json.dumps([message.channel_key, message.kind, message.text,
                                      message.run_id]), flush=True)

    async def main(db, base_url, phase, n):
        config = parse_config({
            "llm": {"backend": "openai", "base_url": base_url, "model": "fake-model",
                    "api_key": "sk-test", "max_retries": 0},
            "storage": {"path": db},
            "memory": {"backend": "none"},
            "compaction": {"enabled": False},
        })
        fake = PrintingFake(name="chat", caps=ChannelCaps(streaming="message"))
        async with Bot(config, transports={"chat": fake}) as bot:
            if phase == "first":
                seen = set()
                async def deltas():
                    async for e in bot.agent.events(kinds=["text_delta"]):
                        if e.conversation_id not in seen:
                            seen.add(e.conversation_id)
                            print("DELTA", e.conversation_id, flush=True)
                task = asyncio.ensure_future(deltas())
                for i in range(n):
                    await fake.say(f"agentik: question {i}", channel=f"c{i}", user=f"u{i}")
                    print("SENT", i, flush=True)
                await asyncio.Event().wait()  # until killed
            else:
                # Start-up has queued the resumed turns; wait for their answers.
                for i in range(n):
                    await bot.bridge.flush(fake.key(channel=f"c{i}"))
                print("PENDING", len(await bot.agent.pending_turns()), flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
    """
)


def question(body: dict) -> int:
    last = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
    match = re.search(r"question (\d+)$", last)
    assert match, last
    return int(match.group(1))


async def start_child(db_path: str, base_url: str, phase: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        db_path,
        base_url,
        phase,
        str(N),
        stdout=asyncio.subprocess.PIPE,
    )


async def test_kill_9_with_unanswered_messages_then_each_is_answered_exactly_once(
    openai_server, db_path
):
    def first(body: dict) -> Reply:
        if question(body) < MID_STREAM:  # streams for minutes: cut mid-stream
            return Reply.text("partial " * 2000, chunks=2000, delay=0.05)
        return Reply.text("never sent", delay=3600)  # not one chunk before the kill

    openai_server.default = first
    proc = await start_child(db_path, openai_server.base_url, "first")
    posts_before: list[list] = []
    streaming: set[str] = set()
    try:
        async with asyncio.timeout(60):
            sent = 0
            while sent < N or len(streaming) < MID_STREAM or len(openai_server.requests) < N:
                if sent == N and len(streaming) == MID_STREAM:
                    await openai_server.wait_requests(N, timeout=60)
                    continue
                line = (await proc.stdout.readline()).decode()
                assert line, "child exited early"
                word, _, rest = line.strip().partition(" ")
                if word == "SENT":
                    sent += 1
                elif word == "DELTA":
                    streaming.add(rest)
                elif word == "POST":
                    posts_before.append(json.loads(rest))
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert len(openai_server.requests) == N
    assert posts_before == []  # no answer was complete, so none was delivered

    # The restart, on the same database, with a model that answers at once.
    openai_server.default = lambda body: Reply.text(f"answer {question(body)}", chunks=1)
    proc = await start_child(db_path, openai_server.base_url, "second")
    posts: list[list] = []
    pending_after = None
    async with asyncio.timeout(120):
        while line := (await proc.stdout.readline()).decode():
            word, _, rest = line.strip().partition(" ")
            if word == "POST":
                posts.append(json.loads(rest))
            elif word == "PENDING":
                pending_after = int(rest)
        assert await proc.wait() == 0
    assert pending_after == 0

    # One model request per question after the restart ...
    requests = collections.Counter(question(b) for b in openai_server.requests[N:])
    assert requests == {i: 1 for i in range(N)}
    # ... and one delivery per channel: that question's answer.
    delivered = collections.defaultdict(list)
    for key, kind, text, _run in posts:
        delivered[key].append((kind, text))
    assert dict(delivered) == {f"fake:chat:#c{i}": [("answer", f"answer {i}")] for i in range(N)}

    # The five cut mid-stream left no partial answer (kill -9 writes nothing);
    # every turn now has exactly one end, and a third start has nothing to do.
    con = sqlite3.connect(db_path)
    assert con.execute("SELECT outcome, COUNT(*) FROM turn_end GROUP BY outcome").fetchall() == [
        ("stop", N)
    ]
    assert con.execute(
        "SELECT COUNT(*) FROM message WHERE kind = 'assistant' AND status = 'complete'"
    ).fetchone() == (N,)
    con.close()
    model = ScriptedModel()
    async with Agent(llm=model, store=SQLiteStore(db_path)) as agent:
        assert await agent.pending_turns() == []
    assert model.requests == []
