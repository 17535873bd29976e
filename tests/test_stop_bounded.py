"""A stop ends within ``[supervision] stop_timeout``, whatever hangs (bot/stopguard.py).

A real ``agentik run`` worker on a real PostgreSQL reached through a relay that can go
silent (a network partition, at the boundary), a real IRC server, the fake model.
The database goes silent in the middle of a turn, then SIGTERM: the writes the turn
still has to commit can never be committed, and before the stop was bounded the
process waited for them for ever.  Now every step is bounded and the one left
behind is named; the process exits, and the lease it released (or that expires)
lets another worker take over.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from agentik.core.testing.openai_server import Reply
from helpers import AGENTIK, SilentLink, clean_env

from ircservers import IRCTestClient

pytest_plugins = ["pgserver", "ircservers"]

PATIENCE = 180.0
CHANNEL = "#stop"
DSN_ENV = "AGENTIK_TEST_STOP_DSN"


def config(openai_url: str, irc_port: int) -> str:
    return f"""
[llm]
base_url = "{openai_url}"
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
[supervision]
stop_timeout = 5.0
drain_timeout = 1.0
[cluster]
lease_seconds = 30
heartbeat_seconds = 5
worker_name = "stuck"
[transports.libera]
type = "irc"
host = "127.0.0.1"
port = {irc_port}
tls = false
nick = "agentik"
channels = ["{CHANNEL}"]
"""


def start(folder: Path, dsn: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as err:
        return subprocess.Popen(
            [AGENTIK, "run", "-c", str(folder / "bot.toml")], cwd=folder,
            env=clean_env(**{DSN_ENV: dsn}), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip


async def test_a_worker_whose_database_goes_silent_mid_turn_still_stops(
    ngircd, openai_server, postgres_dsn, tmp_path: Path
):
    reply = Reply.text("a long answer " * 20, chunks=10, hold_after=1)
    openai_server.default = lambda body: reply
    link = SilentLink(urlsplit(postgres_dsn).port or 5432)
    port = await link.start()
    parts = urlsplit(postgres_dsn)
    relayed = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}"))
    (tmp_path / "bot.toml").write_text(config(openai_server.base_url, ngircd.port), "utf-8")
    log = tmp_path / "stderr.log"
    client = await IRCTestClient.connect(ngircd.port, "alice")
    proc: subprocess.Popen[bytes] | None = None
    try:
        await client.join(CHANNEL)
        proc = start(tmp_path, relayed, log)
        await client.wait_for(lambda m: m.command == "JOIN" and m.nick == "agentik", PATIENCE)
        await client.privmsg(CHANNEL, "agentik: tell me a long story")
        # The turn is under way (its first chunk streamed); the database goes silent.
        await reply.wait_held(PATIENCE)
        link.open.clear()
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = await asyncio.wait_for(asyncio.to_thread(proc.wait), PATIENCE)
        took = time.monotonic() - started
        stderr = log.read_text("utf-8", errors="replace")
        # It stopped in order (the bounded steps), or at worst was cut by the guard
        # with the step it was stuck at named; never a wait for ever.
        assert code in (0, 70), stderr
        assert "left behind" in stderr or "exiting now with status 70" in stderr, stderr
        print(f"stopped with status {code} after {took:.1f} s", file=sys.stderr)
    finally:
        reply.release()
        link.open.set()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)
        await client.close()
        await link.close()


def test_a_stop_stuck_where_no_timeout_reaches_is_cut_with_the_stacks_shown(tmp_path: Path):
    """Code that blocks the event loop itself (a plugin's synchronous hook, a C call
    that never returns) cannot be cut by a timeout inside the loop: the guard
    thread ends the process, naming the step and showing every thread's stack."""
    script = """
import logging, time
from agentik.bot.stopguard import StopGuard
logging.basicConfig(level=logging.INFO)
guard = StopGuard()
guard.arm(0.5, lambda: "closing transport libera")
time.sleep(600)  # the event loop blocked for good
"""
    done = subprocess.run(
        [sys.executable, "-c", script], env=clean_env(), capture_output=True, text=True,
        timeout=PATIENCE,
    )  # fmt: skip
    assert done.returncode == 70, done.stderr
    assert "at: closing transport libera" in done.stderr
    assert "exiting now with status 70" in done.stderr
    assert 'File "<string>", line 7' in done.stderr  # the stack of the blocked thread
