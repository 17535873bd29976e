#!/usr/bin/env python3
"""Soak benchmark: agentik's default bot over IRC and HTTP for an hour, its RSS over time.

Run with ``.venv/bin/python benchmarks/bench_soak.py`` (an hour, ``--duration`` seconds in
all) or ``--quick`` (about 90 s, 100 conversations, timers scaled down; ``make bench``).
Everything runs on this machine, each part in its own process:

* the IRC server: ngircd (``--server miniircd`` for miniircd), as ``bench_irc.py``
  starts it;
* the model: the fake OpenAI-compatible server (``agentik.core.testing.openai_server``)
  in a child process of this script, scripted: a question ``soak <token>`` is answered
  ``ok <token>``; ``report <token>`` is answered with a call of the MCP tool
  ``soak__report`` and, once its output is back, ``reported <token>``; the summariser's,
  the miner's and the reflection's requests (told apart by their instructions) get a
  short summary, three facts and a reflection.  It keeps no request bodies;
* the MCP server: ``benchmarks/data/soak_mcp.py``, a real MCP server over stdio (the
  ``mcp`` SDK) whose ``report`` tool answers with 20,000 characters;
* the bot under test, built the way ``agentik run`` builds it (``load_config()``,
  ``Bot(config)``, ``bot.serve()``) from ``config.example.toml`` as shipped, with only
  these keys changed: ``[llm] backend = "openai"`` (endpoint from ``OPENAI_BASE_URL``),
  ``[storage] path``, ``[transports.terminal]`` off, ``[transports.libera]`` on (the
  local server, no TLS, one channel per IRC conversation, flood control relaxed as in
  ``bench_irc.py``), ``[transports.web]`` on (the HTTP API on a free port),
  ``[compaction] context_tokens`` small (16,000: the third 20 KB tool output in a
  conversation's context compacts it), ``[memory] reflect_after_idle``,
  ``release_vectors_after_idle`` and ``mining_debounce`` short (the idle time: every
  idle timer is scaled as the channels' release is), and one ``[[mcp.servers]]`` entry
  (the server above).
  Everything else is the shipped default: streaming, SQLite persistence with
  ``synchronous = "full"``, memory with builtin embeddings, automatic recall, mining and
  reflection, metrics, access and budgets, ``transcript_cache = 64``.  The bridge's
  channel release (15 minutes of silence, not a configuration key) is set to the same
  short idle time on the built bot.

The load (this process): ``conversations`` conversations (1,000), half of them IRC
channels (10 raw-socket IRC clients share them), half HTTP conversations (created with
``POST /agentik/conversations``; answers read from one ``GET /agentik/events`` stream),
``turns`` turns each (8; every third one, the first included, asks for the 20 KB report),
``window`` conversations (40) active at a time: a steady rate of questions (conversations
x turns over the load phase), round robin over the active conversations that are not
waiting for an answer; a conversation that had its turns leaves the window, a new one
enters.  ``/metrics`` is scraped every 30 seconds (5 in ``--quick``), as a Prometheus
server would.  After the load phase comes an idle phase (three idle times and a bit):
channels are released, idle conversations reflect and are dropped.

Every ``sample`` seconds the bot process's RSS (``/proc/<pid>/status`` VmRSS) and CPU
time are read; a table row is printed every minute (5 s in ``--quick``).  Reported: the
RSS at the mark (10 minutes into the load, or 1/6 of the run in shorter ones; read after
``gc.collect()`` in the bot), its growth from there to the end of the load (goal
<= 20 MB), the RSS after the idle phase against the mark's (goal: within 10%), turns
answered, errors (answers missing or wrong), CPU per turn, and what happened (tool calls,
compactions, mining and reflection requests, conversations loaded at the end).

``BENCH_TRACEMALLOC=<file>``: the bot process traces its allocations (10 frames) from
start-up, snapshots them at the mark and at the end of the load, and writes the top
differences (by line and by traceback) to ``<file>``.
The exit status is 0 unless ``--strict`` is given and a goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import re
import sys
import tempfile
import time
import tomllib
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import bench_irc

from _common import (
    ChildProcess,
    Row,
    finish,
    free_port,
    irc_bot_edits,
    mb,
    ms,
    proc_status,
    process_cpu,
    say,
    say_environment,
    version,
)

SCRIPT = os.path.abspath(__file__)
ROOT = Path(SCRIPT).parent.parent
EXAMPLE = ROOT / "config.example.toml"
MCP_SERVER = ROOT / "benchmarks" / "data" / "soak_mcp.py"
HOST = "127.0.0.1"
BOT_NICK = bench_irc.BOT_NICK
MODEL = bench_irc.MODEL
IRC_SECTION = bench_irc.IRC_SECTION
HTTP_SECTION = "transports.web"  # the example's HTTP API, switched on
TOOL_CHARS = 20_000  # one tool output
CONTEXT_TOKENS = 16_000  # [compaction] context_tokens: three tool outputs do not fit
GOAL_GROWTH = 20 * 2**20  # RSS growth from the mark to the end of the load
GOAL_IDLE = 1.10  # RSS after the idle phase / RSS at the mark
TOKEN = re.compile(r"\b(soak|report) (c\d+t\d+)\b")
ANSWER = re.compile(r"\b(ok|reported) (c\d+t\d+)\b")
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- configuration -----------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    quick: bool
    duration: float  # seconds in all: load, then idle
    conversations: int
    turns: int  # per conversation
    tool_every: int  # turns 0, tool_every, 2 * tool_every ... ask for the report
    window: int  # conversations active at a time
    idle: float  # channel release, reflect_after_idle (seconds)
    sample: float  # seconds between two RSS samples
    print_every: float  # seconds between two printed rows
    scrape_every: float  # seconds between two /metrics scrapes
    irc_clients: int
    turn_timeout: float

    @property
    def idle_phase(self) -> float:
        return 3 * self.idle + 15

    @property
    def load(self) -> float:
        return self.duration - self.idle_phase

    @property
    def rate(self) -> float:
        return self.conversations * self.turns / self.load

    @property
    def mark(self) -> float:
        """Seconds into the load at which the reference RSS is read."""
        return min(600.0, self.duration / 6)

    @property
    def irc_conversations(self) -> int:
        return (self.conversations + 1) // 2


FULL = Config(
    quick=False, duration=3600, conversations=1000, turns=8, tool_every=3, window=40,
    idle=120, sample=5, print_every=60, scrape_every=30, irc_clients=10, turn_timeout=180,
)  # fmt: skip
QUICK = Config(
    quick=True, duration=90, conversations=100, turns=6, tool_every=2, window=20, idle=5,
    sample=1, print_every=5, scrape_every=5, irc_clients=4, turn_timeout=60,
)  # fmt: skip


def scaled(cfg: Config, duration: float | None, conversations: int | None) -> Config:
    """``cfg`` for another duration (timers scaled: idle time 1/30 of it, 5-120 s)."""
    values = dict(cfg.__dict__)
    if conversations:
        values["conversations"] = conversations
        values["window"] = min(cfg.window, max(2, conversations // 4))
    if duration:
        values["duration"] = duration
        values["idle"] = max(5.0, min(120.0, duration / 30))
        values["sample"] = 1.0 if duration < 600 else 5.0
        values["print_every"] = 5.0 if duration < 600 else 60.0
        values["scrape_every"] = 5.0 if duration < 600 else 30.0
    out = Config(**values)
    if out.load < 20:
        raise SystemExit(f"--duration {duration}: too short (the idle phase is {out.idle_phase}s)")
    return out


def channel_names(cfg: Config) -> list[str]:
    return [f"#soak{i}" for i in range(cfg.irc_conversations)]


def agentik_config(
    folder: Path, cfg: Config, irc_port: int, http_port: int, channels: list[str]
) -> Path:
    """Write the soak's configuration (see the module's docstring); return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    edits = irc_bot_edits(
        folder, section=IRC_SECTION, host=HOST, port=irc_port, nick=BOT_NICK, channels=channels
    )
    edits[HTTP_SECTION] = {"enabled": "true", "port": str(http_port)}
    edits["compaction"] = {"context_tokens": str(CONTEXT_TOKENS)}
    edits["memory"] = {
        "reflect_after_idle": json.dumps(f"{cfg.idle:g}s"),
        "release_vectors_after_idle": json.dumps(f"{cfg.idle:g}s"),
        "mining_debounce": f"{min(30.0, cfg.idle):g}",
    }
    text = bench_irc.edit_toml(EXAMPLE.read_text(), edits)
    text += (
        "\n[[mcp.servers]]\n"
        'name = "soak"\n'
        f"command = {json.dumps(sys.executable)}\n"
        f"args = [{json.dumps(str(MCP_SERVER))}]\n"
    )
    data = tomllib.loads(text)  # the edits landed where they should
    assert data["transports"]["libera"]["channels"] == channels
    assert data["transports"]["web"]["enabled"] and data["transports"]["web"]["port"] == http_port
    assert data["compaction"]["context_tokens"] == CONTEXT_TOKENS
    assert data["mcp"]["servers"][0]["name"] == "soak"
    path = folder / "agentik.toml"
    path.write_text(text)
    return path


# -- child processes: the bot and the model -----------------------------------------------
_PROTO: IO[str] | None = None


def _emit(obj: dict[str, Any]) -> None:
    assert _PROTO is not None
    _PROTO.write(json.dumps(obj) + "\n")
    _PROTO.flush()


async def _commands() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


class _Tracer:
    """``BENCH_TRACEMALLOC``: snapshots at the mark and at the end, the diff to a file."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.marked: Any = None
        if path:
            import tracemalloc

            tracemalloc.start(10)

    def mark(self) -> None:
        if self.path:
            import tracemalloc

            gc.collect()
            self.marked = tracemalloc.take_snapshot()

    def dump(self) -> None:
        if not self.path or self.marked is None:
            return
        import tracemalloc

        gc.collect()
        now = tracemalloc.take_snapshot()
        keep = [tracemalloc.Filter(False, tracemalloc.__file__)]
        before, after = self.marked.filter_traces(keep), now.filter_traces(keep)
        with open(self.path, "w") as out:
            size, peak = tracemalloc.get_traced_memory()
            out.write(f"traced now {size / 2**20:.1f} MB, peak {peak / 2**20:.1f} MB\n\n")
            out.write("== top 40 differences by line (end of load - mark)\n")
            for stat in after.compare_to(before, "lineno")[:40]:
                out.write(f"{stat}\n")
            out.write("\n== top 15 differences by traceback\n")
            for stat in after.compare_to(before, "traceback")[:15]:
                out.write(f"\n{stat}\n")
                for line in stat.traceback.format():
                    out.write(f"{line}\n")
        self.marked = None


def _libc() -> Any:
    import ctypes
    import ctypes.util

    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def _mallinfo() -> dict[str, int]:
    """glibc's heap figures (all arenas): bytes in use and bytes free but kept."""
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]  # fmt: skip

    try:
        fn = _libc().mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = Info
    info = fn()
    return {"malloc_used": info.uordblks + info.hblkhd, "malloc_free": info.fordblks}


def _malloc_trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        _libc().malloc_trim(0)


def _object_types() -> Counter[str]:
    """How many objects the garbage collector tracks, by type."""
    gc.collect()
    return Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


def _vectors(memory: Any) -> dict[str, int]:
    """The notes' vectors in the bot's memory now, and the scopes released and read back."""
    index = getattr(memory, "_index", None)
    return {
        "vectors": len(index) if index is not None else 0,
        "scopes_released": getattr(memory, "scopes_released", 0),
        "scopes_loaded": getattr(memory, "scopes_loaded", 0),
    }


async def bot_child(args: argparse.Namespace) -> None:
    """``agentik run -c <config>``, the channel release shortened, commands on stdin."""
    import signal

    tracer = _Tracer(os.environ.get("BENCH_TRACEMALLOC"))
    from agentik.bot.app import Bot
    from agentik.bot.config import load_config
    from agentik.bot.logs import setup_logging

    config = load_config(args.config)
    setup_logging(config.logging.level, config.logging.format, config.secrets())
    bot = Bot(config)
    bot.bridge.idle_seconds = args.idle
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, bot.stop_requested.set)
    channels = [c.lower() for c in args.channels.split(",")]
    types: Counter[str] = Counter()
    async with bot:
        serving = asyncio.create_task(bot.serve())
        transport: Any = bot.transports["libera"]
        await bench_irc._until(
            lambda: serving.done() or all(c in transport.joined for c in channels),
            "the bot to join",
            60 + len(channels) * 0.2,
        )
        if serving.done():
            await serving  # raises what stopped it
        gc.collect()
        _emit({"ready": True})
        reader = await _commands()
        while True:
            cmd = (await reader.readline()).decode().strip()
            if cmd in ("gc", "trim"):
                gc.collect()
                if cmd == "trim":
                    _malloc_trim()
                st = proc_status()
                _emit({"rss": st["VmRSS"], "hwm": st["VmHWM"], "cpu": process_cpu(),
                       "objects": len(gc.get_objects()), "tasks": len(asyncio.all_tasks()),
                       "blocks": sys.getallocatedblocks(), **_mallinfo(),
                       **_vectors(bot.agent.memory)})  # fmt: skip
            elif cmd == "mark":
                tracer.mark()
                types = _object_types()
                _emit({"marked": True})
            elif cmd == "dump":
                tracer.dump()
                grown = _object_types()
                grown.subtract(types)
                _emit({"types": [[name, n] for name, n in grown.most_common(12) if n > 0]})
            elif cmd in ("quit", ""):
                break
        bot.stop_requested.set()
        await serving


def script_reply(body: dict[str, Any], counts: Counter[str]) -> Any:
    """The soak's model (see the module's docstring)."""
    import uuid

    from agentik.core.testing.openai_server import Reply, _text_of

    messages = body.get("messages") or []
    system = " ".join(_text_of(m.get("content")) for m in messages if m.get("role") == "system")
    if "You maintain the memory of a chat assistant" in system:
        counts["summaries"] += 1
        return Reply.text("People asked for reports and short answers; every report was given.")
    if "extract the durable facts" in system:
        counts["mining"] += 1
        series = re.findall(r"\bc(\d+)t\d+", json.dumps(messages))
        name = f"series {series[-1]}" if series else "the series"
        return Reply.text(
            f"- The channel follows {name} closely.\n- Reports there run to 20,000 characters."
            f"\n- People there prefer short answers."
        )
    if "has just ended. Write a short reflection" in system:
        counts["reflections"] += 1
        return Reply.text("The people asked for reports and got them; nothing is left open.")
    users = [m for m in messages if m.get("role") == "user"]
    found = TOKEN.findall(_text_of(users[-1].get("content")) if users else "")
    if not found:
        counts["unknown"] += 1
        return Reply.text("ok")
    kind, token = found[-1]
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        counts["tool_answers"] += 1
        size = len(_text_of(last.get("content")))
        return Reply.text(f"reported {token} ({size} characters)", chunks=2)
    if kind == "report":
        counts["tool_calls"] += 1
        arguments = json.dumps({"topic": token, "size": TOOL_CHARS})
        return Reply.tool_calls([(f"call_{uuid.uuid4().hex[:12]}", "soak__report", arguments)])
    counts["answers"] += 1
    return Reply.text(f"ok {token}", chunks=2)


async def llm_child(args: argparse.Namespace) -> None:
    """The scripted fake OpenAI server; ``counts`` on stdin prints what it answered."""
    from agentik.core.testing.openai_server import FakeOpenAIServer

    counts: Counter[str] = Counter()
    server = FakeOpenAIServer(MODEL, max_body_bytes=1 << 26)

    def reply(body: dict[str, Any]) -> Any:
        # It records every request: an hour of them is gigabytes.
        server.requests.clear()
        server.request_headers.clear()
        server.embedding_requests.clear()
        return script_reply(body, counts)

    server.default = reply
    async with server:
        _emit({"url": server.base_url})
        reader = await _commands()
        while True:
            cmd = (await reader.readline()).decode().strip()
            if cmd == "counts":
                _emit(dict(counts))
            elif cmd in ("quit", ""):
                return


def child_main(args: argparse.Namespace) -> int:
    global _PROTO
    _PROTO = os.fdopen(os.dup(1), "w")  # our protocol; anything else printed goes to stderr
    os.dup2(2, 1)
    runner = {"bot": bot_child, "llm": llm_child}[args.child]
    asyncio.run(runner(args))
    return 0


class Child(ChildProcess):
    async def ask(self, cmd: str, limit: float | None = None) -> dict[str, Any]:
        await self.send_line(cmd)
        return await self.recv(limit)


# -- the load ----------------------------------------------------------------------------
@dataclass
class Conv:
    index: int
    kind: str  # "irc" or "http"
    client: Any = None  # IRC: the load client in its channel
    channel: str = ""  # IRC: the channel; HTTP: the conversation id once created
    turn: int = 0
    busy: bool = False


@dataclass
class Sample:
    t: float  # seconds since the load started
    phase: str
    rss: int
    cpu: float
    turns: int
    errors: int


@dataclass
class Stats:
    sent: int = 0
    answered: int = 0
    errors: int = 0
    skipped: int = 0  # ticks with no conversation free to ask
    unexpected: int = 0  # lines or answers nobody waited for
    latencies: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        self.errors += 1
        if len(self.problems) < 10:
            self.problems.append(text)


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Load:
    """Sends the questions and matches the answers, over IRC and HTTP."""

    def __init__(self, cfg: Config, http_base: str, irc_pairs: list[tuple[Any, str]]) -> None:
        self.cfg = cfg
        self.http_base = http_base
        self.stats = Stats()
        self.waiting: dict[str, tuple[float, str, asyncio.Future[str]]] = {}  # token
        self.runs: dict[str, str] = {}  # HTTP run id -> token
        self.ended: dict[str, str] = {}  # HTTP run id -> answer, ended before it was known
        self.convs: list[Conv] = []
        for i in range(cfg.conversations):
            if i % 2 == 0 and i // 2 < len(irc_pairs):
                client, chan = irc_pairs[i // 2]
                self.convs.append(Conv(i, "irc", client, chan))
            else:
                self.convs.append(Conv(i, "http"))
        for client in {c for c, _ in irc_pairs}:
            client.on_answer = self._irc_answer(client)
        self.session: Any = None
        self.tasks: set[asyncio.Task[None]] = set()

    # answers
    def _irc_answer(self, client: Any) -> Any:
        def on_answer(channel: str, text: str, now: float) -> None:
            self._answer(text, f"{channel}: {text!r}")

        return on_answer

    def _answer(self, text: str, where: str) -> None:
        found = ANSWER.findall(text)
        entry = self.waiting.pop(found[-1][1], None) if found else None
        if entry is None:
            self.stats.unexpected += 1
            return
        if not entry[2].done():
            entry[2].set_result(text)

    async def follow_events(self) -> None:
        """One ``/agentik/events`` stream (reconnecting where it left off)."""
        last = ""
        while True:
            headers = {"Last-Event-ID": last} if last else {}
            try:
                async with self.session.get(
                    f"{self.http_base}/agentik/events?profile=chat", headers=headers, timeout=None
                ) as resp:
                    async for raw in resp.content:
                        line = raw.decode("utf-8", "replace").rstrip("\r\n")
                        if line.startswith("id: "):
                            last = line[4:]
                        elif line.startswith("data: "):
                            self._event(json.loads(line[6:]))
            except (TimeoutError, OSError, ValueError) as exc:
                self.stats.unexpected += 1
                say(f"  (event stream ended: {exc!r}; reconnecting)")
            await asyncio.sleep(0.5)

    def _event(self, event: dict[str, Any]) -> None:
        if event.get("kind") != "turn_ended" or event.get("parent_run_id"):
            return
        run = str(event.get("run_id"))
        token = self.runs.pop(run, None)
        if token is None:
            self.ended[run] = str(event.get("text") or "")
            return
        self._answer(str(event.get("text") or ""), f"http {run}")

    # questions
    async def ask(self, conv: Conv) -> None:
        token = f"c{conv.index}t{conv.turn}"
        word = "report" if conv.turn % self.cfg.tool_every == 0 else "soak"
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        started = time.perf_counter()
        self.waiting[token] = (started, conv.channel, fut)
        self.stats.sent += 1
        try:
            if conv.kind == "irc":
                conv.client.send(conv.channel, f"{BOT_NICK}: {word} {token} for the team")
            else:
                await self._post(conv, f"{word} {token} for the team")
            async with asyncio.timeout(self.cfg.turn_timeout):
                text = await fut
            expected = "reported" if word == "report" else "ok"
            if not re.search(rf"\b{expected} {token}\b", text):
                self.stats.problem(f"{token}: wrong answer {text[:120]!r}")
            else:
                self.stats.answered += 1
                self.stats.latencies.append(time.perf_counter() - started)
        except TimeoutError:
            self.stats.problem(f"{token} ({conv.kind}): no answer in {self.cfg.turn_timeout:.0f}s")
        except Exception as exc:
            self.stats.problem(f"{token} ({conv.kind}): {exc!r}")
        finally:
            self.waiting.pop(token, None)
            conv.turn += 1
            conv.busy = False

    async def _post(self, conv: Conv, text: str) -> None:
        if not conv.channel:
            async with self.session.post(
                f"{self.http_base}/agentik/conversations", json={"title": f"soak {conv.index}"}
            ) as resp:
                if resp.status != 201:
                    raise RuntimeError(f"create: HTTP {resp.status} {await resp.text()}")
                conv.channel = (await resp.json())["id"]
        async with self.session.post(
            f"{self.http_base}/agentik/conversations/{conv.channel}/messages",
            json={"content": text, "author": f"web{conv.index % 7}"},
        ) as resp:
            if resp.status != 202:
                raise RuntimeError(f"message: HTTP {resp.status} {await resp.text()}")
            run = (await resp.json())["run_id"]
        token = TOKEN.findall(text)[-1][1]
        if run in self.ended:
            self._answer(self.ended.pop(run), f"http {run}")
        else:
            self.runs[run] = token

    async def run(self, until: float) -> None:
        """Questions at the steady rate until all conversations had their turns or
        ``until`` (a ``loop.time()``)."""
        loop = asyncio.get_running_loop()
        active: deque[Conv] = deque()
        fresh = iter(self.convs)
        start = loop.time()
        for i in range(10**9):
            when = start + i / self.cfg.rate
            if when >= until:
                break
            await asyncio.sleep(max(0.0, when - loop.time()))
            for conv in list(active):
                if conv.turn >= self.cfg.turns and not conv.busy:
                    active.remove(conv)
            while len(active) < self.cfg.window:
                nxt = next(fresh, None)
                if nxt is None:
                    break
                active.append(nxt)
            if not active:
                break
            for _ in range(len(active)):
                conv = active[0]
                active.rotate(-1)
                if not conv.busy and conv.turn < self.cfg.turns:
                    conv.busy = True
                    task = asyncio.create_task(self.ask(conv))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                    break
            else:
                self.stats.skipped += 1

    async def drain(self, limit: float) -> None:
        if self.tasks:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limit):
                    await asyncio.gather(*list(self.tasks))


def parse_metrics(text: str) -> dict[str, float]:
    """Sums of the sample values of each metric family (labels added together)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0]
        with contextlib.suppress(ValueError):
            out[name] = out.get(name, 0.0) + float(value)
    return out


# -- the benchmark ---------------------------------------------------------------------------
async def bench(cfg: Config, tmp: str, server_name: str) -> list[Row]:
    import aiohttp

    server = await bench_irc.start_irc_server(server_name, tmp)
    llm = await Child.spawn(SCRIPT, "llm", tmp, "llm")
    bot: Child | None = None
    clients: list[Any] = []
    session: aiohttp.ClientSession | None = None
    background: list[asyncio.Task[Any]] = []
    try:
        llm_url = (await llm.recv())["url"]
        channels = channel_names(cfg)
        http_port = free_port()
        path = agentik_config(Path(tmp) / "bot", cfg, server.port, http_port, channels)
        env = bench_irc.child_env(llm_url)
        bot = await Child.spawn(
            SCRIPT, "bot", tmp, "bot", "--config", str(path), "--channels", ",".join(channels),
            "--idle", str(cfg.idle), env=env,
        )  # fmt: skip
        await bot.recv(120 + len(channels) * 0.2)
        pid = bot.proc.pid
        base = f"http://{HOST}:{http_port}"
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        for _ in range(600):
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{base}/ready") as resp:
                    if resp.status == 200:
                        break
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError(f"/ready never answered 200:\n{bot.log()[-3000:]}")
        ready = await bot.ask("gc")
        say(f"== bot ready: RSS {mb(ready['rss'])}, pid {pid}")

        clients, pairs = await bench_irc.connect_clients(
            server.port, "s", channels, cfg.irc_clients
        )
        load = Load(cfg, base, pairs)
        load.session = session
        background.append(asyncio.create_task(load.follow_events()))
        metrics: dict[str, float] = {}

        async def scrape() -> None:
            while True:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(f"{base}/metrics") as resp:
                        metrics.update(parse_metrics(await resp.text()))
                await asyncio.sleep(cfg.scrape_every)

        background.append(asyncio.create_task(scrape()))

        loop = asyncio.get_running_loop()
        t0 = loop.time()
        phase = ["load"]
        samples: list[Sample] = []
        say(f"== RSS of the bot over time (a row every {cfg.print_every:g} s)")
        say(f"  {'t (s)':>7}  {'phase':<5}  {'RSS':>9}  {'turns':>6}  {'errors':>6}  {'CPU %':>6}")

        async def sampler() -> None:
            last_print = -1e9
            prev: Sample | None = None
            while True:
                now = loop.time() - t0
                st = proc_status(pid)
                s = Sample(now, phase[0], st["VmRSS"], proc_cpu(pid), load.stats.answered,
                           load.stats.errors)  # fmt: skip
                samples.append(s)
                if now - last_print >= cfg.print_every - 1e-6:
                    cpu = "" if prev is None else f"{100 * (s.cpu - prev.cpu) / (s.t - prev.t):.0f}"
                    say(f"  {now:7.0f}  {s.phase:<5}  {mb(s.rss):>9}  {s.turns:>6}"
                        f"  {s.errors:>6}  {cpu:>6}")  # fmt: skip
                    last_print, prev = now, s
                await asyncio.sleep(cfg.sample)

        background.append(asyncio.create_task(sampler()))

        async def at_mark() -> dict[str, Any]:
            await asyncio.sleep(cfg.mark)
            stats = await bot.ask("gc")
            stats["turns"] = load.stats.answered
            await bot.ask("mark", 600)
            return stats

        marking = asyncio.create_task(at_mark())
        cpu0, turns0 = proc_cpu(pid), load.stats.answered
        await load.run(t0 + cfg.load)
        await load.drain(cfg.turn_timeout)
        cpu1, turns_load = proc_cpu(pid), load.stats.answered
        mark = await marking
        end = await bot.ask("gc")
        grown = (await bot.ask("dump", 600))["types"]
        load_end = loop.time() - t0
        say(f"  -- load over at {load_end:.0f} s: RSS {mb(end['rss'])} (after gc.collect())")
        phase[0] = "idle"
        await asyncio.sleep(cfg.idle_phase)
        idle = await bot.ask("gc")
        trimmed = await bot.ask("trim")  # what the allocator keeps but could give back
        await asyncio.sleep(cfg.scrape_every + 1)  # one more scrape
        counts = await llm.ask("counts")
        hwm = idle["hwm"]
    finally:
        for task in background:
            task.cancel()
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()
        if session is not None:
            await session.close()
        if bot is not None:
            await bot.stop()
        await llm.stop()
        await server.stop()

    stats = load.stats
    say()
    say("== the load")
    planned = cfg.conversations * cfg.turns
    lat = sorted(stats.latencies) or [0.0]
    say(f"  questions sent {stats.sent} of {planned} planned; answered {stats.answered};"
        f" errors {stats.errors}; ticks with no conversation free {stats.skipped};"
        f" unexpected lines {stats.unexpected}")  # fmt: skip
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    say(f"  latency p50 {ms(lat[len(lat) // 2])}, p99 {ms(p99)}, max {ms(lat[-1])}")
    for problem in stats.problems:
        say(f"  problem: {problem}")
    say(f"  the model answered: {', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}")

    def metric(name: str) -> float:
        return metrics.get(name, metrics.get(f"{name}_total", 0.0))

    say(f"  the bot counted: turns {metric('agentik_turns'):.0f}, tool calls"
        f" {metric('agentik_tool_calls'):.0f}, compactions {metric('agentik_compactions'):.0f},"
        f" turn errors {metric('agentik_turn_errors'):.0f}; conversations loaded at the end"
        f" {metric('agentik_loaded_conversations'):.0f}")  # fmt: skip
    say(f"  bot objects (gc): ready {ready['objects']:,}, mark {mark['objects']:,},"
        f" end of load {end['objects']:,}, after idle {idle['objects']:,};"
        f" tasks {ready['tasks']}, {mark['tasks']}, {end['tasks']}, {idle['tasks']}")  # fmt: skip
    for name, st in (("ready", ready), ("mark", mark), ("end of load", end), ("after idle", idle),
                     ("after idle + malloc_trim(0)", trimmed)):  # fmt: skip
        if "malloc_used" in st:
            say(f"  {name}: RSS {mb(st['rss'])}; malloc in use {mb(st['malloc_used'])}, free but"
                f" kept {mb(st['malloc_free'])}; Python blocks {st['blocks']:,}")  # fmt: skip
    say("  notes' vectors in memory: " + ", ".join(
        f"{name} {st.get('vectors', 0):,}" for name, st in (
            ("ready", ready), ("mark", mark), ("end of load", end), ("after idle", idle)))
        + f"; scopes released {idle.get('scopes_released', 0):,},"
          f" read back {idle.get('scopes_loaded', 0):,}")  # fmt: skip
    say("  objects the bot gained from the mark to the end of the load, by type: "
        + (", ".join(f"{name} +{n:,}" for name, n in grown) or "none"))  # fmt: skip
    after = [s for s in samples if cfg.mark <= s.t <= load_end]
    peak_after = max((s.rss for s in after), default=mark["rss"])
    say(f"  RSS (gc.collect()): ready {mb(ready['rss'])}, mark ({cfg.mark:.0f} s,"
        f" {mark['turns']} turns) {mb(mark['rss'])}, end of load {mb(end['rss'])},"
        f" after idle {mb(idle['rss'])}; sampled peak after the mark {mb(peak_after)};"
        f" VmHWM {mb(hwm)}")  # fmt: skip
    say()

    done = max(1, turns_load - turns0)
    growth = end["rss"] - mark["rss"]
    back = idle["rss"] / mark["rss"]
    return [
        Row("RSS at the mark", mb(mark["rss"]), mb(ready["rss"]), mark["rss"] / ready["rss"],
            "- (baseline: ready)", None),
        Row("RSS growth, mark to end of load", mb(growth), mb(mark["rss"]), None,
            f"<= {GOAL_GROWTH / 2**20:.0f} MB", growth <= GOAL_GROWTH),
        Row("RSS after idle release", mb(idle["rss"]), mb(mark["rss"]), back,
            f"<= {GOAL_IDLE:.2f}x", back <= GOAL_IDLE),
        Row("turns answered", f"{stats.answered}", f"{planned}", stats.answered / planned,
            "-", None),
        Row("errors", f"{stats.errors}", "0", None, "0", stats.errors == 0),
        Row("CPU per turn (bot process)", ms((cpu1 - cpu0) / done), "-", None, "-", None),
        Row("tool calls (20 KB outputs)", f"{counts.get('tool_calls', 0)}", "-", None, ">= 1",
            counts.get("tool_calls", 0) > 0),
        Row("compactions", f"{counts.get('summaries', 0)}", "-", None, ">= 1",
            counts.get("summaries", 0) > 0),
        Row("reflections", f"{counts.get('reflections', 0)}", "-", None, ">= 1",
            counts.get("reflections", 0) > 0),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about 90 s, 100 conversations")
    parser.add_argument("--duration", type=float, default=None, help="seconds in all (3600)")
    parser.add_argument("--conversations", type=int, default=None, help="conversations (1000)")
    parser.add_argument(
        "--server", choices=("ngircd", "miniircd"), default="ngircd", help="IRC server to use"
    )
    parser.add_argument("--tmpdir", default=None, help="where to put configs, databases, logs")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a goal is missed")
    parser.add_argument("--child", choices=("bot", "llm"), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--channels", help=argparse.SUPPRESS)
    parser.add_argument("--idle", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args)

    cfg = scaled(QUICK if args.quick else FULL, args.duration, args.conversations)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="agentik-bench-soak-", dir=args.tmpdir) as tmp:
        say_environment(
            [
                ("irc server", args.server),
                ("agentik", f"{version('agentik')}, config.example.toml (see the docstring)"),
                ("mcp", f"{version('mcp')}, benchmarks/data/soak_mcp.py over stdio"),
                ("temp dir", tmp),
                (
                    "mode",
                    f"{'quick' if cfg.quick else 'full'}: {cfg.duration:g} s ({cfg.load:.0f} s"
                    f" load, {cfg.idle_phase:.0f} s idle), {cfg.conversations} conversations"
                    f" ({cfg.irc_conversations} IRC, the rest HTTP) x {cfg.turns} turns,"
                    f" {cfg.window} at a time, {cfg.rate:.2f} questions/s; a {TOOL_CHARS:,}"
                    f"-character tool output every {cfg.tool_every} turns; idle timers"
                    f" {cfg.idle:g} s; mark at {cfg.mark:.0f} s",
                ),
            ]
        )
        rows = asyncio.run(bench(cfg, tmp, args.server))
    return finish(rows, strict=args.strict, started=started)


if __name__ == "__main__":
    sys.exit(main())
