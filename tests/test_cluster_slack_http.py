"""Slack's HTTP mode on two workers: its turns go through the shared turn queue.

Real processes all the way (as tests/test_cluster_events.py): two ``agentik run``
workers on a real PostgreSQL (tests/pgserver.py), each serving the Events API on its
own port as a load balancer would spread it, the Slack fake at the network boundary
(Web API calls; events POSTed to the workers signed with the app's signing secret, as
Slack signs them), and the fake OpenAI-compatible server.  What a Slack user would
notice:

* a reply in a thread (no mention) that reaches worker B while worker A answers in
  that thread is answered once, in the thread, after A's answer and knowing it;
* Slack's retry of an event (``X-Slack-Retry-Num``) reaching the other worker starts
  no second turn;
* a DM steered through B while A's turn waits for a tool joins A's turn: one answer.

Every wait is on something observable (a Slack call, a log line) with a generous
deadline: a loaded machine starts processes slowly.
"""

from __future__ import annotations

import json
import re
import signal
from typing import Any

import pytest
from cluster import until
from slackcluster import slack_http_workers

from agentik.core.testing.openai_server import Reply

pytest_plugins = ["pgserver"]

#: ``todo`` calls wait for an approval, which their asker may give.
APPROVALS = """[[approvals]]
tools = ["todo"]
approvers = "user"
self_approve = true
"""


def _users(body: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in body["messages"] if m["role"] == "user"]


@pytest.mark.timeout(400)
async def test_a_thread_reply_through_the_other_worker_is_answered_once_in_its_thread(
    postgres_dsn, openai_server, tmp_path
):
    """A mention reaches worker A, which answers in the thread it starts (slowly); a
    reply in that thread, no mention, reaches worker B meanwhile: it is queued, run by A
    after its first answer (the model sees that answer), posted once in the thread.
    Slack's retry of that reply's event, to A this time, starts no other turn."""
    words = [f"w{i}" for i in range(30)]

    def model(body: dict[str, Any]) -> Reply:
        if "and then" in _users(body)[-1]:
            return Reply.text("the end", chunks=1)
        if "last one" in _users(body)[-1]:
            return Reply.text("bye", chunks=1)
        return Reply.text(" ".join(words), chunks=30, delay=0.1)

    openai_server.default = model
    async with slack_http_workers(
        tmp_path, postgres_dsn, openai_server.base_url, stop=signal.SIGTERM
    ) as rig:
        slack = rig.slack
        mention = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> count to 30")
        root = mention["ts"]
        assert await rig.post(rig.a, slack.event_callback(mention)) == 200
        await until(
            lambda: any(t.startswith("w0") for t in rig.thread("C1", root)),
            "A's answer under way in the thread",
        )
        reply = slack.message_event("C1", "and then?", thread_ts=root)
        callback = slack.event_callback(reply)
        assert await rig.post(rig.b, callback) == 200
        await until(
            lambda: "the end" in rig.thread("C1", root),
            lambda: f"the reply answered in the thread: {rig.thread('C1', root)}",
        )
        # Slack retries an event it thinks went unanswered (to any worker): the
        # retry is acknowledged and answered by nobody.
        assert await rig.post(rig.a, callback, retry=1) == 200
        # A later message through A: once it is answered, A had taken the retry.
        last = slack.message_event("C1", "last one", thread_ts=root)
        assert await rig.post(rig.a, slack.event_callback(last)) == 200
        await until(lambda: "bye" in rig.thread("C1", root), "the last message answered")

        texts = rig.thread("C1", root)
        assert texts.count("the end") == 1, texts
        first = next(t for t in texts if t.startswith("w0"))
        assert "w29" in first  # A's first answer went to its end, not cut
        assert texts.index("the end") > texts.index(first)
        asked = [_users(r)[-1] for r in openai_server.requests]
        assert [a.split()[-1] for a in asked] == ["30", "then?", "one"], asked
        # The reply's turn ran after the first answer, knowing it.
        second = openai_server.requests[1]["messages"]
        assert any(m["role"] == "assistant" and "w29" in str(m["content"]) for m in second)
        # Nothing of it outside the thread.
        assert all(m.get("thread_ts") == root for (ch, _), m in slack.messages.items()
                   if ch == "C1" and m.get("user") == slack.bot_user_id)  # fmt: skip


@pytest.mark.timeout(400)
async def test_a_dm_steered_through_the_other_worker_joins_the_turn_running_there(
    postgres_dsn, openai_server, tmp_path
):
    """A DM (``busy`` ``auto``: steer) through B while A's turn waits on an approval of
    its tool call: the message joins A's turn at its next model request — one answer,
    no turn of its own — as on one process; the approval is given through B too."""
    items = {"items": [{"text": "buy bread", "status": "pending"}]}
    openai_server.enqueue(
        Reply.tool_calls([("call-1", "todo", json.dumps(items))]),
        Reply.text("bread and milk then", chunks=3),
    )
    tools = "[tools]\ntodo = true\n"
    async with slack_http_workers(
        tmp_path, postgres_dsn, openai_server.base_url, extra=tools + APPROVALS,
        stop=signal.SIGTERM,
    ) as rig:  # fmt: skip
        slack = rig.slack
        ask = slack.message_event("D1", "make a list", channel_type="im")
        assert await rig.post(rig.a, slack.event_callback(ask)) == 200

        def approval() -> str | None:
            for t in rig.texts("D1"):
                found = re.search(r"approve (\w+)", t)
                if found:
                    return found.group(1)
            return None

        approval_id = await until(approval, lambda: f"the approval asked: {rig.texts('D1')}")
        steer = slack.message_event("D1", "also add milk", channel_type="im")
        assert await rig.post(rig.b, slack.event_callback(steer)) == 200
        await until(
            lambda: "steers run" in rig.a.stderr(),
            lambda: f"A taking the message in; A's log: {rig.a.stderr()[-3000:]}",
        )
        approve = slack.message_event("D1", f"!approve {approval_id}", channel_type="im")
        assert await rig.post(rig.b, slack.event_callback(approve)) == 200
        await until(
            lambda: "bread and milk then" in rig.texts("D1"),
            lambda: f"the answer: {rig.texts('D1')}",
        )
        last = openai_server.requests[-1]["messages"]
        assert [m["role"] for m in last][-2:] == ["tool", "user"]
        assert "also add milk" in str(last[-1]["content"])
        assert len(openai_server.requests) == 2  # no turn of its own
        assert rig.texts("D1").count("bread and milk then") == 1
