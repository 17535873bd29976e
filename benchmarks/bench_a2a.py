#!/usr/bin/env python3
"""A2A benchmark: a turn asked over A2A vs the same turn asked over our own HTTP API.

Run with ``.venv/bin/python benchmarks/bench_a2a.py`` (``make bench`` runs it too);
``--quick`` is a smaller run.  One process, one machine: an ``Agent`` (the scripted
model, answering at once in ``--words`` words; a ``SQLiteStore`` file) behind the
``http`` transport with ``[….a2a]`` on, on 127.0.0.1.  Alternating over ``--rounds``:

* **A2A**: ``SendStreamingMessage`` through the a2a-sdk client (a new task and a new
  conversation each time), read to the task's final status;
* **baseline**: :class:`~agentik.core.client.RemoteAgent`: create a conversation,
  open its event stream, post the message, read to ``turn_ended``.

Reported: the median and p90 time per turn for each, and their ratio (A2A /
baseline).  Goal: A2A costs at most 2x the native API per turn (the SDK's protobuf
conversions, its task store and event queue on top of the same turn).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _common import Row, finish, ms, say, say_environment, version

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token-0123456789abcdef"


async def run(args: argparse.Namespace) -> list[Row]:
    import httpx
    from a2a.client import ClientConfig, create_client
    from a2a.types import Message, Part, Role, SendMessageRequest

    from agentik.bot.bridge import Bridge
    from agentik.core import Agent, SQLiteStore
    from agentik.core.client import RemoteAgent
    from agentik.core.testing.scripted import ScriptedModel
    from agentik.transports.http.transport import HttpTransport

    answer = " ".join(f"word{i}" for i in range(args.words))
    model = ScriptedModel(default=lambda request: answer)
    with tempfile.TemporaryDirectory() as folder:
        agent = Agent(llm=model, store=SQLiteStore(str(Path(folder) / "bench.db")))
        await agent.start()
        bridge = Bridge(agent)
        settings = {
            "port": 0,
            "tokens": [{"name": "bench", "env": "BENCH_TOKEN"}],
            "a2a": {"enabled": True},
        }
        transport = HttpTransport(name="web", settings=settings, environ={"BENCH_TOKEN": TOKEN})
        bridge.attach(transport)
        await transport.start(bridge)
        assert transport.url is not None
        http = httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        client = await create_client(transport.url, ClientConfig(httpx_client=http))
        remote = RemoteAgent(transport.url, token=TOKEN)

        async def a2a_turn() -> None:
            request = SendMessageRequest(
                message=Message(
                    message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[Part(text="hi")]
                )
            )
            async for _ in client.send_message(request):
                pass

        async def native_turn() -> None:
            conv = await remote.create_conversation()
            events = conv.events(after=0)
            run_id = await conv.send("hi")
            async for event in events:
                if event.kind == "turn_ended" and event.run_id == run_id:
                    break
            await events.aclose()

        times: dict[str, list[float]] = {"a2a": [], "native": []}
        try:
            for turn in (a2a_turn, native_turn):  # warm-up
                await turn()
            for _ in range(args.rounds):
                for name, turn in (("a2a", a2a_turn), ("native", native_turn)):
                    for _ in range(args.turns):
                        t0 = time.perf_counter()
                        await turn()
                        times[name].append(time.perf_counter() - t0)
        finally:
            await remote.aclose()
            await http.aclose()
            await transport.aclose()
            await bridge.aclose()
            await agent.aclose()

    def p(values: list[float], q: float) -> float:
        return sorted(values)[min(len(values) - 1, int(q * len(values)))]

    a2a_med, native_med = statistics.median(times["a2a"]), statistics.median(times["native"])
    say(f"== {len(times['a2a'])} turns each, answers of {args.words} words")
    return [
        Row("turn, median", ms(a2a_med), ms(native_med), a2a_med / native_med, "<= 2x",
            a2a_med <= 2 * native_med),
        Row("turn, p90", ms(p(times["a2a"], 0.9)), ms(p(times["native"], 0.9)),
            p(times["a2a"], 0.9) / p(times["native"], 0.9), "-", None),
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a much smaller run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=40, help="turns per round and side")
    parser.add_argument("--words", type=int, default=50)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.turns = 2, 10
    started = time.perf_counter()
    say_environment([("a2a-sdk", version("a2a-sdk")), ("agentik", version("agentik"))])
    rows = asyncio.run(run(args))
    return finish(rows, strict=args.strict, started=started)


if __name__ == "__main__":
    sys.exit(main())
