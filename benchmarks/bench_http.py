#!/usr/bin/env python3
"""HTTP+SSE benchmark: many SSE subscribers on one conversation vs in-process subscribers.

Run with ``.venv/bin/python benchmarks/bench_http.py`` (``make bench`` runs it too);
``--quick`` is a much smaller run for smoke tests.  Everything runs on this machine:

* the server, in a child process of its own so its CPU can be measured: an ``Agent``
  (the scripted model, streaming ``--events`` text deltas ``1/--rate`` seconds apart;
  a ``SQLiteStore`` file) and the ``http`` transport (uvicorn on 127.0.0.1);
* the clients, in another child process: ``--subscribers`` lean raw-socket SSE
  clients (HTTP/1.1, chunked) on the conversation's event stream.  Each notes, for
  every event, its receive time minus the event's ``ts`` (set when the agent
  published it; one clock, one machine): the per-event fan-out latency.

The baseline, measured in the same run and the same server process: as many
in-process subscribers (``Conversation.events()``, one asyncio task each) on the
same stream of events — what fan-out costs without HTTP.  Both phases run the same
turn (same events, same rate), alternating over ``--rounds``, and report the
latency p50/p99 over every (event, subscriber) pair and the server process's CPU
(all threads) per event published and per event delivered.  Ratios are
HTTP / in-process.  Goal: HTTP fan-out p99 <= 100 ms at 200 subscribers.  The exit
status is 0 unless ``--strict`` is given and a goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from _common import Row, aclose_all, finish, ms, process_cpu, say, say_environment, version

SCRIPT = os.path.abspath(__file__)
GOAL_P99 = 0.100  # seconds
PACKAGES = ("starlette", "uvicorn", "httptools", "h11")


# -- the server process --------------------------------------------------------------------
async def _server(events: int, rate: float, db: str) -> None:
    """Serve; answer commands on stdin (one JSON object a line) on stdout."""
    from agentik.bot.bridge import Bridge
    from agentik.core import Agent, SQLiteStore
    from agentik.core.testing.scripted import Reply, ScriptedModel
    from agentik.transports.http.transport import HttpTransport

    model = ScriptedModel(
        default=lambda request: Reply(chunks=["word "] * events, delay=1.0 / rate)
    )
    agent = Agent(llm=model, store=SQLiteStore(db), event_buffer=4 * events)
    await agent.start()
    bridge = Bridge(agent)
    transport = HttpTransport(
        name="bench",
        # Every subscriber holds a connection; the cap is for hostile clients.
        settings={"port": 0, "subscriber_queue": 4 * events, "max_connections": 100_000},
        environ={},
    )
    bridge.attach(transport)
    await transport.start(bridge)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    reply({"url": transport.url})
    try:
        while line := await reader.readline():
            cmd = json.loads(line)
            if cmd["do"] == "cpu":
                reply({"cpu": process_cpu()})
            elif cmd["do"] == "inproc":
                reply(await _inproc(agent, cmd["subscribers"]))
            elif cmd["do"] == "quit":
                break
    finally:
        await aclose_all(transport, bridge, agent)


async def _inproc(agent: Any, subscribers: int) -> dict[str, Any]:
    """The baseline: ``subscribers`` in-process subscriptions on one conversation's turn."""
    conv = await agent.create_conversation(title="in-process")
    subs = [conv.events(profile="chat") for _ in range(subscribers)]
    latencies: list[list[float]] = [[] for _ in subs]

    async def follow(i: int) -> None:
        out = latencies[i]
        async for event in subs[i]:
            out.append(time.time() - event.ts)
            if event.kind == "turn_ended":
                return

    tasks = [asyncio.ensure_future(follow(i)) for i in range(subscribers)]
    cpu0, t0 = process_cpu(), time.perf_counter()
    await conv.send("go", author="bench")
    await asyncio.gather(*tasks)
    cpu, elapsed = process_cpu() - cpu0, time.perf_counter() - t0
    for sub in subs:
        await sub.aclose()
    published = len(latencies[0])
    await agent.delete_conversation(conv.id)
    return {
        "latencies": [x for per in latencies for x in per],
        "published": published,
        "cpu": cpu,
        "elapsed": elapsed,
    }


# -- the client process --------------------------------------------------------------------
async def _client(url: str, subscribers: int) -> None:
    """Open ``subscribers`` streams, start a turn, note each event's latency."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    api = "/agentik"

    async def request(method: str, path: str, body: bytes = b"") -> dict[str, Any]:
        reader, writer = await asyncio.open_connection(host, int(port))
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode() + body)
        data = await reader.read()
        writer.close()
        return json.loads(data.split(b"\r\n\r\n", 1)[1] or b"{}")

    conv = await request("POST", api + "/conversations", b'{"title": "sse"}')
    path = f"{api}/conversations/{conv['id']}/events?profile=chat"
    latencies: list[list[float]] = [[] for _ in range(subscribers)]
    ready = 0
    all_ready = asyncio.Event()

    async def follow(i: int) -> None:
        nonlocal ready
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        await reader.readuntil(b"\r\n\r\n")  # the response head
        ready += 1
        if ready == subscribers:
            all_ready.set()
        out = latencies[i]
        try:
            while True:
                size = int(await reader.readuntil(b"\r\n"), 16)
                if size == 0:
                    return
                frame = await reader.readexactly(size + 2)
                now = time.time()
                at = frame.find(b'"ts":')
                if at < 0:
                    continue  # retry: or a heartbeat
                end = frame.find(b",", at)
                out.append(now - float(frame[at + 5 : end]))
                if b'"kind":"turn_ended"' in frame:
                    return
        finally:
            writer.close()

    tasks = [asyncio.ensure_future(follow(i)) for i in range(subscribers)]
    await all_ready.wait()
    cpu0 = process_cpu()
    await request("POST", f"{api}/conversations/{conv['id']}/messages", b'{"content": "go"}')
    await asyncio.gather(*tasks)
    print(
        json.dumps(
            {
                "latencies": [x for per in latencies for x in per],
                "published": len(latencies[0]),
                "client_cpu": process_cpu() - cpu0,
            }
        ),
        flush=True,
    )
    await request("DELETE", f"{api}/conversations/{conv['id']}")


# -- the parent --------------------------------------------------------------------------------
@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)
    published: int = 0
    delivered: int = 0
    cpu: float = 0.0
    client_cpu: float = 0.0

    def add(self, latencies: list[float], published: int, cpu: float) -> None:
        self.latencies += latencies
        self.published += published
        self.delivered += len(latencies)
        self.cpu += cpu

    def pct(self, p: float) -> float:
        values = sorted(self.latencies)
        return values[min(len(values) - 1, int(p * len(values)))]


class ServerProcess:
    def __init__(self, events: int, rate: float, db: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, SCRIPT, "--role", "server", "--events", str(events),
             "--rate", str(rate), "--db", db],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.url = self.read()["url"]

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the benchmark server exited")
        return json.loads(line)

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        try:
            self.ask(do="quit")
        except (RuntimeError, BrokenPipeError):
            pass
        self.proc.wait(timeout=30)


def run_http(server: ServerProcess, subscribers: int, phase: Phase) -> None:
    cpu0 = server.ask(do="cpu")["cpu"]
    client = subprocess.run(
        [sys.executable, SCRIPT, "--role", "client", "--url", server.url,
         "--subscribers", str(subscribers)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if client.returncode != 0:
        raise RuntimeError("the SSE client failed:\n" + client.stderr)
    cpu = server.ask(do="cpu")["cpu"] - cpu0
    result = json.loads(client.stdout.splitlines()[-1])
    phase.add(result["latencies"], result["published"], cpu)
    phase.client_cpu += result["client_cpu"]


def run_inproc(server: ServerProcess, subscribers: int, phase: Phase) -> None:
    result = server.ask(do="inproc", subscribers=subscribers)
    phase.add(result["latencies"], result["published"], result["cpu"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a much smaller run (smoke test)")
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--events", type=int, default=400, help="text deltas per turn")
    parser.add_argument("--rate", type=float, default=40.0, help="events per second")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--strict", action="store_true", help="exit 1 if a goal is missed")
    parser.add_argument("--role", choices=["server", "client"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "server":
        asyncio.run(_server(args.events, args.rate, args.db))
        return 0
    if args.role == "client":
        asyncio.run(_client(args.url, args.subscribers))
        return 0
    if args.quick:
        args.subscribers, args.events, args.rounds = 20, 40, 1

    say_environment(
        [
            ("packages", ", ".join(f"{d} {version(d)}" for d in PACKAGES)),
            (
                "load",
                f"{args.subscribers} subscribers on one conversation; {args.events} text "
                f"deltas per turn at {args.rate:g}/s; {args.rounds} round(s) per phase",
            ),
        ]
    )
    http, inproc = Phase(), Phase()
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(args.events, args.rate, os.path.join(tmp, "bench.db"))
        try:
            for r in range(args.rounds):
                order = [("http", run_http, http), ("in-process", run_inproc, inproc)]
                for name, run, phase in order if r % 2 == 0 else order[::-1]:
                    say(f"round {r + 1}: {name} ...")
                    run(server, args.subscribers, phase)
        finally:
            server.close()
    say()
    say(
        f"http:       {http.delivered:,} deliveries of {http.published:,} events; "
        f"client process CPU {http.client_cpu:.2f} s (not counted)"
    )
    say(f"in-process: {inproc.delivered:,} deliveries of {inproc.published:,} events")
    say()

    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None

    rows = [
        Row("fan-out latency p50", ms(http.pct(0.5)), ms(inproc.pct(0.5)),
            ratio(http.pct(0.5), inproc.pct(0.5)), "info", None),
        Row("fan-out latency p99", ms(http.pct(0.99)), ms(inproc.pct(0.99)),
            ratio(http.pct(0.99), inproc.pct(0.99)), f"<= {GOAL_P99 * 1e3:.0f} ms",
            http.pct(0.99) <= GOAL_P99),
        Row("server CPU per event", ms(http.cpu / http.published),
            ms(inproc.cpu / inproc.published),
            ratio(http.cpu / http.published, inproc.cpu / inproc.published), "info", None),
        Row("server CPU per delivery", f"{http.cpu / http.delivered * 1e6:.1f} us",
            f"{inproc.cpu / inproc.delivered * 1e6:.1f} us",
            ratio(http.cpu / http.delivered, inproc.cpu / inproc.delivered), "info", None),
        Row("server CPU busy", f"{http.cpu / (http.published / args.rate) * 100:.0f} %",
            f"{inproc.cpu / (inproc.published / args.rate) * 100:.0f} %",
            ratio(http.cpu, inproc.cpu), "info", None),
    ]  # fmt: skip
    return finish(rows, strict=args.strict)


if __name__ == "__main__":
    sys.exit(main())
