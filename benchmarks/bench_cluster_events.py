#!/usr/bin/env python3
"""Events across workers: SSE latency on the worker running a turn and on another one,
and what writing the run events costs.

Run with ``.venv/bin/python benchmarks/bench_cluster_events.py`` (``--quick`` for a
smaller run).  Needs PostgreSQL (``make postgres``): tests/pgserver.py starts one.

* **SSE latency**: two ``agentik run`` workers on one database, each serving the HTTP
  API; a turn runs on worker B (the fake model streams ``--chunks`` pieces, 20 ms
  apart) while one SSE client follows the conversation on B (the local stream) and
  one on A (the stored events, read on each ``NOTIFY``).  An event's latency is the
  time it reached the client less its ``ts`` (when B published it; one machine, one
  clock).  Median and p95 over every event of a round; the range is that of the
  rounds'.  The ratio is A's median to B's.  The same for two clients of the
  agent-wide stream (``/agentik/events``: every worker reads the stored events by
  position, the running one too), against B's conversation stream.
* **Write cost per batch**: ``run_events_add`` of batches of 1, 10 and 50 events (the
  JSON of a ``text_delta``) into PostgreSQL through the store's writer: wall time and
  this process's CPU per batch, median of ``--batches``; each batch size twice, its
  rows on the agent-wide stream (numbered, under the advisory lock) and not (the
  baseline: no position, no lock), interleaved, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from agentik.core.events import TextDelta, event_to_json
from agentik.core.testing.openai_server import FakeOpenAIServer, Reply

from _common import Row, finish, free_port, process_cpu, say, say_environment, version

TESTS_FOLDER = str(Path(__file__).resolve().parent.parent / "tests")
AGENTIK = str(Path(sys.executable).parent / "agentik")
DSN_ENV = "AGENTIK_BENCH_EVENTS_DSN"
TOKEN = "bench-0123456789abcdef"


def _config(name: str, url: str, port: int) -> str:
    return f"""
[llm]
base_url = "{url}"
model = "fake-model"
api_key = "sk-test"
max_retries = 0
[storage]
backend = "postgres"
dsn_env = "{DSN_ENV}"
[memory]
backend = "none"
[compaction]
enabled = false
[cluster]
worker_name = "{name}"
[transports.web]
type = "http"
host = "127.0.0.1"
port = {port}
tokens = [{{ name = "bench", env = "BENCH_TOKEN" }}]
"""


class Worker:
    def __init__(self, folder: Path, name: str, url: str, dsn: str) -> None:
        import os

        folder.mkdir(parents=True)
        self.port = free_port()
        (folder / "bot.toml").write_text(_config(name, url, self.port))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
        env.update({DSN_ENV: dsn, "BENCH_TOKEN": TOKEN})
        self.proc = subprocess.Popen(
            [AGENTIK, "run", "-c", str(folder / "bot.toml")], cwd=folder, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(folder / "stderr.log", "wb"),
        )  # fmt: skip
        self.base = f"http://127.0.0.1:{self.port}"

    async def ready(self) -> None:
        deadline = time.monotonic() + 120
        async with httpx.AsyncClient() as c:
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.TransportError):
                    if (await c.get(self.base + "/ready", timeout=5)).status_code == 200:
                        return
                await asyncio.sleep(0.1)
        raise RuntimeError("a worker did not become ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def _follow(client: httpx.AsyncClient, path: str, out: list[float], started: asyncio.Event):
    """Latencies of every event until ``run_stream_end`` (receive time - ts)."""
    async with client.stream("GET", path) as response:
        started.set()
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                now = time.time()
                data = json.loads(line[6:])
                out.append(now - float(data["ts"]))
                if data["kind"] == "run_stream_end":
                    return


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


async def latency(args: argparse.Namespace, dsn: str, tmp: Path) -> list[Row]:
    rows: list[Row] = []
    with FakeOpenAIServer.in_thread() as server:
        server.default = lambda body: Reply.text("x " * args.chunks, chunks=args.chunks, delay=0.02)
        a = Worker(tmp / "a", "a", server.base_url, dsn)
        b = Worker(tmp / "b", "b", server.base_url, dsn)
        try:
            await a.ready()
            await b.ready()
            headers = {"Authorization": f"Bearer {TOKEN}"}
            timeout = httpx.Timeout(120)
            async with (
                httpx.AsyncClient(base_url=a.base + "/agentik", headers=headers, timeout=timeout)
                as on_a,
                httpx.AsyncClient(base_url=b.base + "/agentik", headers=headers, timeout=timeout)
                as on_b,
            ):  # fmt: skip
                local_med, remote_med, local_p95, remote_p95 = [], [], [], []
                wide_med: dict[str, list[float]] = {"a": [], "b": []}
                wide_p95: dict[str, list[float]] = {"a": [], "b": []}
                for r in range(args.rounds + 1):
                    conv = (await on_b.post("/conversations", json={})).json()
                    path = f"/conversations/{conv['id']}/events"
                    got_a: list[float] = []
                    got_b: list[float] = []
                    ready_a, ready_b = asyncio.Event(), asyncio.Event()
                    wide: dict[str, list[float]] = {"a": [], "b": []}
                    ready_wa, ready_wb = asyncio.Event(), asyncio.Event()
                    fa = asyncio.ensure_future(_follow(on_a, path, got_a, ready_a))
                    fb = asyncio.ensure_future(_follow(on_b, path, got_b, ready_b))
                    fwa = asyncio.ensure_future(_follow(on_a, "/events", wide["a"], ready_wa))
                    fwb = asyncio.ensure_future(_follow(on_b, "/events", wide["b"], ready_wb))
                    for ready in (ready_a, ready_b, ready_wa, ready_wb):
                        await ready.wait()
                    await on_b.post(path.replace("/events", "/messages"), json={"content": "go"})
                    await asyncio.wait_for(asyncio.gather(fa, fb, fwa, fwb), 120)
                    if r == 0:
                        continue  # warm-up
                    for w in ("a", "b"):
                        wide_med[w].append(statistics.median(wide[w]))
                        wide_p95[w].append(_p95(wide[w]))
                    local_med.append(statistics.median(got_b))
                    remote_med.append(statistics.median(got_a))
                    local_p95.append(_p95(got_b))
                    remote_p95.append(_p95(got_a))
                    say(
                        f"round {r}: {len(got_b)} events; local median"
                        f" {statistics.median(got_b) * 1e3:.1f} ms p95 {_p95(got_b) * 1e3:.1f} ms;"
                        f" other worker median {statistics.median(got_a) * 1e3:.1f} ms"
                        f" p95 {_p95(got_a) * 1e3:.1f} ms; /events on B median"
                        f" {statistics.median(wide['b']) * 1e3:.1f} ms, on A"
                        f" {statistics.median(wide['a']) * 1e3:.1f} ms"
                    )

                def rng(v: list[float]) -> str:
                    low, high = min(v) * 1e3, max(v) * 1e3
                    return f"{statistics.median(v) * 1e3:.1f} ms ({low:.1f}-{high:.1f})"

                ratio = statistics.median(remote_med) / max(1e-9, statistics.median(local_med))
                rows.append(Row("SSE latency median, other worker vs local", rng(remote_med),
                                rng(local_med), ratio, "info", None))  # fmt: skip
                rows.append(Row("SSE latency p95, other worker vs local", rng(remote_p95),
                                rng(local_p95), None, "info", None))  # fmt: skip
                for w, where in (("b", "running worker"), ("a", "other worker")):
                    base = max(1e-9, statistics.median(local_med))
                    ratio = statistics.median(wide_med[w]) / base
                    name = f"/events latency median ({where}) vs local conversation"
                    rows.append(Row(name, rng(wide_med[w]), rng(local_med), ratio, "info", None))
                    name = f"/events latency p95 ({where}) vs local conversation"
                    rows.append(Row(name, rng(wide_p95[w]), rng(local_p95), None, "info", None))
        finally:
            a.stop()
            b.stop()
    return rows


async def write_cost(args: argparse.Namespace, dsn: str) -> list[Row]:
    from agentik.core.store.postgres import PostgresStore

    rows: list[Row] = []
    event = TextDelta(conversation_id="c" * 32, run_id="run_" + "0" * 20, seq=1, text="word " * 4)
    data = event_to_json(event)
    async with PostgresStore(dsn) as store:
        seq = 0
        for size in (1, 10, 50):
            walls: dict[bool, list[float]] = {True: [], False: []}
            cpus: dict[bool, list[float]] = {True: [], False: []}
            for i in range(2 * args.batches):
                numbered = i % 2 == 0  # (interleaved: the load hits both alike)
                batch = []
                for _ in range(size):
                    seq += 1
                    batch.append(("c" * 32, seq, time.time(), data))
                w0, c0 = time.perf_counter(), process_cpu()
                await store.run_events_add(batch, wide=[numbered] * size)
                walls[numbered].append(time.perf_counter() - w0)
                cpus[numbered].append(process_cpu() - c0)
            wall, cpu = statistics.median(walls[True]), statistics.median(cpus[True])
            base, base_cpu = statistics.median(walls[False]), statistics.median(cpus[False])
            say(f"batch of {size}: wall {wall * 1e3:.2f} ms (without positions"
                f" {base * 1e3:.2f} ms), CPU {cpu * 1e3:.2f} ms"
                f" ({base_cpu * 1e3:.2f} ms)")  # fmt: skip
            rows.append(Row(f"run_events_add, batch of {size}: wall, numbered vs not",
                            f"{wall * 1e3:.2f} ms", f"{base * 1e3:.2f} ms", wall / max(1e-9, base),
                            "info", None))  # fmt: skip
            rows.append(Row(f"run_events_add, batch of {size}: CPU, numbered vs not",
                            f"{cpu * 1e3:.2f} ms", f"{base_cpu * 1e3:.2f} ms", None,
                            "info", None))  # fmt: skip
    return rows


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
    server.start()
    try:
        await make_template(server)
        dsn = server.dsn(TESTS)
        rows = await write_cost(args, dsn)
        await empty_database(dsn)
        with tempfile.TemporaryDirectory() as tmp:
            rows += await latency(args, dsn, Path(tmp))
    finally:
        server.stop()
    return finish(rows, strict=False, started=started)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smaller run")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--chunks", type=int, default=None)
    p.add_argument("--batches", type=int, default=None)
    args = p.parse_args()
    args.rounds = args.rounds or (2 if args.quick else 6)
    args.chunks = args.chunks or (20 if args.quick else 60)
    args.batches = args.batches or (20 if args.quick else 200)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
