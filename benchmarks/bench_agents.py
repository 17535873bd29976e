#!/usr/bin/env python3
"""The CPU cost of calling an agent as a tool (a child run), against a plain tool call.

Run with ``.venv/bin/python benchmarks/bench_agents.py`` (``make bench``); ``--quick`` is
a smaller run.  Both sides run whole turns, with an instant scripted
model (no network, no sleeping) and a real SQLite store:

* baseline: the model calls a plain tool (``echo``) once, then answers;
* agentik: the model calls ``agent__helper`` once — a child run: a new conversation,
  its user message, its model request and answer, the run-tree rows, the events relayed
  into the parent's stream — then answers.

The two agents live side by side and run alternating blocks of turns (plain, child,
child, plain, …); the overhead is the median of each block pair's difference, so the
drift of a shared machine over the run hits both sides alike.

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

from _common import Row, finish, ms, process_cpu, say, say_environment, version

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


class Side:
    """One side of the comparison: an agent whose model calls ``tool_name`` each turn."""

    def __init__(self, tool_name: str, n: int, folder: Path, synchronous: Synchronous) -> None:
        helper = ScriptedModel(default=lambda r: Reply(text="hi"))
        self.agent = Agent(
            llm=main_model(tool_name),
            profiles={"helper": helper},
            store=SQLiteStore(
                str(folder / f"{tool_name}-{synchronous}.db"), synchronous=synchronous
            ),
            tools=[echo],
            agents={"helper": AgentSpec(description="Says hi.", model="helper")},
            uses=("helper",),
        )
        self.n = n
        self.convs: list[Conversation] = []

    async def start(self) -> None:
        await self.agent.start()
        # One conversation per turn of a block, so no context grows long (each
        # gets one turn per block): the figure is a turn's cost, not history's.
        self.convs = [
            await self.agent.create_conversation(title=f"bench {i}") for i in range(self.n)
        ]
        self.sub = self.agent.events(kinds=["run_stream_end"])
        for conv in self.convs[:5]:  # warm up: imports, caches, the first writes
            await self.one(conv)

    async def one(self, conv: Conversation) -> None:
        run_id = await conv.send("go")
        async for e in self.sub:
            if e.run_id == run_id:
                return

    async def block(self) -> float:
        """CPU seconds per turn over one block of ``n`` turns."""
        c0 = process_cpu()
        for conv in self.convs:
            await self.one(conv)
        return (process_cpu() - c0) / self.n

    async def aclose(self) -> None:
        await self.sub.aclose()
        await self.agent.aclose()


async def measure(n: int, blocks: int, synchronous: Synchronous) -> tuple[float, float, float]:
    """Median CPU per turn of each side, and the median of the paired differences.

    Both agents live side by side and run alternating blocks (plain, child,
    child, plain, …), so the machine's drift over the run hits both sides alike;
    each block's difference is taken against its neighbour.
    """
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        plain, child = (
            Side("echo", n, folder, synchronous),
            Side("agent__helper", n, folder, synchronous),
        )
        await plain.start()
        await child.start()
        try:
            p: list[float] = []
            c: list[float] = []
            for i in range(blocks):
                order = (plain, child) if i % 2 == 0 else (child, plain)
                first, second = await order[0].block(), await order[1].block()
                a, b = (first, second) if i % 2 == 0 else (second, first)
                p.append(a)
                c.append(b)
        finally:
            await child.aclose()
            await plain.aclose()
    diffs = [b - a for a, b in zip(p, c, strict=True)]
    return statistics.median(p), statistics.median(c), statistics.median(diffs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a much smaller run")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the goal is missed")
    args = parser.parse_args()
    started = time.perf_counter()
    say_environment([("agentik", version("agentik"))])
    n, blocks = (20, 4) if args.quick else (50, 40)
    say(f"== {blocks} alternating blocks of {n} turns, each side; CPU per turn (median of blocks)")
    rows: list[Row] = []
    # The store's default (fsync at every commit) and "normal" (WAL, no fsync per commit).
    for synchronous in ("full", "normal"):
        plain, child, extra = asyncio.run(measure(n, blocks, synchronous))
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
