#!/usr/bin/env python3
"""The per-turn cost of Prometheus metrics (issue 21), against turns without them.

Run with ``.venv/bin/python benchmarks/bench_metrics.py`` (``make bench``); ``--quick``
is a smaller run.  Every turn runs through a real agent (SQLite database file, the
instant scripted model) and makes one tool call, so it produces the events metrics
count: turn started and ended, a tool call, two model requests with usage.

1. A/B: the CPU time of a batch of turns with a :class:`~agentik.bot.metrics.Metrics`
   following the agent (its event subscription, the request observers, the counting)
   against the same batch without, and without again (an A/A control: what the
   difference between two identical batches is on this machine); the order rotates
   round by round and paired differences are compared.  On a busy machine the
   metrics' cost is within that noise.
2. isolated: the CPU time metrics add to one turn, replayed many times: its events
   published to a metrics subscription and counted by the metrics task (task
   switches included), and its model requests counted by the request observer,
   minus the same publishing without metrics; against the CPU time of one turn
   without metrics (1).  This is the precise figure.

Goal: metrics cost at most 2% of a turn's CPU.  Also: one scrape (``render()``) of the
registry those turns filled (and the first, which imports ``prometheus_client``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentik.bot.metrics import _KINDS, Metrics
from agentik.core import Agent, SQLiteStore
from agentik.core.eventbus import EventBus
from agentik.core.messages import Usage
from agentik.core.observe import RequestStats
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.core.tools.base import tool

from _common import Row, finish, ms, process_cpu, say, say_environment, version

GOAL = 0.02  # of a turn's CPU


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


def _script(model: ScriptedModel, n: int) -> None:
    for i in range(n):
        model.enqueue(
            Reply(tool_calls=[call("lookup", {"key": f"k{i}"})], usage=Usage(prompt_tokens=20,
                  completion_tokens=5, total_tokens=25))
        )  # fmt: skip
        model.enqueue(
            Reply(text=f"answer {i}",
                  usage=Usage(prompt_tokens=30, completion_tokens=3, total_tokens=33))
        )  # fmt: skip


async def _batch(agent: Agent, model: ScriptedModel, n: int) -> float:
    """CPU seconds of ``n`` turns (each with one tool call), one after another."""
    _script(model, n)
    conv = await agent.create_conversation()
    sub = conv.events(kinds=["turn_ended"])
    start = process_cpu()
    for i in range(n):
        await conv.send(f"question {i}", author="bench")
        await anext(aiter(sub))
    cpu = process_cpu() - start
    await sub.aclose()
    return cpu


async def ab(n: int, rounds: int, folder: Path) -> tuple[dict[str, float], float, float, Metrics]:
    """Median CPU per turn of batches without metrics (twice: ``off`` and ``off2``, an
    A/A control that shows the noise) and with; the order rotates round by round.
    Also the medians of the paired relative differences on/off and off2/off."""
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(str(folder / "ab.db")), tools=[lookup])
    metrics = Metrics(agent)
    runs: dict[str, list[float]] = {"off": [], "on": [], "off2": []}
    order = list(runs)
    async with agent:
        await _batch(agent, model, n)  # warm up: imports, caches, the database
        for i in range(rounds):
            for variant in order[i % 3 :] + order[: i % 3]:
                if variant == "on":
                    metrics.start()
                runs[variant].append(await _batch(agent, model, n) / n)
                if variant == "on":
                    await metrics.aclose()
    off = runs["off"]

    def paired(other: list[float]) -> float:
        return statistics.median((b - a) / a for a, b in zip(off, other, strict=True))

    medians = {k: statistics.median(v) for k, v in runs.items()}
    return medians, paired(runs["on"]), paired(runs["off2"]), metrics


async def captured_turn(folder: Path) -> tuple[list[object], list[RequestStats]]:
    """The events metrics read, and the request stats, of one turn."""
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(str(folder / "one.db")), tools=[lookup])
    stats: list[RequestStats] = []
    agent.request_observers.append(stats.append)
    async with agent:
        sub = agent.events(kinds=_KINDS)
        await _batch(agent, model, 1)
        events = []
        async with asyncio.timeout(60):
            async for e in sub:
                events.append(e)
                if e.kind == "turn_ended":
                    break
        await sub.aclose()
    return events, stats


async def isolated(events: list[Any], stats: list[RequestStats], n: int) -> float:
    """CPU seconds per turn of what metrics add: ``events`` published to a metrics
    subscription and counted by its task, plus the request observers, minus the same
    publishing without the subscription (median of 5 runs of ``n`` turns)."""

    def lost(*_: object) -> Any:
        raise AssertionError("the metrics subscription fell behind")

    async def run(with_metrics: bool) -> float:
        bus = EventBus(key=lambda e: e.stream_seq, lost=lost, buffer=16)
        metrics = Metrics()
        task = None
        if with_metrics:
            sub = bus.subscribe(kinds=_KINDS, max_pending=100_000)
            task = asyncio.get_running_loop().create_task(metrics._follow(sub))
        start = process_cpu()
        for _ in range(n):
            for e in events:
                bus.publish(e)
                await asyncio.sleep(0)  # a turn awaits between events: the task runs
            if with_metrics:
                for s in stats:
                    metrics.model_request(s)
                metrics.message_in("irc")
                metrics.message_out("irc", "answer")
        cpu = process_cpu() - start
        if task is not None:
            task.cancel()
        return cpu / n

    times = []
    for _ in range(5):
        times.append(await run(True) - await run(False))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a much smaller run (smoke test)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a goal is missed")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    n, rounds = (50, 3) if args.quick else (100, 15)
    say_environment([("agentik", version("agentik")), ("prometheus", version("prometheus-client"))])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        say(f"== A/B: {rounds} rounds of {n} turns without, with, and again without metrics"
            " (one tool call each)")  # fmt: skip
        medians, paired, control, metrics = asyncio.run(ab(n, rounds, folder))
        off, on = medians["off"], medians["on"]
        say(f"without metrics  {ms(off)} CPU per turn (again: {ms(medians['off2'])})")
        say(f"with metrics     {ms(on)} CPU per turn")
        say(f"paired batches   with metrics {paired:+.1%}; without, again (A/A noise) "
            f"{control:+.1%} (medians of {rounds} rounds)")  # fmt: skip
        events, stats = asyncio.run(captured_turn(folder))
    say(f"== isolated: counting one turn ({len(events)} events, {len(stats)} model requests)")
    cost = asyncio.run(isolated(events, stats, 2_000 if args.quick else 20_000))
    say(f"counting         {cost * 1e6:.1f} µs CPU per turn ({cost / off:.2%} of a turn)")
    start = process_cpu()
    metrics.render()  # the first scrape also imports prometheus_client
    first = process_cpu() - start
    start = process_cpu()
    body, _ = metrics.render()
    scrape = process_cpu() - start
    say(f"== one scrape: {len(body):,} bytes in {ms(scrape)} CPU (the first: {ms(first)},"
        " importing prometheus_client)")  # fmt: skip
    rows = [
        Row("turn CPU with metrics, paired (A/B)", f"{paired:+.1%}", f"A/A {control:+.1%}",
            1 + paired, "info (noisy)", None),
        Row("metrics counting per turn (isolated)", f"{cost * 1e6:.1f} µs", ms(off),
            cost / off, "<= 2% of a turn", cost / off <= GOAL),
        Row("one scrape (render)", ms(scrape), "-", None, "info", None),
    ]  # fmt: skip
    return finish(rows, strict=args.strict, started=started)


if __name__ == "__main__":
    sys.exit(main())
