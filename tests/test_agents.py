"""Agents as tools: child runs, the run tree, inherited and bounded run policies.

A parent turn calls a named agent (``agent__<name>``); the call runs as a child
run in a conversation of its own (a real SQLite store), its events reach the
parent's subscribers in order, and its limits come from the tree.  Models are
scripted: the main agent and the named agents use different model profiles, so
each side's requests are checked separately.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path

import pytest

from agentik.bot.app import load_registry
from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.bot.builder import AgentBuilder
from agentik.bot.config import load_config
from agentik.core import Agent, SQLiteStore, tool
from agentik.core.agents import AgentSpec, RunPolicy
from agentik.core.approvals import ApprovalRule
from agentik.core.errors import ConfigError, LLMConnectionError
from agentik.core.hookspecs import hookimpl
from agentik.core.messages import Usage
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.transports.testing import MemoryTransport
from helpers import AGENTIK

from rigs import eventually

WAIT = 60.0  # only guards against a hang

RESEARCHER = AgentSpec(
    description="Looks things up.",
    system_prompt="You are the researcher. Use lookup.",
    model="child",
    tools=("lookup",),
)


@tool(
    description="Look a word up",
    parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)
async def lookup(q: str) -> str:
    return f"{q} means 42"


def make_agent(
    tmp_path: Path,
    *,
    agents: dict[str, AgentSpec] | None = None,
    uses: tuple[str, ...] = ("researcher",),
    runs: RunPolicy | None = None,
) -> tuple[Agent, ScriptedModel, ScriptedModel]:
    main, child = ScriptedModel(), ScriptedModel()
    agent = Agent(
        llm=main,
        profiles={"child": child},
        store=SQLiteStore(str(tmp_path / "agents.db")),
        tools=[lookup],
        system_prompt="You are the main bot.",
        agents=agents if agents is not None else {"researcher": RESEARCHER},
        uses=uses,
        run_policy=runs,
    )
    return agent, main, child


async def tree_events(sub, run_id: str) -> list:
    """Events from ``sub`` until run ``run_id``'s stream ends."""
    events = []

    async def consume() -> None:
        async for event in sub:
            events.append(event)
            if event.kind == "run_stream_end" and event.run_id == run_id:
                return

    await asyncio.wait_for(consume(), WAIT)
    return events


def tool_messages(request) -> list:
    return [m for m in request.messages if m.role == "tool"]


# -- a parent calls a child agent that calls a tool ----------------------------------------


async def test_a_child_agent_runs_its_tool_and_its_answer_is_the_parents_tool_result(tmp_path):
    agent, main, child = make_agent(tmp_path)
    main.enqueue(
        Reply(tool_calls=[call("agent__researcher", {"task": "what is foo?"}, id="c_parent")]),
        "The researcher says: foo means 42.",
    )
    child.enqueue(Reply(tool_calls=[call("lookup", {"q": "foo"}, id="c_child")]), "foo means 42")
    async with agent:
        conv = await agent.conversation_for_channel("stdio:test")
        sub = conv.events()
        run_id = await conv.send("ask the researcher about foo", author="alice")
        events = await tree_events(sub, run_id)

    # The main model was offered the agent as a tool, with the default input schema.
    offered = {t.name: t for t in main.requests[0].tools}
    assert offered["agent__researcher"].description == "Looks things up."
    assert offered["agent__researcher"].parameters["required"] == ["task"]
    # The child ran with its own prompt, its own context and only its allowed tools.
    first = child.requests[0]
    assert first.system == "You are the researcher. Use lookup."
    assert [m.content for m in first.messages if m.role == "user"] == ["what is foo?"]
    assert [t.name for t in first.tools] == ["lookup"]
    assert tool_messages(child.requests[1])[0].content == "foo means 42"
    # Its final answer is the parent's tool result.
    (result,) = tool_messages(main.requests[1])
    assert result.content == "foo means 42" and not result.is_error
    ended = [e for e in events if e.kind == "turn_ended"]
    assert ended[-1].run_id == run_id and ended[-1].text == "The researcher says: foo means 42."


async def test_the_parents_subscriber_sees_the_event_tree_in_order(tmp_path):
    agent, main, child = make_agent(tmp_path)
    main.enqueue(
        Reply(tool_calls=[call("agent__researcher", {"task": "foo?"}, id="c_parent")]), "done"
    )
    child.enqueue(Reply(tool_calls=[call("lookup", {"q": "foo"}, id="c_child")]), "42")
    async with agent:
        conv = await agent.conversation_for_channel("stdio:test")
        sub = conv.events()
        everything = agent.events()
        run_id = await conv.send("go")
        events = await tree_events(sub, run_id)
        linked = next(e for e in events if e.kind == "child_run_linked")
        child_run = linked.child_run_id
        seen_by_agent = await tree_events(everything, run_id)

    def who(e) -> str:
        return "parent" if e.run_id == run_id else "child" if e.run_id == child_run else "?"

    shape = [
        (who(e), e.kind)
        for e in events
        if e.kind not in ("response_started", "text_delta", "status_changed", "usage")
    ]
    assert shape == [
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
    assert linked.call_id == "c_parent" and linked.agent == "researcher"
    # Every event is in the parent's stream, numbered as the parent's; child
    # events name the parent run.
    assert all(e.conversation_id == conv.id for e in events)
    assert [e.seq for e in events] == sorted({e.seq for e in events})
    for e in events:
        assert e.parent_run_id == (run_id if who(e) == "child" else None)
    # The agent-wide stream carries each child event once, as the child conversation's.
    child_events = [e for e in seen_by_agent if e.run_id == child_run]
    assert {e.conversation_id for e in child_events} == {linked.child_conversation_id}
    # …and every one of them is relayed into the parent's stream, except the
    # child conversation's own status changes: there the parent is executing
    # its agent tool until the child's answer is back.
    relayed = [e.kind for e in events if e.run_id == child_run]
    assert [k for k in (e.kind for e in child_events) if k != "status_changed"] == relayed
    assert "status_changed" in {e.kind for e in child_events}
    assert "status_changed" not in relayed
    states = [(who(e), e.state) for e in events if e.kind == "status_changed"]
    assert ("parent", "executing_tools") in states
    assert all(w == "parent" for w, _ in states)


# -- budgets, depth, concurrency -------------------------------------------------------------


async def test_a_child_using_up_the_trees_token_budget_stops_both(tmp_path):
    agent, main, child = make_agent(tmp_path, runs=RunPolicy(tree_token_budget=100))
    main.enqueue(
        Reply(
            tool_calls=[call("agent__researcher", {"task": "dig"}, id="c_parent")],
            usage=Usage(prompt_tokens=20, completion_tokens=10, total_tokens=30),
        ),
        "never asked",
    )
    child.enqueue(
        Reply(
            tool_calls=[call("lookup", {"q": "gold"}, id="c_child")],
            usage=Usage(prompt_tokens=60, completion_tokens=20, total_tokens=80),
        ),
        "never asked either",
    )
    async with agent:
        conv = await agent.conversation_for_channel("stdio:test")
        sub = conv.events()
        run_id = await conv.send("dig deep")
        events = await tree_events(sub, run_id)
        linked = next(e for e in events if e.kind == "child_run_linked")
        child_log = await (await agent.get_conversation(linked.child_conversation_id)).messages()

    ends = {e.run_id: e for e in events if e.kind == "turn_ended"}
    child_end = next(e for rid, e in ends.items() if rid != run_id)
    assert child_end.stop_reason == "token_budget"
    assert ends[run_id].stop_reason == "token_budget"
    # The child's 80 tokens count for its parent: 30 + 80.
    assert ends[run_id].usage.total_tokens == 110
    assert child_end.usage.total_tokens == 80
    # The tool the child asked for past the budget was not run; neither model was asked again.
    assert not [e for e in events if e.kind == "tool_call_started" and e.name == "lookup"]
    (refused,) = [m for m in child_log if m.kind == "tool_result"]
    assert refused.is_error and refused.content == "error: not run: the token budget was used up"
    assert len(main.requests) == 1 and len(child.requests) == 1
    (result,) = [e for e in events if e.kind == "tool_call_ended" and e.run_id == run_id]
    assert result.is_error and "token budget" in result.result


async def test_a_run_at_the_depth_limit_is_not_offered_agents_and_a_call_is_refused(tmp_path):
    agents = {
        "planner": AgentSpec(model="child", uses=("researcher",), description="plans"),
        "researcher": RESEARCHER,
    }
    agent, main, child = make_agent(
        tmp_path, agents=agents, uses=("planner",), runs=RunPolicy(max_depth=1)
    )
    main.enqueue(Reply(tool_calls=[call("agent__planner", {"task": "plan"})]), "planned")
    # The planner (depth 1) calls the researcher anyway: refused, it answers without.
    child.enqueue(
        Reply(tool_calls=[call("agent__researcher", {"task": "look"}, id="c_deep")]),
        "plan without research",
    )
    async with agent:
        conv = await agent.conversation_for_channel("stdio:test")
        sub = conv.events()
        run_id = await conv.send("make a plan")
        events = await tree_events(sub, run_id)
        runs = await agent.store.runs(conv.id)

    assert [t.name for t in main.requests[0].tools] == ["lookup", "agent__planner"]
    assert child.requests[0].tools == []  # at the limit: no agent tools
    (refused,) = tool_messages(child.requests[1])
    assert refused.is_error and "depth limit (1)" in refused.content
    assert len(child.requests) == 2  # the researcher never ran
    assert [e.agent for e in events if e.kind == "child_run_linked"] == ["planner"]
    planner = next(r for r in runs if r.agent == "planner")
    deeper = await agent_runs(tmp_path, planner.conversation_id)
    (deep,) = [r for r in deeper if r.agent == "researcher"]
    assert deep.stop_reason == "depth_limit" and deep.parent_run_id == planner.run_id
    assert deep.parent_call_id == "c_deep" and deep.conversation_id is None


async def agent_runs(tmp_path: Path, conversation_id: str):
    async with SQLiteStore(str(tmp_path / "agents.db")) as store:
        return await store.runs(conversation_id)


async def test_at_most_max_concurrent_children_run_at_once(tmp_path):
    agent, main, child = make_agent(tmp_path, runs=RunPolicy(max_concurrent_children=2))
    gates = {task: asyncio.Event() for task in ("one", "two", "three")}

    def gated(request) -> Reply:
        task = next(m.content for m in request.messages if m.role == "user")
        return Reply(text=f"did {task}", gate=gates[task])

    child.default = gated
    main.enqueue(
        Reply(
            tool_calls=[
                call("agent__researcher", {"task": t}, id=f"c_{t}") for t in ("one", "two", "three")
            ]
        ),
        "all done",
    )
    async with agent:
        conv = await agent.conversation_for_channel("stdio:test")
        sub = conv.events()
        run_id = await conv.send("three tasks")
        node = agent.runs.get(run_id)
        assert node is not None
        # No event for "a child waits for a slot": polled.
        await eventually(
            lambda: len(child.requests) == 2 and node.waiting == 1, "two children, one waiting"
        )
        started = [next(m.content for m in r.messages if m.role == "user") for r in child.requests]
        first, _second = started
        (third,) = set(gates) - set(started)
        gates[first].set()
        await eventually(lambda: len(child.requests) == 3, "the third child starts")
        for g in gates.values():
            g.set()
        events = await tree_events(sub, run_id)

    linked = [e for e in events if e.kind == "child_run_linked"]
    assert len(linked) == 3
    first_end = next(
        i for i, e in enumerate(events) if e.kind == "run_stream_end" and e.run_id != run_id
    )
    assert events.index(linked[2]) > first_end  # the third waited for a free slot
    results = sorted(m.content for m in tool_messages(main.requests[1]))
    assert results == ["did one", "did three", "did two"]


# -- failures and interruption ------------------------------------------------------------------


async def test_a_child_whose_model_fails_gives_the_parent_a_tool_error(tmp_path):
    agent, main, child = make_agent(tmp_path)
    main.enqueue(
        Reply(tool_calls=[call("agent__researcher", {"task": "foo?"})]),
        "The researcher is unavailable.",
    )
    child.enqueue(Reply(text="partial answer", fail_after=1, error=LLMConnectionError("down")))
    async with agent:
        conv = await agent.conversation_for_channel("stdio:test")
        sub = conv.events()
        run_id = await conv.send("go")
        events = await tree_events(sub, run_id)

    (result,) = tool_messages(main.requests[1])
    assert result.is_error and result.content.startswith("error: agent researcher failed")
    assert "partial" in result.content
    ends = {e.run_id: e.stop_reason for e in events if e.kind == "turn_ended"}
    assert ends.pop(run_id) == "stop"
    assert list(ends.values()) == ["error"]
    assert [e.kind for e in events if e.kind == "error"] == ["error"]  # the child's, once


async def test_interrupting_the_parent_interrupts_the_child(tmp_path):
    agent, main, child = make_agent(tmp_path)
    main.enqueue(Reply(tool_calls=[call("agent__researcher", {"task": "slow"})]))
    held = Reply(text="one two three", hold_after=1)
    child.enqueue(held)
    async with agent:
        conv = await agent.conversation_for_channel("stdio:test")
        sub = conv.events()
        run_id = await conv.send("go")
        await asyncio.wait_for(held.held.wait(), WAIT)
        assert await conv.interrupt()
        events = await tree_events(sub, run_id)
        child_conv_id = next(e for e in events if e.kind == "child_run_linked")
        child_conv = await agent.get_conversation(child_conv_id.child_conversation_id)
        kept = await child_conv.messages()

    assert child.cancelled == 1
    ends = [(e.run_id == run_id, e.stop_reason) for e in events if e.kind == "turn_ended"]
    assert ends == [(False, "interrupted"), (True, "interrupted")]
    stream_ends = [e.run_id == run_id for e in events if e.kind == "run_stream_end"]
    assert stream_ends == [False, True]
    assert [(m.kind, m.content, m.status) for m in kept if m.kind == "assistant"] == [
        ("assistant", "one ", "interrupted")
    ]


# -- storage and the CLI --------------------------------------------------------------------


async def test_child_runs_are_stored_and_are_not_resumed_after_a_crash(tmp_path):
    agent, main, child = make_agent(tmp_path)
    main.enqueue(
        Reply(
            tool_calls=[call("agent__researcher", {"task": "foo?"}, id="c_parent")],
            usage=Usage(prompt_tokens=5, completion_tokens=2, total_tokens=7),
        ),
        Reply(text="ok", usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)),
    )
    child.enqueue(Reply(text="foo is 42", usage=Usage(prompt_tokens=3, completion_tokens=1,
                                                      total_tokens=4)))  # fmt: skip
    async with agent:
        conv = await agent.conversation_for_channel("stdio:test")
        sub = conv.events()
        run_id = await conv.send("go")
        await tree_events(sub, run_id)
        runs = await agent.store.runs(conv.id)
        pending = await agent.pending_turns()
        child_record = await agent.store.get_conversation(runs[1].conversation_id)
        child_log = await agent.store.messages(runs[1].conversation_id)

    root, kid = runs
    # The child's answer and end were committed with the parent's tool result.
    assert [(m.kind, m.content) for m in child_log] == [
        ("user", "foo?"),
        ("assistant", "foo is 42"),
    ]
    assert (root.run_id, root.agent, root.parent_run_id) == (run_id, None, None)
    assert (root.stop_reason, root.usage["total_tokens"]) == ("stop", 7 + 2 + 4)
    assert kid.parent_run_id == run_id and kid.parent_call_id == "c_parent"
    assert kid.agent == "researcher" and kid.parent_conversation_id == conv.id
    assert (kid.stop_reason, kid.usage["total_tokens"]) == ("stop", 4)
    assert child_record is not None and child_record.meta["parent_run_id"] == run_id
    assert pending == []
    # A crash mid-child: the parent's message is taken up again, never the child's.
    async with SQLiteStore(str(tmp_path / "agents.db")) as store:
        from agentik.core.messages import NewMessage
        from agentik.core.store.base import RunRecord

        await store.run_add(
            RunRecord(
                run_id="run_cut",
                conversation_id=kid.conversation_id,
                parent_run_id=run_id,
                agent="researcher",
                started=1.0,
            )
        )
        await store.append(
            kid.conversation_id,
            log=[NewMessage(kind="user", content="cut off", run_id="run_cut", created_at=1.0)],
        )
        assert await store.pending_turns() == []


def test_conversations_show_prints_the_run_tree_and_list_marks_child_runs(tmp_path):
    async def make() -> tuple[str, str]:
        agent, main, child = make_agent(tmp_path)
        main.enqueue(
            Reply(
                tool_calls=[call("agent__researcher", {"task": "foo?"}, id="c_parent")],
                usage=Usage(prompt_tokens=5, completion_tokens=2, total_tokens=7),
            ),
            Reply(text="ok", usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)),
        )
        child.enqueue(
            Reply(
                tool_calls=[call("lookup", {"q": "foo"}, id="c_child")],
                usage=Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4),
            ),
            Reply(text="42", usage=Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4)),
        )
        async with agent:
            conv = await agent.conversation_for_channel("stdio:test")
            sub = conv.events()
            run_id = await conv.send("go", author="alice")
            await tree_events(sub, run_id)
            return conv.id, run_id

    conv_id, run_id = asyncio.run(make())
    config = tmp_path / "bot.toml"
    config.write_text(f'[storage]\npath = "{tmp_path / "agents.db"}"\n', encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}

    def cli(*args: str) -> str:
        result = subprocess.run(
            [AGENTIK, *args, "-c", str(config)],
            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    shown = cli("conversations", "show", conv_id)
    tree = shown[shown.index("run tree:") :].splitlines()
    assert tree[1] == f"{run_id} (main): stop · 17 tokens", tree
    assert re.fullmatch(
        r"  └ agent__researcher \[c_parent\] → run_\w+ researcher: stop · 8 tokens"
        r" · conversation \w+",
        tree[2],
    ), tree
    assert tree[3] == "      · lookup [c_child]", tree
    listing = cli("conversations", "list").splitlines()
    (child_line,) = [line for line in listing if "researcher: foo?" in line]
    assert f"↳ child of {conv_id}" in child_line
    (parent_line,) = [line for line in listing if line.startswith(conv_id)]
    assert "child of" not in parent_line


# -- configuration -----------------------------------------------------------------------------


async def test_an_unknown_agent_in_uses_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"agent.uses: no agent 'nobody' \(agents: researcher\)"):
        make_agent(tmp_path, uses=("nobody",))
    with pytest.raises(ConfigError, match=r"agents.a.uses: no agent 'b'"):
        make_agent(tmp_path, agents={"a": AgentSpec(uses=("b",))}, uses=())


CONFIG = """
[llm]
backend = "scripted"
[llm.profiles.small]
backend = "scripted"
model = "small"

[agent]
uses = ["researcher", "summariser"]

[agents.researcher]
description = "Finds facts."
soul = "researcher.md"
model = "small"
tools = ["look*", "memory_*"]
memory = "none"

[runs]
max_depth = 3
tree_token_budget = 5000
"""


class SummariserPlugin:
    """A plugin registering an agent through the ``register_agents`` hook."""

    @hookimpl
    def register_agents(self, register):
        register("summariser", AgentSpec(description="Summarises.", model="small"))


async def test_agents_from_the_configuration_file_and_a_plugin_are_tools_of_the_main_agent(
    tmp_path,
):
    (tmp_path / "researcher.md").write_text("You dig up facts.", encoding="utf-8")
    path = tmp_path / "bot.toml"
    path.write_text(
        CONFIG + f'[storage]\npath = "{tmp_path / "bot.db"}"\n[memory]\nbackend = "sqlite"\n',
        encoding="utf-8",
    )
    config = load_config(path)
    assert config.agents["researcher"].tools == ("look*", "memory_*")
    assert config.agent.uses == ("researcher", "summariser")
    assert config.runs.tree_token_budget == 5000
    registry = load_registry(config, extra=(SummariserPlugin(),))
    registry.tools.append(lookup)
    agent = AgentBuilder.from_config(config, registry).build()
    main, small = agent.llm, agent.profiles["small"]
    assert isinstance(main, ScriptedModel) and isinstance(small, ScriptedModel)
    main.enqueue(
        Reply(
            tool_calls=[
                call("agent__researcher", {"task": "facts?"}),
                call("agent__summariser", {"task": "sum up"}),
            ]
        ),
        "done",
    )
    async with agent:
        conv = await agent.conversation_for_channel("stdio:test")
        sub = conv.events()
        run_id = await conv.send("go", author="alice")
        await tree_events(sub, run_id)

    names = sorted(t.name for t in main.requests[0].tools)
    assert "agent__researcher" in names and "agent__summariser" in names
    researcher = next(r for r in small.requests if r.messages[-1].content == "facts?")
    assert researcher.system == "You dig up facts."
    # memory = "none": the memory tools are not offered, though the allow-list matches them.
    assert [t.name for t in researcher.tools] == ["lookup"]
    assert any(n.startswith("memory_") for n in names)
    summariser = next(r for r in small.requests if r.messages[-1].content == "sum up")
    assert summariser.tools == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[agent]\nuses = ["ghost"]\n', r"agent\.uses: no agent 'ghost' \(agents: none defined\)"),
        ('[agents.a]\nmodel = "big"\n', r"agents\.a\.model: no profile 'big'"),
        ('[agents.a]\ntools = "x"\n', r"agents\.a\.tools"),
        ('[agents.a]\nuses = ["b"]\n', r"agents\.a\.uses: no agent 'b'"),
        ("[runs]\nmax_depth = -1\n", r"runs\.max_depth"),
        ('[agents.a]\nsoul = "missing.md"\n', r"agents\.a\.soul: cannot read"),
    ],
)
def test_bad_agent_configuration_is_a_clear_error_naming_the_key(tmp_path, extra, message):
    path = tmp_path / "bot.toml"
    path.write_text('[llm]\nbackend = "scripted"\n' + extra, encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        config = load_config(path)
        AgentBuilder.from_config(config, load_registry(config)).build()


# -- in a channel -------------------------------------------------------------------------------


async def test_in_a_channel_the_child_asks_for_approval_there_and_only_the_answer_is_posted(
    tmp_path,
):
    main, child = ScriptedModel(), ScriptedModel()
    agent = Agent(
        llm=main,
        profiles={"child": child},
        store=SQLiteStore(str(tmp_path / "agents.db")),
        tools=[lookup],
        agents={"researcher": RESEARCHER},
        uses=("researcher",),
        approvals=[ApprovalRule(tools=("lookup",), approvers="user", self_approve=True)],
    )
    main.enqueue(
        Reply(tool_calls=[call("agent__researcher", {"task": "what is foo?"})]),
        "The researcher says foo means 42.",
    )
    child.enqueue(
        Reply(text="Let me look.", tool_calls=[call("lookup", {"q": "foo"})]), "foo means 42"
    )
    await agent.start()
    bridge = Bridge(agent)
    t = MemoryTransport(name="mem")
    bridge.attach(t, ChannelOptions(command_prefix="!"))
    await t.start(bridge)
    try:
        asked = agent.events(kinds=["approval_requested"])
        await t.inject("research foo", channel_key="mem:alice", author="alice", direct=True)
        request = await asyncio.wait_for(anext(asked), WAIT)
        assert request.name == "lookup" and request.parent_run_id is not None
        await t.inject(f"!approve {request.approval_id}", channel_key="mem:alice",
                       author="alice", direct=True)  # fmt: skip
        # The caller's turn ends after its child's (a finished child conversation
        # may already have left memory: look at the caller, not the child).
        caller = await agent.conversation_for_channel("mem:alice")
        await asyncio.wait_for(caller.wait_idle(), WAIT)
        await asyncio.wait_for(bridge.flush("mem:alice"), WAIT)
    finally:
        await bridge.aclose()
        await agent.aclose()
    # The channel saw the approval request (with its id) and the parent's answer only.
    assert any(request.approval_id in text for text in t.texts())
    assert t.texts("answer") == ["The researcher says foo means 42."]
    assert not any("Let me look." in text or text == "foo means 42" for text in t.texts())
    assert tool_messages(child.requests[1])[0].content == "foo means 42"


async def test_a_child_that_runs_out_of_its_time_budget_gives_the_parent_an_error(tmp_path):
    spec = AgentSpec(model="child", time_budget=0.2)  # its model never answers
    agent, main, child = make_agent(tmp_path, agents={"researcher": spec})
    main.enqueue(Reply(tool_calls=[call("agent__researcher", {"task": "wait"})]), "gave up")
    child.enqueue(Reply(text="never", gate=asyncio.Event()))
    async with agent:
        conv = await agent.conversation_for_channel("stdio:test")
        sub = conv.events()
        run_id = await conv.send("go")
        events = await tree_events(sub, run_id)

    ends = {e.run_id == run_id: e.stop_reason for e in events if e.kind == "turn_ended"}
    assert ends == {False: "time_budget", True: "stop"}
    (result,) = tool_messages(main.requests[1])
    assert result.is_error and result.content == "error: agent researcher ran out of time"


def test_agent_keys_are_declared_once_by_the_settings_they_override():
    """Issue 30: AgentSpec re-declared system_prompt ([agent]), uses ([agent]),
    max_tool_calls and time_budget ([tools]), token_budget and max_concurrent_children
    ([runs]). Each is now declared by one knobs class that the overridden section
    inherits too; the keys a named agent leaves unset are ``None`` (the caller's, or
    the bot's), with the same limits as their section's, in the file and in code."""
    from agentik.bot.config import AgentSection, parse_config
    from agentik.core.settings import setting_fields
    from agentik.core.tools.base import TurnPolicy

    def declared_by(cls: type, key: str) -> type:
        return next(k for k in cls.__mro__ if key in getattr(k, "__annotations__", {}))

    sections = {"system_prompt": AgentSection, "uses": AgentSection,
                "max_tool_calls": TurnPolicy, "time_budget": TurnPolicy,
                "token_budget": RunPolicy, "max_concurrent_children": RunPolicy}  # fmt: skip
    where = {AgentSection: "agent", TurnPolicy: "tools", RunPolicy: "runs"}
    fields = setting_fields(AgentSpec)
    for key, section in sections.items():
        assert key not in AgentSpec.__annotations__, key
        assert declared_by(AgentSpec, key) is declared_by(section, key), key
    # Unset: None, except the two whose default is the same for both (none; no limit).
    unset = {k: getattr(AgentSpec(), k) for k in sections}
    assert unset == {"system_prompt": None, "uses": (), "max_tool_calls": None,
                     "time_budget": None, "token_budget": 0,
                     "max_concurrent_children": None}  # fmt: skip
    assert fields["max_tool_calls"].description == (
        "Tool calls one of its runs may make (unset: the caller's)."
    )
    # The section's limits, in both tables, errors naming the key.
    for key, bad in {"max_tool_calls": -1, "time_budget": 0, "token_budget": -1,
                     "max_concurrent_children": 0}.items():  # fmt: skip
        with pytest.raises(ConfigError, match=rf"^<string>: agents\.a\.{key}: "):
            parse_config({"agents": {"a": {key: bad}}}, env={})
        with pytest.raises(ConfigError, match=rf"^<string>: {where[sections[key]]}\.{key}: "):
            parse_config({where[sections[key]]: {key: bad}}, env={})
    spec = parse_config({"agents": {"a": {"max_tool_calls": 0, "time_budget": 0.5}}}, env={})
    assert (spec.agents["a"].max_tool_calls, spec.agents["a"].time_budget) == (0, 0.5)
    assert spec.agents["a"].max_concurrent_children is None
