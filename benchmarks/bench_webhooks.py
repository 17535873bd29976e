#!/usr/bin/env python3
"""What outbound webhooks cost a busy bot: turns per second with webhooks on against off.

Run with ``.venv/bin/python benchmarks/bench_webhooks.py`` (``--quick``: a smaller run).
Two agents live side by side in one process, each on its own real SQLite file, with an
instant scripted model: ``off`` has no webhook, ``on`` has two ``[[webhooks]]`` receivers
(the default events, so each turn makes two deliveries).  The receiver is a separate
process (aiohttp on 127.0.0.1) answering 204 at once, so its CPU is not ours.

Load: ``--conversations`` conversations send a turn each at once, ``--turns`` rounds per
block.  A block of ``on`` ends when every turn has ended *and* every delivery of the
block is recorded as delivered (a backlog would otherwise move into the next block).  The
two sides run alternating blocks (off, on, on, off, …) so a shared machine's drift hits
both alike; the figures are the medians of the blocks: turns/s and the process's CPU per
turn (the steadier figure on a shared machine), each as the ratio on / off.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentik.bot.webhooks import Webhooks, WebhookSettings
from agentik.core import Agent, Conversation, SQLiteStore
from agentik.core.testing.scripted import ScriptedModel

from _common import Row, finish, free_port, ms, process_cpu, say, say_environment, version

_RECEIVER = """
import sys
from aiohttp import web

seen = 0

async def hook(request):
    global seen
    await request.read()
    seen += 1
    return web.Response(status=204)

async def count(request):
    return web.Response(text=str(seen))

app = web.Application()
app.router.add_post("/hook", hook)
app.router.add_get("/count", count)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=lambda *a: print("up", flush=True))
"""


class Side:
    """An agent with ``conversations`` conversations; two webhooks to ``url`` (``None``:
    none)."""

    def __init__(self, folder: Path, name: str, url: str | None, conversations: int) -> None:
        self.agent = Agent(llm=ScriptedModel(), store=SQLiteStore(str(folder / f"{name}.db")))
        self.webhooks: Webhooks | None = None
        self.url = url
        if url is not None:
            settings = [
                WebhookSettings(name=f"hook{i}", url=url, secret_env="BENCH_WEBHOOK_SECRET")
                for i in range(2)
            ]
            self.webhooks = Webhooks(self.agent, settings)
        self.n = conversations
        self.convs: list[Conversation] = []
        self.sent = 0

    async def start(self) -> None:
        await self.agent.start()
        if self.webhooks is not None:
            await self.webhooks.start()
        self.convs = [
            await self.agent.create_conversation(title=f"bench {i}") for i in range(self.n)
        ]
        await self.round()  # warm up

    async def round(self) -> None:
        """One turn in every conversation at once; returns when all have ended."""
        sub = self.agent.events(kinds=["run_stream_end"], max_pending=100_000)
        try:
            runs = {await c.send("hello", author="bench") for c in self.convs}
            async for e in sub:
                runs.discard(e.run_id)
                if not runs:
                    break
        finally:
            await sub.aclose()
        self.sent += self.n

    async def drained(self) -> None:
        """Until every delivery so far is recorded as delivered."""
        if self.webhooks is None:
            return
        import aiohttp

        want = 2 * self.sent
        assert self.url is not None
        async with aiohttp.ClientSession() as session:
            while True:
                async with session.get(self.url.replace("/hook", "/count")) as r:
                    seen = int(await r.text())
                if seen >= want and await self.agent.store.webhook_next_due() is None:
                    return
                await asyncio.sleep(0.02)

    async def block(self, rounds: int) -> tuple[float, float]:
        """Turns per second over ``rounds`` rounds (deliveries included), and the
        process's CPU seconds per turn (the event loop and the store's writer thread)."""
        t0, c0 = time.perf_counter(), process_cpu()
        for _ in range(rounds):
            await self.round()
        await self.drained()
        turns = rounds * self.n
        return turns / (time.perf_counter() - t0), (process_cpu() - c0) / turns

    async def aclose(self) -> None:
        if self.webhooks is not None:
            await self.webhooks.aclose()
        await self.agent.aclose()


async def measure(
    url: str, conversations: int, rounds: int, blocks: int
) -> tuple[tuple[float, float], tuple[float, float]]:
    """(turns/s, CPU s per turn) of the off side and of the on side, medians of blocks."""
    with tempfile.TemporaryDirectory() as tmp:
        off = Side(Path(tmp), "off", None, conversations)
        on = Side(Path(tmp), "on", url, conversations)
        await off.start()
        await on.start()
        await on.drained()
        try:
            a: list[tuple[float, float]] = []
            b: list[tuple[float, float]] = []
            for i in range(blocks):
                if i % 2 == 0:
                    a.append(await off.block(rounds))
                    b.append(await on.block(rounds))
                else:
                    b.append(await on.block(rounds))
                    a.append(await off.block(rounds))
        finally:
            await on.aclose()
            await off.aclose()

    def median(xs: list[tuple[float, float]]) -> tuple[float, float]:
        return statistics.median(x for x, _ in xs), statistics.median(c for _, c in xs)

    return median(a), median(b)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a much smaller run")
    parser.add_argument("--conversations", type=int, default=50)
    parser.add_argument("--strict", action="store_true", help="exit 1 when the goal is missed")
    args = parser.parse_args()
    started = time.perf_counter()
    say_environment([("agentik", version("agentik"))])
    rounds, blocks = (2, 4) if args.quick else (4, 10)
    os.environ["BENCH_WEBHOOK_SECRET"] = "bench-secret-0123456789"
    port = free_port()
    receiver = subprocess.Popen(
        [sys.executable, "-c", _RECEIVER, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert receiver.stdout is not None
        receiver.stdout.readline()  # "up"
        say(
            f"== {blocks} alternating blocks of {rounds} rounds x {args.conversations}"
            " concurrent turns; two webhooks on the 'on' side"
        )
        (off, off_cpu), (on, on_cpu) = asyncio.run(
            measure(f"http://127.0.0.1:{port}/hook", args.conversations, rounds, blocks)
        )
    finally:
        receiver.terminate()
        receiver.wait()
    say(f"  webhooks off: {off:,.0f} turns/s, {ms(off_cpu)} CPU per turn")
    say(f"  webhooks on:  {on:,.0f} turns/s, {ms(on_cpu)} CPU per turn (deliveries included)")
    rows = [
        Row("turns/s, webhooks on vs off", f"{on:,.0f} turns/s", f"{off:,.0f} turns/s",
            on / off, ">= 0.8x", on / off >= 0.8),
        Row("CPU per turn, webhooks on vs off", ms(on_cpu), ms(off_cpu), on_cpu / off_cpu,
            "-", None),
    ]  # fmt: skip
    return finish(rows, strict=args.strict, started=started)


if __name__ == "__main__":
    sys.exit(main())
