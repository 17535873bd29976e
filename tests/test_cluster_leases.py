"""Connection leases in one bot process (agentik.bot.ownership), with a real IRC server.

The failover between worker processes is tests/test_cluster_failover.py; here one
bot meets what another worker would do to its lease, written into the database
as that worker would have (another owner with the next epoch), and a bot on
SQLite keeps its leases in its own process.
"""

from __future__ import annotations

import asyncio
import time
import tomllib
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agentik.bot.app import Bot
from agentik.bot.config import parse_config
from agentik.core.testing.openai_server import Reply
from helpers import SilentLink

from ircservers import IRCTestClient

pytest_plugins = ["pgserver", "ircservers"]

PATIENCE = 120.0
CHANNEL = "#lease"
DSN_ENV = "AGENTIK_TEST_LEASE_DSN"


def config_for(
    openai_url: str, irc_port: int, storage: str, *, lease: float = 3.0, beat: float = 0.2
) -> Any:
    text = f"""
[llm]
base_url = "{openai_url}"
model = "fake-model"
api_key = "sk-test"
[storage]
{storage}
[memory]
backend = "none"
[cluster]
lease_seconds = {lease}
heartbeat_seconds = {beat}
worker_name = "solo"
[transports.libera]
type = "irc"
host = "127.0.0.1"
port = {irc_port}
tls = false
nick = "agentik"
channels = ["{CHANNEL}"]
reconnect_min = 0.2
reconnect_max = 1.0
"""
    return parse_config(tomllib.loads(text), env={})


async def until(check: Any, what: str) -> Any:
    deadline = time.monotonic() + PATIENCE
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def in_channel(client: IRCTestClient) -> bool:
    since = client.mark()
    client.send_raw(f"NAMES {CHANNEL}")
    await client.wait_for(lambda m: m.command == "366", PATIENCE, since=since)
    names = [
        n.lstrip("@+")
        for m in client.received[since:]
        if m.command == "353"
        for n in m.params[-1].split()
    ]
    return "agentik" in names


def metric(bot: Bot, name: str, **labels: str) -> float | None:
    body, _ = bot.metrics.render()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # (exposed sorted)
    for line in body.decode().splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_a_bot_on_sqlite_holds_its_connection_lease_in_its_own_process(
    ngircd, openai_server, tmp_path
):
    config = config_for(openai_server.base_url, ngircd.port, f'path = "{tmp_path / "b.db"}"')
    async with Bot(config) as bot:
        cluster = bot.status()["cluster"]
        assert cluster["shared"] is False and cluster["owns"] == ["libera"]
        assert cluster["worker"].startswith("solo:")
        # The connection is its own for as long as it runs (ready as ever).
        lease = cluster["connections"]["libera"]
        assert lease["owner"] == cluster["worker"] and lease["epoch"] == 1
        assert lease["expires_in"] is None
        assert [w["id"] for w in cluster["workers"]] == [cluster["worker"]]
        assert metric(bot, "agentik_connection_owned", transport="libera") == 1.0
        assert metric(bot, "agentik_worker_info", worker=cluster["worker"]) == 1.0
        assert bot.health.get("transport:libera") is not None
        # Nothing of it is written to the SQLite file: one process keeps it.
        import sqlite3

        with sqlite3.connect(tmp_path / "b.db") as db:
            assert db.execute("SELECT COUNT(*) FROM lease").fetchone() == (0,)


async def test_a_renewal_refused_stops_the_connection_and_a_free_lease_brings_it_back(
    ngircd, openai_server, postgres_dsn, monkeypatch
):
    import asyncpg

    monkeypatch.setenv(DSN_ENV, postgres_dsn)
    openai_server.default = lambda body: Reply.text("answer")
    storage = f'backend = "postgres"\ndsn_env = "{DSN_ENV}"'
    config = config_for(openai_server.base_url, ngircd.port, storage)
    client = await IRCTestClient.connect(ngircd.port, "alice")
    db = await asyncpg.connect(postgres_dsn)
    try:
        await client.join(CHANNEL)
        async with Bot(config) as bot:
            serving = asyncio.ensure_future(bot.serve())
            try:
                await until(lambda: in_channel(client), "the bot in the channel")
                me = bot.ownership.worker
                assert bot.status()["cluster"]["owns"] == ["libera"]
                # Another worker took the lease (the next epoch): this one's next
                # renewal is refused and its connection goes at once.
                await db.execute(
                    "UPDATE lease SET owner = 'intruder', epoch = epoch + 1,"
                    " expires_at = extract(epoch FROM clock_timestamp()) + 3600"
                    " WHERE name = 'conn:libera'"
                )
                await client.wait_for(
                    lambda m: m.command == "QUIT" and m.nick == "agentik", PATIENCE
                )
                await until(lambda: not bot.ownership.holds("libera"), "the lease let go")
                await until(lambda: "transport:libera" not in bot.health.components(), "standby")
                assert bot.health.ready()  # in standby it serves and is ready
                await until(
                    lambda: metric(bot, "agentik_connection_owned", transport="libera") == 0.0,
                    "the gauge to follow",
                )
                state = {"transport": "libera", "state": "stopped"}
                await until(
                    lambda: metric(bot, "agentik_transport_state", **state) == 1.0, "stopped"
                )
                # The intruder's lease expires: this worker takes it, with the next epoch.
                since = client.mark()
                await db.execute(
                    "UPDATE lease SET expires_at = 0 WHERE name = 'conn:libera'"
                )  # fmt: skip
                await client.wait_for(
                    lambda m: m.command == "JOIN" and m.nick == "agentik", PATIENCE, since=since
                )
                row = await db.fetchrow("SELECT owner, epoch FROM lease WHERE name = 'conn:libera'")
                assert (row["owner"], row["epoch"]) == (me, 3)
                client.privmsg(CHANNEL, "agentik: back?")
                await client.wait_for(
                    lambda m: m.command == "PRIVMSG" and m.text.endswith("answer"), PATIENCE
                )
            finally:
                bot.stop_requested.set()
                await asyncio.wait_for(serving, PATIENCE)
        # Stopped: the lease is released (free at once for the next worker).
        row = await db.fetchrow(
            "SELECT expires_at FROM lease WHERE name = 'conn:libera'"
        )  # fmt: skip
        assert row["expires_at"] == 0
    finally:
        await db.close()
        await client.close()


async def test_a_database_gone_silent_stops_the_connection_before_its_lease_expires(
    ngircd, openai_server, postgres_dsn, monkeypatch
):
    import asyncpg

    link = SilentLink(urlsplit(postgres_dsn).port or 5432)
    port = await link.start()
    parts = urlsplit(postgres_dsn)
    relayed = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}"))
    monkeypatch.setenv(DSN_ENV, relayed)
    storage = f'backend = "postgres"\ndsn_env = "{DSN_ENV}"'
    config = config_for(openai_server.base_url, ngircd.port, storage, lease=6.0, beat=2.0)
    client = await IRCTestClient.connect(ngircd.port, "alice")
    db = await asyncpg.connect(postgres_dsn)  # the test's own way in, not relayed
    expiry = "SELECT expires_at - extract(epoch FROM clock_timestamp()) FROM lease"
    try:
        await client.join(CHANNEL)
        async with Bot(config) as bot:
            serving = asyncio.ensure_future(bot.serve())
            try:
                await until(lambda: in_channel(client), "the bot in the channel")
                since = client.mark()
                link.open.clear()  # the database goes silent for this worker
                quit_line = await client.wait_for(
                    lambda m: m.command == "QUIT" and m.nick == "agentik", PATIENCE, since=since
                )
                # Its lease (by the database's clock) had not expired yet when the
                # connection went: no other worker could have opened one meanwhile.
                assert await db.fetchval(expiry + " WHERE name = 'conn:libera'") > 0
                assert quit_line is not None and not bot.ownership.holds("libera")
                since = client.mark()
                link.open.set()  # back: nobody took it, the same worker takes it again
                await client.wait_for(
                    lambda m: m.command == "JOIN" and m.nick == "agentik", PATIENCE, since=since
                )
                row = await db.fetchrow("SELECT owner, epoch FROM lease WHERE name = 'conn:libera'")
                assert (row["owner"], row["epoch"]) == (bot.ownership.worker, 1)
            finally:
                link.open.set()
                bot.stop_requested.set()
                await asyncio.wait_for(serving, PATIENCE)
    finally:
        await db.close()
        await client.close()
        await link.close()


async def test_a_new_owner_meeting_the_dead_owners_session_takes_its_nick_back(
    ngircd, openai_server, postgres_dsn, monkeypatch
):
    """The old owner's session lingers on the server (a partition, a ping timeout
    not yet reached): the new owner connects under an alternate nick, and takes the
    nick back when the server drops the ghost."""
    import asyncpg

    monkeypatch.setenv(DSN_ENV, postgres_dsn)
    openai_server.default = lambda body: Reply.text("answer")
    storage = f'backend = "postgres"\ndsn_env = "{DSN_ENV}"'
    config = config_for(openai_server.base_url, ngircd.port, storage)
    db = await asyncpg.connect(postgres_dsn)
    # The dead owner: its lease still running, its session still on the server.
    await db.execute(
        "INSERT INTO lease (name, owner, epoch, acquired_at, expires_at) VALUES"
        " ('conn:libera', 'dead', 4, 0, extract(epoch FROM clock_timestamp()) + 3600)"
    )
    ghost = await IRCTestClient.connect(ngircd.port, "agentik")
    client = await IRCTestClient.connect(ngircd.port, "alice")
    try:
        await ghost.join(CHANNEL)
        await client.join(CHANNEL)
        async with Bot(config) as bot:
            serving = asyncio.ensure_future(bot.serve())
            try:
                assert bot.status()["cluster"]["owns"] == []
                await db.execute("UPDATE lease SET expires_at = 0 WHERE name = 'conn:libera'")
                joined = await client.wait_for(
                    lambda m: m.command == "JOIN" and (m.nick or "").startswith("agentik"),
                    PATIENCE,
                )
                assert joined.nick != "agentik"  # an alternate nick: the ghost holds it
                row = await db.fetchrow("SELECT owner, epoch FROM lease WHERE name = 'conn:libera'")
                assert (row["owner"], row["epoch"]) == (bot.ownership.worker, 5)
                await ghost.quit("ping timeout")
                await client.wait_for(
                    lambda m: m.command == "NICK" and m.nick == joined.nick
                    and m.params[0] == "agentik",
                    PATIENCE,
                )  # fmt: skip
                client.privmsg(CHANNEL, "agentik: still you?")
                await client.wait_for(
                    lambda m: m.command == "PRIVMSG" and m.nick == "agentik", PATIENCE
                )
            finally:
                bot.stop_requested.set()
                await asyncio.wait_for(serving, PATIENCE)
    finally:
        await db.close()
        await client.close()
        await ghost.close()
