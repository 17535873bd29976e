"""The Slack transport: the real slack-bolt/slack-sdk stack against a local fake Slack."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import aiohttp
import pytest

from agentik.core import SQLiteStore
from agentik.core.testing.scripted import Reply, ScriptedModel
from agentik.transports.slack.transport import SlackTransport, markdown_to_mrkdwn

from fakeslack import FakeSlack
from rigs import answered, asked_and_answered, bot_texts, eventually, slack_bot


async def test_a_mention_is_answered_in_its_thread_with_native_streaming(tmp_path):
    # An answer longer than stream_buffer is streamed (edit_interval = 0: at once, not
    # held to see whether it is quick); with status_delay = 0 the status is set at
    # once, before the answer, and cleared after it.
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice", display_name="Alice A.")
        async with slack_bot(slack, tmp_path, stream_buffer=8, status_delay=0, edit_interval=0) as (
            bot,
            model,
            agent,
            bridge,
        ):
            model.enqueue(Reply(text="Hello **Alice**, here is the answer.", chunks=None))
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> hi there")
            await slack.push_event(event)
            key = f"slack:T1:C1:{event['ts']}"
            await answered(slack, bridge, key)
            start = await slack.wait_for_call("chat.startStream")
            assert start["thread_ts"] == event["ts"] and start["channel"] == "C1"
            await slack.wait_for_call("chat.stopStream")
            assert bot_texts(slack, "C1") == ["Hello **Alice**, here is the answer."]
            # The model saw the display name, not the user id, and no mention markup.
            assert [(m.author, m.content) for m in model.requests[0].messages] == [
                ("Alice A.", "hi there")
            ]
            status = slack.calls_to("assistant.threads.setStatus")
            assert status[0]["status"] == "is thinking…" and status[-1]["status"] == ""


async def test_web_api_calls_share_a_connection_not_one_each(tmp_path):
    # Each new connection to Slack is a TCP and TLS handshake: answers one after the
    # other reuse the connection their Web API calls came over.
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        # Four calls a mention: the status set at once, the answer streamed, the status cleared.
        async with slack_bot(slack, tmp_path, stream_buffer=4, status_delay=0, edit_interval=0) as (
            bot,
            model,
            agent,
            bridge,
        ):
            for i in range(3):
                event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> q{i}")
                await slack.push_event(event)
                await answered(slack, bridge, f"slack:T1:C1:{event['ts']}")
            assert bot_texts(slack, "C1") == ["echo: q0", "echo: q1", "echo: q2"]
            calls = [m for m, _ in slack.calls if m != "apps.connections.open"]
            assert len(calls) >= 12  # auth.test, users.info; 4 a mention (status, stream, status)
            assert len(slack.api_connections) <= 3, (len(slack.api_connections), calls)


async def test_a_slow_status_call_holds_up_its_own_thread_only(tmp_path):
    # Setting the assistant status is a round trip to Slack: the next mention is
    # answered meanwhile, and nothing is sent in the first thread before its status.
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        slack.rate_limit("assistant.threads.setStatus", times=1, retry_after=10)
        # The status set at once; the answer streamed (longer than stream_buffer).
        async with slack_bot(slack, tmp_path, stream_buffer=4, status_delay=0, edit_interval=0) as (
            bot,
            model,
            agent,
            bridge,
        ):
            first = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> first")
            await slack.push_event(first)
            await slack.wait_for_call("assistant.threads.setStatus")  # answered 429
            second = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> second")
            await slack.push_event(second)
            await answered(slack, bridge, f"slack:T1:C1:{second['ts']}")
            await answered(slack, bridge, f"slack:T1:C1:{first['ts']}")
            assert bot_texts(slack, "C1") == ["echo: second", "echo: first"]
            in_first = [
                (m, p.get("status"))
                for m, p in slack.calls
                if m != "users.info" and first["ts"] in (p.get("thread_ts"), p.get("ts"))
            ]
            assert in_first == [
                ("assistant.threads.setStatus", "is thinking…"),  # 429
                ("assistant.threads.setStatus", "is thinking…"),
                ("chat.startStream", None),
                ("assistant.threads.setStatus", ""),  # (appends and stop name the message)
            ]


def _in_thread(slack: FakeSlack, thread_ts: str) -> list[tuple[str, dict]]:
    """The Web API calls about ``thread_ts`` (stream appends and stops name their
    message: they count when it is in the thread)."""
    ours = {ts for (_, ts), m in slack.messages.items() if m.get("thread_ts") == thread_ts}
    return [
        (m, p)
        for m, p in slack.calls
        if m != "users.info" and (p.get("thread_ts") == thread_ts or p.get("ts") in ours)
    ]


async def test_a_quick_answer_is_one_message_even_a_long_one(tmp_path):
    # An answer complete before its first stream_buffer characters, or within
    # edit_interval of its first ones, is posted whole: one chat.postMessage with the
    # Markdown, no stream, and no status (it showed within status_delay: none was set,
    # so none is cleared).  (edit_interval = 60: however slow the machine, these
    # instant answers are written within it.)
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, status_delay=60, edit_interval=60) as (
            bot,
            model,
            agent,
            bridge,
        ):
            model.enqueue(Reply(text="Hello **Alice**, the answer is `x < 2`.", chunks=None))
            quick = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> quick")
            await slack.push_event(quick)
            await answered(slack, bridge, f"slack:T1:C1:{quick['ts']}")
            calls = _in_thread(slack, quick["ts"])
            assert [m for m, _ in calls] == ["chat.postMessage"]
            assert calls[0][1]["markdown_text"] == "Hello **Alice**, the answer is `x < 2`."
            assert "text" not in calls[0][1] and calls[0][1]["channel"] == "C1"
            words = [f"word{i} " for i in range(100)]  # 690 characters, token by token
            model.enqueue(Reply(chunks=words))
            long = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> long")
            await slack.push_event(long)
            await answered(slack, bridge, f"slack:T1:C1:{long['ts']}")
            calls = _in_thread(slack, long["ts"])
            assert [m for m, _ in calls] == ["chat.postMessage"]
            assert calls[0][1]["markdown_text"] == "".join(words)
            assert [t.strip() for t in bot_texts(slack, "C1")] == [
                "Hello **Alice**, the answer is `x < 2`.",
                "".join(words).strip(),
            ]
            assert slack.calls_to("assistant.threads.setStatus") == []
            assert not [m for m, _ in slack.calls if m.startswith("chat.") and "Stream" in m]


async def test_a_slow_answer_is_streamed_while_it_is_written_in_timed_appends(tmp_path):
    # An answer still being written edit_interval after its first words is streamed
    # natively: what it has so far shows before the model has finished (here the model
    # waits half-way until the test has seen it), and each append carries everything
    # written since the one before, not a call per piece.
    interval = 0.3
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, status_delay=60, edit_interval=interval) as (
            bot,
            model,
            agent,
            bridge,
        ):
            words = [f"word{i} " for i in range(120)]  # 830 characters, token by token
            reply = Reply(chunks=words, hold_after=60)
            model.enqueue(reply)
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> slow")
            began = time.monotonic()
            await slack.push_event(event)
            await reply.held.wait()
            # The first 60 pieces show in one stream while the model still waits.
            first_half = "".join(words[:60]).strip()
            await slack.wait_until(
                lambda: [t.strip() for t in bot_texts(slack, "C1")] == [first_half],
                60,
                "the first half streamed",
            )
            assert slack.calls_to("chat.startStream")
            assert slack.calls_to("chat.stopStream") == []  # still open: not written yet
            reply.release.set()
            await answered(slack, bridge, f"slack:T1:C1:{event['ts']}")
            elapsed = time.monotonic() - began
            assert [t.strip() for t in bot_texts(slack, "C1")] == ["".join(words).strip()]
            methods = [m for m, _ in _in_thread(slack, event["ts"])]
            assert methods[0] == "chat.startStream" and methods[-1] == "chat.stopStream"
            assert set(methods[1:-1]) <= {"chat.appendStream"}
            # At most one start or append per edit_interval (the stop carries the rest):
            # 120 pieces came, far fewer calls went.
            assert len(methods) - 1 <= elapsed / interval + 2, (methods, elapsed)
            assert slack.calls_to("chat.postMessage") == []


async def test_a_slow_answer_shows_the_status_first_and_clears_it_last(tmp_path):
    # Nothing has shown status_delay after the mention: the status is set, and cleared
    # once the answer has been posted.
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, status_delay=0.05) as (bot, model, agent, bridge):
            gate = asyncio.Event()
            model.enqueue(Reply(text="worth the wait", gate=gate))
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> slow")
            await slack.push_event(event)
            await slack.wait_for_call("assistant.threads.setStatus")  # the model still waits
            gate.set()
            await answered(slack, bridge, f"slack:T1:C1:{event['ts']}")
            assert [(m, p.get("status")) for m, p in _in_thread(slack, event["ts"])] == [
                ("assistant.threads.setStatus", "is thinking…"),
                ("chat.postMessage", None),
                ("assistant.threads.setStatus", ""),
            ]
            assert bot_texts(slack, "C1") == ["worth the wait"]


async def test_a_direct_message_is_answered(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path) as (bot, model, agent, bridge):
            event = slack.message_event("D1", "private question", channel_type="im")
            await slack.push_event(event)
            await answered(slack, bridge, "slack:T1:D1")
            assert bot_texts(slack, "D1") == ["echo: private question"]


async def test_two_users_in_one_thread(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        slack.add_user("U2", "bob")
        async with slack_bot(slack, tmp_path) as (bot, model, agent, bridge):
            first = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> start", user="U1")
            await slack.push_event(first)
            key = f"slack:T1:C1:{first['ts']}"
            await answered(slack, bridge, key)
            # A reply in the bot's thread, without a mention, is for the bot too.
            reply = slack.message_event("C1", "and me?", user="U2", thread_ts=first["ts"])
            await slack.push_event(reply)
            await asked_and_answered(model, 2, bridge, key)
            users = [(m.author, m.content) for m in model.requests[-1].messages if m.role == "user"]
            assert users == [("alice", "start"), ("bob", "and me?")]
            # Chatter outside the bot's threads is not answered. Events reach the
            # bridge in arrival order: once a later direct message is answered,
            # the chatter has been seen (and ignored).
            await slack.push_event(slack.message_event("C1", "unrelated", user="U2"))
            await slack.push_event(slack.message_event("C1", "!help", user="U2"))
            await slack.push_event(slack.message_event("D1", "later", channel_type="im"))
            await answered(slack, bridge, "slack:T1:D1")
            assert [r.messages[-1].content for r in model.requests][2:] == ["later"]
            assert bot_texts(slack, "C1") == ["echo: start", "echo: and me?"]


async def test_a_reply_in_the_bots_thread_is_answered_after_a_restart_without_a_mention(
    tmp_path,
):
    """The threads the bot answers in are known by their conversations in the store, not
    only by the process that saw them start: after a restart (or on another worker) a
    reply there, no mention, is still for the bot; a reply in a thread it was never
    in is not."""
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        store_path = tmp_path / "slack.db"
        async with slack_bot(slack, tmp_path, store=SQLiteStore(str(store_path))) as (
            bot,
            model,
            agent,
            bridge,
        ):
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> hello")
            await slack.push_event(event)
            await answered(slack, bridge, f"slack:T1:C1:{event['ts']}")
        model = ScriptedModel()
        async with slack_bot(slack, tmp_path, model=model, store=SQLiteStore(str(store_path))) as (
            bot,
            model,
            agent,
            bridge,
        ):
            other = slack.message_event("C1", "people talking")  # a thread without the bot
            await slack.push_event(slack.message_event("C1", "not for you", thread_ts=other["ts"]))
            await slack.push_event(slack.message_event("C1", "and then?", thread_ts=event["ts"]))
            await eventually(lambda: len(bot_texts(slack, "C1")) == 2, "the reply answered")
            # Handled in order: the reply in the other thread was seen first, and dropped.
            assert [r.messages[-1].content for r in model.requests] == ["and then?"]
            replies = [m for (ch, _), m in slack.messages.items()
                       if ch == "C1" and m.get("user") == slack.bot_user_id]  # fmt: skip
            assert all(m.get("thread_ts") == event["ts"] for m in replies)


async def test_each_message_is_handled_once_even_across_a_restart(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        store_path = tmp_path / "slack.db"
        async with slack_bot(slack, tmp_path, store=SQLiteStore(str(store_path))) as (
            bot,
            model,
            agent,
            bridge,
        ):
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> once please")
            await slack.push_event(event, event_id="Ev1")
            await slack.push_event(event, event_id="Ev1", retry_num=1, retry_reason="timeout")
            # The same message also arrives as a plain message event (another event id).
            twin = dict(event, type="message", channel_type="channel")
            await slack.push_event(twin, event_id="Ev2")
            await answered(slack, bridge, f"slack:T1:C1:{event['ts']}")
            # A later message, answered, proves the duplicates were seen (in order).
            await slack.push_event(slack.message_event("D1", "later", channel_type="im"))
            await answered(slack, bridge, "slack:T1:D1")
            assert [r.messages[-1].content for r in model.requests] == ["once please", "later"]
        # After a restart the same delivery is still recognised.
        model = ScriptedModel()
        async with slack_bot(slack, tmp_path, model=model, store=SQLiteStore(str(store_path))) as (
            bot,
            model,
            agent,
            bridge,
        ):
            envelope = await slack.push_event(event, event_id="Ev1", retry_num=2)
            await slack.wait_for_ack(envelope)
            # (A new place: answered() tells a fresh conversation's first answer.)
            await slack.push_event(slack.message_event("D2", "after", channel_type="im"))
            await answered(slack, bridge, "slack:T1:D2")
            assert [r.messages[-1].content for r in model.requests] == ["after"]


_KILLED_BOT = """
import asyncio, sys, types
sys.path.insert(0, sys.argv[1])
from rigs import slack_bot

async def main(tmp, api_url, bot_token, app_token):
    from pathlib import Path
    slack = types.SimpleNamespace(api_url=api_url, bot_token=bot_token, app_token=app_token)
    async with slack_bot(slack, Path(tmp)):
        print("READY", flush=True)
        await asyncio.Event().wait()

asyncio.run(main(*sys.argv[2:]))
"""


async def test_a_bot_killed_after_answering_does_not_answer_the_redelivery(tmp_path):
    # The handled-events file is written without waiting for the disk (a WAL file
    # with synchronous = NORMAL): a killed process still loses nothing it wrote, so
    # a redelivery after the restart is not answered a second time.  (The write comes
    # within SEEN_FLUSH of the acknowledgement, which nobody holds back for it: the
    # test waits for it to be in the file before the kill.)
    import signal
    import sqlite3
    import sys
    from pathlib import Path

    def recorded() -> bool:
        path = tmp_path / "seen.sqlite3"
        if not path.exists():
            return False
        with contextlib.closing(sqlite3.connect(path)) as db:
            return bool(db.execute("SELECT 1 FROM seen WHERE key = 'event:EvK'").fetchall())

    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _KILLED_BOT, str(Path(__file__).parent), str(tmp_path),
            slack.api_url, slack.bot_token, slack.app_token, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            async with asyncio.timeout(60):
                assert (await proc.stdout.readline()).strip() == b"READY"
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> once please")
            await slack.push_event(event, event_id="EvK")
            await slack.wait_for_call("chat.postMessage")  # answered (short: posted whole)
            await eventually(recorded, "the event in the handled-events file")
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        assert bot_texts(slack, "C1") == ["echo: once please"]
        async with slack_bot(slack, tmp_path) as (bot, model, agent, bridge):
            envelope = await slack.push_event(event, event_id="EvK", retry_num=1)
            await slack.wait_for_ack(envelope)
            await slack.push_event(slack.message_event("D2", "after", channel_type="im"))
            await answered(slack, bridge, "slack:T1:D2")
            assert [r.messages[-1].content for r in model.requests] == ["after"]
        assert bot_texts(slack, "C1") == ["echo: once please"]


async def test_the_handled_events_file_keeps_the_newest_dedupe_keep_events(tmp_path):
    # The file stays near dedupe_keep rows however many events come, and what it keeps
    # still stops a redelivery after a restart.
    import sqlite3

    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        store_path = tmp_path / "slack.db"
        async with slack_bot(
            slack, tmp_path, store=SQLiteStore(str(store_path)), dedupe_keep=100
        ) as (bot, model, agent, bridge):
            for i in range(150):  # channel chatter: remembered (two keys each), not answered
                await slack.push_event(slack.message_event("C1", f"chatter {i}", user="U1"))
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> once please")
            await slack.push_event(event, event_id="Ev1")
            await answered(slack, bridge, f"slack:T1:C1:{event['ts']}")
            seen_path = bot.seen_path
        # (written in batches, the last one as the transport closes)
        with contextlib.closing(sqlite3.connect(seen_path)) as db:
            (rows,) = db.execute("SELECT COUNT(*) FROM seen").fetchone()
        assert 100 <= rows <= 110
        async with slack_bot(
            slack, tmp_path, store=SQLiteStore(str(store_path)), dedupe_keep=100
        ) as (bot, model, agent, bridge):
            await slack.push_event(event, event_id="Ev1", retry_num=1)
            await slack.push_event(slack.message_event("D2", "after", channel_type="im"))
            await answered(slack, bridge, "slack:T1:D2")
            assert [r.messages[-1].content for r in model.requests] == ["after"]


def test_a_burst_of_handled_events_is_remembered_whole_across_a_restart(tmp_path):
    # Many events handed over at once are written by several statements of one
    # transaction (a statement takes at most _SEEN_ROWS keys): all of them, in order,
    # are known to the file's next reader.
    from agentik.transports.slack.transport import _SEEN_ROWS, _Seen

    path = str(tmp_path / "seen.sqlite3")
    keys = [f"event:Ev{i}" for i in range(2 * _SEEN_ROWS + 7)]
    seen = _Seen(path, keep=10_000)
    seen.open()
    try:
        seen.persist("event:first")
        seen.persist(*keys)
    finally:
        seen.close()
    again = _Seen(path, keep=10_000)
    again.open()
    try:
        assert list(again.keys) == ["event:first", *keys]
        assert again.check_and_add(keys[-1])
        assert not again.check_and_add("event:new")
    finally:
        again.close()


async def test_edit_streaming_stays_within_the_edit_rate(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, streaming="edit", edit_interval=0.2) as (
            bot,
            model,
            agent,
            bridge,
        ):
            words = [f"w{i} " for i in range(40)]
            model.enqueue(Reply(chunks=words, delay=0.02))
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> stream it")
            started = time.monotonic()
            await slack.push_event(event)
            await answered(slack, bridge, f"slack:T1:C1:{event['ts']}")
            elapsed = time.monotonic() - started
            assert [t.strip() for t in bot_texts(slack, "C1")] == ["".join(words).strip()]
            updates = slack.calls_to("chat.update")
            assert len(slack.calls_to("chat.postMessage")) == 1
            # Throttled: at most one edit per edit_interval (plus the final one).
            assert 1 <= len(updates) <= elapsed / 0.2 + 2
            assert slack.calls_to("chat.startStream") == []


async def test_auto_streaming_falls_back_to_edits_without_native_support(tmp_path):
    async with FakeSlack() as slack:
        slack.supports_streaming = False
        slack.add_user("U1", "alice")
        # Answers longer than stream_buffer: the first one tries a native stream.
        async with slack_bot(slack, tmp_path, stream_buffer=4, edit_interval=0) as (
            bot,
            model,
            agent,
            bridge,
        ):
            first = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> one")
            await slack.push_event(first)
            await answered(slack, bridge, f"slack:T1:C1:{first['ts']}")
            # The workspace refused the native stream: the answer was posted instead ...
            assert bot_texts(slack, "C1") == ["echo: one"]
            # ... and later answers stream by editing, without trying native again.
            tries = len(slack.calls_to("chat.startStream"))
            assert tries == 1
            model.enqueue(Reply(chunks=[f"x{i} " for i in range(10)], delay=0.02))
            second = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> two")
            await slack.push_event(second)
            await answered(slack, bridge, f"slack:T1:C1:{second['ts']}")
            assert len(slack.calls_to("chat.startStream")) == tries
            assert slack.calls_to("chat.update")


async def test_a_stream_due_by_time_falls_back_to_edits_without_native_support(tmp_path):
    # The stream of a slow answer starts when its hold is over, with no new piece
    # coming (the model waits): where the workspace refuses native streaming, what
    # was written so far is posted then (and edited later), nothing lost.
    async with FakeSlack() as slack:
        slack.supports_streaming = False
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, status_delay=60, edit_interval=0.2) as (
            bot,
            model,
            agent,
            bridge,
        ):
            words = [f"word{i} " for i in range(80)]  # 550 characters
            reply = Reply(chunks=words, hold_after=50)
            model.enqueue(reply)
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> slow")
            await slack.push_event(event)
            await reply.held.wait()
            first_part = "".join(words[:50]).strip()
            await slack.wait_until(
                lambda: [t.strip() for t in bot_texts(slack, "C1")] == [first_part],
                60,
                "the first part posted",
            )
            assert len(slack.calls_to("chat.startStream")) == 1  # tried, refused
            reply.release.set()
            await answered(slack, bridge, f"slack:T1:C1:{event['ts']}")
            assert [t.strip() for t in bot_texts(slack, "C1")] == ["".join(words).strip()]
            assert len(slack.calls_to("chat.postMessage")) == 1
            assert slack.calls_to("chat.update")


async def test_rate_limited_calls_are_retried_not_dropped_or_doubled(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, streaming="edit") as (bot, model, agent, bridge):
            slack.rate_limit("chat.postMessage", times=1, retry_after=1)
            event = slack.message_event("D1", "hello", channel_type="im")
            await slack.push_event(event)
            await answered(slack, bridge, "slack:T1:D1")
            assert bot_texts(slack, "D1") == ["echo: hello"]
            assert len(slack.calls_to("chat.postMessage")) == 2  # the 429, then the retry


async def test_socket_dropped_mid_answer_reconnects_and_delivers(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, streaming="edit") as (bot, model, agent, bridge):
            gate = asyncio.Event()
            held = Reply(text="answer after the drop", gate=gate)
            model.enqueue(held)
            await slack.push_event(slack.message_event("D1", "first", channel_type="im"))
            await held.started.wait()
            await slack.drop_socket(abort=False)
            await slack.wait_for_socket(2)
            gate.set()
            await bridge.flush("slack:T1:D1")
            await slack.push_event(slack.message_event("D1", "second", channel_type="im"))
            await eventually(lambda: len(bot_texts(slack, "D1")) >= 2, "two answers in D1")
            await bridge.flush("slack:T1:D1")
            assert bot_texts(slack, "D1") == ["answer after the drop", "echo: second"]


async def test_stop_command_and_stop_reaction(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, streaming="edit") as (bot, model, agent, bridge):
            first = slack.message_event("D1", "talk", channel_type="im")
            # Held mid-answer until stopped: the stop always finds it running.
            slow = Reply(text="word " * 200, hold_after=5)
            model.enqueue(slow)
            await slack.push_event(first)
            await slow.held.wait()
            await slack.wait_for_call(
                "chat.postMessage", lambda p: p.get("text", "").startswith("word")
            )
            await slack.push_event(slack.message_event("D1", "!stop", channel_type="im"))
            await bridge.flush("slack:T1:D1")
            assert "_(interrupted)_" in bot_texts(slack, "D1")
            # The same with the stop reaction on the bot's message.
            slow2 = Reply(text="more " * 200, hold_after=5)
            model.enqueue(slow2)
            await slack.push_event(slack.message_event("D1", "again", channel_type="im"))
            await slow2.held.wait()
            # The answer being written (not the earlier "(interrupted)" line) gets the reaction.
            await slack.wait_for_call(
                "chat.postMessage", lambda p: p.get("text", "").startswith("more")
            )
            bot_ts = max(ts for (ch, ts), m in slack.messages.items()
                         if ch == "D1" and m.get("user") == slack.bot_user_id
                         and m["text"].startswith("more"))  # fmt: skip
            reaction = {
                "type": "reaction_added", "user": "U1", "reaction": "octagonal_sign",
                "item": {"type": "message", "channel": "D1", "ts": bot_ts},
                "item_user": slack.bot_user_id, "event_ts": slack.new_ts(),
            }  # fmt: skip
            await slack.push_event(reaction)
            await bridge.flush("slack:T1:D1")
            assert bot_texts(slack, "D1").count("_(interrupted)_") == 2


async def test_http_mode_verifies_signatures(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(
            slack, tmp_path, mode="http", signing_secret=slack.signing_secret, http_port=0
        ) as (bot, model, agent, bridge):
            url = f"http://127.0.0.1:{bot.http_port}/slack/events"
            event = slack.message_event("D1", "over http", channel_type="im")
            body = json.dumps(slack.event_callback(event)).encode()
            async with aiohttp.ClientSession() as http:
                bad = {**slack.sign(body), "X-Slack-Signature": "v0=" + "0" * 64}
                async with http.post(url, data=body, headers=bad) as resp:
                    assert resp.status == 401
                assert model.requests == []
                headers = {**slack.sign(body), "Content-Type": "application/json"}
                async with http.post(url, data=body, headers=headers) as resp:
                    assert resp.status == 200
            await answered(slack, bridge, "slack:T1:D1")
            assert bot_texts(slack, "D1") == ["echo: over http"]


def test_markdown_becomes_mrkdwn():
    assert markdown_to_mrkdwn("**bold** *it* [docs](https://x.y/z)") == (
        "*bold* _it_ <https://x.y/z|docs>"
    )
    assert markdown_to_mrkdwn("# Title\n```py\nkeep **this**\n```") == (
        "*Title*\n```\nkeep **this**\n```"
    )


async def test_one_conversation_per_channel_when_configured(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, conversation_per="channel", streaming="edit") as (
            bot,
            model,
            agent,
            bridge,
        ):
            for n, text in enumerate(("first", "second"), start=1):
                await slack.push_event(
                    slack.app_mention_event("C9", f"<@{slack.bot_user_id}> {text}")
                )
                await eventually(lambda n=n: len(model.requests) >= n, f"model request {n}")
                await answered(slack, bridge, "slack:T1:C9")
            users = [m.content for m in model.requests[-1].messages if m.role == "user"]
            assert users == ["first", "second"]


def test_settings_name_the_missing_token():
    import pytest

    from agentik.core import ConfigError

    with pytest.raises(ConfigError, match=r"transports\.s\b.*app_token"):
        SlackTransport(name="s", settings={"bot_token": "xoxb-1"})
    with pytest.raises(ConfigError, match="signing_secret"):
        SlackTransport(name="s", settings={"bot_token": "xoxb-1", "mode": "http"})


async def test_a_long_streamed_answer_continues_in_new_messages_at_word_breaks(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(
            slack, tmp_path, max_message_chars=200, stream_buffer=16, edit_interval=0
        ) as (
            bot,
            model,
            agent,
            bridge,
        ):
            words = [f"wörd{i}" for i in range(120)]
            # Tokens cut words in half, as models do.
            text = " ".join(words)
            model.enqueue(Reply(chunks=[text[i : i + 7] for i in range(0, len(text), 7)]))
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> long please")
            await slack.push_event(event)
            await answered(slack, bridge, f"slack:T1:C1:{event['ts']}")
            texts = bot_texts(slack, "C1")
            assert len(texts) >= 4 and all(len(t) <= 200 for t in texts)
            assert " ".join(texts).split() == words  # no word cut in two
            assert len(slack.calls_to("chat.startStream")) == len(texts)  # all streamed natively


# ----------------------------------------------------------------- issue 18


@pytest.mark.parametrize(
    "missing", [("thread_ts",), ("channel_id",), ("thread_ts", "user_id", "context")]
)
async def test_an_assistant_event_without_its_thread_is_dropped_with_a_warning(
    tmp_path, caplog, missing
):
    """Slack always names the thread of an ``assistant_thread_*`` event; one that does
    not (hostile or broken input) is acknowledged and dropped with our warning, never an
    error from bolt's assistant helpers, and the bot goes on answering."""
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, assistant_greeting="Hello") as (_, _, _, bridge):
            caplog.set_level(logging.WARNING)
            for make in (
                slack.assistant_thread_started_event,
                lambda ch: slack.assistant_thread_context_changed_event(ch, "1.2", {}),
            ):
                event = make("D1")
                for key in missing:
                    del event["assistant_thread"][key]
                await slack.wait_for_ack(await slack.push_event(event))
            await slack.push_event(slack.message_event("D2", "still there?", channel_type="im"))
            await answered(slack, bridge, "slack:T1:D2")
            assert bot_texts(slack, "D2")
            assert slack.calls_to("chat.postMessage") == [] or all(
                c["channel"] == "D2" for c in slack.calls_to("chat.postMessage")
            )  # no greeting went anywhere
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
            dropped = [
                r.getMessage() for r in caplog.records if "dropped an assistant" in r.getMessage()
            ]
            assert len(dropped) == 2, dropped


async def test_assistant_thread_gets_a_greeting_prompts_and_a_title(tmp_path):
    prompts = ["What can you do?", {"title": "Summarize", "message": "Summarize this channel"}]
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(
            slack, tmp_path, streaming="edit", assistant_greeting="Hello, I am **here**.",
            assistant_prompts=prompts,
        ) as (bot, model, agent, bridge):  # fmt: skip
            started = slack.assistant_thread_started_event(
                "D1", context={"channel_id": "C7", "team_id": "T1", "enterprise_id": None}
            )
            thread_ts = started["assistant_thread"]["thread_ts"]
            envelope = await slack.push_event(started)
            await slack.wait_for_ack(envelope)
            offered = await slack.wait_for_call("assistant.threads.setSuggestedPrompts")
            assert offered["channel_id"] == "D1" and offered["thread_ts"] == thread_ts
            assert offered["prompts"] == [
                {"title": "What can you do?", "message": "What can you do?"},
                {"title": "Summarize", "message": "Summarize this channel"},
            ]
            greeting = await slack.wait_for_call("chat.postMessage")
            assert greeting["channel"] == "D1" and greeting["thread_ts"] == thread_ts
            assert greeting["text"] == "Hello, I am *here*."
            # The user switches channels: the context is kept, no message is rewritten.
            changed = slack.assistant_thread_context_changed_event(
                "D1", thread_ts, {"channel_id": "C8", "team_id": "T1"}
            )
            await slack.wait_for_ack(await slack.push_event(changed))
            assert slack.calls_to("chat.update") == []
            # The first message names the thread and is answered in it.
            first = slack.message_event(
                "D1", "How do I deploy the staging cluster?\nDetails follow.", thread_ts=thread_ts
            )
            await slack.push_event(first)
            title = await slack.wait_for_call("assistant.threads.setTitle")
            assert title == {
                "channel_id": "D1", "thread_ts": thread_ts,
                "title": "How do I deploy the staging cluster?",
            }  # fmt: skip
            await answered(slack, bridge, f"slack:T1:D1:{thread_ts}")
            assert bot_texts(slack, "D1")[-1].startswith("echo: How do I deploy")
            # Only the first message names it.
            await slack.push_event(slack.message_event("D1", "and prod?", thread_ts=thread_ts))
            await asked_and_answered(model, 2, bridge, f"slack:T1:D1:{thread_ts}")
            assert len(slack.calls_to("assistant.threads.setTitle")) == 1


async def test_assistant_thread_without_greeting_or_prompts_stays_quiet(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, assistant_greeting="") as (bot, model, a, bridge):
            started = slack.assistant_thread_started_event("D1")
            await slack.wait_for_ack(await slack.push_event(started))
            # A later message, answered, shows the event was handled (in order).
            await slack.push_event(slack.message_event("D2", "hi", channel_type="im"))
            await answered(slack, bridge, "slack:T1:D2")
            assert slack.calls_to("assistant.threads.setSuggestedPrompts") == []
            assert [p["channel"] for p in slack.calls_to("chat.postMessage")] == ["D2"]


async def test_file_share_and_thread_broadcast_are_answered_other_subtypes_not(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, streaming="edit") as (bot, model, agent, bridge):
            shared = slack.message_event(
                "D1", "what is in this file?", channel_type="im", subtype="file_share"
            )
            await slack.push_event(shared)
            await answered(slack, bridge, "slack:T1:D1")
            # The file came along (fetched from the fake, given to the model as its text).
            shared_text = "what is in this file?\n[file: notes.txt, 12 bytes]\nhello world\n"
            assert bot_texts(slack, "D1") == ["echo: " + shared_text]
            # A thread the bot takes part in; a reply "also sent to the channel".
            first = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> start")
            await slack.push_event(first)
            key = f"slack:T1:C1:{first['ts']}"
            await answered(slack, bridge, key)
            broadcast = slack.message_event(
                "C1", "for everyone", thread_ts=first["ts"], subtype="thread_broadcast"
            )
            await slack.push_event(broadcast)
            await asked_and_answered(model, 3, bridge, key)
            assert bot_texts(slack, "C1") == ["echo: start", "echo: for everyone"]
            # Not people's messages: ignored.  Our own message (as Slack echoes it) too.
            ours = slack.message_event("D1", "echo: loop?", user=slack.bot_user_id)
            ours["bot_id"] = slack.bot_id
            edited = slack.message_event("D1", "", subtype="message_changed")
            edited["message"] = {"type": "message", "user": "U1", "text": "changed", "ts": "1.0"}
            others = [
                ours,
                edited,
                slack.message_event("D1", "<@U1> has joined", subtype="channel_join"),
                slack.message_event("D1", "from a bot", subtype="bot_message"),
                # no words and no file (its files gone): nothing to answer
                slack.message_event("D1", "", subtype="file_share", files=[]),
            ]
            for event in others:
                await slack.push_event(event)
            await slack.push_event(slack.message_event("D2", "later", channel_type="im"))
            await answered(slack, bridge, "slack:T1:D2")
            asked = [r.messages[-1].content for r in model.requests]
            assert asked == [shared_text, "start", "for everyone", "later"]


async def test_state_file_defaults_next_to_the_database(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        store = SQLiteStore(str(data / "agentik.db"))
        async with slack_bot(slack, tmp_path, store=store, state_file=None) as (bot, *_):
            assert bot.seen_path == str(data / "slack-slack-seen.sqlite3")
        assert (data / "slack-slack-seen.sqlite3").exists()
        assert list(elsewhere.iterdir()) == []
        # With the database in memory, so are the handled events: no file anywhere.
        memory = SQLiteStore(":memory:")
        async with slack_bot(slack, tmp_path, store=memory, state_file=None) as (bot, *_):
            assert bot.seen_path == ":memory:"
        assert list(elsewhere.iterdir()) == []


def test_a_relative_state_file_is_relative_to_the_configuration_file(tmp_path, monkeypatch):
    from agentik.bot.app import load_registry, make_transport
    from agentik.bot.config import load_config

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "agentik.toml").write_text(
        '[transports.team]\ntype = "slack"\nbot_token = "xoxb-1"\napp_token = "xapp-1"\n'
        'state_file = "state/seen.sqlite3"\n'
    )
    monkeypatch.chdir(tmp_path)
    config = load_config(conf / "agentik.toml")
    transport = make_transport(
        load_registry(config), "team", config.transports["team"], config.source
    )
    assert transport.options.state_file == str(conf / "state" / "seen.sqlite3")


async def test_no_unused_token_warning_and_connection_logs(tmp_path, monkeypatch, caplog):
    async with FakeSlack() as slack:
        # Exported as the README says.
        monkeypatch.setenv("SLACK_BOT_TOKEN", slack.bot_token)
        slack.add_user("U1", "alice")
        caplog.set_level(logging.INFO)
        async with slack_bot(slack, tmp_path) as (bot, model, agent, bridge):
            assert not [r for r in caplog.records if "unused" in r.getMessage()]
            assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
            started = [r for r in caplog.records if "connected to team" in r.getMessage()]
            assert [r.levelno for r in started] == [logging.INFO]
            assert "Fake Team (T1) as @bot (UBOT), Socket Mode" in started[0].getMessage()
            # A lost connection and its recovery are logged at the same level.
            await slack.drop_socket(abort=False)
            await slack.wait_for_socket(2)

            def records(text: str) -> list[logging.LogRecord]:
                return [r for r in caplog.records if text in r.getMessage()]

            await eventually(lambda: records("Socket Mode reconnected"), "the reconnection")
            (lost,) = records("connection lost")
            (back,) = records("Socket Mode reconnected")
            assert lost.levelno == back.levelno == logging.INFO
            # The reconnected bot still answers.
            await slack.push_event(slack.message_event("D1", "still there?", channel_type="im"))
            await answered(slack, bridge, "slack:T1:D1")


async def test_http_mode_logs_where_it_listens(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    async with FakeSlack() as slack:
        async with slack_bot(
            slack, tmp_path, mode="http", signing_secret=slack.signing_secret, http_port=0
        ) as (bot, *_):
            (line,) = [
                r.getMessage() for r in caplog.records if "connected to team" in r.getMessage()
            ]
            assert line.endswith(
                f"HTTP mode: Events API at http://127.0.0.1:{bot.http_port}/slack/events"
            )


async def test_the_model_reads_what_was_typed_not_slacks_entities_and_link_markup(tmp_path):
    """Slack sends ``a < b && c`` as ``a &lt; b &amp;&amp; c`` and links, channels and
    broadcasts as ``<…>`` markup.  Before, the model got the entities: it read
    garbled code, and what it quoted back was escaped again, so people saw ``&lt;``."""
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path) as (bot, model, agent, bridge):
            code = "if (a < b && c > d) { x = &y; }"
            text = (
                slack.typed(code) + " see <https://example.com/guide|the guide>,"
                " <http://x.org|x.org>, <#C9|general> and <!here>"
            )
            await slack.push_event(slack.message_event("D1", text, channel_type="im"))
            await answered(slack, bridge, "slack:T1:D1")
            seen = "if (a < b && c > d) { x = &y; } see [the guide](https://example.com/guide),"
            seen += " x.org, #general and @here"
            assert [m.content for m in model.requests[0].messages] == [seen]
            # The echo shows what was typed: each character escaped exactly once.
            assert bot_texts(slack, "D1")[0].startswith(
                "echo: if (a &lt; b &amp;&amp; c &gt; d) { x = &amp;y; }"
            )


async def test_the_stop_reaction_has_the_rights_of_stop_not_more(tmp_path):
    """``!stop`` on someone else's answer needs the ``stop-others`` right; the stop
    reaction interrupted any answer for anyone in the channel (ignored users too)."""
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        slack.add_user("U2", "bob")
        async with slack_bot(slack, tmp_path, streaming="edit") as (bot, model, agent, bridge):
            slow = Reply(text="word " * 200, hold_after=5)
            model.enqueue(slow)
            mention = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> talk", user="U1")
            await slack.push_event(mention)
            await slow.held.wait()
            posted = await slack.wait_for_call(
                "chat.postMessage", lambda p: p.get("text", "").startswith("word")
            )
            answer_ts = next(
                ts for (ch, ts), m in slack.messages.items()
                if ch == "C1" and m.get("user") == slack.bot_user_id and m["text"] == posted["text"]
            )  # fmt: skip

            def reaction(user: str) -> dict:
                return {
                    "type": "reaction_added", "user": user, "reaction": "octagonal_sign",
                    "item": {"type": "message", "channel": "C1", "ts": answer_ts},
                    "item_user": slack.bot_user_id, "event_ts": slack.new_ts(),
                }  # fmt: skip

            await slack.push_event(reaction("U2"))  # bob did not ask
            refused = await slack.wait_for_call(
                "chat.postMessage", lambda p: "only the asker" in (p.get("text") or "")
            )
            assert refused["thread_ts"] == mention["ts"]
            assert bridge.busy(f"slack:T1:C1:{mention['ts']}")  # still answering
            await slack.push_event(reaction("U1"))  # alice did
            await bridge.flush(f"slack:T1:C1:{mention['ts']}")
            assert "_(interrupted)_" in bot_texts(slack, "C1")


async def test_a_standby_app_asks_its_team_once_for_all_waiting_and_not_again_at_once_on_failure(
    tmp_path,
):
    """``identify`` (a worker holding the app in standby, and each linked copy waiting
    for it): callers at the same time share one ``auth.test``; after a refused one,
    the next caller is told at once, without asking Slack again."""
    from agentik.transports.base import TransportFailed

    from rigs import slack_transport

    async with FakeSlack(team_id="T7") as slack:
        transport = slack_transport(slack, tmp_path)
        slack.hold("auth.test")
        callers = [asyncio.ensure_future(transport.identify()) for _ in range(3)]
        await slack.wait_until(lambda: slack.held, 10, "the held auth.test")
        assert not transport.owns("slack:T7:C1")
        slack.release()
        await asyncio.gather(*callers)
        assert transport.owns("slack:T7:C1") and not transport.owns("slack:T1:C1")
        assert len(slack.calls_to("auth.test")) == 1
        await transport.identify()  # known: Slack is not asked again
        assert len(slack.calls_to("auth.test")) == 1

        refused = slack_transport(slack, tmp_path / "refused", bot_token="xoxb-revoked")
        with pytest.raises(TransportFailed, match="bot token"):
            await refused.identify()
        assert len(slack.calls_to("auth.test")) == 2
        with pytest.raises(ConnectionError, match="just now"):
            await refused.identify()
        assert len(slack.calls_to("auth.test")) == 2  # not asked again at once
        assert not refused.owns("slack:T7:C1")
        await refused.aclose()
        await transport.aclose()
