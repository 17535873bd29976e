"""Budgets (issue 19): per speaker and per channel limits, through real transports.

Slack (the real slack-bolt stack against the fake Slack) gives verified
speakers; IRC (a real server, no services) gives unverified ones.  The clock
the budgets read is a variable the tests move: no test waits for a minute or
a day to pass.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable
from contextlib import AsyncExitStack, asynccontextmanager

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent, SQLiteStore
from agentik.core.budgets import (
    BudgetLimits,
    Budgets,
    BudgetSettings,
    Subject,
    UnverifiedLimits,
)
from agentik.core.llm.openai_backend import OpenAIBackend
from agentik.core.messages import Usage
from agentik.core.store.memory import MemoryStore
from agentik.core.testing.openai_server import FakeOpenAIServer
from agentik.core.testing.openai_server import Reply as ServerReply
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.core.tools.base import tool
from agentik.transports.irc.transport import IRCTransport

from fakeslack import FakeSlack
from ircservers import IRCTestClient
from rigs import FAST, bot_texts, eventually, joined, slack_bot

pytest_plugins = ["ircservers", "pgserver"]

#: 2026-12-01 13:59:30 UTC: half a minute before a minute (and 10 h before a day) ends.
T0 = 1_796_133_570.0
DAY = 86_400.0


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def budgeted_bot(slack, tmp_path, llm, settings, clock, *, role_for=None, tools=()):
    """:func:`rigs.slack_bot` on ``llm`` under the budgets ``settings`` (counted by
    ``clock``); yields its bridge."""
    store = SQLiteStore(str(tmp_path / "budgets.db"))
    budgets = Budgets(settings, store, clock=clock)
    extra = {"role_for": role_for} if role_for else {}
    async with slack_bot(
        slack, tmp_path, model=llm, store=store, tools=tools,
        bridge_kw={"budgets": budgets, **extra},
    ) as bot:  # fmt: skip
        yield bot.bridge


async def bot_said(slack: FakeSlack, channel: str, count: int) -> list[str]:
    """Wait until the bot has posted ``count`` messages in ``channel``; all of them."""

    def enough() -> list[str] | None:
        texts = bot_texts(slack, channel)
        return texts if len(texts) >= count else None

    return await eventually(enough, f"{count} messages from the bot in {channel}")


async def bot_posted(slack: FakeSlack, channel: str, needle: str) -> str:
    """Wait until the bot has posted a message in ``channel`` containing ``needle``; it."""
    found = await eventually(
        lambda: [t for t in bot_texts(slack, channel) if needle in t],
        f"the bot to post {needle!r} in {channel}",
    )
    return found[-1]


async def _at_least(count: Awaitable[int], n: int) -> bool:
    return await count >= n


def openai_llm(server: FakeOpenAIServer) -> OpenAIBackend:
    return OpenAIBackend(model="fake-model", base_url=server.base_url, api_key="sk-test",
                         max_retries=0, timeout=60)  # fmt: skip


async def test_token_budget_used_up_gives_one_notice_no_model_call_and_resets_next_day(tmp_path):
    settings = BudgetSettings(user=BudgetLimits(tokens_per_day=100))
    clock = Clock()
    async with FakeSlack() as slack, FakeOpenAIServer(model="fake-model") as server:
        slack.add_user("U1", "alice")
        async with budgeted_bot(slack, tmp_path, openai_llm(server), settings, clock) as bridge:
            # The model reports 80 + 40 tokens: the first answer uses up the day.
            server.enqueue(ServerReply.text("first answer", usage=(80, 40)))
            await slack.push_event(slack.message_event("D1", "hello", channel_type="im"))
            await bot_said(slack, "D1", 1)
            await bridge.flush("slack:T1:D1")
            assert len(server.requests) == 1
            await slack.push_event(slack.message_event("D1", "more please", channel_type="im"))
            texts = await bot_said(slack, "D1", 2)
            # A notice: italics in Slack.
            assert texts[1] == "_alice: daily token budget used up (100); resets at 00:00 UTC_"
            # Once per window: the next message gets no second notice, and no model call.
            await slack.push_event(slack.message_event("D1", "and again", channel_type="im"))
            await slack.push_event(slack.message_event("D1", "!budget", channel_type="im"))
            texts = await bot_said(slack, "D1", 3)
            assert texts[2].startswith("alice: 0 of 100 tokens today left")
            assert "this channel: 120 tokens today (no limit)" in texts[2]
            assert len(server.requests) == 1
            # The next UTC day the budget is back.
            clock.now += DAY
            await slack.push_event(slack.message_event("D1", "a new day", channel_type="im"))
            # (The fake model's echo names the speaker.)
            assert await bot_posted(slack, "D1", "a new day") == "echo: alice: a new day"
            assert len(server.requests) == 2


async def test_budgets_hold_across_a_restart_on_the_same_database(tmp_path):
    settings = BudgetSettings(channel=BudgetLimits(tokens_per_day=10))
    clock = Clock()
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        model = ScriptedModel()
        model.enqueue(Reply(text="a long answer", usage=Usage(total_tokens=25)))
        async with budgeted_bot(slack, tmp_path, model, settings, clock) as bridge:
            await slack.push_event(slack.message_event("D1", "hello", channel_type="im"))
            await bot_said(slack, "D1", 1)
            await bridge.flush("slack:T1:D1")
        # A new process: new agent, bridge and budgets on the same file.
        model = ScriptedModel()
        async with budgeted_bot(slack, tmp_path, model, settings, clock):
            await slack.push_event(slack.message_event("D1", "still there?", channel_type="im"))
            texts = await bot_said(slack, "D1", 2)
            assert texts[1] == (
                "_this channel's daily token budget used up (10); resets at 00:00 UTC_"
            )
            assert model.requests == []
    with sqlite3.connect(tmp_path / "budgets.db") as db:
        rows = db.execute("SELECT scope, kind, amount FROM budget_usage ORDER BY 1, 2").fetchall()
    assert ("channel", "tokens", 25) in rows and ("channel", "messages", 1) in rows


async def test_tool_calls_past_the_daily_limit_are_refused_per_role(tmp_path):
    ran: list[str] = []

    @tool(description="look something up", parameters={"type": "object", "properties": {}})
    async def lookup() -> str:
        ran.append("lookup")
        return "found it"

    settings = BudgetSettings(user=BudgetLimits(tool_calls_per_day=1))
    roles = {"U1": "user", "U2": "admin"}

    def role_for(transport_name, message, channel_key):
        assert transport_name == "slack"
        return roles[message.author_id]

    clock = Clock()
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        slack.add_user("U2", "bob")
        model = ScriptedModel()
        async with budgeted_bot(slack, tmp_path, model, settings, clock, role_for=role_for,
                             tools=[lookup]) as bridge:  # fmt: skip
            # alice (user): two calls in one turn; the second is past her daily limit.
            model.enqueue(
                Reply(tool_calls=[call("lookup", id="c1")]),
                Reply(tool_calls=[call("lookup", id="c2")]),
                Reply(text="done without more tools"),
            )
            await slack.push_event(slack.message_event("D1", "look twice", channel_type="im"))
            await bot_said(slack, "D1", 1)
            await bridge.flush("slack:T1:D1")
            assert ran == ["lookup"]
            tool_results = [m for m in model.requests[-1].messages if m.role == "tool"]
            assert tool_results[0].content == "found it"
            assert tool_results[1].is_error
            assert "daily tool call budget is used up (1)" in tool_results[1].content
            assert "lookup was not run" in tool_results[1].content
            # bob (admin, no limit set) may call tools in another conversation.
            model.enqueue(
                Reply(tool_calls=[call("lookup", id="c3")]),
                Reply(tool_calls=[call("lookup", id="c4")]),
                Reply(text="bob's answer"),
            )
            await slack.push_event(slack.message_event("D2", "look", user="U2",
                                                       channel_type="im"))  # fmt: skip
            await bot_said(slack, "D2", 1)
            await bridge.flush("slack:T1:D2")
            assert ran == ["lookup"] * 3
            # alice's !budget says so.
            await slack.push_event(slack.message_event("D1", "!budget", channel_type="im"))
            report = await bot_posted(slack, "D1", "tool calls today")
            assert report.startswith("alice: ") and "0 of 1 tool calls today left" in report


async def test_unverified_irc_speakers_share_a_per_minute_bucket(miniircd, tmp_path):
    # A role limit the unverified bucket overrides, and one it takes as it is.
    settings = BudgetSettings(user=BudgetLimits(messages_per_minute=9, tool_calls_per_day=4),
                              unverified=UnverifiedLimits(messages_per_minute=2))  # fmt: skip
    clock = Clock()
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "irc.db")))
    await agent.start()
    bridge = Bridge(agent, budgets=Budgets(settings, agent.store, clock=clock))
    transport = IRCTransport(
        name="testnet",
        settings={"host": "127.0.0.1", "port": miniircd.port, "nick": "agentik", "channels": ["#b"],
                  **FAST},
    )  # fmt: skip
    bridge.attach(transport, ChannelOptions(command_prefix="!"))
    await transport.start(bridge)
    try:
        await joined(transport, "#b")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        bob = await IRCTestClient.connect(miniircd.port, "bob")
        await alice.join("#b")
        await bob.join("#b")

        def from_bot(m):
            return m.command in ("PRIVMSG", "NOTICE") and (m.nick or "").lower() == "agentik"

        alice.privmsg("#b", "agentik: one")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: echo: one")
        bob.privmsg("#b", "agentik: two")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "bob: echo: two")
        # A third message in the same minute, by either nick, is over the shared bucket.
        alice.privmsg("#b", "agentik: three")
        notice = await alice.wait_for(from_bot)
        assert notice.text == (
            "alice: message budget used up (2 a minute) for unverified speakers on testnet;"
            " resets at 14:00 UTC"
        )
        # bob changing nothing but his nick does not escape it; no second notice either.
        bob.privmsg("#b", "agentik: four")
        bob.privmsg("#b", "!budget")
        report = await alice.wait_for(from_bot)
        assert report.text.startswith("bob (unverified, shared on testnet): ")
        assert "0 of 2 messages this minute left" in report.text
        assert "4 of 4 tool calls today left" in report.text
        assert "this channel: " in report.text
        assert len(model.requests) == 2
        # The next minute the bucket is open again.
        clock.now += 30
        alice.privmsg("#b", "agentik: five")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: echo: five")
        assert len(model.requests) == 3
        await alice.close()
        await bob.close()
    finally:
        await transport.aclose()
        await bridge.aclose()
        await agent.aclose()


async def test_no_budgets_means_unlimited_and_budget_says_so(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        model = ScriptedModel()
        async with budgeted_bot(slack, tmp_path, model, BudgetSettings(), Clock()):
            await slack.push_event(slack.message_event("D1", "!budget", channel_type="im"))
            assert (await bot_said(slack, "D1", 1)) == ["no budgets are set: usage is unlimited"]


async def _two_workers_at_the_edge(stores) -> None:
    """Two workers (two stores, two Budgets, one database) each get a burst from
    alice at once: between them exactly as many messages pass as the limit allows,
    and alice's counter never goes past it."""
    settings = BudgetSettings(user=BudgetLimits(messages_per_minute=4))
    alice = Subject(transport="slack", channel="slack:T1:C1", identity="slack:alice")
    async with AsyncExitStack() as stack:
        for store in stores:
            await stack.enter_async_context(store)
        workers = [Budgets(settings, store, clock=Clock()) for store in stores]
        results = await asyncio.gather(
            *(worker.admit(alice, chars=10) for worker in workers for _ in range(6))
        )
        assert results.count(None) == 4
        refusals = [r for r in results if r is not None]
        assert {(r.scope, r.kind, r.limit) for r in refusals} == {("identity", "messages", 4)}
        used = await workers[1].used(alice)
        assert used[("identity", "messages")] == 4
        assert used[("channel", "messages")] == 4


async def test_workers_on_one_postgres_never_admit_past_a_limit(postgres_dsn):
    from agentik.core.store.postgres import PostgresStore

    await _two_workers_at_the_edge([PostgresStore(postgres_dsn), PostgresStore(postgres_dsn)])


_WORKER = """
import asyncio, sys
from agentik.core.budgets import BudgetLimits, Budgets, BudgetSettings, Subject
from agentik.core.store.postgres import PostgresStore

async def main():
    settings = BudgetSettings(user=BudgetLimits(messages_per_minute=5))
    alice = Subject(transport="slack", channel="slack:T1:C1", identity="slack:alice")
    async with PostgresStore(sys.argv[1]) as store:
        budgets = Budgets(settings, store, clock=lambda: float(sys.argv[2]))
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        results = await asyncio.gather(*(budgets.admit(alice) for _ in range(8)))
        print("admitted", sum(r is None for r in results), flush=True)

asyncio.run(main())
"""


async def test_worker_processes_on_one_postgres_never_admit_past_a_limit(postgres_dsn):
    """Two worker processes (their own event loops, on both cores), told to go at
    once, each admit a burst of alice's messages: 5 between them, not 5 each."""
    import os
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    pipe = asyncio.subprocess.PIPE
    argv = [sys.executable, "-c", _WORKER, postgres_dsn, str(T0)]
    procs = [
        await asyncio.create_subprocess_exec(*argv, env=env, stdin=pipe, stdout=pipe)
        for _ in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert (await asyncio.wait_for(proc.stdout.readline(), 120)) == b"ready\n"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        outs = [await asyncio.wait_for(proc.communicate(), 120) for proc in procs]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    admitted = [int(out.split()[-1]) for out, _ in outs]
    assert sum(admitted) == 5, admitted
    from agentik.core.store.postgres import PostgresStore

    async with PostgresStore(postgres_dsn) as store:
        alice = Subject(transport="slack", channel="slack:T1:C1", identity="slack:alice")
        budgets = Budgets(BudgetSettings(), store, clock=Clock())
        assert (await budgets.used(alice))[("identity", "messages")] == 5


async def test_takes_over_overlapping_counters_on_three_stores_stay_exact(postgres_dsn):
    """Many takes at once from three stores (three writers batching them) over people
    and channels that overlap: whatever order their locks meet in (a deadlock is
    broken and the take run again), none fails, no counter passes its limit, and a
    take was refused only because one of its counters was full."""
    import random

    from agentik.core.store.postgres import PostgresStore

    limit = 7
    pick = random.Random(32)
    takes = [(pick.choice("abcd"), pick.choice("xyz")) for _ in range(240)]
    async with AsyncExitStack() as stack:
        stores = [await stack.enter_async_context(PostgresStore(postgres_dsn)) for _ in range(3)]

        async def take(n: int, person: str, channel: str):
            counters = [("identity", person), ("channel", channel)]
            return await stores[n % 3].budget_take(
                [(scope, key, "messages", 60, limit) for scope, key in counters],
                [(scope, key, "messages", 60, 1) for scope, key in counters],
            )

        results = await asyncio.gather(*(take(n, p, c) for n, (p, c) in enumerate(takes)))
        counts = {(scope, key): n for scope, key, _, _, n in await stores[0].budget_rows(0)}
    assert all(n <= limit for n in counts.values())
    admitted = [t for t, r in zip(takes, results, strict=True) if r is None]
    assert sum(n for (scope, _), n in counts.items() if scope == "identity") == len(admitted)
    for (person, channel), r in zip(takes, results, strict=True):
        if r is not None:
            assert limit in (counts.get(("identity", person)), counts.get(("channel", channel)))


async def test_processes_on_one_sqlite_file_never_admit_past_a_limit(tmp_path):
    await _two_workers_at_the_edge([SQLiteStore(str(tmp_path / "shared.db")) for _ in range(2)])


async def test_tool_calls_held_on_two_workers_hold_the_daily_limit(postgres_dsn):
    """Tool calls checked at once on two workers (one PostgreSQL database): exactly the
    limit is admitted between them; a call that then does not run is given back."""
    from agentik.core.store.postgres import PostgresStore

    settings = BudgetSettings(user=BudgetLimits(tool_calls_per_day=3))
    alice = Subject(transport="slack", channel="slack:T1:C1", identity="slack:alice")
    async with AsyncExitStack() as stack:
        workers = []
        for n in range(2):
            store = await stack.enter_async_context(PostgresStore(postgres_dsn))
            agent = await stack.enter_async_context(Agent(llm=ScriptedModel(), store=store))
            conv = await agent.conversation_for_channel("slack:T1:C1")
            budgets = Budgets(settings, store, clock=Clock())
            budgets.bind(f"run{n}", alice)
            workers.append((budgets, conv, f"run{n}"))
        refusals = await asyncio.gather(*(
            budgets.tool_call(conv, run, "lookup", f"{run}-c{i}")
            for budgets, conv, run in workers for i in range(4)
        ))  # fmt: skip
        admitted = [i for i, r in enumerate(refusals) if r is None]
        assert len(admitted) == 3
        assert all("daily tool call budget is used up (3)" in r for r in refusals if r)
        used = await workers[0][0].used(alice)
        assert used[("identity", "tool_calls")] == 3
        # Of the admitted calls, only the first ran; the turns end: the rest is given back.
        first = admitted[0]
        budgets, _, run = workers[first // 4]
        await budgets.tool_call_ran(run, f"{run}-c{first % 4}")
        for budgets, _, run in workers:
            await budgets.turn_ended(run, Usage(total_tokens=10))
        used = await workers[1][0].used(alice)
        assert (used[("identity", "tool_calls")], used[("channel", "tool_calls")]) == (1, 1)


async def test_memory_store_counts_like_sqlite():
    store = MemoryStore()
    rows = [("identity", "x:a", "tokens", 0, 5), ("identity", "x:a", "tokens", 0, 7),
            ("channel", "c", "messages", 60, 1)]  # fmt: skip
    await store.budget_add(rows)
    got = await store.budget_usage([("identity", "x:a"), ("channel", "c")],
                                   {"tokens": 0, "messages": 60})  # fmt: skip
    assert got == {("identity", "x:a", "tokens"): 12, ("channel", "c", "messages"): 1}
    assert await store.budget_prune({"messages": 120}) == 1
    assert await store.budget_rows(0) == [("identity", "x:a", "tokens", 0, 12)]


def test_agentik_access_budgets_shows_limits_and_todays_usage(tmp_path):
    import subprocess
    import time

    from agentik.core.budgets import Subject
    from helpers import AGENTIK

    conf = tmp_path / "bot.toml"
    conf.write_text(
        '[storage]\npath = "bot.db"\n'
        "[budgets.user]\nmessages_per_minute = 6\ntokens_per_day = 200000\n"
        "[budgets.channel]\ntool_calls_per_day = 50\n",
        encoding="utf-8",
    )

    async def use() -> None:
        async with SQLiteStore(str(tmp_path / "bot.db")) as store:
            from agentik.bot.config import load_config

            budgets = Budgets(load_config(conf).budgets, store)
            alice = Subject(transport="libera", channel="irc:libera:#ops", identity="libera:alice")
            await budgets.record(alice, "tokens", 1234)
            await budgets.record(alice, "tool_calls", 2)
            # Yesterday's usage is not today's.
            await budgets.record(alice, "tokens", 99, now=time.time() - DAY)

    asyncio.run(use())
    run = subprocess.run([AGENTIK, "access", "budgets", "-c", str(conf)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "  user: 6 messages/minute, 200,000 tokens/day, unlimited tool calls/day" in lines
    assert "  admin: unlimited" in lines
    assert (
        "  unverified: messages/minute as their role, tokens/day as their role, tool calls/day"
        " as their role" in lines
    )
    assert "  channel: unlimited messages/minute, unlimited tokens/day, 50 tool calls/day" in lines
    assert "  identity   libera:alice: 1,234 tokens, 2 tool calls" in lines
    assert "  channel    irc:libera:#ops: 1,234 tokens, 2 tool calls" in lines
    bad = subprocess.run([AGENTIK, "access", "budgets", "--day", "yesterday", "-c", str(conf)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "agentik: --day: not a date (YYYY-MM-DD): 'yesterday'"
    )


async def test_http_api_answers_429_when_the_budget_is_used_up(tmp_path):
    import httpx

    from agentik.transports.http.transport import HttpTransport

    settings = BudgetSettings(user=BudgetLimits(tokens_per_day=20))
    clock = Clock()
    model = ScriptedModel()
    store = SQLiteStore(str(tmp_path / "http.db"))
    agent = Agent(llm=model, store=store)
    await agent.start()
    budgets = Budgets(settings, store, clock=clock)
    bridge = Bridge(agent, budgets=budgets)
    transport = HttpTransport(name="web", settings={"port": 0}, environ={})
    bridge.attach(transport)
    await transport.start(bridge)
    try:
        base = f"{transport.url}{transport.options.prefix}"
        async with httpx.AsyncClient(base_url=base, timeout=60) as c:
            conv = (await c.post("/conversations", json={})).json()
            path = f"/conversations/{conv['id']}/messages"
            model.enqueue(Reply(text="an answer", usage=Usage(total_tokens=25)))
            r = await c.post(path, json={"content": "hello"})
            assert r.status_code == 202, r.text
            await (await agent.get_conversation(conv["id"])).wait_idle()

            # The turn's tokens are counted from the agent's events: wait for them.
            async def counted() -> bool:
                return any(k == "tokens" for _, _, k, _, _ in await store.budget_rows(0))

            await eventually(counted, "the turn's tokens to be counted")
            r = await c.post(path, json={"content": "more"})
            assert r.status_code == 429
            error = r.json()["error"]
            assert error["code"] == "budget_exceeded"
            assert error["message"].endswith(
                ": daily token budget used up (20); resets at 00:00 UTC"
            )
            assert int(r.headers["retry-after"]) == 10 * 3600 + 30
            # Every refused request says so (an API client has no chat scroll-back).
            assert (await c.post(path, json={"content": "again"})).status_code == 429
            assert len(model.requests) == 1
            texts = [m["content"] for m in (await c.get(path)).json()["items"]]
            assert texts == ["hello", "an answer"]  # nothing stored for the refused ones
            clock.now += DAY
            assert (await c.post(path, json={"content": "tomorrow"})).status_code == 202
    finally:
        await transport.aclose()
        await bridge.aclose()
        await agent.aclose()


async def test_the_bot_takes_budgets_from_its_configuration(tmp_path, openai_server):
    from agentik.bot.app import Bot
    from agentik.bot.config import parse_config

    base = {
        "llm": {
            "backend": "openai",
            "base_url": openai_server.base_url,
            "api_key": "sk-x",
            "model": "fake-model",
        },
        "storage": {"path": str(tmp_path / "bot.db")},
    }
    bot = Bot(parse_config({**base, "budgets": {"channel": {"tokens_per_day": 5}}}))
    budgets = bot.bridge.budgets
    assert budgets is not None and budgets.store is bot.agent.store
    assert budgets.settings.channel.tokens_per_day == 5
    await bot.aclose()
    # Without [budgets] nothing is limited and nothing is counted.
    bot = Bot(parse_config(base))
    assert bot.bridge.budgets is None
    await bot.aclose()


# -- budgets under concurrency (issue 28, item 3) ---------------------------------------
@asynccontextmanager
async def http_bot(tmp_path, llm, settings, clock, *, tools=(), http=None, environ=None,
                   token=None, **agent_kwargs):  # fmt: skip
    """A bot serving the HTTP API (no tokens: every request is the same speaker)."""
    import httpx

    from agentik.transports.http.transport import HttpTransport

    store = SQLiteStore(str(tmp_path / "http.db"))
    agent = Agent(llm=llm, store=store, tools=tools, **agent_kwargs)
    await agent.start()
    budgets = Budgets(settings, store, clock=clock)
    bridge = Bridge(agent, budgets=budgets)
    transport = HttpTransport(name="web", settings={"port": 0, **(http or {})},
                              environ=environ or {})  # fmt: skip
    bridge.attach(transport)
    await transport.start(bridge)
    try:
        base = f"{transport.url}{transport.options.prefix}"
        headers = {"authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(base_url=base, timeout=120, headers=headers) as client:
            yield agent, store, client
    finally:
        await transport.aclose()
        await bridge.aclose()
        await agent.aclose()


async def post_at_once(client, n: int) -> tuple[list[str], list[int]]:
    """``n`` new conversations, then one message into each, all sent at once:
    the conversations' ids and the answers' status codes."""
    ids = [(await client.post("/conversations", json={})).json()["id"] for _ in range(n)]
    answers = await asyncio.gather(
        *(client.post(f"/conversations/{cid}/messages", json={"content": "hi"}) for cid in ids)
    )
    return ids, [r.status_code for r in answers]


async def all_idle(agent: Agent, ids: list[str]) -> None:
    for cid in ids:
        await (await agent.get_conversation(cid)).wait_idle()


async def test_messages_sent_at_once_into_new_conversations_hold_the_speakers_limit(tmp_path):
    settings = BudgetSettings(user=BudgetLimits(messages_per_minute=5))
    async with FakeOpenAIServer() as server:
        llm = openai_llm(server)
        async with http_bot(tmp_path, llm, settings, Clock()) as (agent, _store, client):
            ids, codes = await post_at_once(client, 40)
            assert sorted(codes) == [202] * 5 + [429] * 35
            await all_idle(agent, ids)
            assert len(server.requests) == 5


async def test_tool_calls_of_concurrent_turns_hold_the_daily_limit(tmp_path):
    ran: list[str] = []

    @tool(description="look something up", parameters={"type": "object", "properties": {}})
    async def lookup() -> str:
        ran.append("lookup")
        return "found it"

    def reply(body):
        if body["messages"][-1]["role"] == "user":
            n = len(server.requests)
            return ServerReply.tool_calls([(f"c{n}", "lookup", "{}")], usage=(5, 5))
        return ServerReply.text("done", usage=(5, 5))

    settings = BudgetSettings(user=BudgetLimits(tool_calls_per_day=5))
    async with FakeOpenAIServer() as server:
        server.default = reply
        llm = openai_llm(server)
        async with http_bot(tmp_path, llm, settings, Clock(), tools=[lookup]) as (
            agent, store, client,
        ):  # fmt: skip
            ids, codes = await post_at_once(client, 10)
            assert codes == [202] * 10
            await all_idle(agent, ids)
            assert ran == ["lookup"] * 5
            counted = [n for scope, _, kind, _, n in await store.budget_rows(0)
                       if kind == "tool_calls" and scope == "identity"]  # fmt: skip
            assert counted == [5]


async def test_concurrent_slow_turns_reserve_tokens_and_settle_at_their_end(tmp_path):
    held: list[ServerReply] = []

    def reply(body):
        # Each turn uses 100 tokens and answers only when the test says so.
        r = ServerReply.text("slow answer", chunks=2, usage=(60, 40))
        r.hold_after = 1
        held.append(r)
        return r

    settings = BudgetSettings(user=BudgetLimits(tokens_per_day=300))
    async with FakeOpenAIServer() as server:
        server.default = reply
        llm = openai_llm(server)
        async with http_bot(tmp_path, llm, settings, Clock()) as (agent, store, client):
            ids = [(await client.post("/conversations", json={})).json()["id"] for _ in range(30)]
            answers = await asyncio.gather(*(
                client.post(f"/conversations/{cid}/messages", json={"content": "hi"})
                for cid in ids
            ))  # fmt: skip
            codes = [r.status_code for r in answers]
            # The first turn's reservation covers the limit: the others wait for its end,
            # and are told why.
            assert codes.count(202) == 1 and codes.count(429) == 29
            refusal = next(r for r in answers if r.status_code == 429)
            assert refusal.headers["retry-after"] == "5"  # not at 00:00 UTC: when turns end
            refused = refusal.json()["error"]
            assert refused["message"].endswith(
                ": daily token budget used up (300, counting 1,000 reserved by turns still"
                " running); resets at 00:00 UTC"
            )
            for r in held:
                r.release()
            await all_idle(agent, ids)

            async def tokens() -> int:
                rows = await store.budget_rows(0)
                return sum(n for s, _, k, _, n in rows if k == "tokens" and s == "identity")

            await eventually(lambda: _at_least(tokens(), 100), "100 tokens counted")
            # Settled: what the turn used (100) counts, not its reservation; turns now
            # reserve the mean a turn used, so of three more sent at once two fit.
            more, codes = await post_at_once(client, 3)
            assert sorted(codes) == [202, 202, 429]
            for r in held:
                r.release()
            await all_idle(agent, more)
            await eventually(lambda: _at_least(tokens(), 300), "300 tokens counted")
            assert await tokens() == 300
            assert len(server.requests) == 3


async def test_the_tool_call_budget_counts_calls_that_ran_not_denied_approvals(tmp_path):
    from agentik.core.approvals import ApprovalRule

    from httpserver import TOKENS, sse

    ran: list[str] = []

    @tool(name="fs__write_file", description="Write a file",
          parameters={"type": "object", "properties": {}})  # fmt: skip
    async def write() -> str:
        ran.append("write")
        return "written"

    http = {"tokens": [{"name": "admin", "env": "ADMIN_TOKEN"},
                       {"name": "alice", "env": "ALICE_TOKEN"}]}  # fmt: skip
    rules = [ApprovalRule(tools=("fs__*",), approvers="user")]
    settings = BudgetSettings(user=BudgetLimits(tool_calls_per_day=1))
    model = ScriptedModel()
    async with http_bot(tmp_path, model, settings, Clock(), tools=[write], http=http,
                        environ=TOKENS, token=TOKENS["ALICE_TOKEN"],
                        approvals=rules) as (agent, store, alice):  # fmt: skip
        admin_headers = {"authorization": f"Bearer {TOKENS['ADMIN_TOKEN']}"}
        conv = (await alice.post("/conversations", json={})).json()
        base = f"/conversations/{conv['id']}"
        async with sse(alice, base + "/events", params={"profile": "chat"}) as events:

            async def approval_or_end() -> str:
                while True:
                    msg = await events.next(timeout=60)
                    if msg.kind == "approval_requested":
                        assert msg.data is not None
                        return msg.data["approval_id"]
                    if msg.kind == "turn_ended":
                        return ""

            for decision in ("deny", "approve"):
                model.enqueue(Reply(tool_calls=[call("fs__write_file", {})]), "ok")
                r = await alice.post(base + "/messages", json={"content": "write it"})
                assert r.status_code == 202, r.text
                approval = await approval_or_end()
                assert approval, f"no approval was asked before the {decision}"
                url = f"{base}/approvals/{approval}"
                r = await alice.post(url, json={"decision": decision}, headers=admin_headers)
                assert r.status_code == 200, r.text
                await events.until("turn_ended")
        await (await agent.get_conversation(conv["id"])).wait_idle()
        # The denied call never ran and is not counted: the approved one fit the limit.
        assert ran == ["write"]
        counted = [n for scope, key, kind, _, n in await store.budget_rows(0)
                   if kind == "tool_calls" and scope == "identity"]  # fmt: skip
        assert counted == [1]
