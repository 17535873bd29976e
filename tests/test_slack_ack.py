"""Slack events are acknowledged, and recorded as handled, only once their message is
committed: a worker killed before its commit loses nothing (Slack sends the event
again and it is answered once), and a redelivery of an event whose message did
commit is not answered again.

Real processes all the way: ``agentik run`` on a SQLite file (Socket Mode), or two
``agentik run`` workers on a real PostgreSQL (tests/pgserver.py) serving the Events
API on their own ports as a load balancer spreads it; the Slack fake at the network
boundary (tests/fakeslack.py: the real slack-bolt/slack-sdk stacks talk to it); the
fake OpenAI-compatible server.  The window between an event's arrival and its commit
is held open by the test holding the database's write lock (SQLite's, or a lock on
PostgreSQL's ``message`` table), never by a hook in our code: the worker cannot
commit, and is killed with SIGKILL.

Slack's redeliveries are sent by the test as Slack sends them (the same event and
``event_id``, ``retry_attempt``/``X-Slack-Retry-Num``), at most three, until one is
acknowledged.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from typing import Any

import pytest
from cluster import Worker, last_user, until
from slackcluster import SlackCrew, slack_http_workers

from agentik.core import SQLiteStore
from agentik.core.testing.openai_server import Reply

from fakeslack import FakeSlack
from rigs import bot_texts, slack_bot

pytest_plugins = ["pgserver"]

#: Slack sends an event at most this many times again (at once, after 1 and 5 minutes).
SLACK_RETRIES = 3


def _heard(body: dict[str, Any]) -> Reply:
    return Reply.text(f"heard: {last_user(body)}", chunks=1)


def _asked(openai_server: Any, words: str) -> int:
    """How many model requests were about the message ``words`` (as its last)."""
    return sum(words in last_user(r) for r in openai_server.requests)


async def _acked(slack: FakeSlack, envelope_id: str) -> bool:
    """Whether the bot acknowledged ``envelope_id`` (a bot that does not, sends nothing:
    Slack's next attempt comes a minute later, the deadline here)."""
    try:
        await slack.wait_for_ack(envelope_id, 60.0)
    except TimeoutError:
        return False
    return True


# -- one process on SQLite, Socket Mode ---------------------------------------------------
def _sqlite_config(openai_url: str, slack: FakeSlack) -> str:
    return f"""
[llm]
base_url = "{openai_url}"
model = "fake-model"
api_key = "sk-test"
max_retries = 0
[storage]
path = "bot.db"
[memory]
backend = "none"
[compaction]
enabled = false
[logging]
level = "info"
[transports.slack]
type = "slack"
mode = "socket"
bot_token = "{slack.bot_token}"
app_token = "{slack.app_token}"
api_url = "{slack.api_url}"
streaming = "edit"
"""


@pytest.mark.timeout(400)
async def test_a_process_killed_before_its_commit_answers_slacks_redelivery_once(
    openai_server, tmp_path
):
    """One ``agentik run`` on SQLite.  The test holds the database's write lock; a DM
    arrives and reaches the bridge (the bot asked Slack who wrote it), which cannot
    commit it; the process is killed.  The event was not acknowledged, so Slack sends
    it again: the restarted process answers it, once.  Before, the event was acked
    (and recorded as handled) on arrival, and the message was lost."""
    openai_server.default = _heard
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        bot = Worker(tmp_path / "bot", _sqlite_config(openai_server.base_url, slack), "")
        bot.start()
        try:
            await slack.wait_for_socket(1, 180)
            # Warm up (the database exists, the bot answers), and know U1 is not cached.
            await slack.push_event(slack.message_event("D0", "warm up", channel_type="im"))
            await until(lambda: bot_texts(slack, "D0"), "the warm-up answer")
            before_info = len(slack.calls_to("users.info"))

            db = sqlite3.connect(bot.folder / "bot.db", isolation_level=None)
            try:
                db.execute("BEGIN IMMEDIATE")  # the write lock: nobody else commits
                event = slack.message_event("D1", "keep me", channel_type="im", user="U2")
                slack.add_user("U2", "bob")
                first = await slack.push_event(event, event_id="EvKeep")
                # The message reached the hand-over (the author's name was asked):
                # its commit waits for the lock the test holds.
                await until(
                    lambda: len(slack.calls_to("users.info")) > before_info,
                    "the bot to take the message in",
                )
                bot.kill(signal.SIGKILL)
                await bot.wait()
            finally:
                db.execute("ROLLBACK")
                db.close()
            assert first not in slack.acks, "acknowledged before its message was committed"
            # (its turn may have sent its model request while the message's write waited:
            # nothing of it was shown)
            assert not bot_texts(slack, "D1")
            asked_before = _asked(openai_server, "keep me")

            bot.start()  # the same folder and database
            await slack.wait_for_socket(2, 180)
            for attempt in range(1, SLACK_RETRIES + 1):
                retry = await slack.push_event(
                    event, event_id="EvKeep", retry_num=attempt, retry_reason="timeout"
                )
                if await _acked(slack, retry):
                    break
            else:
                raise AssertionError(f"no redelivery acknowledged:\n{bot.stderr()[-3000:]}")
            await until(lambda: bot_texts(slack, "D1"), "the answer to the redelivered event")
            # A later message answered: anything doubled would have shown by now.
            await slack.push_event(slack.message_event("D1", "and this", channel_type="im"))
            # (Waited for by its whole text: a reply still being streamed is not done.)
            await until(
                lambda: "heard: alice: and this" in bot_texts(slack, "D1"), "the later answer"
            )
            assert bot_texts(slack, "D1") == ["heard: bob: keep me", "heard: alice: and this"]
            assert _asked(openai_server, "keep me") == asked_before + 1
        finally:
            bot.stop()


async def test_a_redelivery_while_the_first_is_still_committing_is_answered_once(tmp_path):
    """One process (in this test's loop), its SQLite file's write lock held by the test:
    a DM arrives and cannot be committed; Slack's retry of it arrives meanwhile (the
    first was not acknowledged).  Once the lock is released the message is committed
    once, the retry (or a later one) is acknowledged, and it is answered once."""
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        store_path = tmp_path / "slack.db"
        async with slack_bot(slack, tmp_path, store=SQLiteStore(str(store_path))) as (
            _bot, model, _agent, _bridge,
        ):  # fmt: skip
            await slack.wait_for_socket(1)
            db = sqlite3.connect(store_path, isolation_level=None)
            try:
                db.execute("BEGIN IMMEDIATE")
                event = slack.message_event("D1", "only once", channel_type="im")
                first = await slack.push_event(event, event_id="EvOnce")
                await until(lambda: slack.calls_to("users.info"), "the bot taking it in")
                retry = await slack.push_event(event, event_id="EvOnce", retry_num=1)
                assert first not in slack.acks and retry not in slack.acks
            finally:
                db.execute("ROLLBACK")
                db.close()
            acked = [e for e in (first, retry) if await _acked(slack, e)]
            for attempt in (2, 3):
                if acked:
                    break
                again = await slack.push_event(event, event_id="EvOnce", retry_num=attempt)
                acked += [again] if await _acked(slack, again) else []
            assert acked, "no delivery of the event was acknowledged"
            await until(lambda: bot_texts(slack, "D1"), "the answer")
            await slack.push_event(slack.message_event("D1", "and this", channel_type="im"))
            # (the whole later answer: its message may be posted before its last words)
            await until(
                lambda: bot_texts(slack, "D1")[1:] == ["echo: and this"], "the later answer"
            )
            assert bot_texts(slack, "D1") == ["echo: only once", "echo: and this"]
            assert [r.messages[-1].content for r in model.requests] == ["only once", "and this"]


# -- two workers on PostgreSQL, HTTP mode --------------------------------------------------
async def _redeliver(crew: SlackCrew, worker: Worker, payload: dict[str, Any]) -> int:
    """Slack's retries of ``payload`` to ``worker`` until one is acknowledged; which."""
    answers = []
    for attempt in range(1, SLACK_RETRIES + 1):
        answers.append(await crew.post(worker, payload, retry=attempt))
        if answers[-1] == 200:
            return attempt
    raise AssertionError(
        f"none of Slack's {SLACK_RETRIES} retries was acknowledged ({answers});"
        f" {worker.folder.name}'s log:\n{worker.stderr()[-5000:]}"
    )


async def _blocked_on_message(conn: Any) -> bool:
    """Whether a session waits for a lock on the ``message`` table (a commit held)."""
    waiting = await conn.fetchval(
        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
        " WHERE c.relname = 'message' AND NOT l.granted"
    )
    return bool(waiting)


@pytest.mark.timeout(400)
async def test_a_worker_killed_before_its_commit_loses_no_event_to_the_other(
    postgres_dsn, openai_server, tmp_path
):
    """Two workers on PostgreSQL.  The test locks the ``message`` table; a DM reaches
    worker A, which claims the event and blocks on its commit (seen in ``pg_locks``):
    Slack gets no acknowledgement (A answers 503 once its wait is up, or nothing), and
    A is killed.  Slack's retries reach worker B: once A's claim has expired B takes
    the event; it is answered once, by B."""
    import asyncpg

    openai_server.default = _heard
    async with slack_http_workers(tmp_path, postgres_dsn, openai_server.base_url) as crew:
        slack, a, b = crew.slack, crew.a, crew.b
        lock = await asyncpg.connect(postgres_dsn)
        try:
            tx = lock.transaction()
            await tx.start()
            await lock.execute("LOCK TABLE message IN EXCLUSIVE MODE")
            event = slack.event_callback(
                slack.message_event("D1", "keep me", channel_type="im"), event_id="EvKeep"
            )
            first = asyncio.create_task(crew.post(a, event))
            await until(lambda: _blocked_on_message(lock), "A's commit waiting for the lock")
            a.kill(signal.SIGKILL)
            await a.wait()
            assert await first != 200, "acknowledged before its message was committed"
            await tx.rollback()
        finally:
            await lock.close()
        assert _asked(openai_server, "keep me") == 0

        await _redeliver(crew, b, event)
        await until(lambda: bot_texts(slack, "D1"), "B's answer to the redelivered event")
        later = slack.event_callback(slack.message_event("D1", "and this", channel_type="im"))
        assert await crew.post(b, later) == 200
        await until(lambda: "heard: alice: and this" in bot_texts(slack, "D1"), "the later answer")
        assert bot_texts(slack, "D1") == ["heard: alice: keep me", "heard: alice: and this"]
        assert _asked(openai_server, "keep me") == 1


@pytest.mark.timeout(400)
async def test_a_redelivery_of_a_committed_event_is_not_answered_again(
    postgres_dsn, openai_server, tmp_path
):
    """A mention reaches worker A, is committed, acknowledged and answered; A is then
    killed (so its claim on the event is still fresh).  Slack's retry of the event and
    the mention's ``message`` twin reach worker B: both are acknowledged at once, and
    nothing is answered twice."""
    openai_server.default = _heard
    async with slack_http_workers(tmp_path, postgres_dsn, openai_server.base_url) as crew:
        slack, a, b = crew.slack, crew.a, crew.b
        mention = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> once please")
        event = slack.event_callback(mention, event_id="EvOnce")
        assert await crew.post(a, event) == 200
        await until(lambda: bot_texts(slack, "C1"), "A's answer")
        a.kill(signal.SIGKILL)
        await a.wait()

        assert await crew.post(b, event, retry=1) == 200
        twin = slack.event_callback(
            dict(mention, type="message", channel_type="channel"), event_id="EvTwin"
        )
        assert await crew.post(b, twin) == 200
        later = slack.event_callback(slack.message_event("D1", "and this", channel_type="im"))
        assert await crew.post(b, later) == 200
        await until(lambda: bot_texts(slack, "D1"), "B's answer to a later message")
        assert bot_texts(slack, "C1") == ["heard: alice: once please"]
        assert _asked(openai_server, "once please") == 1
