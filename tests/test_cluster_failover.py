"""Several workers on one PostgreSQL database: one owner per chat connection, failover.

Real processes all the way: ``agentik run`` workers (the entry a service runs) on
a real PostgreSQL (tests/pgserver.py), a real IRC server (ngircd) or the Slack fake
(tests/fakeslack.py, at the network boundary), the fake OpenAI-compatible server.
Short leases (``lease_seconds = 3``, ``heartbeat_seconds = 0.5``) so a kill -9 is
taken over quickly; every wait is on something observable (a line on the IRC
server, a lease row, a ``/health`` answer) with a generous deadline: a loaded
machine starts processes slowly. The worker rig (``Worker``, ``workers``, ``until``)
is tests/cluster.py, shared by the multi-worker tests.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from typing import Any

import pytest
from cluster import (
    DSN_ENV,
    PATIENCE,
    Worker,
    configs,
    last_user,
    owner_of,
    until,
    worker_config,
    workers,
)

from agentik.core.testing.openai_server import Reply
from helpers import AGENTIK, clean_env

from fakeslack import FakeSlack
from ircservers import IRCTestClient

pytest_plugins = ["pgserver", "ircservers"]

CHANNEL = "#lease"


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


# -- IRC --------------------------------------------------------------------------------------
@pytest.mark.timeout(400)  # three workers, a kill and a takeover, on a loaded machine
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
        async with workers(
            3, tmp_path, postgres_dsn, configs(openai_server.base_url, transport)
        ) as crew:
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


@pytest.mark.timeout(400)  # two workers and a handover, on a loaded machine
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
            2, tmp_path, postgres_dsn, configs(openai_server.base_url, transport, lease=30.0)
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


@pytest.mark.timeout(400)  # two workers, a turn and a handover, on a loaded machine
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
            2, tmp_path, postgres_dsn, configs(openai_server.base_url, transport, lease=30.0)
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
@pytest.mark.timeout(400)  # two workers, a kill and a takeover, on a loaded machine
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
        async with workers(
            2, tmp_path, postgres_dsn, configs(openai_server.base_url, transport)
        ) as crew:
            first = await owner_of(crew, "slack")
            await slack.wait_for_socket(1, PATIENCE)
            # One websocket session: only the owner connects.  (``apps.connections.open``
            # calls may be more than one: slack_sdk asks again when an answer is late, as
            # on a loaded machine; only a websocket session is a connection.)
            assert slack.socket_connections == 1
            opened = len(slack.calls_to("apps.connections.open"))
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


@pytest.mark.timeout(400)  # two workers, a stop and a takeover, on a loaded machine
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
async def test_slack_answer_posted_unrecorded_by_a_stopping_owner_is_not_posted_again(
    postgres_dsn, openai_server, tmp_path, stop: int
) -> None:
    """The rolling-restart double, made to happen every time: the owner's post of a new
    thread's answer reaches Slack, but its response never comes back (the worker stops:
    SIGTERM closes the HTTP session after 5 s, kill -9 ends it), so the outbox never
    learns its ts. The next owner redelivers that piece: it finds the message by the
    piece's metadata and updates it, rather than posting the answer a second time."""
    openai_server.default = lambda body: Reply.text("the answer to the first question")
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        transport = f"""
[transports.slack]
type = "slack"
bot_token = "{slack.bot_token}"
app_token = "{slack.app_token}"
api_url = "{slack.api_url}"
"""
        crew: list[Worker] = []
        try:
            async with workers(
                2, tmp_path, postgres_dsn, configs(openai_server.base_url, transport,
                                                   lease=10.0, beat=1.0)
            ) as crew:  # fmt: skip
                first = await owner_of(crew, "slack")
                await slack.wait_for_socket(1, PATIENCE)
                slack.hold("chat.postMessage")
                # A mention in the channel: the thread's first message.
                event = slack.message_event("C1", f"<@{slack.bot_user_id}> first question",
                                            user="U1")  # fmt: skip
                await slack.push_event(event)
                await slack.wait_until(lambda: bool(slack.held), PATIENCE, "the answer's post")
                first.kill(stop)
                await first.wait()
                second = next(w for w in crew if w is not first)
                await until(lambda: "took over slack" in second.stderr(), "the takeover")
                took = next(ln for ln in second.stderr().splitlines() if "took over slack" in ln)
                answers = [m for m in slack.messages.values()
                           if m.get("user") == slack.bot_user_id
                           and m.get("thread_ts") == event["ts"]]  # fmt: skip
                assert [m["text"] for m in answers] == ["the answer to the first question"], took
                # The one post was found (not posted again) by its metadata.
                assert "1 piece(s) redelivered" in took
                assert len(slack.calls_to("chat.postMessage")) == 1
                assert slack.calls_to("conversations.replies")
                assert sum("first question" in last_user(r) for r in openai_server.requests) == 1
        except BaseException:
            for w in crew:  # shown with the failure
                print(f"--- {w.folder.name}\n{w.stderr()[-6000:]}")
            print("calls:", [(m, {k: str(v)[:80] for k, v in p.items()}) for m, p in slack.calls])
            raise
        finally:
            slack.release()


def _said(slack: FakeSlack, channel: str, text: str) -> bool:
    return any(
        text in (m.get("text") or "")
        for (ch, _), m in slack.messages.items()
        if ch == channel and m.get("user") == slack.bot_user_id
    )


# -- linked channels ---------------------------------------------------------------------------
@pytest.mark.timeout(400)  # two workers, a link, a failover, on a loaded machine
async def test_a_link_made_on_one_worker_is_in_force_on_the_worker_that_takes_over(
    ngircd, postgres_dsn, openai_server, tmp_path
) -> None:
    """``!link`` on the worker owning the connections; the other, already running, learns
    of it (the ``links`` topic) and, once it has taken the connections over after a kill
    -9, relays the Slack channel's people to the IRC channel as the link says; after an
    ``!unlink`` through it, the first worker, started again, keeps them apart."""
    openai_server.default = lambda body: Reply.text("noted")
    async with FakeSlack() as slack:
        slack.add_user("U2", "bob")
        slack.add_user("U9", "root")
        mention = f"<@{slack.bot_user_id}>"
        transport = (
            irc_transport(ngircd.port)
            + f"""
[transports.slack]
type = "slack"
bot_token = "{slack.bot_token}"
app_token = "{slack.app_token}"
api_url = "{slack.api_url}"
conversation_per = "channel"
streaming = "edit"
[access]
admins = ["slack:T1:U9"]
"""
        )

        def link_seen(view: dict[str, Any] | None) -> bool:
            return view is not None and "link:team" in (view.get("components") or {})

        def said(words: str) -> bool:
            return any(words in (c.get("text") or "") for c in slack.calls_to("chat.postMessage"))

        crew = [Worker(tmp_path / f"w{i}", worker_config(f"w{i}", openai_server.base_url,
                                                          extra=transport), postgres_dsn)
                for i in range(2)]  # fmt: skip
        watcher = await IRCTestClient.connect(ngircd.port, "watcher")
        try:
            await watcher.join(CHANNEL)
            first, second = crew
            first.start()  # alone: it owns both connections
            await owner_of([first], "libera")
            await owner_of([first], "slack")
            await slack.wait_for_socket(1, PATIENCE)
            second.start()
            await until(second.health, "the second worker's /health")
            await slack.push_event(slack.message_event(
                "C1", f"{mention} !link team irc:libera:{CHANNEL}", user="U9"))  # fmt: skip
            await until(lambda: said("linked team"), "the link made")
            # The second worker knows it (its /health shows the link) without a restart.
            await until(lambda: _call(second.health, link_seen), "the link on the other worker")

            since = watcher.mark()
            first.kill()
            await first.wait()
            await owner_of([second], "libera")
            await owner_of([second], "slack")
            await watcher.wait_for(
                lambda m: m.command == "JOIN" and (m.nick or "").startswith("agentik"),
                PATIENCE, since=since,
            )  # fmt: skip
            await slack.wait_for_socket(2, PATIENCE)
            await slack.push_event(slack.message_event("C1", "after the failover", user="U2"))
            await watcher.wait_for(lambda m: "after the failover" in m.text, PATIENCE)

            # Undone through the second worker: the first, started again, keeps them apart.
            await slack.push_event(slack.message_event("C1", f"{mention} !unlink team",
                                                       user="U9"))  # fmt: skip
            await until(lambda: said("unlinked team"), "the link undone")
            first.start()
            await until(lambda: _call(first.health, lambda v: v is not None and not link_seen(v)),
                        "the first worker back, without the link")  # fmt: skip
        except BaseException:
            for w in crew:  # shown with the failure
                print(f"--- {w.folder.name}\n{w.stderr()[-6000:]}")
            raise
        finally:
            await watcher.close()
            for w in crew:
                w.stop()


async def _call(get: Any, check: Any) -> bool:
    """``check(await get())``: for :func:`until` on a worker's ``/health``."""
    return bool(check(await get()))
