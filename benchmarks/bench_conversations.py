#!/usr/bin/env python3
"""What each conversation keeps in memory (issue 31): KB per open and per released channel.

Run with ``.venv/bin/python benchmarks/bench_conversations.py``; ``--quick`` is a
smaller run.  A bot built from ``config.example.toml`` (the default configuration:
SQLite persistence, recall, metrics, governance) with its transports replaced by an
in-memory one, the model the fake OpenAI server in its own process.

For each phase (10 channels, then 300): every channel gets ``--turns`` addressed
messages, 50 channels at a time; then every channel is released as the bridge
releases an idle one.  Python's own allocations (``tracemalloc``, started after a
warm-up, so imports and the first turns' caches are not counted) and the process's
RSS are read after each step, garbage collected:

* **open**: what the run added, per channel, while every channel is open (its
  conversation, transcript, replay buffer, renderer, subscription, locks);
* **released**: what is left per channel once they are released (the agent-wide
  event buffer, of fixed size, and timers such as reflection's); a released
  conversation holds no transcript.

Goal (issue 31): at most 10 KB per active channel; released channels hold no
transcript.  ``--top N`` prints the N files that hold the most after each step;
``--parts`` splits what each open channel holds by the part of agentik that allocated
it (the innermost frame of its code: ``bot/``, the bridge; ``core/``, the
conversation; ``transports/``), with tracebacks deep enough to find it (slower).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from _common import (
    Row,
    fake_openai_server,
    finish,
    proc_status,
    process_cpu,
    say,
    say_environment,
    version,
)

ROOT = Path(__file__).resolve().parent.parent
GOAL_KB = 10.0


def _config_text() -> str:
    """``config.example.toml`` with its transports left out and the OpenAI backend."""
    src = (ROOT / "config.example.toml").read_text()
    head = src.split("[transports.terminal]")[0]
    tail = "[mcp]" + src.split("\n[mcp]", 1)[1]
    return (head + tail).replace('backend = "auto"', 'backend = "openai"', 1)


def _traced() -> int:
    return sum(s.size for s in tracemalloc.take_snapshot().statistics("filename"))


async def _settle() -> None:
    await asyncio.sleep(0.2)  # pending writes and callbacks let go of what they hold
    for _ in range(3):
        gc.collect()
    await asyncio.sleep(0.05)  # what the collector freed is taken out on the loop


def _parts(before: tracemalloc.Snapshot, channels: int) -> None:
    """What the open channels hold, per channel, by the part of agentik that allocated it."""
    held: dict[str, int] = {}
    for stat in tracemalloc.take_snapshot().compare_to(before, "traceback"):
        ours = [f.filename for f in stat.traceback if "/agentik/" in f.filename]
        part = ours[-1].split("/agentik/")[-1].split("/")[0] if ours else "(other)"
        held[part] = held.get(part, 0) + stat.size_diff
    say("   by part: " + ", ".join(
        f"{part} {size / channels / 1024:.1f} KB" for part, size in sorted(held.items())
    ))  # fmt: skip


def _top(before: tracemalloc.Snapshot, n: int) -> None:
    if n:
        for s in tracemalloc.take_snapshot().compare_to(before, "filename")[:n]:
            say(f"    {s.size_diff / 1024:9.1f} KB {s.count_diff:7d}  {s.traceback}")


async def _run(url: str, phases: list[int], turns: int, top: int, parts: bool = False) -> list[Row]:
    from agentik.bot.app import Bot
    from agentik.bot.config import load_config
    from agentik.transports.testing.memory import MemoryTransport

    tmp = Path(tempfile.mkdtemp(prefix="bench-conversations-"))
    (tmp / "agentik.toml").write_text(_config_text())
    os.environ.update(OPENAI_BASE_URL=url, OPENAI_MODEL="fake-model", OPENAI_API_KEY="x")
    os.chdir(tmp)
    config = load_config(str(tmp / "agentik.toml"))

    class Waiting(MemoryTransport):
        """Resolves a future when the answer naming its question arrives."""

        waiters: dict[str, asyncio.Future[Any]] = {}

        async def send(self, message: Any) -> None:
            if message.kind == "answer":
                for key, fut in list(self.waiters.items()):
                    if key in (message.text or "") and not fut.done():
                        fut.set_result(message)
                        del self.waiters[key]

    t = Waiting(name="mem")
    rows: list[Row] = []
    async with Bot(config, transports={"mem": t}) as bot:
        logging.getLogger().setLevel(logging.WARNING)  # one line per answer otherwise
        bridge = bot.bridge
        sem = asyncio.Semaphore(50)

        async def channel(name: str, n: int) -> None:
            async with sem:
                for i in range(n):
                    key = f"question {name}-{i}"
                    fut = t.waiters[key] = asyncio.get_running_loop().create_future()
                    text = f"{key} lorem ipsum dolor sit amet, consectetur adipiscing elit"
                    await t.inject(text, channel_key=f"mem:#{name}", author=name, addressed=True)
                    await asyncio.wait_for(fut, 120)

        async def release_all() -> None:
            chs = bridge.channels
            for key, ch in list(chs.open.items()):
                async with chs.lock(key):
                    if chs.open.get(key) is ch:
                        del chs.open[key]
                        await chs.close(ch)

        # Warm-up: imports, the embedding model, first-use caches.
        await asyncio.gather(*(channel(f"warm{c}", 2) for c in range(10)))
        await release_all()
        await _settle()
        tracemalloc.start(40 if parts else 1)
        for n in phases:
            await _settle()
            snap = tracemalloc.take_snapshot()
            base, rss0 = _traced(), proc_status()["VmRSS"]
            c0 = process_cpu()
            await asyncio.gather(*(channel(f"p{n}c{c}", turns) for c in range(n)))
            cpu = (process_cpu() - c0) / (n * turns)
            await _settle()
            held, rss1 = _traced() - base, proc_status()["VmRSS"] - rss0
            say(f"== {n} channels x {turns} turns: {cpu * 1e3:.2f} ms CPU per turn (traced)")
            say(f"   open: {held / n / 1024:.1f} KB per channel, RSS +{rss1 / 2**20:.1f} MB; "
                f"{bridge.open_channels} open, {bot.agent.cached_transcripts} idle transcripts "
                f"cached, {len(bot.agent.services.open)} conversations loaded")  # fmt: skip
            _top(snap, top)
            if parts:
                _parts(snap, n)
            await release_all()
            await _settle()
            left, rss2 = _traced() - base, proc_status()["VmRSS"] - rss0
            say(f"   released: {left / n / 1024:.1f} KB per channel, RSS +{rss2 / 2**20:.1f} MB; "
                f"{bot.agent.cached_transcripts} idle transcripts cached, "
                f"{len(bot.agent.services.open)} conversations loaded")  # fmt: skip
            _top(snap, top)
            kb = held / n / 1024
            rows.append(
                Row(f"{n} channels: KB per open channel", f"{kb:.1f} KB", f"{GOAL_KB:.0f} KB",
                    kb / GOAL_KB, f"<= {GOAL_KB:.0f} KB", kb <= GOAL_KB)
            )  # fmt: skip
            rows.append(
                Row(f"{n} channels: KB per released channel", f"{left / n / 1024:.1f} KB",
                    f"{kb:.1f} KB", left / held if held else None, "less than open",
                    left < held)
            )  # fmt: skip
            rows.append(
                Row(f"{n} channels: conversations loaded after release",
                    str(len(bot.agent.services.open)), "0", None, "0",
                    len(bot.agent.services.open) == 0)
            )  # fmt: skip
        tracemalloc.stop()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="10 and 100 channels")
    parser.add_argument("--turns", type=int, default=3, help="turns per channel (3)")
    parser.add_argument("--top", type=int, default=0, help="print the N files holding most")
    parser.add_argument(
        "--parts", action="store_true", help="split each open channel's memory by part (slower)"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args()
    started = time.perf_counter()
    say_environment([("agentik", version("agentik")), ("openai", version("openai"))])
    phases = [10, 100] if args.quick else [10, 300]
    with fake_openai_server() as url:
        rows = asyncio.run(_run(url, phases, args.turns, args.top, args.parts))
    return finish(rows, strict=args.strict, started=started)


if __name__ == "__main__":
    sys.exit(main())
