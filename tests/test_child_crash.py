"""kill -9 between a child run's end and its parent's tool result (agents as tools).

``agentik.core.agents`` ("Durability") says a child's last write is deferred
into the transaction of the parent's tool result, and that a crash before it
loses nothing a user sent: the parent's turn is taken up again.  A child
process runs an agent whose ``after_tool_call`` hook holds the parent's tool
result of ``agent__helper`` (a slow step after the child has answered); it is
killed there.  The restarted agent must answer the user's message once.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from agentik.core import Agent, SQLiteStore, hookimpl
    from agentik.core.agents import AgentSpec
    from agentik.core.testing.scripted import Reply, ScriptedModel, call

    class Hold:
        @hookimpl
        async def after_tool_call(self, conversation, run_id, call, result):
            if call.name == "agent__helper":
                print("HOLD", result.text, flush=True)
                await asyncio.Event().wait()  # until killed

    async def main(db, phase):
        child = ScriptedModel([Reply(text="child answer")])
        if phase == "first":
            parent = ScriptedModel([Reply(tool_calls=[call("agent__helper", {"task": "look"})])])
            hooks = [Hold()]
        else:
            parent = ScriptedModel([Reply(text="final answer")])
            hooks = []
        agent = Agent(
            llm=parent, store=SQLiteStore(db), hooks=hooks,
            agents={"helper": AgentSpec(description="Helps.", model="helper")},
            uses=("helper",), profiles={"helper": child},
        )
        async with agent:
            if phase == "first":
                conv = await agent.create_conversation()
                await conv.send("please help", author="alice")
                print("SENT", conv.id, flush=True)
                await asyncio.Event().wait()
            answered = []
            for m in await agent.pending_turns():
                conv = await agent.get_conversation(m.conversation_id)
                events = conv.events()
                conv.resume([m])
                async for e in events:
                    if e.kind == "turn_ended" and e.run_id == m.run_id:
                        answered.append(e.text)
                        break
            print("ANSWERED", len(answered), repr(answered), flush=True)
            print("REQUESTS", len(parent.requests), len(child.requests), flush=True)
            print("PENDING", len(await agent.pending_turns()), flush=True)

    asyncio.run(main(*sys.argv[1:]))
    """
)


async def run(db: str, phase: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, db, phase, stdout=asyncio.subprocess.PIPE
    )


async def test_kill_9_after_the_child_answered_before_the_parents_tool_result(tmp_path):
    db = str(tmp_path / "bot.db")
    proc = await run(db, "first")
    try:
        async with asyncio.timeout(60):
            lines = []
            while not lines or not lines[-1].startswith("HOLD"):
                line = (await proc.stdout.readline()).decode()
                assert line, f"the bot exited early: {lines}"
                lines.append(line)
        assert lines[-1].split(maxsplit=1)[1].strip() == "child answer"
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    con = sqlite3.connect(db)
    tool_results = con.execute("SELECT COUNT(*) FROM message WHERE kind = 'tool_result'").fetchone()
    con.close()
    assert tool_results == (0,)  # killed before the parent's tool result was written

    proc = await run(db, "again")
    async with asyncio.timeout(60):
        out, _ = await proc.communicate()
    report = dict(line.split(" ", 1) for line in out.decode().splitlines())
    assert report["ANSWERED"] == "1 ['final answer']"
    assert report["PENDING"] == "0"
    assert report["REQUESTS"] == "1 0"
    # One request of the parent (the child's answer was not kept: its result is
    # an error the model sees, and it answers; it could call the child again).
    con = sqlite3.connect(db)
    answers = con.execute(
        "SELECT content FROM message WHERE kind = 'assistant' AND content = 'final answer'"
    ).fetchall()
    con.close()
    assert answers == [("final answer",)]
