"""Helpers shared by the benchmark scripts (``bench_*.py``).

The scripts are run by path (``python benchmarks/bench_core.py``), which puts this folder
on ``sys.path``, so they import this module as ``_common``.  Only the standard library is
imported here: ``bench_irc.py`` measures the RSS of child processes that must not load
agentik or the OpenAI SDK.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any


# -- results ---------------------------------------------------------------------------
@dataclass
class Row:
    name: str
    value: str
    baseline: str
    ratio: float | None
    goal: str
    ok: bool | None  # None: informational
    _: KW_ONLY
    section: str = ""  # the "#" column of the summary, where a script has sections

    @property
    def result(self) -> str:
        return "info" if self.ok is None else ("PASS" if self.ok else "MISS")


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def per_s(value: float, unit: str) -> str:
    """``value`` per second, e.g. ``per_s(1234.5, "msg/s")`` is ``1,234 msg/s``."""
    return f"{value:,.0f} {unit}"


def mb(n_bytes: float) -> str:
    return f"{n_bytes / 2**20:.1f} MB"


def say(text: str = "") -> None:
    print(text, flush=True)


def print_table(rows: list[Row], *, sections: bool = False) -> None:
    """The summary table and the goals missed; ``sections`` adds a ``#`` column first."""
    header: tuple[str, ...] = ("measurement", "agentik", "baseline", "ratio", "goal", "result")
    body: list[tuple[str, ...]] = [
        (r.name, r.value, r.baseline, f"{r.ratio:.2f}x" if r.ratio is not None else "-", r.goal,
         r.result)
        for r in rows
    ]  # fmt: skip
    right = {1, 2, 3}
    if sections:
        header = ("#", *header)
        body = [(r.section, *cells) for r, cells in zip(rows, body, strict=True)]
        right = {i + 1 for i in right}
    widths = [max(len(str(x[i])) for x in [header, *body]) for i in range(len(header))]

    def fmt(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)
        ).rstrip()

    line = "-" * len(fmt(header))
    say("== summary (ratio = agentik / baseline)")
    say(line)
    say(fmt(header))
    say(line)
    for cells in body:
        say(fmt(cells))
    say(line)
    graded = [r for r in rows if r.ok is not None]
    missed = [r for r in graded if not r.ok]
    say(f"{len(graded) - len(missed)}/{len(graded)} goals met")
    for r in missed:
        where = f"[{r.section}] " if sections else ""
        say(f"  MISS {where}{r.name}: {r.value} (baseline {r.baseline}), goal {r.goal}")


def finish(
    rows: list[Row], *, strict: bool, sections: bool = False, started: float | None = None
) -> int:
    """The end of every script: the summary table, the total time when ``started`` (a
    ``time.perf_counter()``) is given, and the exit status (1: ``strict`` and a goal missed)."""
    print_table(rows, sections=sections)
    if started is not None:
        say(f"total time {time.perf_counter() - started:.1f} s")
    return 1 if strict and any(r.ok is False for r in rows) else 0


# -- environment -------------------------------------------------------------------------
def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def say_environment(items: Iterable[tuple[str, str]]) -> None:
    """The ``== environment`` block: Python, platform and CPU, then ``items`` (label, value)."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    say("== environment")
    for label, value in (
        ("python", f"{sys.version.split()[0]} ({platform.python_implementation()})"),
        ("platform", platform.platform()),
        ("cpu", f"{cpu_model()}; cpu_count={os.cpu_count()} usable={affinity}"),
        *items,
    ):
        say(f"{label:<11} {value}")
    say()


def _status(pid: int | str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            parts = value.split()
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return out


def writer_processes(pid: int | str = "self") -> list[int]:
    """``pid``'s SQLite writer processes (``[storage] writer = "process"``): its
    children running ``agentik.core.store.sqlite_writer``."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"sqlite_writer" in cmdline:
                found.append(int(child))
    return found


def _private(pid: int) -> int:
    """Bytes of ``pid``'s pages no other process maps (what its exit would free)."""
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Private_Clean", "Private_Dirty"):
            total += int(value.split()[0]) * 1024
    return total


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM (bytes) and Threads of ``pid`` from /proc, with what its SQLite
    writer process adds: the writer's private pages (its own heap, SQLite's cache).
    The pages it shares are the interpreter's and the libraries' files the bot maps
    too, already in the bot's RSS; counting its whole RSS would count them twice."""
    out = _status(pid)
    for child in writer_processes(pid):
        try:
            extra = _private(child)
        except OSError:
            continue
        out["VmRSS"] += extra
        out["VmHWM"] += extra
    return out


def writer_cpu(pid: int | str = "self") -> float:
    """CPU seconds (user + system) of ``pid``'s SQLite writer processes so far."""
    total = 0.0
    for child in writer_processes(pid):
        # (One thread: its schedstat's time on a CPU, in ns; /proc's stat counts ticks.)
        try:
            total += int(Path(f"/proc/{child}/schedstat").read_text().split()[0]) / 1e9
        except OSError:
            continue
    return total


def process_cpu() -> float:
    """This process's CPU seconds (every thread), its SQLite writer process's included."""
    return time.process_time() + writer_cpu()


# -- configuration -------------------------------------------------------------------------
def irc_bot_edits(
    folder: Path, *, section: str, host: str, port: int, nick: str, channels: list[str]
) -> dict[str, dict[str, str]]:
    """The edits (table: key: TOML value, for ``bench_irc.edit_toml``) that point
    config.example.toml's bot at a local IRC server: the OpenAI backend (its endpoint
    from the environment), the database in ``folder``, the terminal off, the IRC
    network ``section`` switched on at ``host:port`` as ``nick`` in ``channels``, with
    flood control and queue limits out of the way (a bench measures agentik, not its
    throttles).  A script adds its own tables to the dict."""
    irc = {
        "enabled": "true",
        "host": json.dumps(host),
        "port": str(port),
        "tls": "false",
        "nick": json.dumps(nick),
        "channels": json.dumps(channels),
        "flood_burst": "1000000",
        "flood_rate": "1000000000.0",
        "user_rate_limit": "1000000",
        "queue_limit": "1000000",
        "target_queue_limit": "1000000",
    }
    return {
        "llm": {"backend": '"openai"'},
        "storage": {"path": json.dumps(str(folder / "agentik.db"))},
        "transports.terminal": {"enabled": "false"},
        section: irc,
    }


# -- servers -------------------------------------------------------------------------------
def _port_block() -> Any:
    """The benchmarks' ports: 18000-19999, below the kernel's ephemeral range and below
    the tests' blocks (20000 up, one per xdist worker), so a benchmark run beside the
    tests does not race them for a port.  Benchmarks run one at a time: one block.
    The picker is agentik's (core/testing/ports.py, standard library only), loaded by
    path so that a bare baseline imports nothing of agentik."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "core" / "testing" / "ports.py"
    spec = importlib.util.spec_from_file_location("_agentik_test_ports", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PortBlock(18000, 2000)


_ports: Any = None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free now, for a server the benchmark starts next
    (not the kernel's ``bind(0)``: see core/testing/ports.py)."""
    global _ports
    if _ports is None:
        _ports = _port_block()
    return int(_ports.take(host))


async def aclose_all(*parts: object) -> None:
    """Close a bot's parts in order (e.g. transport, bridge, agent), each awaited."""
    for part in parts:
        await part.aclose()  # type: ignore[attr-defined]


@contextmanager
def fake_openai_server() -> Iterator[str]:
    """Run the fake OpenAI server in its own process (its CPU is not ours); yield its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentik.core.testing.openai_server", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError(f"the fake OpenAI server did not start (printed {url!r})")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ChildProcess:
    """A child process of a benchmark script (``script --child <kind> ...``) that
    answers JSON lines on its stdout; its stderr goes to ``<tmp>/<tag>.log``."""

    #: Seconds :meth:`recv` waits for a line by default.
    wait = 60.0

    def __init__(self, proc: asyncio.subprocess.Process, log_path: Path, kind: str) -> None:
        self.proc = proc
        self.log_path = log_path
        self.kind = kind

    @classmethod
    async def spawn(
        cls,
        script: str,
        kind: str,
        tmp: str,
        tag: str,
        *extra: str,
        env: dict[str, str] | None = None,
    ) -> Any:
        log_path = Path(tmp) / f"{tag}.log"
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                script,
                "--child",
                kind,
                *extra,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                limit=1 << 24,
            )
        return cls(proc, log_path, kind)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace").strip()
        except OSError:
            return ""

    async def recv(self, limit: float | None = None) -> dict[str, Any]:
        """The next JSON line from the child (waiting up to ``limit`` seconds)."""
        limit = self.wait if limit is None else limit
        assert self.proc.stdout is not None
        try:
            async with asyncio.timeout(limit):
                line = await self.proc.stdout.readline()
        except TimeoutError:
            raise RuntimeError(f"{self.kind} child silent for {limit}s:\n{self.log()}") from None
        if not line:
            await self.proc.wait()
            raise RuntimeError(
                f"{self.kind} child exited ({self.proc.returncode}):\n{self.log()[-4000:]}"
            )
        return dict(json.loads(line))

    async def send_line(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        await self.proc.stdin.drain()

    async def stop(self) -> None:
        """Say ``quit`` and wait (40 s: agentik reflects on its conversations), else kill."""
        if self.proc.returncode is None:
            try:
                await self.send_line("quit")
                async with asyncio.timeout(40):
                    await self.proc.wait()
            except (TimeoutError, ConnectionError):
                self.proc.kill()
                await self.proc.wait()
