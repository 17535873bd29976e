#!/usr/bin/env python3
"""Benchmark: what agentik adds to a webhook round trip, against a bare echo webhook.

Run with ``.venv/bin/python examples/agentik-webhook/bench_webhook.py`` (``--quick``:
a smaller run).  Both sides are measured in the same run, with the same HTTP client
posting messages and the same callback server receiving the answers on 127.0.0.1:

* **agentik**: ``WebhookTransport`` + the bot's ``Bridge`` + an ``Agent`` on a SQLite
  file (``synchronous`` ``normal`` and ``full``) + the scripted model (it echoes);
* **baseline**: a bare aiohttp endpoint that answers ``202`` and POSTs
  ``"echo: <text>"`` to the callback, with nothing stored.

Measurements: the round trip of one message at a time (POST sent → answer received;
median and 95th percentile), and the throughput of many channels at once (each
channel sends its next message once the previous one is answered).  Ratios are
agentik / baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib import metadata
from pathlib import Path

import aiohttp
from agentik_webhook import WebhookTransport
from aiohttp import web

from agentik.bot.bridge import Bridge
from agentik.core import Agent, SQLiteStore
from agentik.core.testing.scripted import ScriptedModel


class Callback:
    """Receives answers; wakes whoever waits for the answer to a given text."""

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[float]] = {}
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/answers", self.answer)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/answers"

    async def answer(self, request: web.Request) -> web.Response:
        payload = await request.json()
        future = self.waiting.pop(payload["text"].removeprefix("echo: "), None)
        if future is not None and not future.done():
            future.set_result(time.perf_counter())
        return web.Response(status=204)

    def expect(self, text: str) -> asyncio.Future[float]:
        future = asyncio.get_running_loop().create_future()
        self.waiting[text] = future
        return future


@asynccontextmanager
async def agentik_webhook(callback: Callback, synchronous: str) -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        agent = Agent(
            llm=ScriptedModel(),
            store=SQLiteStore(str(Path(tmp) / "bench.db"), synchronous=synchronous),  # type: ignore[arg-type]
        )
        await agent.start()
        bridge = Bridge(agent)
        transport = WebhookTransport(
            name="bench", settings={"port": 0, "callback_url": callback.url}
        )
        bridge.attach(transport)
        await transport.start(bridge)
        try:
            yield transport.url
        finally:
            await transport.aclose()
            await bridge.aclose()
            await agent.aclose()


@asynccontextmanager
async def bare_webhook(callback: Callback) -> AsyncIterator[str]:
    session = aiohttp.ClientSession()
    tasks: set[asyncio.Task[None]] = set()

    async def forward(text: str) -> None:
        async with session.post(callback.url, json={"text": f"echo: {text}"}) as resp:
            await resp.read()

    async def incoming(request: web.Request) -> web.Response:
        data = await request.json()
        task = asyncio.create_task(forward(data["text"]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return web.json_response({"ok": True}, status=202)

    app = web.Application()
    app.router.add_post("/webhook", incoming)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/webhook"
    finally:
        await asyncio.gather(*tasks)
        await runner.cleanup()
        await session.close()


async def round_trips(
    url: str, callback: Callback, http: aiohttp.ClientSession, channel: str, count: int
) -> list[float]:
    """``count`` messages, one at a time, from ``channel``; each one's round trip in seconds."""
    times = []
    for i in range(count):
        text = f"{channel} message {i}"
        answered = callback.expect(text)
        start = time.perf_counter()
        # A private message per "channel" (a user): always answered, its own conversation.
        async with http.post(url, json={"user": channel, "text": text}) as resp:
            assert resp.status == 202, await resp.text()
        times.append(await asyncio.wait_for(answered, 30) - start)
    return times


Server = Callable[[Callback], AbstractAsyncContextManager[str]]


async def measure(server: Server, quick: bool) -> tuple[list[float], float]:
    callback = Callback()
    await callback.start()
    try:
        async with server(callback) as url, aiohttp.ClientSession() as http:
            await round_trips(url, callback, http, "warmup", 10)
            sequential = await round_trips(url, callback, http, "dm", 50 if quick else 300)
            channels, each = (5, 10) if quick else (20, 25)
            start = time.perf_counter()
            await asyncio.gather(
                *(round_trips(url, callback, http, f"room{c}", each) for c in range(channels))
            )
            rate = channels * each / (time.perf_counter() - start)
    finally:
        assert callback.runner is not None
        await callback.runner.cleanup()
    return sequential, rate


def p95(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.95) - 1]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a much smaller run")
    quick = parser.parse_args().quick
    print(
        f"agentik {metadata.version('agentik')}, agentik-webhook "
        f"{metadata.version('agentik-webhook')}, aiohttp {aiohttp.__version__}"
    )
    base_seq, base_rate = await measure(bare_webhook, quick)
    rows = []
    for sync in ("normal", "full"):

        def server(cb: Callback, sync: str = sync) -> AbstractAsyncContextManager[str]:
            return agentik_webhook(cb, sync)

        seq, rate = await measure(server, quick)
        med, bmed = statistics.median(seq), statistics.median(base_seq)
        rows += [
            (f"round trip, median (synchronous={sync})", med * 1e3, bmed * 1e3, "ms"),
            (f"round trip, p95 (synchronous={sync})", p95(seq) * 1e3, p95(base_seq) * 1e3, "ms"),
            (f"throughput, many channels (synchronous={sync})", rate, base_rate, "msg/s"),
        ]
    width = max(len(r[0]) for r in rows)
    print(f"{'measurement':<{width}}  {'agentik':>14}  {'baseline':>14}  {'ratio':>7}")
    for name, ours, theirs, unit in rows:
        print(
            f"{name:<{width}}  {ours:>8.2f} {unit:<5}  {theirs:>8.2f} {unit:<5}  "
            f"{ours / theirs:>6.2f}x"
        )


if __name__ == "__main__":
    asyncio.run(main())
