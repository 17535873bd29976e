"""Helpers shared by the tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

#: The ``agentik`` console script of the venv running the tests, never
#: whatever ``agentik`` comes first on ``PATH`` (another checkout, a global install).
AGENTIK = str(Path(sys.executable).parent / "agentik")


def clean_env(*, drop: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """The environment for an ``agentik`` subprocess: this one's without the
    ``OPENAI_*`` and ``AGENTIK_*`` settings (nor the names starting with one of
    ``drop``), plus ``extra``."""
    skip = ("OPENAI_", "AGENTIK_", *drop)
    env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    env.update(extra)
    return env


def agentik(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    drop: tuple[str, ...] = (),
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run the ``agentik`` command to completion in ``cwd`` with a :func:`clean_env`
    (less ``drop``, plus ``env``), stdin closed, its output captured as text (the
    timeout only guards against a hang)."""
    return subprocess.run(
        [AGENTIK, *args],
        cwd=cwd,
        env=clean_env(drop=drop, **(env or {})),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def collect_turn(sub, *, run_id: str | None = None, wait: float = 60.0) -> list:
    """Events from ``sub`` until the turn (``run_id`` or the first one) ends."""
    events = []

    async def consume() -> None:
        async for event in sub:
            events.append(event)
            if event.kind == "turn_ended" and (run_id is None or event.run_id == run_id):
                return

    await asyncio.wait_for(consume(), wait)
    return events


async def turn(conv, text: str, *, author: str | None = "alice", wait: float = 60.0) -> list:
    """Send ``text`` to ``conv`` (from ``author``); the events of its turn, to its end."""
    sub = conv.events()
    run_id = await conv.send(text, author=author)
    events = await collect_turn(sub, run_id=run_id, wait=wait)
    await sub.aclose()
    return events


def ended(events):
    """The ``turn_ended`` event that ends ``events`` (it must)."""
    end = events[-1]
    assert end.kind == "turn_ended", [e.kind for e in events]
    return end


async def open_channels(agent, keys, *, bridge=None, transport=None) -> tuple:
    """A bridge over an in-memory transport that answers every message and releases
    no channel for an hour (new unless ``bridge``/``transport`` are given), with a
    message answered in each channel of ``keys``: the channels a bot holds open.
    Returns ``(bridge, transport)``."""
    from agentik.bot.bridge import Bridge, ChannelOptions
    from agentik.transports.testing import MemoryTransport

    if bridge is None:
        bridge = Bridge(agent, idle_seconds=3600)
        transport = MemoryTransport(name="mem")
        bridge.attach(transport, ChannelOptions(answer="all"))
        await transport.start(bridge)
    assert transport is not None
    for i, key in enumerate(keys):
        await transport.inject(f"hello {i}", channel_key=key, author="alice")
        await bridge.flush(key)
    return bridge, transport


async def release_idle_channels(bridge, transport, key: str) -> None:
    """Make ``bridge`` release its idle channels now: a short idle time, its reaper
    (asleep towards the hour) started again by a message answered in the new channel
    ``key``, every reaper round waited for, then a garbage collection."""
    import contextlib
    import gc

    bridge.idle_seconds = 0.05
    sleeping = bridge.channels.reaper
    assert sleeping is not None
    sleeping.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sleeping
    await transport.inject("last", channel_key=key, author="alice")
    await bridge.flush(key)
    while (reaper := bridge.channels.reaper) is not None:
        await asyncio.wait_for(reaper, 60)
    gc.collect()


def rows(db_path: str, sql: str, *args) -> list[tuple]:
    """What ``sql`` gives on the SQLite file ``db_path``, read from outside the bot."""
    with sqlite3.connect(db_path) as db:
        return db.execute(sql, args).fetchall()


# -- a bot killed mid-turn (tests/test_crash.py, tests/test_postgres_store.py) --------------
_KILLED_CHILD = """
import asyncio, sys
from agentik.core import Agent, OpenAIBackend

def store(engine, target):
    if engine == "postgres":
        from agentik.core.store.postgres import PostgresStore
        return PostgresStore(target)
    from agentik.core import SQLiteStore
    return SQLiteStore(target)

async def main(engine, target, base_url):
    llm = OpenAIBackend(model="fake-model", base_url=base_url, max_retries=0)
    async with Agent(llm=llm, store=store(engine, target)) as agent:
        conv = await agent.conversation_for_channel("stdio:crash")
        print("CONV", conv.id, flush=True)
        i = 0
        while True:
            run_id = await conv.send(f"message {i}")
            print("SENT", i, run_id, flush=True)
            i += 1
            await asyncio.sleep(0.01)

asyncio.run(main(*sys.argv[1:4]))
"""


async def kill_mid_turn(
    openai_server, engine: str, target: str
) -> tuple[str, list[tuple[int, str]]]:
    """Run a bot in a child process on a store (``engine`` ``"sqlite"`` on the file
    ``target``, ``"postgres"`` on the DSN ``target``) that sends ``message <i>`` to one
    conversation in a loop, and SIGKILL it once 25 sends returned and the model got a
    request.  Every answer stops mid-stream (held until released, never), so the kill
    lands in the middle of a turn however fast or slow the machine is.  Returns the
    conversation's id and ``(i, run_id)`` of every send that returned."""
    from agentik.core.testing.openai_server import Reply

    openai_server.default = lambda body: Reply.text("a slow answer " * 20, chunks=40, hold_after=5)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED_CHILD, engine, target, openai_server.base_url,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    sent: list[tuple[int, str]] = []
    conv_id = None
    try:
        async with asyncio.timeout(60):
            while len(sent) < 25 or not openai_server.requests:
                line = (await proc.stdout.readline()).decode().split()
                assert line, "child exited early"
                if line[0] == "CONV":
                    conv_id = line[1]
                else:
                    sent.append((int(line[1]), line[2]))
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    assert conv_id is not None
    return conv_id, sent


async def back_after_the_kill(openai_server, store, conv_id: str, sent: list) -> None:
    """The bot comes back on ``store`` after :func:`kill_mid_turn`: the same
    conversation, and the model is told every message sent before the kill, in order,
    then the new one."""
    from agentik.core import Agent, OpenAIBackend
    from agentik.core.testing.openai_server import Reply

    openai_server.default = lambda body: Reply.text("back", chunks=1)
    before = len(openai_server.requests)
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url)
    async with Agent(llm=llm, store=store) as agent:
        conv = await agent.conversation_for_channel("stdio:crash")
        assert conv.id == conv_id, (conv.id, conv_id)
        await conv.send("after the crash")
        await conv.wait_idle()
    request = openai_server.requests[before]
    users = [m["content"] for m in request["messages"] if m["role"] == "user"]
    assert users[-1] == "after the crash", users[-1]
    told = [u for u in users if u.startswith("message")][: len(sent)]
    assert [f"message {i}" for i, _ in sent] == told, told


def in_ci() -> bool:
    """Whether we run under CI (``CI=true``): missing dependencies fail there."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def require_local_model() -> None:
    """Skip when the local model (the ``local`` extra) is missing; fail under ``CI=true``."""
    from agentik.core.llm.llamacpp_backend import local_model_problem

    problem = local_model_problem()
    if problem is None:
        return
    if in_ci():
        pytest.fail(f"{problem} (CI=true: `make test` installs the local extra)", pytrace=False)
    pytest.skip(problem)


#: Debian's ``chromium`` for the web page tests (``make chromium``; with ``CI=true``
#: a missing one fails them), and the flags that keep it off the network.
CHROMIUM = Path(os.environ.get("AGENTIK_CHROMIUM", "/usr/bin/chromium"))
HAVE_CHROMIUM = CHROMIUM.exists()
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]


async def chat_page(browser, url: str, token: str):
    """A new page of the web chat at ``url``, signed in with ``token``, in a new
    conversation whose stream is live. Returns the page and the list its JavaScript
    errors are collected into."""
    from playwright.async_api import expect

    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(url + "/")
    await page.fill("#token", token)
    await page.click("#save-token")
    await page.click("#new")
    await expect(page.locator("#status")).to_have_text("live")
    return page, errors


#: The manual: every page under ``docs/`` (the README only points into it).
DOCS = Path(__file__).resolve().parent.parent / "docs"


def manual_text() -> str:
    """The text of every page of the manual, for the "is it documented" tests."""
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(DOCS.rglob("*.md")))


class SilentLink:
    """A TCP relay to PostgreSQL that can go silent (bytes held, connections kept
    open): the database unreachable as a network partition makes it, at the boundary."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.open = asyncio.Event()
        self.open.set()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    await self.open.wait()
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_w), pump(up_r, writer))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


@contextlib.contextmanager
def traced() -> Iterator[Callable[[], int]]:
    """tracemalloc on inside the block (left as it was after it); yields a function
    giving the bytes Python allocated and still holds since the block began."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        yield lambda: tracemalloc.get_traced_memory()[0] - start
    finally:
        if not was_tracing:
            tracemalloc.stop()
