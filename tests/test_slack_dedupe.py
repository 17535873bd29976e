"""Slack's redeliveries on several workers: the handled events live in the shared store
(PostgreSQL, tests/pgserver.py), so an event one worker answered is not answered again
by another (the real slack-bolt stack against the fake Slack, tests/fakeslack.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agentik.bot.bridge import Bridge
from agentik.bot.builder import StoreSeenEvents, wire_transport
from agentik.core import Agent
from agentik.core.store.postgres import PostgresStore
from agentik.core.testing.scripted import ScriptedModel
from helpers import AGENTIK, clean_env

from fakeslack import FakeSlack
from rigs import answered, bot_texts, serving, slack_transport

pytest_plugins = ["pgserver"]


@asynccontextmanager
async def worker(slack: FakeSlack, folder: Path, dsn: str) -> AsyncIterator[Any]:
    """One worker of a bot on PostgreSQL: its own process state (agent, bridge, Slack
    app, folder), the database shared; wired as ``agentik run`` wires it."""
    await asyncio.to_thread(folder.mkdir)
    model = ScriptedModel()
    agent = Agent(llm=model, store=PostgresStore(dsn))
    await agent.start()
    bridge = Bridge(agent)
    transport = slack_transport(slack, folder)
    wire_transport(transport, agent.store)
    async with serving(agent, bridge, transport) as transport:
        yield transport, model, bridge


async def test_a_retry_reaching_another_worker_is_not_answered_again(tmp_path, postgres_dsn):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with worker(slack, tmp_path / "a", postgres_dsn) as (_, model_a, bridge_a):
            await slack.wait_for_socket(1)
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> once please")
            await slack.push_event(event, event_id="Ev1")
            await answered(slack, bridge_a, f"slack:T1:C1:{event['ts']}")
            async with worker(slack, tmp_path / "b", postgres_dsn) as (b, model_b, bridge_b):
                await slack.wait_for_socket(2)  # events now go to worker B's connection
                retry = await slack.push_event(event, event_id="Ev1", retry_num=1)
                # The same message as the other event type (another event id).
                twin = dict(event, type="message", channel_type="channel")
                await slack.push_event(twin, event_id="Ev2")
                await slack.wait_for_ack(retry)
                # A later message answered by B proves B saw both (in arrival order).
                await slack.push_event(slack.message_event("D1", "later", channel_type="im"))
                await answered(slack, bridge_b, "slack:T1:D1")
                assert [r.messages[-1].content for r in model_a.requests] == ["once please"]
                assert [r.messages[-1].content for r in model_b.requests] == ["later"]
                assert bot_texts(slack, "C1") == ["echo: once please"]
                # No handled-events file: the store holds them.
                assert b.seen_path == ":memory:"
                assert not list((tmp_path / "b").iterdir())


async def test_workers_racing_with_one_event_see_it_first_once(postgres_dsn):
    """Several workers' stores (their own pools) given the same key at once: one wins."""
    stores = [PostgresStore(postgres_dsn, pool_min=2, pool_max=2) for _ in range(4)]
    for s in stores:
        await s.start()
    try:
        seen = [StoreSeenEvents(s) for s in stores]
        for round_ in range(20):
            keys = [f"event:E{round_}", f"msg:C1:{round_}"]
            results = await asyncio.gather(*(s.first_seen(keys) for s in seen))
            assert sorted(len(r) for r in results) == [0, 0, 0, 2], results
    finally:
        for s in stores:
            await s.aclose()


def _config(folder: Path, openai_url: str, slack: FakeSlack) -> Path:
    path = folder / "bot.toml"
    path.write_text(
        f"""
[llm]
base_url = "{openai_url}"
model = "fake-model"
[storage]
backend = "postgres"
[memory]
backend = "none"
[cluster]
lease_seconds = 3.0
heartbeat_seconds = 0.5
[transports.work]
type = "slack"
mode = "socket"
bot_token = "{slack.bot_token}"
app_token = "{slack.app_token}"
api_url = "{slack.api_url}"
""",
        encoding="utf-8",
    )
    return path


@asynccontextmanager
async def agentik_run(config: Path, dsn: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """``agentik run -c config`` on PostgreSQL, killed at the end."""
    env = clean_env(AGENTIK_POSTGRES_DSN=dsn)
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "run", "-c", str(config), env=env, cwd=config.parent,
        stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_two_agentik_run_workers_answer_slacks_retry_once(
    tmp_path, postgres_dsn, openai_server
):
    """Two ``agentik run`` processes (two workers of one bot) on one PostgreSQL, the
    Socket Mode connection owned by one at a time: worker A answers an event and is
    stopped (a rolling restart), worker B takes the connection over, and Slack's
    redelivery of A's event, now reaching B, is not answered again."""
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        folders = [tmp_path / "a", tmp_path / "b"]
        for f in folders:
            f.mkdir()
        configs = [_config(f, openai_server.base_url, slack) for f in folders]
        async with agentik_run(configs[0], postgres_dsn) as a:
            await slack.wait_for_socket(1)
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> once please")
            await slack.push_event(event, event_id="Ev1")
            await slack.wait_until(lambda: bot_texts(slack, "C1") or None, 60, "worker A's answer")
            async with agentik_run(configs[1], postgres_dsn):
                a.terminate()  # SIGTERM: A hands its connection's lease over
                await a.wait()
                await slack.wait_for_socket(2)  # B's connection: Slack delivers to B
                await slack.wait_for_ack(await slack.push_event(event, event_id="Ev1",
                                                                retry_num=1))  # fmt: skip
                twin = dict(event, type="message", channel_type="channel")
                await slack.wait_for_ack(await slack.push_event(twin, event_id="Ev2"))
                await slack.push_event(slack.message_event("D1", "later", channel_type="im"))
                answer_b = lambda: bot_texts(slack, "D1") or None  # noqa: E731
                await slack.wait_until(answer_b, 60, "worker B's answer")
        assert slack.socket_connections == 2  # one each: A's, then B's
        asked = [r["messages"][-1]["content"] for r in openai_server.requests]
        assert len(asked) == 2 and asked[1].endswith("later"), asked
        assert len(bot_texts(slack, "C1")) == 1
