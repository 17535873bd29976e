"""The turn queue on PostgreSQL: what it adds to a turn, and how soon a queued turn runs.

Measured in one process against a real PostgreSQL (tests/pgserver.py starts one, as
for the tests), with an instant scripted model (so the costs shown are agentik's):

* **CPU per turn** (``time.process_time``, the whole process: the agent and the
  asyncpg client), turns of one conversation submitted one after another, each
  awaited to its end: submitted to the conversation directly (the baseline, as a
  single worker or an IRC channel's turns run) against submitted through the turn
  queue by the worker holding the conversation's lease (what every HTTP API turn
  does with several workers).  Rounds alternate; medians and the range of rounds.
* **Claim latency**: two workers (two agents, each with its own store, pool and
  listening connection, in this process): worker B queues a turn of a
  conversation worker A holds; from B's call to submit it (the message and its
  queue row committed, then the ``NOTIFY``) to A's turn starting (its
  ``TurnStarted`` event: A's claim, ``FOR UPDATE SKIP LOCKED``, and the turn's
  set-up).

Without PostgreSQL (``make postgres``) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _common import Row, finish, ms, process_cpu, say, say_environment, version

TESTS_FOLDER = str(Path(__file__).resolve().parent.parent / "tests")


async def _agent(dsn: str, name: str) -> Any:
    from agentik.core import Agent
    from agentik.core.cluster import ClusterSettings
    from agentik.core.cluster.conversations import TurnQueue
    from agentik.core.store.postgres import PostgresStore
    from agentik.core.testing.scripted import ScriptedModel

    agent = Agent(llm=ScriptedModel(default=lambda req: "ok"), store=PostgresStore(dsn))
    await agent.start()
    queue = TurnQueue(agent, name, ClusterSettings(lease_seconds=30, heartbeat_seconds=5))

    async def admit(conv: Any, turn: Any, message: Any) -> Any:
        return None, conv.settings

    queue.front_end("bench", admit)
    agent.turn_queue = queue
    await queue.start()
    await agent.store.notifier().listening()
    return agent


async def _close(agent: Any) -> None:
    if agent.turn_queue is not None:
        await agent.turn_queue.aclose()
    await agent.aclose()


async def cpu_per_turn(dsn: str, turns: int, rounds: int) -> list[Row]:
    agent = await _agent(dsn, "a")
    try:
        queue = agent.turn_queue
        direct_conv = await agent.create_conversation(title="direct")
        queued_conv = await agent.create_conversation(title="queued")

        async def direct(n: int) -> float:
            t0 = process_cpu()
            for i in range(n):
                await direct_conv.send(f"m{i}")
                await direct_conv.wait_idle()
            return (process_cpu() - t0) / n

        async def queued(n: int) -> float:
            t0 = process_cpu()
            for i in range(n):
                _, here = await queue.submit(
                    queued_conv, f"m{i}", author=None, author_id=None, channel=None,
                    settings=queued_conv.settings, payload={"via": "bench"},
                )  # fmt: skip
                assert here
                await queue.settled(queued_conv.id)
            return (process_cpu() - t0) / n

        await direct(10)
        await queued(10)  # warm: connections, statements, the lease
        a: list[float] = []
        b: list[float] = []
        for _ in range(rounds):
            a.append(await direct(turns))
            b.append(await queued(turns))
    finally:
        await _close(agent)
    da, db = statistics.median(a), statistics.median(b)
    say(f"CPU per turn, direct: {ms(da)} ({ms(min(a))}-{ms(max(a))}), "
        f"through the queue: {ms(db)} ({ms(min(b))}-{ms(max(b))}), "
        f"+{ms(db - da)} ({db / da:.2f}x)")  # fmt: skip
    return [
        Row("CPU per turn through the turn queue (PostgreSQL)", ms(db), f"{ms(da)} direct",
            db / da, "info", None),
    ]  # fmt: skip


async def claim_latency(dsn: str, samples: int) -> list[Row]:
    from agentik.core.events import TurnStarted

    a = await _agent(dsn, "a")
    b = await _agent(dsn, "b")
    latencies: list[float] = []
    try:
        conv_a = await a.create_conversation(title="claimed")
        # A holds the conversation (it ran a turn of it).
        await a.turn_queue.submit(conv_a, "first", author=None, author_id=None, channel=None,
                                  settings=conv_a.settings, payload={"via": "bench"})  # fmt: skip
        await a.turn_queue.settled(conv_a.id)
        conv_b = await b.get_conversation(conv_a.id)
        started: dict[str, float] = {}
        seen = asyncio.Event()

        async def follow() -> None:
            async for event in a.events():
                if isinstance(event, TurnStarted):
                    started[event.run_id or ""] = time.perf_counter()
                    seen.set()

        follower = asyncio.create_task(follow())
        await asyncio.sleep(0.1)
        try:
            for i in range(samples):
                seen.clear()
                sent = time.perf_counter()
                run_id, here = await b.turn_queue.submit(
                    conv_b, f"q{i}", author=None, author_id=None, channel=None,
                    settings=conv_b.settings, payload={"via": "bench"},
                )  # fmt: skip
                assert not here
                while run_id not in started:
                    await asyncio.wait_for(seen.wait(), 30)
                    seen.clear()
                latencies.append(started[run_id] - sent)
                await a.turn_queue.settled(conv_a.id)
        finally:
            follower.cancel()
    finally:
        await _close(b)
        await _close(a)
    latencies.sort()
    med = statistics.median(latencies)
    p95 = latencies[max(0, int(len(latencies) * 0.95) - 1)]
    say(f"claim latency (B submits, A starts the turn): median {ms(med)}, p95 {ms(p95)}, "
        f"best {ms(latencies[0])}, worst {ms(latencies[-1])}")  # fmt: skip
    return [
        Row("claim latency (another worker queues), median", ms(med), f"p95 {ms(p95)}", None,
            "info", None),
    ]  # fmt: skip


async def main_async(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    say_environment([("agentik", version("agentik")), ("asyncpg", version("asyncpg"))])
    sys.path.insert(0, TESTS_FOLDER)
    from pgserver import TESTS, PostgresServer, empty_database, find_binaries, make_template

    bindir = find_binaries()
    if bindir is None:
        say("PostgreSQL is not installed (make postgres): nothing to measure")
        return 0
    server = PostgresServer(bindir)
    try:
        server.start()
        await make_template(server)
        dsn = server.dsn(TESTS)
        rows = await cpu_per_turn(dsn, args.turns, args.rounds)
        await empty_database(dsn)
        rows += await claim_latency(dsn, args.samples)
    finally:
        server.stop()
    return finish(rows, strict=False, started=started)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smaller run")
    p.add_argument("--turns", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--samples", type=int, default=None)
    args = p.parse_args()
    args.turns = args.turns or (30 if args.quick else 100)
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.samples = args.samples or (10 if args.quick else 30)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
