"""Several workers on one PostgreSQL database: one owner per chat connection, failover.

Real processes all the way: ``agentik run`` workers (the entry a service runs) on
a real PostgreSQL (tests/pgserver.py), a real IRC server (ngircd) or the Slack fake
(tests/fakeslack.py, at the network boundary), the fake OpenAI-compatible server.
Short leases (``lease_seconds = 3``, ``heartbeat_seconds = 0.5``) so a kill -9 is
taken over quickly; every wait is on something observable (a line on the IRC
server, a lease row, a ``/health`` answer) with a generous deadline: a loaded
machine starts processes slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx

from agentik.core.testing.openai_server import Reply
from helpers import AGENTIK, clean_env

from fakeslack import FakeSlack
from ircservers import IRCTestClient

pytest_plugins = ["pgserver", "ircservers"]

#: Seconds any one wait may take (processes start slowly on a loaded machine).
PATIENCE = 180.0
CHANNEL = "#lease"
DSN_ENV = "AGENTIK_TEST_LEASE_DSN"


class Worker:
    """One ``agentik run`` process with its own folder, config and health socket."""

    def __init__(self, folder: Path, config: str, dsn: str) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.config = folder / "bot.toml"
        self.config.write_text(config, encoding="utf-8")
        self.log = folder / "stderr.log"
        self.dsn = dsn
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [AGENTIK, "run", "-c", str(self.config)], cwd=self.folder,
                env=clean_env(**{DSN_ENV: self.dsn}), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    async def health(self) -> dict[str, Any] | None:
        """``/health`` (with its ``cluster`` section), or ``None`` while not listening."""
        transport = httpx.AsyncHTTPTransport(uds=str(self.folder / "h.sock"), retries=0)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://w") as c:
                return dict((await c.get("/health", timeout=10)).json())
        except (httpx.TransportError, ValueError):
            return None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def wait(self) -> int:
        assert self.proc is not None
        proc = self.proc
        return await asyncio.wait_for(asyncio.to_thread(proc.wait), PATIENCE)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def worker_config(
    name: str, openai_url: str, transport: str, *, lease: float = 3.0, beat: float = 0.5
) -> str:
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
[health]
listen = "unix:h.sock"
[cluster]
lease_seconds = {lease}
heartbeat_seconds = {beat}
worker_name = "{name}"
{transport}
"""


def irc_transport(port: int) -> str:
    return f"""
[transports.libera]
type = "irc"
host = "127.0.0.1"
port = {port}
tls = false
nick = "agentik"
channels = ["{CHANNEL}"]
reconnect_min = 0.2
reconnect_max = 1.0
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
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def lease_row(dsn: str, name: str) -> tuple[str, int, float, float] | None:
    """``(owner, epoch, acquired_at, expires_at)`` of a lease, straight from the database
    (its clock: ``expires_at`` and ``acquired_at`` are the server's times)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT owner, epoch, acquired_at, expires_at FROM lease WHERE name = $1", name
        )
    finally:
        await conn.close()
    return None if row is None else (str(row[0]), int(row[1]), float(row[2]), float(row[3]))


async def bot_nicks(client: IRCTestClient) -> list[str]:
    """The nicks in the channel besides the test client's (NAMES, answered in order)."""
    since = client.mark()
    client.send_raw(f"NAMES {CHANNEL}")
    await client.wait_for(lambda m: m.command == "366", PATIENCE, since=since)
    names: list[str] = []
    for m in client.received[since:]:
        if m.command == "353":
            names += [n.lstrip("@+") for n in m.params[-1].split()]
    return sorted(n for n in names if n.lower() != client.nick.lower())


def answers(client: IRCTestClient, text: str) -> list[str]:
    """Lines the bot said in the channel containing ``text``."""
    return [
        m.params[-1]
        for m in client.received
        if m.command == "PRIVMSG"
        and (m.nick or "").lower().startswith("agentik")
        and text in m.params[-1]
    ]


def last_user(body: dict[str, Any]) -> str:
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    content = users[-1] if users else ""
    return content if isinstance(content, str) else str(content)


@contextlib.asynccontextmanager
async def workers(
    n: int, tmp_path: Path, dsn: str, openai_url: str, transport: str, **kw: Any
) -> AsyncIterator[list[Worker]]:
    crew = [
        Worker(tmp_path / f"w{i}", worker_config(f"w{i}", openai_url, transport, **kw), dsn)
        for i in range(n)
    ]
    try:
        for w in crew:
            w.start()
        yield crew
    finally:
        for w in crew:
            w.stop()


async def owner_of(crew: list[Worker], transport: str) -> Worker:
    """The worker whose ``/health`` says it owns ``transport`` (once all alive agree)."""

    async def agreed() -> Worker | None:
        views = [await w.health() for w in crew if w.alive]
        if any(v is None or "cluster" not in v for v in views):
            return None
        owners = [w for w, v in zip([w for w in crew if w.alive], views, strict=True)
                  if transport in v["cluster"]["owns"]]  # fmt: skip
        seen = {v["cluster"]["connections"].get(transport, {}).get("owner") for v in views}
        if len(owners) == 1 and len(seen) == 1:
            return owners[0]
        return None

    found: Worker = await until(agreed, f"one owner of {transport} that every worker sees")
    return found


# -- IRC --------------------------------------------------------------------------------------
async def test_three_workers_share_one_irc_connection_and_fail_over_after_kill_9(
    ngircd, postgres_dsn, openai_server, tmp_path
):
    held: list[Reply] = []

    def model(body: dict[str, Any]) -> Reply:
        asked = last_user(body)
        if "slow question" in asked and not held:
            # The first time: the model starts and holds, so the kill lands mid-turn.
            held.append(Reply.text("", hold_after=0))
            return held[0]
        return Reply.text(f"answer to {asked.split(':')[-1].strip()}")

    openai_server.default = model
    client = await IRCTestClient.connect(ngircd.port, "alice")
    try:
        await client.join(CHANNEL)
        transport = irc_transport(ngircd.port)
        async with workers(3, tmp_path, postgres_dsn, openai_server.base_url, transport) as crew:
            # (1) One owner, one connection on the server.
            first = await owner_of(crew, "libera")
            await until(lambda: bot_nicks(client), "the bot in the channel")
            assert await bot_nicks(client) == ["agentik"]
            view = await first.health()
            assert view is not None
            cluster = view["cluster"]
            assert cluster["worker"].startswith("w") and cluster["shared"] is True
            # (5) /health: every worker with its heartbeat, who owns the connection.
            await until(lambda: _all_alive(first, 3), "three live workers in the owner's /health")
            view = await first.health()
            assert view is not None
            names = sorted(w["id"].split(":")[0] for w in view["cluster"]["workers"])
            assert names == ["w0", "w1", "w2"]
            conn = view["cluster"]["connections"]["libera"]
            assert conn["owner"] == view["cluster"]["worker"] and conn["epoch"] >= 1
            assert 0 < conn["expires_in"] <= 3.0
            for other in crew:
                if other is not first:
                    seen = await other.health()
                    assert seen is not None and seen["cluster"]["owns"] == []
                    # A worker in standby is ready: it serves, it owns no connection.
                    assert "transport:libera" not in seen["components"]
            # `agentik status` shows the same.
            status = await asyncio.to_thread(
                subprocess.run, [AGENTIK, "status", "-c", str(first.config)],
                env=clean_env(**{DSN_ENV: postgres_dsn}), capture_output=True, text=True,
                timeout=120,
            )  # fmt: skip
            assert status.returncode == 0, status.stderr
            out = status.stdout.splitlines()
            assert f"worker {cluster['worker']}: owns libera" in out, status.stdout
            assert any(line.split()[:3] == ["libera", "owner", cluster["worker"] + ","]
                       for line in out), status.stdout  # fmt: skip

            # A message is answered once.
            client.privmsg(CHANNEL, "agentik: first question")
            await client.wait_for(
                lambda m: m.command == "PRIVMSG" and "answer to first question" in m.text,
                PATIENCE,
            )
            epoch = conn["epoch"]

            # (2) kill -9 of the owner mid-turn.
            client.privmsg(CHANNEL, "agentik: slow question")
            await until(lambda: held, "the slow question's model request")
            await held[0].wait_held(PATIENCE)
            killed_at = time.monotonic()
            first.kill()
            await first.wait()
            line = await client.wait_for(
                lambda m: m.command == "PRIVMSG" and "answer to slow question" in m.text,
                PATIENCE,
            )
            failover = time.monotonic() - killed_at
            print(f"failover: kill -9 to the pending answer from the new owner: {failover:.2f} s")
            assert line.nick == "agentik"
            survivors = [w for w in crew if w is not first]
            second = await owner_of(survivors, "libera")
            row = await lease_row(postgres_dsn, "conn:libera")
            assert row is not None and row[1] == epoch + 1
            assert row[0] == (await second.health() or {})["cluster"]["worker"]
            # A later question is answered after it: the pending answer came once.
            client.privmsg(CHANNEL, "agentik: after question")
            await client.wait_for(
                lambda m: m.command == "PRIVMSG" and "answer to after question" in m.text,
                PATIENCE,
            )
            assert len(answers(client, "answer to slow question")) == 1
            assert len(answers(client, "answer to first question")) == 1
            asked = [last_user(r) for r in openai_server.requests]
            # The killed turn's request and the new owner's: the turn ran again once.
            assert sum("slow question" in a for a in asked) == 2
            assert sum("first question" in a for a in asked) == 1
            assert await bot_nicks(client) == ["agentik"]
            assert "took over libera" in second.stderr()
    finally:
        for r in held:
            r.release()
        await client.close()


async def _all_alive(worker: Worker, n: int) -> bool:
    view = await worker.health()
    if view is None:
        return False
    live = [w for w in view["cluster"]["workers"] if w["alive"]]
    return len(live) == n


async def test_sigterm_hands_the_connection_over_before_its_lease_expires(
    ngircd, postgres_dsn, openai_server, tmp_path
):
    openai_server.default = lambda body: Reply.text(f"answer to {last_user(body).split(':')[-1]}")
    client = await IRCTestClient.connect(ngircd.port, "alice")
    try:
        await client.join(CHANNEL)
        transport = irc_transport(ngircd.port)
        # A long lease: a takeover that waited for expiry would come 30 s later.
        async with workers(
            2, tmp_path, postgres_dsn, openai_server.base_url, transport, lease=30.0
        ) as crew:
            first = await owner_of(crew, "libera")
            await until(lambda: bot_nicks(client), "the bot in the channel")
            before = await lease_row(postgres_dsn, "conn:libera")
            assert before is not None
            owner, epoch, _, expiry = before
            first.kill(signal.SIGTERM)
            assert await first.wait() == 0
            # The next owner has the next epoch, and took it before the old lease's
            # expiry (both times by the database's clock): it was handed over.
            after = await until(
                lambda: _taken(postgres_dsn, owner), "another worker to take the lease"
            )
            assert after[1] == epoch + 1
            assert after[2] < expiry
            second = next(w for w in crew if w is not first)
            assert f"released libera (epoch {epoch})" in first.stderr()
            # The old connection quit; a line sent before the new one joins is not
            # the bot's to see (IRC keeps no history), so wait for it in the channel.
            await until(lambda: bot_nicks(client), "the new owner in the channel")
            client.privmsg(CHANNEL, "agentik: still there?")
            await client.wait_for(
                lambda m: m.command == "PRIVMSG" and "answer to" in m.text, PATIENCE
            )
            assert await bot_nicks(client) == ["agentik"]
            assert f"owns libera (epoch {epoch + 1})" in second.stderr()
    finally:
        await client.close()


async def test_a_turn_running_at_sigterm_is_answered_once_after_the_handover(
    ngircd, postgres_dsn, openai_server, tmp_path
):
    """SIGTERM while a turn runs: the stopping worker keeps the connection's lease
    until its turn has finished and what it wrote is committed; only then does the
    other worker take the connection over, and it delivers that answer (written
    after the goodbye) once, without asking the model again."""
    held: list[Reply] = []

    def model(body: dict[str, Any]) -> Reply:
        asked = last_user(body)
        if "slow question" in asked and not held:
            held.append(Reply.text("answer to slow question", hold_after=0))
            return held[0]
        return Reply.text(f"answer to {asked.split(':')[-1].strip()}")

    openai_server.default = model
    client = await IRCTestClient.connect(ngircd.port, "alice")
    try:
        await client.join(CHANNEL)
        transport = irc_transport(ngircd.port)
        async with workers(
            2, tmp_path, postgres_dsn, openai_server.base_url, transport, lease=30.0
        ) as crew:
            first = await owner_of(crew, "libera")
            await until(lambda: bot_nicks(client), "the bot in the channel")
            before = await lease_row(postgres_dsn, "conn:libera")
            assert before is not None
            owner, epoch, _, _ = before
            client.privmsg(CHANNEL, "agentik: slow question")
            await until(lambda: held, "the slow question's model request")
            await held[0].wait_held(PATIENCE)
            since = client.mark()
            first.kill(signal.SIGTERM)
            await client.wait_for(
                lambda m: m.command == "QUIT" and m.nick == "agentik", PATIENCE, since=since
            )

            async def stopping() -> dict[str, Any] | None:
                view = await first.health()
                draining = view is not None and view["cluster"].get("draining")
                return view if draining else None

            view = await until(stopping, "the first worker stopping")
            # Its turn still runs: the lease is still its own, nobody took over.
            assert view["cluster"]["owns"] == ["libera"]
            row = await lease_row(postgres_dsn, "conn:libera")
            assert row is not None and (row[0], row[1]) == (owner, epoch)
            held[0].release()
            assert await first.wait() == 0
            after = await until(
                lambda: _taken(postgres_dsn, owner), "another worker to take the lease"
            )
            assert after[1] == epoch + 1
            line = await client.wait_for(
                lambda m: m.command == "PRIVMSG" and "answer to slow question" in m.text,
                PATIENCE,
            )
            assert line.nick == "agentik"
            client.privmsg(CHANNEL, "agentik: after question")
            await client.wait_for(
                lambda m: m.command == "PRIVMSG" and "answer to after question" in m.text,
                PATIENCE,
            )
            assert len(answers(client, "answer to slow question")) == 1
            asked = [last_user(r) for r in openai_server.requests]
            assert sum("slow question" in a for a in asked) == 1, asked
    finally:
        for r in held:
            r.release()
        await client.close()


async def _taken(dsn: str, old: str) -> tuple[str, int, float, float] | None:
    row = await lease_row(dsn, "conn:libera")
    return row if row is not None and row[0] != old else None


# -- Slack Socket Mode ---------------------------------------------------------------------------
async def test_slack_socket_mode_fails_over_after_kill_9(postgres_dsn, openai_server, tmp_path):
    openai_server.default = lambda body: Reply.text(f"echo {last_user(body).split('>')[-1]}")
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        transport = f"""
[transports.slack]
type = "slack"
bot_token = "{slack.bot_token}"
app_token = "{slack.app_token}"
api_url = "{slack.api_url}"
streaming = "edit"
"""
        async with workers(2, tmp_path, postgres_dsn, openai_server.base_url, transport) as crew:
            first = await owner_of(crew, "slack")
            await slack.wait_for_socket(1, PATIENCE)
            opened = len(slack.calls_to("apps.connections.open"))
            assert opened == 1
            event = slack.message_event("D1", "hello one", channel_type="im", user="U1")
            await slack.push_event(event)
            await until(lambda: _said(slack, "D1", "hello one"), "the first answer")
            killed_at = time.monotonic()
            first.kill()
            await first.wait()
            second = await owner_of([w for w in crew if w is not first], "slack")
            await until(
                lambda: len(slack.calls_to("apps.connections.open")) > opened,
                "the new owner to open the socket",
            )
            await slack.wait_for_socket(2, PATIENCE)
            event = slack.message_event("D2", "hello two", channel_type="im", user="U1")
            await slack.push_event(event)
            await until(lambda: _said(slack, "D2", "hello two"), "the new owner's answer")
            print(f"slack failover: kill -9 to an answer by the new owner: "
                  f"{time.monotonic() - killed_at:.2f} s")  # fmt: skip
            assert "took over slack" in second.stderr()
            assert len(slack.calls_to("apps.connections.open")) == opened + 1


def _said(slack: FakeSlack, channel: str, text: str) -> bool:
    return any(
        text in (m.get("text") or "")
        for (ch, _), m in slack.messages.items()
        if ch == channel and m.get("user") == slack.bot_user_id
    )
