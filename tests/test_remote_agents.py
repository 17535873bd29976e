"""A remote agent as a tool: ``[agents.<name>] url = "…"`` across two ``agentik run``.

The parent bot uses two agents that behave alike: ``near`` runs in its own
process (a model profile of its own), ``far`` is the agent of a second
``agentik run`` reached over its HTTP API. Both answer through the same fake
OpenAI-compatible server (``child_llm``), the parent through another
(``parent_llm``). The parent is driven over its own HTTP API with the remote
client, so what is checked is what an SSE client of the parent sees.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from remotebots import TOKEN, RunningBot, bot_config, running_bot, start_bot

from agentik.bot.config import load_config
from agentik.core import Agent, SQLiteStore
from agentik.core.agents import AgentSpec
from agentik.core.client import RemoteAgent
from agentik.core.errors import ConfigError
from agentik.core.testing.openai_server import FakeOpenAIServer, Reply
from agentik.core.testing.scripted import Reply as ScriptedReply
from agentik.core.testing.scripted import ScriptedModel, call

WAIT = 60.0
#: Small usage on every scripted reply: the parent's tree budget is 100 tokens.
SMALL = (2, 1)


@pytest.fixture(scope="module")
def parent_llm() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer.in_thread() as server:
        yield server


@pytest.fixture(scope="module")
def child_llm() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer.in_thread() as server:
        yield server


@pytest.fixture(scope="module")
def child_bot(child_llm, tmp_path_factory) -> Iterator[RunningBot]:
    folder = tmp_path_factory.mktemp("child")
    with running_bot(bot_config(folder, child_llm.base_url, name="far")) as bot:
        yield bot


@pytest.fixture(scope="module")
def parent_bot(parent_llm, child_llm, child_bot, tmp_path_factory) -> Iterator[RunningBot]:
    folder = tmp_path_factory.mktemp("parent")
    extra = f"""
[agent]
name = "parent"
uses = ["near", "far"]
[llm.profiles.child]
base_url = "{child_llm.base_url}"
model = "fake-model"
[runs]
tree_token_budget = 100
[agents.near]
description = "Answers questions, here."
model = "child"
tools = ["memory_list"]
[agents.far]
description = "Answers questions, from another bot."
url = "{child_bot.url}"
token_env = "FAR_TOKEN"
"""
    config = bot_config(folder, parent_llm.base_url, name="parent", extra="")
    text = config.read_text(encoding="utf-8").replace('[agent]\nname = "parent"\n', "")
    config.write_text(text + extra, encoding="utf-8")
    with running_bot(config, FAR_TOKEN=TOKEN) as bot:
        yield bot
    assert TOKEN not in "".join(bot.log)  # the remote's token is never logged


@pytest.fixture
async def parent(parent_bot) -> AsyncIterator[RemoteAgent]:
    async with parent_bot.client() as agent:
        yield agent


@pytest.fixture
async def child(child_bot) -> AsyncIterator[RemoteAgent]:
    async with child_bot.client() as agent:
        yield agent


async def tree_events(sub: Any, run_id: str) -> list[Any]:
    """Events from ``sub`` until run ``run_id``'s stream ends."""
    events = []
    async with asyncio.timeout(WAIT):
        async for event in sub:
            events.append(event)
            if event.kind == "run_stream_end" and event.run_id == run_id:
                return events
    raise AssertionError(f"the stream ended early: {[e.kind for e in events]}")


def _call(agent: str, task: str) -> Reply:
    return Reply.tool_calls(
        [("c_parent", f"agent__{agent}", json.dumps({"task": task}))], usage=SMALL
    )


async def _run_tree(parent: RemoteAgent, parent_llm, child_llm, agent: str) -> tuple[str, list]:
    parent_llm.enqueue(_call(agent, "what is foo?"), Reply.text("done", usage=SMALL))
    child_llm.enqueue(
        Reply.tool_calls([("c_child", "memory_list", "{}")], usage=SMALL),
        Reply.text("foo is 42", usage=SMALL),
    )
    conv = await parent.create_conversation()
    sub = conv.events()
    run_id = await conv.send("ask the agent")
    events = await tree_events(sub, run_id)
    await sub.aclose()
    return run_id, events


def _shape(events: list, run_id: str) -> list[tuple[str, str]]:
    linked = next(e for e in events if e.kind == "child_run_linked")

    def who(e: Any) -> str:
        return (
            "parent" if e.run_id == run_id else "child" if e.run_id == linked.child_run_id else "?"
        )

    return [
        (who(e), e.kind)
        for e in events
        if e.kind not in ("response_started", "text_delta", "status_changed", "usage")
    ]


async def test_a_remote_agents_run_tree_has_the_shape_of_a_local_ones(
    parent, child, parent_llm, child_llm
):
    near_run, near = await _run_tree(parent, parent_llm, child_llm, "near")
    far_run, far = await _run_tree(parent, parent_llm, child_llm, "far")
    expected = [
        ("parent", "turn_started"),
        ("parent", "tool_call_started"),
        ("parent", "child_run_linked"),
        ("child", "turn_started"),
        ("child", "tool_call_started"),
        ("child", "tool_call_ended"),
        ("child", "turn_ended"),
        ("child", "run_stream_end"),
        ("parent", "tool_call_ended"),
        ("parent", "turn_ended"),
        ("parent", "run_stream_end"),
    ]
    assert _shape(near, near_run) == expected
    assert _shape(far, far_run) == expected
    for run_id, events in ((near_run, near), (far_run, far)):
        linked = next(e for e in events if e.kind == "child_run_linked")
        # One stream, numbered as the parent's; the child's events name the parent run.
        assert {e.conversation_id for e in events} == {events[0].conversation_id}
        assert [e.seq for e in events] == sorted({e.seq for e in events})
        for e in events:
            assert e.parent_run_id == (run_id if e.run_id == linked.child_run_id else None)
        (result,) = [e for e in events if e.kind == "tool_call_ended" and e.run_id == run_id]
        assert result.result == "foo is 42" and not result.is_error
        assert linked.call_id == "c_parent"
    # The far child's run is a turn of the other bot, in a conversation there.
    linked = next(e for e in far if e.kind == "child_run_linked")
    assert linked.agent == "far"
    there = await child.get_conversation(linked.child_conversation_id)
    history = [(m.kind, m.run_id) for m in await there.messages()]
    assert history[0] == ("user", linked.child_run_id)
    assert (await there.messages())[-1].content == "foo is 42"
    # The child's tokens count for the parent's turn, as a local child's do.
    usage = {e.run_id: e.usage.total_tokens for e in far if e.kind == "turn_ended"}
    assert usage[far_run] == usage[linked.child_run_id] + 2 * sum(SMALL)


async def test_interrupting_the_parent_stops_the_remote_child(parent, child, parent_llm, child_llm):
    parent_llm.enqueue(_call("far", "take your time"))
    held = Reply.text("one two three", chunks=3, hold_after=1)
    child_llm.enqueue(held)
    conv = await parent.create_conversation()
    sub = conv.events()
    watch = conv.events()
    run_id = await conv.send("go")
    await held.wait_held(WAIT)
    # The remote child is mid-answer: its turn has started (its request may go out
    # before its message is stored; its start is shown once it is).
    async with asyncio.timeout(WAIT):
        async for e in watch:
            if e.kind == "turn_started" and e.run_id != run_id:
                break
    assert await conv.interrupt() is True
    events = await tree_events(sub, run_id)
    ends = [(e.run_id == run_id, e.stop_reason) for e in events if e.kind == "turn_ended"]
    assert ends == [(False, "interrupted"), (True, "interrupted")]
    assert [e.run_id == run_id for e in events if e.kind == "run_stream_end"] == [False, True]
    linked = next(e for e in events if e.kind == "child_run_linked")
    there = await child.get_conversation(linked.child_conversation_id)
    assert (await there.status())["state"] == "idle"
    # Its partial answer is kept there, marked interrupted.
    (kept,) = [m for m in await there.messages() if m.kind == "assistant"]
    assert kept.status == "interrupted"
    assert (
        kept.content
        and "one two three".startswith(kept.content)
        and kept.content != "one two three"
    )
    held.release()


async def test_a_remote_child_using_up_the_trees_budget_stops_both(
    parent, child, parent_llm, child_llm
):
    parent_llm.enqueue(
        Reply.tool_calls([("c_parent", "agent__far", json.dumps({"task": "dig"}))], usage=(20, 10)),
        Reply.text("never asked"),
    )
    # The child's first request uses 80 tokens (30 + 80 > the tree's 100); it asks for a
    # tool, then its next answer is held: it is still running when its caller stops it.
    held = Reply.text("never finished", chunks=2, hold_after=1)
    child_llm.enqueue(Reply.tool_calls([("c_child", "memory_list", "{}")], usage=(60, 20)), held)
    asked = len(parent_llm.requests)
    conv = await parent.create_conversation()
    sub = conv.events()
    run_id = await conv.send("dig deep")
    events = await tree_events(sub, run_id)
    held.release()
    ends = {e.run_id: e for e in events if e.kind == "turn_ended"}
    linked = next(e for e in events if e.kind == "child_run_linked")
    assert ends[run_id].stop_reason == "token_budget"
    assert ends[linked.child_run_id].stop_reason == "interrupted"  # stopped by its caller
    # The child's 80 tokens count for its parent: 30 + 80; the parent asked its model once.
    assert ends[run_id].usage.total_tokens == 110
    assert len(parent_llm.requests) == asked + 1
    (result,) = [e for e in events if e.kind == "tool_call_ended" and e.run_id == run_id]
    assert result.is_error and "token budget" in result.result
    there = await child.get_conversation(linked.child_conversation_id)
    assert (await there.status())["state"] == "idle"


# -- configuration and failures, in process ----------------------------------------------------


def _dead_url() -> str:
    """A loopback URL where nothing listens (the port was just free)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (AgentSpec(url="ftp://example.org"), "agents.far.url: not an http:// or https:// URL"),
        (
            AgentSpec(url="http://127.0.0.1:9", token_env="AGENTIK_TEST_UNSET_TOKEN"),
            "agents.far.token_env: environment variable AGENTIK_TEST_UNSET_TOKEN is not set",
        ),
    ],
)
def test_a_bad_remote_agent_is_a_clear_error_naming_the_key(tmp_path, spec, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        Agent(
            llm=ScriptedModel(),
            store=SQLiteStore(str(tmp_path / "a.db")),
            agents={"far": spec},
            uses=("far",),
        )


async def test_an_unreachable_remote_agent_is_a_tool_error_and_the_turn_goes_on(tmp_path):
    main = ScriptedModel()
    main.enqueue(
        ScriptedReply(tool_calls=[call("agent__far", {"task": "hello?"}, id="c1")]), "no answer"
    )
    agent = Agent(
        llm=main,
        store=SQLiteStore(str(tmp_path / "a.db")),
        agents={"far": AgentSpec(url=_dead_url(), description="far away")},
        uses=("far",),
    )
    async with agent:
        conv = await agent.create_conversation()
        sub = conv.events()
        run_id = await conv.send("go")
        events = await tree_events(sub, run_id)
    (result,) = [e for e in events if e.kind == "tool_call_ended"]
    assert result.is_error and "agent far could not be reached" in result.result
    assert events[-2].kind == "turn_ended" and events[-2].text == "no answer"


def test_a_remote_agents_token_is_redacted_from_the_logs(tmp_path, monkeypatch):
    monkeypatch.setenv("FAR_TOKEN", TOKEN)
    path = tmp_path / "bot.toml"
    path.write_text(
        '[llm]\nbackend = "scripted"\n[agents.far]\nurl = "http://127.0.0.1:9"\n'
        'token_env = "FAR_TOKEN"\n',
        encoding="utf-8",
    )
    assert TOKEN in load_config(path).secrets()


@pytest.mark.timeout(300)  # a bot of its own starts (slow on a loaded machine)
async def test_a_remote_bot_that_dies_mid_run_is_a_tool_error_and_the_turn_goes_on(
    tmp_path, monkeypatch
):
    """The remote's event stream breaks; the client tries to reconnect, cannot, and the
    parent's model gets an error result instead of a hung or crashed turn."""
    doomed_llm = FakeOpenAIServer()
    await doomed_llm.start()
    doomed = start_bot(bot_config(tmp_path / "doomed", doomed_llm.base_url, name="doomed"))
    held = Reply.text("never finished", chunks=2, hold_after=1)
    doomed_llm.enqueue(held)
    monkeypatch.setenv("DOOMED_TOKEN", TOKEN)
    main = ScriptedModel()
    main.enqueue(
        ScriptedReply(tool_calls=[call("agent__doomed", {"task": "work"}, id="c1")]), "carried on"
    )
    agent = Agent(
        llm=main,
        store=SQLiteStore(str(tmp_path / "a.db")),
        agents={"doomed": AgentSpec(url=doomed.url, token_env="DOOMED_TOKEN")},
        uses=("doomed",),
    )
    try:
        async with agent:
            conv = await agent.create_conversation()
            sub = conv.events()
            run_id = await conv.send("go")
            await held.wait_held(WAIT)
            doomed.proc.kill()  # mid-answer
            events = await tree_events(sub, run_id)
    finally:
        doomed.stop()
        held.release()
        await doomed_llm.close()
    (result,) = [e for e in events if e.kind == "tool_call_ended"]
    assert result.is_error and "agent doomed" in result.result
    ended = next(e for e in events if e.kind == "turn_ended" and e.run_id == run_id)
    assert ended.text == "carried on"
