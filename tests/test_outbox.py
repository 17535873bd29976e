"""The persisted outbox: an answer produced before a crash reaches its channel once.

The kill tests run a bot (agent + bridge + the real IRC or Slack transport)
in a child process, kill it with SIGKILL while an answer is only partly
delivered, start it again on the same SQLite file and check what the
channel got: the rest, and no piece twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import sys
import textwrap

import pytest

from agentik.core import MemoryStore, SQLiteStore
from agentik.core.store.base import OutboxEntry
from agentik.core.testing.openai_server import Reply

from fakeslack import FakeSlack
from ircservers import IRCTestClient, start_miniircd
from rigs import eventually

pytest_plugins = ["ircservers"]

WAIT = 60  # outer guard against hangs only


# -- the store contract ------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "memory"])
async def store(request, tmp_path):
    s = SQLiteStore(str(tmp_path / "outbox.db")) if request.param == "sqlite" else MemoryStore()
    await s.start()
    yield s
    await s.aclose()


def entry(piece: int, text: str = "", **kw) -> OutboxEntry:
    return OutboxEntry(
        channel_key="irc:net:#t", run_id="r1", piece=piece, transport="net", kind="answer",
        text=text or f"line {piece}", reply_to="#t", **kw,
    )  # fmt: skip


async def test_outbox_keeps_each_piece_once_and_moves_states_forward(store):
    ids = await store.outbox_add([entry(0), entry(1), entry(2)])
    assert len(set(ids)) == 3
    # A re-render writes the same pieces again: nothing is enqueued twice.
    assert await store.outbox_add([entry(1, "changed"), entry(0)]) == [ids[1], ids[0]]
    await store.outbox_mark([(ids[0], "sent", False, None), (ids[1], "sent", True, None)])
    await store.outbox_mark([(ids[0], "queued", None, None)])  # never backwards
    left = await store.outbox_undelivered()
    # Sent without a confirmation to wait for: done.  Sent and awaiting one: not yet.
    assert [(e.id, e.text, e.state) for e in left] == [
        (ids[1], "line 1", "sent"),
        (ids[2], "line 2", "queued"),
    ]
    await store.outbox_mark([(ids[1], "confirmed", None, "ts-1"), (ids[2], "sent", False, None)])
    assert await store.outbox_undelivered() == []


async def test_a_streamed_answer_row_is_completed_in_place(store):
    [sid] = await store.outbox_add([entry(0, "", complete=False)])
    await store.outbox_mark([(sid, "sent", True, "1700.01")])
    [row] = await store.outbox_undelivered()
    assert (row.complete, row.ref, row.text) == (False, "1700.01", "line 0")
    assert await store.outbox_add([entry(0, "the whole answer")]) == [sid]
    [row] = await store.outbox_undelivered()
    assert (row.complete, row.ref, row.text, row.reply_to) == (
        True,
        "1700.01",
        "the whole answer",
        "#t",
    )
    # Complete now: a later write of the same piece changes nothing.
    await store.outbox_add([entry(0, "something else")])
    assert (await store.outbox_undelivered())[0].text == "the whole answer"


async def test_old_outbox_rows_are_pruned(store):
    import time

    await store.outbox_add([entry(0), entry(1)])
    assert await store.outbox_prune(time.time() - 3600) == 0
    assert len(await store.outbox_undelivered()) == 2
    assert await store.outbox_prune(time.time() + 1) == 2
    assert await store.outbox_undelivered() == []


# -- kill -9 with lines in the IRC flood queue ------------------------------------------------
BOT = textwrap.dedent(
    """
    import asyncio, json, sys
    from agentik.bot.bridge import Bridge, ChannelOptions
    from agentik.core import Agent, SQLiteStore
    from agentik.core.testing.scripted import Reply, ScriptedModel

    async def main(db, kind, settings, replies):
        replies = [Reply(**r) if isinstance(r, dict) else r for r in json.loads(replies)]
        model = ScriptedModel(replies)
        agent = Agent(llm=model, store=SQLiteStore(db))
        await agent.start()
        bridge = Bridge(agent)
        settings = json.loads(settings)
        if kind == "irc":
            from agentik.transports.irc.transport import IRCTransport
            transport = IRCTransport(name="net", settings=settings)
        else:
            from agentik.transports.slack.transport import SlackTransport
            transport = SlackTransport(name="slack", settings=settings)
            held = [r for r in replies if isinstance(r, Reply) and r.hold_after]
            if held:  # the test says when the held answer may go on
                loop = asyncio.get_running_loop()
                async def release():
                    await loop.run_in_executor(None, sys.stdin.readline)
                    held[0].release.set()
                asyncio.ensure_future(release())
        bridge.attach(transport, ChannelOptions(command_prefix="!"))
        await transport.start(bridge)
        print("REDELIVERED", await bridge.redeliver(), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main(*sys.argv[1:]))
    """
)


@contextlib.asynccontextmanager
async def bot_process(db: str, kind: str, settings: str, replies: str = "[]", *, stdin=None):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", BOT, db, kind, settings, replies,
        stdout=asyncio.subprocess.PIPE, stdin=stdin,
    )  # fmt: skip
    try:
        async with asyncio.timeout(WAIT):
            line = (await proc.stdout.readline()).decode().split()
        assert line and line[0] == "REDELIVERED", "the bot did not start"
        yield proc, int(line[1])
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        await proc.wait()


async def wait_db(db: str, sql: str, want) -> None:
    """Wait until ``sql`` on the bot's database (read from outside) gives ``want``."""

    def read():
        con = sqlite3.connect(db, timeout=30)
        try:
            return con.execute(sql).fetchall()
        except sqlite3.OperationalError:  # the bot has not created its schema yet
            return None
        finally:
            con.close()

    async def written() -> bool:
        return await asyncio.to_thread(read) == want

    # Another process writes it: nothing to wait on but the file itself.
    await eventually(written, f"{sql} to give {want!r}", wait=WAIT, interval=0.05)
    return want


def settings(**kw) -> str:
    import json

    return json.dumps(kw)


ANSWER = [f"line {i:02d} of a long answer" for i in range(1, 13)]


@contextlib.asynccontextmanager
async def agentik_run(config):
    """``agentik run -c config``: the installed command, the whole run path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    exe = os.path.join(os.path.dirname(sys.executable), "agentik")
    proc = await asyncio.create_subprocess_exec(
        exe, "run", "-c", str(config), env=env, cwd=config.parent,
        stdin=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        await proc.wait()


def irc_config(tmp_path, openai_server, port, *, burst: int, rate: float):
    config = tmp_path / "bot.toml"
    config.write_text(
        f"""
[llm]
base_url = "{openai_server.base_url}"
model = "fake-model"
[storage]
path = "{tmp_path / "bot.db"}"
[memory]
mining = false
reflection = false
[transports.net]
type = "irc"
host = "127.0.0.1"
port = {port}
tls = false
nick = "agentbot"
channels = ["#t"]
flood_burst = {burst}
flood_rate = {rate}
# the whole 12-line answer goes out (IRC's default cap is 4 lines)
max_answer_lines = 0
"""
    )
    return config


@pytest.mark.parametrize("echo", [True, False], ids=["echo-message", "no-echo"])
async def test_kill_9_with_lines_in_the_irc_flood_queue(tmp_path, openai_server, echo):
    server = await start_miniircd(tmp_path, echo_message=echo)
    db = str(tmp_path / "bot.db")
    alice = None

    def from_bot(m):
        return m.command == "PRIVMSG" and m.nick == "agentbot" and m.target == "#t"

    def joined(m):
        return m.command == "JOIN" and m.nick == "agentbot"

    try:
        alice = await IRCTestClient.connect(server.port, "alice")
        await alice.join("#t")
        openai_server.default = lambda body: Reply.text("\n".join(ANSWER), chunks=3)
        # Flood control lets 3 lines through (each costs ~1.15 of 4 tokens); the
        # rest would wait ~1000 s each: they are still queued when the bot dies.
        slow = irc_config(tmp_path, openai_server, server.port, burst=4, rate=0.001)
        async with agentik_run(slow) as proc:
            await alice.wait_for(joined, WAIT)
            await alice.privmsg("#t", "agentbot: tell me a long story")
            first = await alice.collect(from_bot, 3, WAIT)
            # In a channel the answer's first line names the asker (address_asker).
            assert [m.text for m in first] == [f"alice: {ANSWER[0]}", *ANSWER[1:3]]
            # Every line is in the outbox; the three written ones are recorded as
            # confirmed (echo-message) or sent (no echo): the state we kill in.
            done = "confirmed" if echo else "sent"
            await wait_db(
                db,
                "SELECT state, COUNT(*) FROM outbox GROUP BY state ORDER BY state",
                sorted([(done, 3), ("queued", 9)]),
            )
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        assert proc.returncode == -signal.SIGKILL

        # Restart on the same database with fast flood control: the nine queued
        # lines go out, once, in order; then a new answer follows them.
        openai_server.default = lambda body: Reply.text("after the restart", chunks=1)
        fast = irc_config(tmp_path, openai_server, server.port, burst=20, rate=50)
        async with agentik_run(fast) as proc:
            await alice.wait_for(joined, WAIT)
            rest = await alice.collect(from_bot, 9, WAIT)
            # The resumed answer names the asker again on its first line after the gap.
            assert [m.text for m in rest] == [f"alice: {ANSWER[3]}", *ANSWER[4:]]
            await alice.privmsg("#t", "agentbot: and now?")
            # The queue is FIFO: a line sent twice would arrive before this one.
            last = "alice: after the restart"
            await alice.wait_for(lambda m: from_bot(m) and m.text == last, WAIT)
            texts = [m.text.removeprefix("alice: ") for m in alice.received if from_bot(m)]
            assert texts == [*ANSWER, "after the restart"]
            await wait_db(db, "SELECT DISTINCT state FROM outbox", [(done,)])
    finally:
        if alice is not None:
            await alice.close()
        await server.stop()


# -- kill -9 with a Slack answer not (fully) delivered ----------------------------------------
@contextlib.asynccontextmanager
async def slack_kill_test(
    tmp_path, *, block: str, replies: str, stdin=None, go=None, streaming: str = "edit"
):
    """Run the bot until ``block`` is called (and rate-limited for 1000 s), kill it,
    restart it; return the fake and the thread's key."""
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        db = str(tmp_path / "bot.db")
        conf = settings(
            bot_token=slack.bot_token, app_token=slack.app_token, api_url=slack.api_url,
            state_file=str(tmp_path / "seen.sqlite3"), streaming=streaming, edit_interval=1000,
        )  # fmt: skip
        slack.rate_limit(block, times=1, retry_after=1000)
        async with bot_process(db, "slack", conf, replies, stdin=stdin) as (proc, redelivered):
            assert redelivered == 0
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> tell me")
            await slack.push_event(event)
            if go is not None:
                await go(slack, proc, db)
            await slack.wait_for_call(block, timeout=WAIT)
            # The turn is complete in the audit log while the delivery hangs.
            await wait_db(
                db,
                "SELECT status FROM message WHERE kind = 'assistant'",
                [("complete",)],
            )
            yield slack, proc, db


async def test_kill_9_before_the_slack_answer_was_posted(tmp_path):
    # The post hangs (rate-limited for 1000 s); the bot dies; the streamed answer's
    # outbox row never got its text: it comes from the audit log after the restart.
    async with slack_kill_test(
        tmp_path, block="chat.postMessage", replies='["the whole answer"]'
    ) as (slack, proc, db):
        await wait_db(db, "SELECT complete, state, ref FROM outbox", [(0, "queued", None)])
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        async with bot_process(db, "slack", restart_conf(slack, tmp_path)) as (_, redelivered):
            assert redelivered == 1
            await wait_db(db, "SELECT complete, state FROM outbox", [(1, "confirmed")])
        posted = [m for m in slack.messages.values() if m.get("user") == slack.bot_user_id]
        assert [m["text"] for m in posted] == ["the whole answer"]
        assert slack.calls_to("chat.update") == []


async def test_kill_9_before_a_short_answer_held_whole_was_posted(tmp_path):
    # Native streaming (the default) holds a short answer and posts it whole at its
    # end: its outbox row had no write of its own (it went in with the turn's end),
    # and is complete before the post, which hangs; the bot dies.  After the restart
    # the answer is posted, once.
    async with slack_kill_test(
        tmp_path, block="chat.postMessage", replies='["a short answer"]', streaming="auto"
    ) as (slack, proc, db):
        await wait_db(db, "SELECT complete, state, text FROM outbox",
                      [(1, "queued", "a short answer")])  # fmt: skip
        assert slack.calls_to("chat.startStream") == []  # held whole: no stream
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        async with bot_process(db, "slack", restart_conf(slack, tmp_path)) as (_, redelivered):
            assert redelivered == 1
            await wait_db(db, "SELECT complete, state FROM outbox", [(1, "confirmed")])
        posted = [m for m in slack.messages.values() if m.get("user") == slack.bot_user_id]
        assert [m["text"] for m in posted] == ["a short answer"]


def restart_conf(slack: FakeSlack, tmp_path) -> str:
    return settings(
        bot_token=slack.bot_token, app_token=slack.app_token, api_url=slack.api_url,
        state_file=str(tmp_path / "seen.sqlite3"), streaming="edit",
    )  # fmt: skip


async def test_kill_9_before_the_final_slack_edit_updates_instead_of_posting_again(tmp_path):
    # The answer's message is posted with its first words; the final edit hangs;
    # the bot dies.  After the restart the message is updated - no second post.
    replies = '[{"chunks": ["first words ", "and the rest of the answer"], "hold_after": 1}]'

    async def go(slack, proc, db):
        post = await slack.wait_for_call("chat.postMessage", timeout=WAIT)
        assert post["text"].strip() == "first words"
        # The post returned: its ts is in the outbox before the answer goes on.
        await wait_db(db, "SELECT state, ref IS NOT NULL FROM outbox", [("sent", 1)])
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()

    whole = "first words and the rest of the answer"
    async with slack_kill_test(
        tmp_path, block="chat.update", replies=replies, stdin=asyncio.subprocess.PIPE, go=go
    ) as (slack, proc, db):
        await wait_db(db, "SELECT complete, state, text FROM outbox", [(1, "sent", whole)])
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        async with bot_process(db, "slack", restart_conf(slack, tmp_path)) as (_, redelivered):
            assert redelivered == 1
            await wait_db(db, "SELECT state FROM outbox", [("confirmed",)])
        assert len(slack.calls_to("chat.postMessage")) == 1
        updates = slack.calls_to("chat.update")
        assert updates[-1]["text"] == whole
        posted = [m for m in slack.messages.values() if m.get("user") == slack.bot_user_id]
        assert [m["text"] for m in posted] == [whole]
