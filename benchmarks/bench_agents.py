#!/usr/bin/env python3
"""The CPU cost of calling an agent as a tool (a child run), against a plain tool call.

Run with ``.venv/bin/python benchmarks/bench_agents.py`` (``make bench``); ``--quick`` is
a smaller run.  Both sides run whole turns on the same agent, with an instant scripted
model (no network, no sleeping) and a real SQLite store:

* baseline: the model calls a plain tool (``echo``) once, then answers;
* agentik: the model calls ``agent__helper`` once — a child run: a new conversation,
  its user message, its model request and answer, the run-tree rows, the events relayed
  into the parent's stream — then answers.

CPU is the whole process's (``time.process_time``: the event loop and the store's writer
thread), with the store's default ``synchronous = "full"`` (an fsync per commit) and
with ``"normal"`` (a child conversation's own commits skip the fsync either way: see
``agentik.core.agents``, "Durability").  Goal: a child run adds at most 1 ms of CPU
to a turn.  The ratio printed is agentik / baseline per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agentik.core import Agent, Conversation, SQLiteStore, tool
from agentik.core.agents import AgentSpec
from agentik.core.llm.base import LLMRequest
from agentik.core.store.sqlite import Synchronous
from agentik.core.testing.scripted import Reply, ScriptedModel, call

from _common import Row, finish, ms, say, say_environment, version

GOAL = 1e-3  # seconds of CPU a child run may add to a turn


@tool(
    description="Echo the text",
    parameters={"type": "object", "properties": {"task": {"type": "string"}}},
)
async def echo(task: str = "") -> str:
    return task


def main_model(tool_name: str) -> ScriptedModel:
    """Calls ``tool_name`` once per turn, then answers with the result."""

    def decide(request: LLMRequest) -> Reply:
        last = request.messages[-1]
        if last.role == "tool":
            return Reply(text=f"result: {last.content}")
        return Reply(tool_calls=[call(tool_name, {"task": "say hi"})])

    return ScriptedModel(default=decide)


async def turns(
    tool_name: str, n: int, rounds: int, folder: Path, synchronous: Synchronous
) -> list[float]:
    """CPU seconds per turn, one figure per round of ``n`` turns."""
    helper = ScriptedModel(default=lambda r: Reply(text="hi"))
    agent = Agent(
        llm=main_model(tool_name),
        profiles={"helper": helper},
        store=SQLiteStore(str(folder / f"{tool_name}-{synchronous}.db"), synchronous=synchronous),
        tools=[echo],
        agents={"helper": AgentSpec(description="Says hi.", model="helper")},
        uses=("helper",),
    )
    per_turn: list[float] = []
    async with agent:
        # One conversation per turn of a round, so no context grows long (each
        # gets one turn per round): the figure is a turn's cost, not history's.
        convs = [await agent.create_conversation(title=f"bench {i}") for i in range(n)]
        sub = agent.events(kinds=["run_stream_end"])

        async def one(conv: Conversation) -> None:
            run_id = await conv.send("go")
            async for e in sub:
                if e.run_id == run_id:
                    return

        for conv in convs[:5]:  # warm up: imports, caches, the first writes
            await one(conv)
        for _ in range(rounds):
            c0 = time.process_time()
            for conv in convs:
                await one(conv)
            per_turn.append((time.process_time() - c0) / n)
        await sub.aclose()
    return per_turn


async def measure(n: int, rounds: int, synchronous: Synchronous) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        plain: list[float] = []
        child: list[float] = []
        # Interleaved, so drift of a loaded machine hits both sides alike.
        for _ in range(2):
            plain += await turns("echo", n, rounds, folder, synchronous)
            child += await turns("agent__helper", n, rounds, folder, synchronous)
    return statistics.median(plain), statistics.median(child)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a much smaller run")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the goal is missed")
    args = parser.parse_args()
    started = time.perf_counter()
    say_environment([("agentik", version("agentik"))])
    n, rounds = (20, 2) if args.quick else (200, 5)
    say(f"== {n} turns x {rounds} rounds x 2, each side; CPU per turn (median of rounds)")
    rows: list[Row] = []
    # The store's default (fsync at every commit) and "normal" (WAL, no fsync per commit).
    for synchronous in ("full", "normal"):
        plain, child = asyncio.run(measure(n, rounds, synchronous))
        extra = child - plain
        say(f"synchronous={synchronous}")
        say(f"  plain tool call turn: {ms(plain)} CPU")
        say(f"  agent call turn:      {ms(child)} CPU ({extra * 1e3:+.2f} ms for the child run)")
        rows += [
            Row(f"turn with a child run, {synchronous} (CPU)", ms(child), ms(plain),
                child / plain, "-", None),
            Row(f"child run overhead, {synchronous} (CPU)", ms(extra), "-", None,
                f"<= {ms(GOAL)}", extra <= GOAL),
        ]  # fmt: skip
    return finish(rows, strict=args.strict, started=started)


if __name__ == "__main__":
    sys.exit(main())
