#!/usr/bin/env python3
"""The event loop's CPU per turn on the core's event path, this checkout against another.

Run with ``.venv/bin/python benchmarks/bench_event_path.py --base-src OTHER/src`` (for
example a ``git archive`` of ``main`` unpacked in ``/tmp``); ``--quick`` is a smaller run.
Without ``--base-src`` the baseline is this checkout too (the spread of the machine).

Each measurement is a child process (``--child``) that runs an agent with the scripted
model (no network: only the core's own work is on the loop) and a ``MemoryStore``:
``--turns`` turns, each in a new conversation, ``--window`` at a time, each read to its
``turn_ended`` through a ``chat`` subscriber, while three agent-wide followers read the
kinds a bot's metrics, health and background jobs read.  It reports the loop thread's
CPU time (``time.thread_time``) per turn after a warm-up.  The two checkouts take
``--pairs`` turns alternately (A B, then B A) and the table gives the mean of each and
the ratio (issue 31: fewer events offered, weighed and woken per turn).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import Row, finish, say

ROOT = Path(__file__).resolve().parent.parent


async def _child(turns: int, window: int) -> float:
    from agentik.core import Agent, MemoryStore
    from agentik.core.testing.scripted import ScriptedModel

    agent = Agent(llm=ScriptedModel(), store=MemoryStore())
    async with agent:
        followers = [
            agent.events(kinds=kinds, max_pending=100_000)
            for kinds in (
                {"turn_ended", "tool_call_ended", "error", "compacted"},
                {"turn_ended", "error"},
                {"turn_ended", "compacted", "conversation_ended", "memory_noted"},
            )
        ]

        async def follow(sub: object) -> None:
            async for _ in sub:  # type: ignore[attr-defined]
                pass

        tasks = [asyncio.create_task(follow(s)) for s in followers]

        async def one(i: int) -> None:
            conv = await agent.create_conversation()
            sub = conv.events(profile="chat")
            await conv.send(f"question number {i}: how are you today?")
            async for e in sub:
                if e.kind == "turn_ended":
                    break
            await sub.aclose()

        async def run(n: int) -> None:
            slots = asyncio.Semaphore(window)

            async def go(i: int) -> None:
                async with slots:
                    await one(i)

            await asyncio.gather(*(go(i) for i in range(n)))

        await run(max(20, turns // 10))  # warm-up
        started = time.thread_time()
        await run(turns)
        spent = time.thread_time() - started
        for t in tasks:
            t.cancel()
        return spent / turns


def _measure(src: Path, turns: int, window: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--turns", str(turns), "--window", str(window)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run")
    parser.add_argument("--base-src", type=Path, help="the other checkout's src folder")
    parser.add_argument("--turns", type=int, default=None, help="measured turns per child")
    parser.add_argument("--window", type=int, default=16, help="turns at a time")
    parser.add_argument("--pairs", type=int, default=None, help="children per checkout")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    turns = args.turns or (200 if args.quick else 800)
    if args.child:
        print(asyncio.run(_child(turns, args.window)))
        return 0
    pairs = args.pairs or (2 if args.quick else 8)
    here = ROOT / "src"
    base = args.base_src or here
    say(f"== event path: {pairs} pairs of {turns} turns, {args.window} at a time")
    say(f"   this checkout {here}; baseline {base}")
    mine: list[float] = []
    theirs: list[float] = []
    for i in range(pairs):
        order = [(here, mine), (base, theirs)]
        for src, into in order if i % 2 == 0 else reversed(order):
            into.append(_measure(src, turns, args.window))
        say(f"   pair {i + 1}: this {mine[-1] * 1e6:.0f} µs, baseline {theirs[-1] * 1e6:.0f} µs")
    a, b = statistics.mean(mine), statistics.mean(theirs)
    rows = [
        Row(
            "loop CPU per turn (mean of the pairs)",
            f"{a * 1e6:.0f} µs",
            f"{b * 1e6:.0f} µs",
            a / b,
            "-",
            None,
        )
    ]
    return finish(rows, strict=False)


if __name__ == "__main__":
    sys.exit(main())
