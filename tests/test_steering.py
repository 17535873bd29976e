"""Steering a running turn, ``busy`` modes, conversation status and per-request usage
(issue 20): the real openai client against the fake OpenAI-compatible server (so the
request body the model receives is checked), a real SQLite file, a real IRC server,
the real slack-bolt/slack-sdk stack against the fake Slack, and the real HTTP stack."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from agentik.bot.chansettings import ChannelSettings, SettingError, parse_setting
from agentik.core import Agent, OpenAIBackend, SQLiteStore
from agentik.core.events import StatusChanged, event_from_json, event_to_json
from agentik.core.testing.openai_server import FakeOpenAIServer, Reply
from agentik.core.tools.base import FunctionTool
from helpers import collect_turn

from fakeslack import FakeSlack
from httpserver import running_server, sse
from ircservers import IRCTestClient
from rigs import answered, eventually, irc_bot, said_in, slack_bot

pytest_plugins = ["ircservers"]

WAIT = 60


class SlowTool:
    """A tool that blocks until released, so a test acts while it is known to run."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0

    async def lookup(self, query: str = "") -> str:
        self.calls += 1
        self.started.set()
        await self.release.wait()
        return f"found {query}"

    def tool(self) -> FunctionTool:
        return FunctionTool(self.lookup, name="slow", description="a slow lookup")

    async def wait_started(self) -> None:
        await asyncio.wait_for(self.started.wait(), WAIT)


def _llm(server: FakeOpenAIServer) -> OpenAIBackend:
    return OpenAIBackend(
        model="fake-model", base_url=server.base_url, api_key="sk-test", max_retries=0, timeout=60
    )


def _slow_then_answer(server: FakeOpenAIServer, answer: str = "done") -> None:
    server.enqueue(
        Reply.tool_calls([("call_1", "slow", '{"query": "X"}')], usage=(11, 2)),
        Reply.text(answer, usage=(23, 4)),
    )


def _users(body: dict) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m["role"] == "user"]


def _roles(body: dict) -> list[str]:
    return [m["role"] for m in body["messages"] if m["role"] != "system"]


@pytest.fixture
async def rig(openai_server, db_path):
    slow = SlowTool()
    async with Agent(
        llm=_llm(openai_server), store=SQLiteStore(db_path), tools=[slow.tool()]
    ) as agent:
        yield agent, slow


# -- the core -------------------------------------------------------------------------------


async def test_a_correction_sent_while_a_tool_runs_reaches_the_next_request_of_that_turn(
    rig, openai_server
):
    agent, slow = rig
    conv = await agent.create_conversation()
    sub = conv.events()
    _slow_then_answer(openai_server, "Y it is")
    run_id = await conv.send("look up X", author="alice", author_id="net:alice", busy="steer")
    await slow.wait_started()
    during = conv.status()
    assert (during.state, during.run_id, during.tools) == ("executing_tools", run_id, ("slow",))
    assert during.usage.prompt_tokens == 11 and during.requests == 1

    sent = await conv.submit(
        "actually, look up Y", author="alice", author_id="net:alice", busy="steer"
    )
    assert sent.steered and sent.run_id == run_id
    # Recorded when it arrived, linked to the running run, before the tool's result.
    rows = await conv.messages()
    assert [(m.kind, m.run_id) for m in rows] == [
        ("user", run_id), ("tool_call", run_id), ("user", run_id),
    ]  # fmt: skip
    assert rows[-1].content == "actually, look up Y" and rows[-1].data["steered"] is True
    slow.release.set()
    events = await collect_turn(sub, wait=WAIT)

    # One turn, two model requests: the second one carries the correction, after
    # the tool result, so the answer takes it into account.
    assert len(openai_server.requests) == 2
    second = openai_server.requests[1]
    assert _roles(second) == ["user", "assistant", "tool", "user"]
    assert "actually, look up Y" in _users(second)[-1]
    assert "look up Y" not in json.dumps(openai_server.requests[0])
    assert events[-1].kind == "turn_ended" and events[-1].text == "Y it is"
    assert all(e.run_id == run_id for e in events)

    rows = await conv.messages()
    assert [m.kind for m in rows] == ["user", "tool_call", "user", "tool_result", "assistant"]
    assert {m.run_id for m in rows} == {run_id}
    memory = await conv.working_memory()
    assert [m.role for m in memory] == ["user", "assistant", "tool", "user", "assistant"]
    assert memory[3].content == "actually, look up Y"

    # Status transitions, in order, the last idle just before turn_ended.
    states = [e.state for e in events if e.kind == "status_changed"]
    assert states == ["running", "streaming", "executing_tools", "streaming", "idle"]
    changes = [e for e in events if isinstance(e, StatusChanged)]
    assert [c.previous for c in changes] == ["idle", *states[:-1]]
    assert changes[2].tools == ("slow",)
    assert events[-2].kind == "status_changed" and events[-2].state == "idle"
    assert conv.status().state == "idle" and conv.status().run_id is None

    # A usage event per model request; turn_ended keeps the total.
    usage = [e for e in events if e.kind == "usage"]
    assert [(u.usage.prompt_tokens, u.usage.completion_tokens) for u in usage] == [
        (11, 2), (23, 4),
    ]  # fmt: skip
    assert [(u.model, u.backend, u.request) for u in usage] == [
        ("fake-model", "openai", 1), ("fake-model", "openai", 2),
    ]  # fmt: skip
    assert (events[-1].usage.prompt_tokens, events[-1].usage.completion_tokens) == (34, 6)
    # Both new kinds survive the wire format.
    for e in [*changes, *usage]:
        assert event_from_json(event_to_json(e)) == e


async def test_usage_and_status_are_in_the_metrics_profile_not_in_chat(rig, openai_server):
    agent, slow = rig
    conv = await agent.create_conversation()
    chat, metrics = conv.events(profile="chat"), conv.events(profile="metrics")
    openai_server.enqueue(Reply.text("hi", usage=(5, 1)))
    await conv.send("hello")
    chat_kinds = [e.kind for e in await collect_turn(chat, wait=WAIT)]
    metric_kinds = [e.kind for e in await collect_turn(metrics, wait=WAIT)]
    assert "usage" not in chat_kinds and "status_changed" not in chat_kinds
    assert metric_kinds == [
        "turn_started", "status_changed", "status_changed", "usage", "status_changed",
        "turn_ended",
    ]  # fmt: skip


async def test_a_message_sent_while_the_final_answer_streams_becomes_the_next_turn(
    rig, openai_server
):
    agent, slow = rig
    conv = await agent.create_conversation()
    sub = conv.events(kinds={"turn_ended"})
    final = Reply.text("a long answer", chunks=3, hold_after=1)
    openai_server.enqueue(final)
    first = await conv.send("question", busy="steer")
    await final.wait_held()
    # (the request goes out before the message is stored; the turn streams once it is)
    await eventually(lambda: conv.status().state == "streaming", "the answer streaming")
    # Too late to steer: this may be the turn's last request.
    assert await conv.steer("and another thing") is None
    sent = await conv.submit("and another thing", busy="steer")
    assert not sent.steered and sent.run_id != first
    final.release()
    ended = [await asyncio.wait_for(anext(sub), WAIT) for _ in range(2)]
    assert [e.run_id for e in ended] == [first, sent.run_id]
    assert len(openai_server.requests) == 2
    assert _users(openai_server.requests[1])[-1].endswith("and another thing")
    assert "and another thing" not in json.dumps(openai_server.requests[0])
    rows = await conv.messages()
    assert [(m.kind, m.content) for m in rows if m.kind == "user"] == [
        ("user", "question"), ("user", "and another thing"),
    ]  # fmt: skip


async def test_queue_mode_keeps_the_message_for_its_own_turn(rig, openai_server):
    agent, slow = rig
    conv = await agent.create_conversation()
    sub = conv.events(kinds={"turn_ended"})
    _slow_then_answer(openai_server, "X found")
    first = await conv.send("look up X")
    await slow.wait_started()
    sent = await conv.submit("then Z", busy="queue")
    assert not sent.steered and sent.run_id != first
    assert conv.status().queued == 1
    slow.release.set()
    ended = [await asyncio.wait_for(anext(sub), WAIT) for _ in range(2)]
    assert [e.run_id for e in ended] == [first, sent.run_id]
    # The first turn's second request did not see it; the next turn did.
    assert "then Z" not in json.dumps(openai_server.requests[1])
    assert _users(openai_server.requests[2])[-1].endswith("then Z")


async def test_interrupt_mode_stops_the_running_answer_and_answers_the_new_message(
    rig, openai_server
):
    agent, slow = rig
    conv = await agent.create_conversation()
    sub = conv.events(kinds={"turn_ended", "interrupted"})
    held = Reply.text("a very long answer", chunks=4, hold_after=1)
    openai_server.enqueue(held, Reply.text("short answer"))
    first = await conv.send("tell me everything")
    await held.wait_held()
    sent = await conv.submit("no, just the summary", busy="interrupt")
    assert sent.interrupted and not sent.steered and sent.run_id != first
    got = [await asyncio.wait_for(anext(sub), WAIT) for _ in range(3)]
    assert [(e.kind, e.run_id) for e in got] == [
        ("interrupted", first), ("turn_ended", first), ("turn_ended", sent.run_id),
    ]  # fmt: skip
    assert got[1].stop_reason == "interrupted" and got[2].text == "short answer"
    held.release()
    partial = [m for m in await conv.messages() if m.kind == "assistant"]
    assert [(m.run_id, m.status) for m in partial] == [
        (first, "interrupted"), (sent.run_id, "complete"),
    ]  # fmt: skip
    assert _users(openai_server.requests[-1])[-1].endswith("no, just the summary")


async def test_a_correction_the_turn_never_reached_becomes_the_next_turn(rig, openai_server):
    agent, slow = rig
    conv = await agent.create_conversation()
    sub = conv.events(kinds={"turn_ended"})
    _slow_then_answer(openai_server)
    first = await conv.send("look up X", author_id="net:alice")
    await slow.wait_started()
    steered = await conv.steer("also Y", author_id="net:alice")
    assert steered == first
    assert await conv.interrupt() is True  # the turn stops before its next request
    ended = [await asyncio.wait_for(anext(sub), WAIT) for _ in range(2)]
    assert ended[0].run_id == first and ended[0].stop_reason == "interrupted"
    assert ended[1].run_id != first and ended[1].stop_reason == "stop"
    # Answered once, by its own turn, and in working memory once.
    assert _users(openai_server.requests[-1])[-1].endswith("also Y")
    memory = [m.content for m in await conv.working_memory() if m.role == "user"]
    assert memory == ["look up X", "also Y"]


async def test_a_correction_a_shutdown_cut_off_reaches_the_resumed_turn(openai_server, db_path):
    slow = SlowTool()
    async with Agent(
        llm=_llm(openai_server), store=SQLiteStore(db_path), tools=[slow.tool()]
    ) as agent:
        conv = await agent.conversation_for_channel("stdio:steer")
        _slow_then_answer(openai_server)
        run_id = await conv.send("look up X", author_id="t:alice")
        await slow.wait_started()
        assert await conv.steer("actually Y", author_id="t:alice") == run_id
    # The shutdown cut the turn off during its tool call, before the correction
    # reached the working memory.  After a restart the resumed turn takes it.
    # (The fake model still holds the second reply of the cut-off turn: "done".)
    async with Agent(llm=_llm(openai_server), store=SQLiteStore(db_path), tools=[]) as agent:
        pending = await agent.pending_turns()
        assert [(m.content, m.run_id) for m in pending] == [
            ("look up X", run_id), ("actually Y", run_id),
        ]  # fmt: skip
        conv = await agent.conversation_for_channel("stdio:steer")
        ended = conv.events(kinds={"turn_ended"})
        assert conv.resume(pending) == [run_id]
        end = await asyncio.wait_for(anext(ended), WAIT)
        assert (end.run_id, end.text) == (run_id, "done")
        body = openai_server.requests[-1]
        assert _roles(body) == ["user", "assistant", "tool", "user"]
        assert _users(body)[-1].endswith("actually Y")
        assert await agent.pending_turns() == []


async def test_someone_else_with_other_tool_rights_is_queued_not_steered(rig, openai_server):
    agent, slow = rig
    conv = await agent.create_conversation()
    _slow_then_answer(openai_server)
    await conv.send("look up X", author_id="net:alice", allow_tool=lambda name: True)
    await slow.wait_started()
    mine = await conv.submit("and Y please", author_id="net:alice", busy="steer")
    assert mine.steered
    # The tools run with alice's rights: bob's message gets a turn of its own.
    sent = await conv.submit("and Z", author_id="net:bob", busy="steer")
    assert not sent.steered and conv.status().queued == 1
    slow.release.set()
    await asyncio.wait_for(conv.wait_idle(), WAIT)
    assert "and Z" not in json.dumps(openai_server.requests[1])
    assert _users(openai_server.requests[2])[-1].endswith("and Z")


async def test_awaiting_human_while_a_tool_waits_for_a_person(openai_server, db_path):
    answered = asyncio.Event()
    asking = asyncio.Event()
    holder: dict = {}

    async def ask() -> str:
        with holder["conv"].waiting_for_human():
            asking.set()
            await answered.wait()
        return "yes"

    tool = FunctionTool(ask, name="ask", description="ask a person")
    async with Agent(llm=_llm(openai_server), store=SQLiteStore(db_path), tools=[tool]) as agent:
        conv = holder["conv"] = await agent.create_conversation()
        sub = conv.events(kinds={"status_changed", "turn_ended"})
        openai_server.enqueue(Reply.tool_calls([("c1", "ask", "{}")]), Reply.text("ok"))
        await conv.send("go")
        await asyncio.wait_for(asking.wait(), WAIT)
        assert conv.status().state == "awaiting_human"
        answered.set()
        events = await collect_turn(sub, wait=WAIT)
    assert [e.state for e in events if e.kind == "status_changed"] == [
        "running", "streaming", "executing_tools", "awaiting_human", "executing_tools",
        "streaming", "idle",
    ]  # fmt: skip


async def test_awaiting_human_while_an_approval_is_pending(openai_server, db_path):
    from agentik.core.approvals import ApprovalRule

    slow = SlowTool()
    rules = [ApprovalRule(tools=("slow",), approve="always", approvers="user")]
    async with Agent(
        llm=_llm(openai_server), store=SQLiteStore(db_path), tools=[slow.tool()], approvals=rules
    ) as agent:
        conv = await agent.conversation_for_channel("fake:chat:#c")
        sub = conv.events(kinds={"status_changed", "approval_requested", "turn_ended"})
        _slow_then_answer(openai_server)
        await conv.send("go", author="alice", author_id="chat:alice")
        async with asyncio.timeout(WAIT):
            async for e in sub:
                if e.kind == "approval_requested":
                    break
        status = conv.status()
        assert (status.state, status.tools) == ("awaiting_human", ("slow",))
        [pending] = await agent.approvals.pending("fake:chat:#c")
        await agent.approvals.decide(
            pending, "approve", approver="bob", approver_id="chat:bob", role="user"
        )
        await slow.wait_started()
        assert conv.status().state == "executing_tools"
        slow.release.set()
        events = await collect_turn(sub, wait=WAIT)
    assert [e.state for e in events if e.kind == "status_changed"] == [
        "awaiting_human", "executing_tools", "streaming", "idle",
    ]  # fmt: skip


# -- the setting ----------------------------------------------------------------------------


def test_busy_setting_parses_and_rejects_with_the_key_named():
    assert parse_setting("busy", ["Steer"]) == "steer"
    assert parse_setting("busy", ["interrupt"]) == "interrupt"
    with pytest.raises(SettingError, match="busy: 'later' is not one of auto, queue, steer"):
        parse_setting("busy", ["later"])
    assert ChannelSettings(busy="queue").busy == "queue"
    with pytest.raises(ValueError, match="busy"):
        ChannelSettings(busy="later")  # type: ignore[arg-type]


# -- IRC ------------------------------------------------------------------------------------


@asynccontextmanager
async def ops_bot(port, db_path, server, tools, *, channel_settings=None):
    """The bot (:func:`rigs.irc_bot`) on the fake OpenAI server, in #ops; yields its
    bridge and agent."""
    async with irc_bot(
        port, Path(db_path).parent, db=db_path, llm=_llm(server), agent_kw={"tools": tools},
        bridge_kw={"channel_settings": channel_settings}, channels=["#ops"],
        joined_to=["#ops"], wait=WAIT,
    ) as bot:  # fmt: skip
        yield bot.bridge, bot.agent


async def test_irc_direct_message_steers_and_status_says_what_runs(
    miniircd, openai_server, db_path
):
    slow = SlowTool()
    async with ops_bot(miniircd.port, db_path, openai_server, [slow.tool()]) as (bridge, agent):
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        _slow_then_answer(openai_server, "Y found")
        alice.privmsg("agentik", "look up X")
        await slow.wait_started()
        alice.privmsg("agentik", "!status")
        status = await alice.wait_for(said_in("alice", "executing tools (slow)", notices=True))
        assert "model requests" in status.text and "11+2 tokens" in status.text
        # A DM defaults to busy = steer: the correction joins the running turn.
        alice.privmsg("agentik", "actually, look up Y")
        # A channel's messages are taken in order: once !status answers, the
        # correction before it was taken.
        alice.privmsg("agentik", "!status")
        await alice.wait_for(said_in("alice", "executing tools (slow)", notices=True))
        conv = await agent.conversation_for_channel("irc:testnet:alice!*@*")
        assert [m.kind for m in await conv.messages()] == ["user", "tool_call", "user"]
        slow.release.set()
        await alice.wait_for(said_in("alice", "Y found", notices=True))
        assert len(openai_server.requests) == 2
        assert _users(openai_server.requests[1])[-1].endswith("actually, look up Y")
        rows = await conv.messages()
        assert [m.kind for m in rows] == ["user", "tool_call", "user", "tool_result", "assistant"]
        assert len({m.run_id for m in rows}) == 1
        alice.privmsg("agentik", "!status")
        await alice.wait_for(said_in("alice", "· idle", notices=True))
        await alice.close()


async def test_irc_channel_queues_by_default_and_interrupts_when_set(
    miniircd, openai_server, db_path
):
    slow = SlowTool()
    patterns = {"irc:testnet:#ops": ChannelSettings(busy="interrupt")}
    async with ops_bot(miniircd.port, db_path, openai_server, [slow.tool()]) as (bridge, agent):
        bob = await IRCTestClient.connect(miniircd.port, "bob")
        await bob.join("#ops")
        # A shared channel defaults to busy = queue.
        _slow_then_answer(openai_server, "X found")
        bob.privmsg("#ops", "agentik: look up X")
        await slow.wait_started()
        bob.privmsg("#ops", "agentik: then Z")
        bob.privmsg("#ops", "!status")
        await bob.wait_for(said_in("#ops", "executing tools (slow)", "1 queued", notices=True))
        slow.release.set()
        await bob.wait_for(said_in("#ops", "X found", notices=True))
        await bob.wait_for(said_in("#ops", "echo:", "then Z", notices=True))
        assert "then Z" not in json.dumps(openai_server.requests[1])
        await bob.close()

    async with ops_bot(
        miniircd.port, db_path, openai_server, [],
        channel_settings=patterns,
    ) as (bridge, agent):  # fmt: skip
        bob = await IRCTestClient.connect(miniircd.port, "bob")
        await bob.join("#ops")
        held = Reply.text("a very long answer", chunks=4, hold_after=1)
        openai_server.enqueue(held)
        deltas = agent.events(kinds={"text_delta"})
        bob.privmsg("#ops", "agentik: tell me everything")
        await held.wait_held()
        # Mid-answer: its first words reached the turn (its request goes out before
        # the message is stored, its words are read once it is).
        await asyncio.wait_for(anext(deltas), WAIT)
        bob.privmsg("#ops", "agentik: no, the summary")
        await bob.wait_for(said_in("#ops", "(interrupted)", notices=True))
        await bob.wait_for(said_in("#ops", "echo:", "no, the summary", notices=True))
        held.release()
        conv = await agent.conversation_for_channel("irc:testnet:#ops")
        kept = [m for m in await conv.messages() if m.kind == "assistant"]
        assert kept[-2].status == "interrupted" and kept[-1].content.endswith("no, the summary")
        await bob.close()


# -- HTTP -----------------------------------------------------------------------------------


async def test_http_steer_and_the_status_route(openai_server, db_path):
    slow = SlowTool()
    async with (
        running_server(db_path, model=_llm(openai_server), tools=[slow.tool()]) as server,
        server.client() as c,
    ):
        conv = (await c.post("/conversations", json={})).json()
        path = f"/conversations/{conv['id']}"
        idle = (await c.get(path + "/status")).json()
        assert idle == {
            "conversation_id": conv["id"], "state": "idle", "run_id": None, "tools": [],
            "queued": 0, "requests": 0,
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            "todo": None,  # no checklist (the todo tool): docs/asking.md
        }  # fmt: skip
        _slow_then_answer(openai_server, "Y found")
        async with sse(c, path + "/events", params={"profile": "metrics"}) as events:
            first = (await c.post(path + "/messages", json={"content": "look up X"})).json()
            await slow.wait_started()
            status = (await c.get(path + "/status")).json()
            assert status["state"] == "executing_tools" and status["tools"] == ["slow"]
            assert status["run_id"] == first["run_id"] and status["usage"]["prompt_tokens"] == 11
            r = await c.post(
                path + "/messages", json={"content": "actually, look up Y", "busy": "steer"}
            )
            assert r.status_code == 202
            assert r.json()["steered"] is True and r.json()["run_id"] == first["run_id"]
            bad = await c.post(path + "/messages", json={"content": "x", "busy": "later"})
            assert bad.status_code == 422
            slow.release.set()
            seen = await events.until("turn_ended")
        assert [m.data["state"] for m in seen if m.kind == "status_changed"] == [
            "running", "streaming", "executing_tools", "streaming", "idle",
        ]  # fmt: skip
        assert [m.data["usage"]["prompt_tokens"] for m in seen if m.kind == "usage"] == [11, 23]
        assert _users(openai_server.requests[1])[-1].endswith("actually, look up Y")
        assert (await c.get(path + "/status")).json()["state"] == "idle"
        missing = await c.get("/conversations/nope/status")
        assert missing.status_code == 404


# -- Slack ----------------------------------------------------------------------------------


def _thread_texts(slack, channel: str, thread_ts: str) -> list[str]:
    """The bot's messages in one thread, oldest first."""
    return [
        m["text"]
        for (ch, _), m in sorted(slack.messages.items(), key=lambda kv: kv[0][1])
        if ch == channel and m.get("user") == slack.bot_user_id and m.get("thread_ts") == thread_ts
    ]


async def test_slack_thread_reply_steers_the_running_turn_the_channel_top_level_does_not(
    openai_server, tmp_path
):
    slow = SlowTool()
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        slack.add_user("U2", "bob")
        # The status set at once for each message (status_delay = 0), the correction's too.
        async with slack_bot(
            slack, tmp_path, model=_llm(openai_server), tools=[slow.tool()], status_delay=0
        ) as (bot, model, agent, bridge):
            # Only the tool call is queued: the model answers each request in order,
            # so the top-level question below gets the reply queued for it.
            openai_server.enqueue(
                Reply.tool_calls([("call_1", "slow", '{"query": "X"}')], usage=(11, 2))
            )
            mention = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> look up X", user="U1")
            await slack.push_event(mention)
            thread = f"slack:T1:C1:{mention['ts']}"
            await slow.wait_started()
            # A reply in the thread (busy = auto: a thread steers) while the tool runs ...
            await slack.push_event(
                slack.message_event("C1", "actually, look up Y", user="U1", thread_ts=mention["ts"])
            )
            # ... and a question at the channel's top level: a thread of its own.
            openai_server.enqueue(Reply.text("it is noon"))
            top = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> what time is it?",
                                          user="U2")  # fmt: skip
            await slack.push_event(top)
            await answered(slack, bridge, f"slack:T1:C1:{top['ts']}")
            assert _thread_texts(slack, "C1", top["ts"]) == ["it is noon"]
            asked = openai_server.requests[1]
            assert _users(asked)[-1].endswith("what time is it?")
            assert "look up" not in json.dumps(asked)
            # Messages reach the bridge in arrival order: the thread's reply was taken
            # first, into the running turn (recorded with its run, before the result).
            conv = await agent.conversation_for_channel(thread)
            rows = await conv.messages()
            assert [m.kind for m in rows] == ["user", "tool_call", "user"]
            assert rows[-1].data["steered"] is True and len({m.run_id for m in rows}) == 1
            assert conv.status().state == "executing_tools"

            openai_server.enqueue(Reply.text("Y found"))
            slow.release.set()
            await answered(slack, bridge, thread)
            # The turn's next request carries the correction, after the tool result,
            # and nothing of the other thread.
            assert len(openai_server.requests) == 3
            second = openai_server.requests[2]
            assert _roles(second) == ["user", "assistant", "tool", "user"]
            assert _users(second)[-1].endswith("actually, look up Y")
            assert "what time" not in json.dumps(second)
            # One answer, in the thread (after the tool's line); the top-level
            # question got its own, in its own thread.
            assert _thread_texts(slack, "C1", mention["ts"]) == ['_⚙ slow(query="X")_', "Y found"]
            # The "thinking" status the correction set again is cleared by the answer.
            status = [c["status"] for c in slack.calls_to("assistant.threads.setStatus")
                      if c["thread_ts"] == mention["ts"]]  # fmt: skip
            assert status[-1] == "" and status.count("is thinking…") == 2
            rows = await conv.messages()
            assert [m.kind for m in rows] == ["user", "tool_call", "user", "tool_result",
                                              "assistant"]  # fmt: skip
            assert len({m.run_id for m in rows}) == 1
            assert slow.calls == 1
