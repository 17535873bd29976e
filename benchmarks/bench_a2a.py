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

* **A2A, tasks in memory**: the same as A2A, against a second server whose store
  keeps no task records (the SDK's in-memory task store, as before tasks were
  stored): what keeping task records in the store costs.

Reported: the median and p90 time per turn for each, and their ratios (A2A /
baseline; A2A / A2A with tasks in memory).  Goals: A2A costs at most 2x the
native API per turn (the SDK's protobuf conversions, its task store and event
queue on top of the same turn); stored task records at most 1.25x in-memory ones.
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
from typing import Any

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
    from agentik.core.store.base import Store
    from agentik.core.testing.scripted import ScriptedModel
    from agentik.transports.http.transport import HttpTransport

    answer = " ".join(f"word{i}" for i in range(args.words))
    model = ScriptedModel(default=lambda request: answer)

    class NoTaskRecords(SQLiteStore):
        """A store keeping no A2A task records: the SDK's in-memory task store serves."""

        a2a_task_put = Store.a2a_task_put

    async def serve(store: SQLiteStore) -> tuple[Agent, Bridge, HttpTransport]:
        agent = Agent(llm=model, store=store)
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
        return agent, bridge, transport

    with tempfile.TemporaryDirectory() as folder:
        agent, bridge, transport = await serve(SQLiteStore(str(Path(folder) / "bench.db")))
        assert "a2a_tasks" in agent.store.capabilities
        agent_m, bridge_m, transport_m = await serve(NoTaskRecords(str(Path(folder) / "m.db")))
        assert "a2a_tasks" not in agent_m.store.capabilities
        assert transport.url is not None and transport_m.url is not None
        http = httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        client = await create_client(transport.url, ClientConfig(httpx_client=http))
        client_m = await create_client(transport_m.url, ClientConfig(httpx_client=http))
        remote = RemoteAgent(transport.url, token=TOKEN)

        async def a2a_turn(on: Any = client) -> None:
            request = SendMessageRequest(
                message=Message(
                    message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[Part(text="hi")]
                )
            )
            async for _ in on.send_message(request):
                pass

        async def a2a_memory_turn() -> None:
            await a2a_turn(client_m)

        async def native_turn() -> None:
            conv = await remote.create_conversation()
            events = conv.events(after=0)
            run_id = await conv.send("hi")
            async for event in events:
                if event.kind == "turn_ended" and event.run_id == run_id:
                    break
            await events.aclose()

        times: dict[str, list[float]] = {"a2a": [], "native": [], "memory": []}
        sides = (("a2a", a2a_turn), ("native", native_turn), ("memory", a2a_memory_turn))
        try:
            for _, turn in sides:  # warm-up
                await turn()
            for _ in range(args.rounds):
                for name, turn in sides:
                    for _ in range(args.turns):
                        t0 = time.perf_counter()
                        await turn()
                        times[name].append(time.perf_counter() - t0)
        finally:
            await remote.aclose()
            await http.aclose()
            for t, b, a in ((transport, bridge, agent), (transport_m, bridge_m, agent_m)):
                await t.aclose()
                await b.aclose()
                await a.aclose()

    def p(values: list[float], q: float) -> float:
        return sorted(values)[min(len(values) - 1, int(q * len(values)))]

    a2a_med, native_med = statistics.median(times["a2a"]), statistics.median(times["native"])
    memory_med = statistics.median(times["memory"])
    say(f"== {len(times['a2a'])} turns each, answers of {args.words} words")
    return [
        Row("turn, median", ms(a2a_med), ms(native_med), a2a_med / native_med, "<= 2x",
            a2a_med <= 2 * native_med),
        Row("turn, p90", ms(p(times["a2a"], 0.9)), ms(p(times["native"], 0.9)),
            p(times["a2a"], 0.9) / p(times["native"], 0.9), "-", None),
        Row("stored tasks vs in memory, median", ms(a2a_med), ms(memory_med),
            a2a_med / memory_med, "<= 1.25x", a2a_med <= 1.25 * memory_med),
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
