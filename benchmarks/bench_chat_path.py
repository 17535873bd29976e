"""Store round trips per chat question with several workers (issues 32 and 33).

With a turn queue (PostgreSQL, ``[cluster]``), a question asked in a channel linked
with a channel of another transport goes through the shared turn queue
(``agentik.bot.chatqueue``); one asked in a channel that is not keeps the direct path.
This counts the PostgreSQL round trips (statements sent by asyncpg, transactions'
BEGIN/COMMIT included) from a question said on IRC until its answer was shown and the
bot went quiet, one question at a time, for both kinds of channel of one bot (an
``agentik`` Bot in this process, with the keepers' periodic work pushed out of the
way: a heartbeat of 60 s).  Run it against another checkout (``PYTHONPATH``) to
compare the direct path before and after a change.

    PYTHONPATH=src python benchmarks/bench_chat_path.py [--questions 20]

Needs PostgreSQL (``make postgres``) and ngircd (``make irc-servers``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from _common import say

ROOT = Path(__file__).resolve().parent.parent
TESTS_FOLDER = str(ROOT / "tests")
DSN_ENV = "AGENTIK_BENCH_CHAT_DSN"
QUIET = 0.5  # seconds without a round trip: the bot is done with a question


class Counter:
    """Counts asyncpg's round trips in this process (its ``Connection`` methods that
    send a statement), whatever part of the bot sends them."""

    def __init__(self) -> None:
        self.n = 0
        self.last = time.monotonic()

    def install(self) -> None:
        from asyncpg.connection import Connection

        for name in ("execute", "executemany", "fetch", "fetchrow", "fetchval"):
            original = getattr(Connection, name)

            def counted(conn: Any, *a: Any, __o: Any = original, **kw: Any) -> Any:
                self.n += 1
                self.last = time.monotonic()
                return __o(conn, *a, **kw)

            setattr(Connection, name, counted)

    async def quiet(self) -> None:
        # (a quiet period: nothing to wait on but the clock)
        while time.monotonic() - self.last < QUIET:  # noqa: ASYNC110
            await asyncio.sleep(QUIET / 5)


def _config(openai_url: str, irc_port: int) -> str:
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
[cluster]
lease_seconds = 180
heartbeat_seconds = 60
poll_seconds = 600
worker_name = "bench"
[transports.libera]
type = "irc"
host = "127.0.0.1"
port = {irc_port}
tls = false
nick = "agentik"
channels = ["#plain", "#linked"]
user_rate_limit = 10000
flood_rate = 100.0
[transports.web]
type = "http"
host = "127.0.0.1"
port = 0
[[links]]
name = "linked"
channels = ["irc:libera:#linked", "http:web:linked"]
"""


async def measure(folder: Path, dsn: str, questions: int) -> dict[str, list[int]]:
    from pgserver import empty_database

    from agentik.bot.app import Bot
    from agentik.bot.config import parse_config
    from agentik.core.testing.openai_server import FakeOpenAIServer, Reply

    from ircservers import IRCTestClient, start_ngircd

    await empty_database(dsn)
    os.environ[DSN_ENV] = dsn
    counter = Counter()
    counter.install()
    ircd = await start_ngircd(folder / "irc")
    got: dict[str, list[int]] = {}
    try:
        async with FakeOpenAIServer() as model:
            model.default = lambda body: Reply.text("an answer")
            config = parse_config(tomllib.loads(_config(model.base_url, ircd.port)), env={})
            async with Bot(config) as bot:
                alice = await IRCTestClient.connect(ircd.port, "alice")
                try:
                    for channel in ("#plain", "#linked"):
                        await alice.join(channel)
                    # (the bot joined first: NAMES lists it; the warm-up round waits on answers)
                    for channel in ("#plain", "#linked", "#plain", "#linked"):
                        counts = got.setdefault(channel, [])
                        counts.clear()  # (the first round warms up; the second counts)
                        for i in range(questions):
                            await counter.quiet()
                            before = counter.n
                            alice.privmsg(channel, f"agentik: q{i} {channel}")
                            await alice.wait_for(
                                lambda m, c=channel: m.command == "PRIVMSG"
                                and m.nick == "agentik" and m.params[0] == c,
                                120,
                            )  # fmt: skip
                            await counter.quiet()
                            counts.append(counter.n - before)
                    say(f"   turn queue: {'yes' if bot.turn_queue is not None else 'no'}")
                finally:
                    await alice.close()
    finally:
        await ircd.stop()
    return got


async def main_async(args: argparse.Namespace) -> int:
    sys.path.insert(0, TESTS_FOLDER)
    from pgserver import PostgresServer, find_binaries, make_template

    bindir = find_binaries()
    if bindir is None:
        say("PostgreSQL is not installed (make postgres): skipped")
        return 0
    server = PostgresServer(bindir)
    try:
        server.start()
        await make_template(server)
        with tempfile.TemporaryDirectory(prefix="agentik-bench-chat-") as tmp:
            got = await measure(Path(tmp), server.dsn("agentik_tests"), args.questions)
    finally:
        server.stop()
    for channel, counts in got.items():
        kind = "linked across transports (queued)" if channel == "#linked" else "not linked"
        say(f"   {channel} ({kind}): {statistics.median(counts):g} round trips per question"
            f" (min {min(counts)}, max {max(counts)}, {len(counts)} questions)")  # fmt: skip
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--questions", type=int, default=20)
    raise SystemExit(asyncio.run(main_async(parser.parse_args())))


if __name__ == "__main__":
    main()
