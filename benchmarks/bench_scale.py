#!/usr/bin/env python3
"""Several workers on one PostgreSQL database (issue 32): throughput, failover, the cost
of PostgreSQL per turn, and listing many conversations.

Run with ``.venv/bin/python benchmarks/bench_scale.py`` (needs PostgreSQL's binaries:
``make postgres``; the server is started here, as the tests start it, in a temporary
folder; without them the script says so and exits 0). ``--quick`` is a smaller run;
``--only a,c`` runs some sections. Everything runs on this machine: the workers are
real ``agentik run`` processes, the model is the fake OpenAI-compatible server in a
process of its own.

a. Throughput with 1, 2 and 3 workers, the model answering after 200 ms (I/O-bound, as
   real models are). Each worker is driven through its own HTTP API by ``--per-worker``
   conversations (created on that worker, and kept there: routing is sticky per
   conversation until the turn queue lands), each sending its next message when its
   previous turn ended. Turns per second over ``--seconds`` after a warm-up; the
   baseline is one worker, measured in the same run. Goal: 2 workers >= 1.8x one,
   3 >= 2.5x (the load grows with the workers: the question is whether a worker added
   adds its share, the shared database not getting in the way).
b. Failover: three workers share an IRC connection (ngircd); a question is asked and
   the model holds its answer; the owner is killed -9; the time from the kill to that
   pending answer delivered by the new owner, over ``--kills`` kills (the killed worker
   started again each time), with ``lease_seconds = 6`` and ``heartbeat_seconds = 2``
   (what docs/operations.md recommends for a failover under 10 s). Goal: p95 <= 10 s.
c. CPU per turn of one bot process on PostgreSQL against the same configuration on
   SQLite (config.example.toml, an in-memory transport, the model answering at once),
   alternating ``--rounds`` times. Goal: PostgreSQL <= SQLite + 2 ms.
d. Listing 100,000 conversations (``--conversations``) through the store, on both
   engines: the first page (50, most recently active first), a page deep in the list
   by ``offset`` (what the HTTP API's ``offset`` does), and a keyset page (the next 50
   after a given one). Goal: first page <= 50 ms, keyset page <= 20 ms (median of 20).

The exit status is 0 unless ``--strict`` is given and a goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from _common import (
    ChildProcess,
    Row,
    finish,
    free_port,
    ms,
    process_cpu,
    say,
    say_environment,
    version,
)

SCRIPT = os.path.abspath(__file__)
ROOT = Path(SCRIPT).resolve().parent.parent
#: tests/pgserver.py starts PostgreSQL here as it does for the tests; ircservers ngircd.
TESTS_FOLDER = str(ROOT / "tests")
AGENTIK = str(Path(sys.executable).parent / "agentik")
DSN_ENV = "AGENTIK_BENCH_DSN"
MODEL_DELAY = 0.2  # seconds the fake model takes to answer in (a)
PATIENCE = 180.0  # seconds any one wait may take


# -- the fake model, a process of its own -------------------------------------------------------
def _last_user(body: dict[str, Any]) -> str:
    users = [m.get("content") for m in body.get("messages", []) if m.get("role") == "user"]
    content = users[-1] if users else ""
    return content if isinstance(content, str) else json.dumps(content)


async def _openai_child(delay: float) -> None:
    """Serve; say the URL, then ``{"held": tag}`` each time a ``hold-N`` question is
    asked for the first time (that answer never comes: its asker is about to die)."""
    from agentik.core.testing.openai_server import FakeOpenAIServer, Reply

    held: set[str] = set()

    def model(body: dict[str, Any]) -> Reply:
        asked = _last_user(body)
        found = re.search(r"hold-\d+", asked)
        if found and found.group(0) not in held:
            held.add(found.group(0))
            print(json.dumps({"held": found.group(0)}), flush=True)
            return Reply.text("", delay=3600.0)
        text = f"answer {found.group(0)}" if found else f"answer to {asked}"
        # The delay is slept before each chunk: the text, then the usage when asked for.
        chunks = 2 if (body.get("stream_options") or {}).get("include_usage") else 1
        return Reply.text(text, delay=delay / chunks)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with FakeOpenAIServer("fake-model") as server:
        server.default = model
        print(json.dumps({"url": server.base_url}), flush=True)
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        quit_task = asyncio.ensure_future(reader.readline())
        stop_task = asyncio.ensure_future(stop.wait())
        await asyncio.wait({quit_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)


@contextlib.asynccontextmanager
async def fake_model(tmp: str, delay: float) -> AsyncIterator[tuple[str, ChildProcess]]:
    child = await ChildProcess.spawn(SCRIPT, "openai", tmp, f"openai-{delay}", str(delay))
    try:
        url = (await child.recv(PATIENCE))["url"]
        yield url, child
    finally:
        await child.stop()


# -- workers --------------------------------------------------------------------------------------
class Worker:
    """One ``agentik run`` process with its own folder, config and health socket."""

    def __init__(self, folder: Path, config: str, dsn: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.config = folder / "bot.toml"
        self.config.write_text(config, encoding="utf-8")
        self.dsn = dsn
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
        env[DSN_ENV] = self.dsn
        with open(self.folder / "stderr.log", "ab") as err:
            self.proc = subprocess.Popen(
                [AGENTIK, "run", "-c", str(self.config)], cwd=self.folder, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip

    def log(self) -> str:
        return (self.folder / "stderr.log").read_text(errors="replace")[-3000:]

    async def health(self) -> dict[str, Any] | None:
        import httpx

        transport = httpx.AsyncHTTPTransport(uds=str(self.folder / "h.sock"), retries=0)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://w") as c:
                return dict((await c.get("/health", timeout=10)).json())
        except (httpx.TransportError, ValueError):
            return None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    async def wait(self) -> None:
        if self.proc is not None:
            await asyncio.wait_for(asyncio.to_thread(self.proc.wait), PATIENCE)

    async def stop(self) -> None:
        self.kill(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.to_thread(self.proc.wait), 60)  # type: ignore[union-attr]
        except (TimeoutError, AttributeError):
            self.kill()
            await self.wait()


def worker_config(name: str, url: str, extra: str, *, lease: float, beat: float) -> str:
    return f"""
[llm]
base_url = "{url}"
model = "fake-model"
api_key = "sk-bench"
max_retries = 0
[storage]
backend = "postgres"
dsn_env = "{DSN_ENV}"
[memory]
backend = "none"
[compaction]
enabled = false
[health]
listen = "unix:h.sock"
[cluster]
lease_seconds = {lease}
heartbeat_seconds = {beat}
worker_name = "{name}"
{extra}
"""


async def until(check: Callable[[], Any], what: str, patience: float = PATIENCE) -> Any:
    """Poll ``check`` (sync or async) until it returns something true."""
    deadline = time.monotonic() + patience
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def owner(crew: list[Worker], transport: str) -> Worker | None:
    """The worker whose ``/health`` says it owns ``transport``, once every live one agrees."""
    live = [w for w in crew if w.proc is not None and w.proc.poll() is None]
    views = [await w.health() for w in live]
    if any(v is None or "cluster" not in v for v in views):
        return None
    owners = [w for w, v in zip(live, views, strict=True) if transport in v["cluster"]["owns"]]  # type: ignore[index]
    seen = {v["cluster"]["connections"].get(transport, {}).get("owner") for v in views}  # type: ignore[index]
    return owners[0] if len(owners) == 1 and len(seen) == 1 else None


async def ready(worker: Worker) -> bool:
    view = await worker.health()
    return view is not None and "cluster" in view


# -- (a) throughput -------------------------------------------------------------------------------
class Driver:
    """Drives one worker's HTTP API: conversations created there, a turn at a time each;
    turn ends are read from one ``/agentik/events`` stream."""

    def __init__(self, port: int) -> None:
        import httpx

        self.base = f"http://127.0.0.1:{port}/agentik"
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        self.client = httpx.AsyncClient(timeout=PATIENCE, limits=limits)
        self.ended: set[str] = set()
        self.changed = asyncio.Event()
        self.reader: asyncio.Task[None] | None = None
        self.done = 0

    async def start(self) -> None:
        opened = asyncio.Event()

        async def read() -> None:
            async with self.client.stream("GET", f"{self.base}/events?profile=metrics") as resp:
                if resp.status_code != 200:
                    raise RuntimeError(f"events: {resp.status_code} {await resp.aread()!r}")
                opened.set()
                async for line in resp.aiter_lines():
                    if line.startswith("data:") and '"turn_ended"' in line:
                        self.ended.add(json.loads(line[5:])["run_id"])
                        self.changed.set()

        self.reader = asyncio.create_task(read())
        waiting = asyncio.ensure_future(opened.wait())
        await asyncio.wait({waiting, self.reader}, timeout=PATIENCE,
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        if self.reader.done():
            waiting.cancel()
            self.reader.result()  # its error
        if not opened.is_set():
            raise RuntimeError(f"no event stream from {self.base}")

    async def conversation(self) -> str:
        resp = await self.client.post(f"{self.base}/conversations", json={"title": "bench"})
        resp.raise_for_status()
        return str(resp.json()["id"])

    async def turn(self, conversation: str, text: str) -> None:
        resp = await self.client.post(
            f"{self.base}/conversations/{conversation}/messages", json={"content": text}
        )
        resp.raise_for_status()
        run = resp.json()["run_id"]
        while run not in self.ended:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), PATIENCE)
        self.ended.discard(run)
        self.done += 1

    async def aclose(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(BaseException):
                await self.reader
        await self.client.aclose()


async def _listening(port: int) -> bool:
    import httpx

    try:
        async with httpx.AsyncClient() as c:
            return (await c.get(f"http://127.0.0.1:{port}/health", timeout=10)).status_code == 200
    except httpx.TransportError:
        return False


async def throughput_of(
    n: int, folder: Path, dsn: str, url: str, args: argparse.Namespace
) -> float:
    from pgserver import empty_database

    await empty_database(dsn)
    ports = [free_port() for _ in range(n)]
    crew = [
        Worker(folder / f"n{n}-w{i}", worker_config(f"w{i}", url, f"""
[transports.web]
type = "http"
host = "127.0.0.1"
port = {ports[i]}
web_ui = false
max_connections_per_client = 0
""", lease=15.0, beat=5.0), dsn)
        for i in range(n)
    ]  # fmt: skip
    drivers: list[Driver] = []
    try:
        for w in crew:
            w.start()
        for w, port in zip(crew, ports, strict=True):
            await until(lambda w=w: ready(w), f"worker {w.folder.name}")  # type: ignore[misc]
            await until(lambda p=port: _listening(p), f"the HTTP API of {w.folder.name}")  # type: ignore[misc]
        drivers = [Driver(p) for p in ports]
        for d in drivers:
            await d.start()
        stop = asyncio.Event()

        async def talk(d: Driver, c: int) -> None:
            conversation = await d.conversation()
            i = 0
            while not stop.is_set():
                await d.turn(conversation, f"question {c}-{i}")
                i += 1

        tasks = [asyncio.create_task(talk(d, c)) for d in drivers for c in range(args.per_worker)]
        await asyncio.sleep(args.warmup)  # warm-up: every conversation created and running
        start_done, start = sum(d.done for d in drivers), time.perf_counter()
        await asyncio.sleep(args.seconds)
        rate = (sum(d.done for d in drivers) - start_done) / (time.perf_counter() - start)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), PATIENCE)
        return rate
    finally:
        for d in drivers:
            await d.aclose()
        for w in crew:
            await w.stop()


async def throughput(folder: Path, dsn: str, args: argparse.Namespace) -> list[Row]:
    say(f"== (a) throughput: {args.per_worker} conversations per worker, the model answers"
        f" after {MODEL_DELAY * 1e3:.0f} ms; {args.seconds:.0f} s each,"
        f" {args.repeats} runs")  # fmt: skip
    rates: dict[int, list[float]] = {1: [], 2: [], 3: []}
    async with fake_model(str(folder), MODEL_DELAY) as (url, _):
        for _ in range(args.repeats):
            for n in (1, 2, 3):
                rate = await throughput_of(n, folder, dsn, url, args)
                rates[n].append(rate)
                say(f"   {n} worker(s): {rate:.1f} turns/s")
    base = statistics.median(rates[1])
    rows = [Row("(a) 1 worker (baseline)", f"{base:.1f} turns/s", "-", None, "-", None,
                section="a")]  # fmt: skip
    for n, goal in ((2, 1.8), (3, 2.5)):
        rate = statistics.median(rates[n])
        spread = f" ({min(rates[n]):.1f}-{max(rates[n]):.1f})" if len(rates[n]) > 1 else ""
        rows.append(Row(f"(a) {n} workers", f"{rate:.1f} turns/s{spread}", f"{base:.1f} turns/s",
                        rate / base, f">= {goal}x", rate / base >= goal, section="a"))  # fmt: skip
    return rows


# -- (b) failover ---------------------------------------------------------------------------------
async def failover(folder: Path, dsn: str, args: argparse.Namespace) -> list[Row]:
    from pgserver import empty_database

    from ircservers import IRCTestClient, _ngircd_binary, start_ngircd

    if _ngircd_binary() is None:
        say("== (b) failover: ngircd is not installed (make irc-servers): skipped")
        return []
    say(f"== (b) failover: kill -9 of the IRC connection's owner, {args.kills} kills"
        f" (lease_seconds = 6, heartbeat_seconds = 2)")  # fmt: skip
    await empty_database(dsn)
    ircd = await start_ngircd(folder / "irc")
    channel = "#scale"
    irc = f"""
[transports.libera]
type = "irc"
host = "127.0.0.1"
port = {ircd.port}
tls = false
nick = "agentik"
channels = ["{channel}"]
reconnect_min = 0.2
reconnect_max = 1.0
"""
    times: list[float] = []
    client = None
    crew: list[Worker] = []
    try:
        async with fake_model(str(folder), 0.0) as (url, model):
            client = await IRCTestClient.connect(ircd.port, "alice")
            await client.join(channel)
            crew = [
                Worker(folder / f"f-w{i}", worker_config(f"w{i}", url, irc, lease=6.0, beat=2.0),
                       dsn)
                for i in range(3)
            ]  # fmt: skip
            for w in crew:
                w.start()
            for k in range(args.kills):
                for w in crew:
                    await until(lambda w=w: ready(w), f"worker {w.folder.name}")  # type: ignore[misc]
                first = await until(lambda: owner(crew, "libera"), "one owner of libera")
                since = client.mark()
                if k == 0:
                    await client.wait_for(
                        lambda m: m.command == "JOIN" and (m.nick or "") == "agentik", PATIENCE
                    )
                tag = f"hold-{k}"
                client.privmsg(channel, f"agentik: {tag}")
                held = await model.recv(PATIENCE)
                assert held == {"held": tag}, held
                killed = time.perf_counter()
                first.kill()
                await first.wait()
                await client.wait_for(
                    lambda m, tag=tag: m.command == "PRIVMSG" and f"answer {tag}" in m.text,  # type: ignore[misc]
                    PATIENCE, since=since,
                )  # fmt: skip
                took = time.perf_counter() - killed
                times.append(took)
                say(f"   kill {k + 1}: {took:.2f} s")
                first.start()
                # The new owner in the channel before the next question (IRC keeps no
                # history: a line sent before its JOIN would not be its to see).
                await until(lambda: owner(crew, "libera"), "the new owner")
    finally:
        if client is not None:
            await client.close()
        for w in crew:
            await w.stop()
        await ircd.stop()
    times.sort()
    p50 = statistics.median(times)
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    return [
        Row(f"(b) failover p50 ({len(times)} kills)", f"{p50:.2f} s", "-", None, "-", None,
            section="b"),
        Row(f"(b) failover p95 ({min(times):.1f}-{max(times):.1f} s)", f"{p95:.2f} s",
            "15 s lease (k8s)", p95 / 15.0, "<= 10 s", p95 <= 10.0, section="b"),
    ]  # fmt: skip


# -- (c) CPU per turn, PostgreSQL vs SQLite ------------------------------------------------
def _default_config(folder: Path, postgres: bool) -> str:
    """config.example.toml without its transports (an in-memory one is given), the
    model from the environment; on PostgreSQL the store and nothing else changed."""
    src = (ROOT / "config.example.toml").read_text()
    head = src.split("[transports.terminal]")[0]
    tail = "[mcp]" + src.split("\n[mcp]", 1)[1]
    text = (head + tail).replace('backend = "auto"', 'backend = "openai"', 1)
    if postgres:
        text = text.replace('# backend = "sqlite"', f'backend = "postgres"\ndsn_env = "{DSN_ENV}"',
                            1)  # fmt: skip
    path = folder / ("pg.toml" if postgres else "sqlite.toml")
    path.write_text(text)
    return str(path)


def server_cpu(data: Path | None) -> float:
    """CPU seconds used so far by the PostgreSQL server whose data folder is ``data``:
    its postmaster and the processes it started (the backends of open connections)."""
    if data is None:
        return 0.0
    try:
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(stat.parent.name)
        if pid == postmaster or int(fields[1]) == postmaster:  # fields[1]: the parent
            total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


async def cpu_per_turn(
    folder: Path, dsn: str, postgres: bool, turns: int, data: Path | None = None
) -> tuple[float, float]:
    """CPU seconds per turn of this process, and of the PostgreSQL server (``data``)."""
    from pgserver import empty_database

    from agentik.bot.app import Bot
    from agentik.bot.config import load_config
    from agentik.transports.testing.memory import MemoryTransport

    if postgres:
        await empty_database(dsn)
    run = folder / f"c-{'pg' if postgres else 'sqlite'}-{time.monotonic_ns()}"
    run.mkdir()
    config = load_config(_default_config(run, postgres))
    waiters: dict[str, asyncio.Future[None]] = {}

    class Answers(MemoryTransport):
        async def send(self, message: Any) -> None:
            if message.kind == "answer":
                for key, fut in list(waiters.items()):
                    if key in (message.text or "") and not fut.done():
                        fut.set_result(None)
                        del waiters[key]

    mem = Answers(name="mem")
    channels = 10

    async def talk(c: int, n: int) -> None:
        for i in range(n):
            key = f"question {c}-{i}-{time.monotonic_ns()}"
            fut = waiters[key] = asyncio.get_running_loop().create_future()
            await mem.inject(key, channel_key=f"mem:#c{c}", author=f"u{c}", addressed=True)
            await asyncio.wait_for(fut, PATIENCE)

    async with Bot(config, transports={"mem": mem}):
        await asyncio.gather(*(talk(c, 2) for c in range(channels)))  # warm
        cpu, server = process_cpu(), server_cpu(data)
        await asyncio.gather(*(talk(c, turns // channels) for c in range(channels)))
        done = turns // channels * channels
        return (process_cpu() - cpu) / done, (server_cpu(data) - server) / done


async def postgres_cost(folder: Path, dsn: str, args: argparse.Namespace) -> list[Row]:
    say(f"== (c) CPU per turn of one process, config.example.toml: PostgreSQL vs SQLite,"
        f" {args.turns} turns x {args.rounds} rounds")  # fmt: skip
    got: dict[bool, list[float]] = {False: [], True: []}
    served: list[float] = []
    async with fake_model(str(folder), 0.0) as (url, _):
        os.environ.update(OPENAI_BASE_URL=url, OPENAI_MODEL="fake-model", OPENAI_API_KEY="x")
        os.environ[DSN_ENV] = dsn
        for _ in range(args.rounds):
            for postgres in (False, True):
                cpu, server = await cpu_per_turn(
                    folder, dsn, postgres, args.turns, args.pg_data if postgres else None
                )
                got[postgres].append(cpu)
                if postgres:
                    served.append(server)
                extra = f" (+ {server * 1e3:.2f} ms in the server)" if postgres else ""
                engine = "PostgreSQL" if postgres else "SQLite"
                say(f"   {engine}: {cpu * 1e3:.2f} ms CPU/turn{extra}")
    sqlite, pg = statistics.median(got[False]), statistics.median(got[True])

    def spread(xs: list[float]) -> str:
        return f" ({min(xs) * 1e3:.2f}-{max(xs) * 1e3:.2f})" if len(xs) > 1 else ""

    return [
        Row("(c) CPU/turn SQLite (baseline)", ms(sqlite) + spread(got[False]), "-", None, "-",
            None, section="c"),
        Row("(c) CPU/turn PostgreSQL", ms(pg) + spread(got[True]), ms(sqlite), pg / sqlite,
            "<= +2 ms", pg - sqlite <= 2e-3, section="c"),
        Row("(c) + the server's CPU/turn", ms(statistics.median(served)) + spread(served), "-",
            None, "-", None, section="c"),
    ]  # fmt: skip


# -- (d) listing -----------------------------------------------------------------------------------
def _conversations(n: int) -> list[tuple[str, str, float, float, str]]:
    now = time.time()
    return [(f"conv-{i:07d}", f"conversation {i}", now - n + i, now - n + i * 1.0, "{}")
            for i in range(n)]  # fmt: skip


async def _fill_sqlite(path: Path, n: int) -> None:
    import sqlite3

    from agentik.core import SQLiteStore

    async with SQLiteStore(str(path)):
        pass  # the schema
    db = sqlite3.connect(path)
    with db:
        db.executemany(
            "INSERT INTO conversation (id, title, created_at, updated_at, meta)"
            " VALUES (?, ?, ?, ?, ?)", _conversations(n),
        )  # fmt: skip
    db.execute("ANALYZE")
    db.close()


async def _fill_postgres(dsn: str, n: int) -> None:
    import asyncpg
    from pgserver import empty_database

    await empty_database(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.copy_records_to_table(
            "conversation", records=_conversations(n),
            columns=["id", "title", "created_at", "updated_at", "meta"],
        )  # fmt: skip
        await conn.execute("ANALYZE conversation")
    finally:
        await conn.close()


async def _median_ms(fn: Callable[[], Any], times: int = 20) -> tuple[float, float]:
    """Median and best wall milliseconds of ``times`` calls (the best: what a call costs
    when the loaded machine does not make it wait)."""
    walls = []
    for _ in range(times):
        t = time.perf_counter()
        await fn()
        walls.append(time.perf_counter() - t)
    return statistics.median(walls) * 1e3, min(walls) * 1e3


async def listing(folder: Path, dsn: str, args: argparse.Namespace) -> list[Row]:
    from agentik.core import SQLiteStore
    from agentik.core.store.postgres import PostgresStore

    n = args.conversations
    say(f"== (d) listing {n:,} conversations, pages of 50 (median of 20)")
    await _fill_sqlite(folder / "list.db", n)
    await _fill_postgres(dsn, n)
    rows: list[Row] = []
    for name, store in (("SQLite", SQLiteStore(str(folder / "list.db"))),
                        ("PostgreSQL", PostgresStore(dsn))):  # fmt: skip
        async with store:  # type: ignore[attr-defined]
            first = await store.list_conversations(limit=50)
            assert len(first) == 50
            deep = n - 50  # the last page: the worst for an offset
            after = (await store.list_conversations(limit=1, offset=deep - 1))[0]
            keyset = await store.list_conversations_after(after.updated_at, after.id, limit=50)
            assert keyset == await store.list_conversations(limit=50, offset=deep)
            timed = {
                "first page": await _median_ms(lambda s=store: s.list_conversations(limit=50)),
                "keyset page": await _median_ms(
                    lambda s=store, a=after: s.list_conversations_after(
                        a.updated_at, a.id, limit=50
                    )
                ),
                f"offset {deep:,} (info)": await _median_ms(
                    lambda s=store, d=deep: s.list_conversations(limit=50, offset=d)
                ),
            }
        for what, (took, best) in timed.items():
            say(f"   {name} {what}: {took:.2f} ms (best {best:.2f} ms)")
            goal = {"first page": 50.0, "keyset page": 20.0}.get(what)
            rows.append(Row(f"(d) {name} {what}", f"{took:.2f} ms (best {best:.2f})", "-", None,
                            f"<= {goal:.0f} ms" if goal else "-",
                            None if goal is None else took <= goal, section="d"))  # fmt: skip
    return rows


# -- main ----------------------------------------------------------------------------------
async def main_async(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    say_environment([
        ("agentik", version("agentik")), ("asyncpg", version("asyncpg")),
        ("load", " ".join(f"{x:.1f}" for x in os.getloadavg()) + " (1, 5, 15 min)"),
    ])  # fmt: skip
    sys.path.insert(0, TESTS_FOLDER)
    from pgserver import TESTS, PostgresServer, find_binaries, make_template

    bindir = find_binaries()
    if bindir is None:
        say("PostgreSQL is not installed (make postgres): nothing to measure; skipped")
        return 0
    server = PostgresServer(bindir)
    rows: list[Row] = []
    try:
        server.start()
        await make_template(server)
        dsn = server.dsn(TESTS)
        args.pg_data = server.data
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            sections = {
                "d": listing, "c": postgres_cost, "a": throughput, "b": failover,
            }  # fmt: skip
            for key, section in sections.items():
                if key in args.only:
                    rows += await section(folder, dsn, args)
    finally:
        server.stop()
    say(f"load after: {' '.join(f'{x:.1f}' for x in os.getloadavg())} (1, 5, 15 min)")
    return finish(rows, strict=args.strict, sections=True, started=started)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        asyncio.run(_openai_child(float(sys.argv[3])))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smaller run")
    p.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    p.add_argument("--only", default="abcd", help="the sections to run, e.g. 'ad'")
    p.add_argument("--per-worker", type=int, default=None)
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--kills", type=int, default=None)
    p.add_argument("--turns", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--conversations", type=int, default=None)
    args = p.parse_args()
    q = args.quick
    args.per_worker = args.per_worker or 8
    args.seconds = args.seconds or (5.0 if q else 15.0)
    args.warmup = 3.0
    args.repeats = args.repeats or (1 if q else 3)
    args.kills = args.kills or (5 if q else 20)
    args.turns = args.turns or (100 if q else 300)
    args.rounds = args.rounds or (1 if q else 3)
    args.conversations = args.conversations or 100_000
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
