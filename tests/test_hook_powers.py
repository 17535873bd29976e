"""Plugins that emit and abort, tools with effects, and ``prompt_rendered`` (issue 35).

The agent runs for real on a SQLite file with the scripted model double;
plugins are plain objects with ``@hookimpl`` methods, as a third-party
package's would be.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Literal

import pytest

from agentik.bot.config import parse_config
from agentik.core import Agent, SQLiteStore, TurnPolicy, tool
from agentik.core.errors import ConfigError, PluginError, ToolError
from agentik.core.events import (
    PluginEvent,
    declare_event,
    event_from_json,
    event_to_json,
)
from agentik.core.hooks import Abort
from agentik.core.hookspecs import hookimpl
from agentik.core.streamprofiles import StreamProfileSettings, resolve_profiles
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.core.tools.base import AskUser, EndTurn, ToolResult


@declare_event
@dataclass(frozen=True, kw_only=True, slots=True)
class Flagged(PluginEvent):
    """A test plugin's own event: it saw a tool call worth flagging."""

    kind: Literal["acme.flagged"] = field(default="acme.flagged", init=False)
    tool: str
    reason: str
    score: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Undeclared(PluginEvent):
    kind: Literal["acme.undeclared"] = field(default="acme.undeclared", init=False)
    note: str = ""


@tool
async def add(a: int, b: int) -> str:
    """Add two numbers."""
    return str(a + b)


async def drain(sub, until: str = "run_stream_end", wait: float = 60.0):
    """The events of ``sub`` up to the first ``until`` of a top-level run (inclusive)."""
    got = []
    async with asyncio.timeout(wait):
        async for event in sub:
            got.append(event)
            if event.kind == until and event.parent_run_id is None:
                return got
    raise AssertionError(f"the stream ended before {until}")


# -- a hook emits an event of its own kind ----------------------------------------------------
class Flagger:
    @hookimpl
    def before_tool_call(self, call, emit):
        if call.name == "add":
            emit(Flagged, tool=call.name, reason="arithmetic", score=0.5)


class Sloppy:
    @hookimpl
    def after_tool_call(self, emit):
        emit(Undeclared, note="never declared")

    @hookimpl
    def after_response(self, emit):
        emit(Flagged, tool="x", reason=object())  # not JSON


async def test_a_hook_emits_its_declared_kind_which_round_trips_and_profiles_filter(tmp_path):
    model = ScriptedModel([Reply(tool_calls=[call("add", {"a": 1, "b": 2})]), "3"])
    profiles = resolve_profiles(
        {"flags": StreamProfileSettings(extends="chat", kinds=["acme.flagged"])}
    )
    agent = Agent(
        llm=model,
        store=SQLiteStore(str(tmp_path / "t.db")),
        tools=[add],
        hooks=[Flagger()],
        stream_profiles=profiles,
    )
    async with agent:
        conv = await agent.create_conversation()
        debug, chat, flags = (
            conv.events(),
            conv.events(profile="chat"),
            conv.events(profile="flags"),
        )
        await conv.send("add 1 and 2")
        seen = {
            name: await drain(sub)
            for name, sub in [("debug", debug), ("chat", chat), ("flags", flags)]
        }
    [flag] = [e for e in seen["debug"] if e.kind == "acme.flagged"]
    assert (flag.tool, flag.reason, flag.score) == ("add", "arithmetic", 0.5)
    # In the turn's stream, in order: after the call was asked for, before it started.
    kinds = [e.kind for e in seen["debug"]]
    assert kinds.index("acme.flagged") < kinds.index("tool_call_started")
    assert flag.run_id == seen["debug"][0].run_id and flag.seq > 0
    # Serialisable: the same event comes back from its JSON.
    again = event_from_json(event_to_json(flag))
    assert again == flag and type(again) is Flagged
    # Filterable: ``chat`` does not carry it, a profile that names it does.
    assert "acme.flagged" not in [e.kind for e in seen["chat"]]
    assert [e.kind for e in seen["flags"]].count("acme.flagged") == 1
    assert "text_delta" in [e.kind for e in seen["flags"]]


async def test_an_undeclared_or_unserialisable_event_fails_the_hook_not_the_turn(caplog):
    model = ScriptedModel([Reply(tool_calls=[call("add", {"a": 2, "b": 2})]), "4"])
    agent = Agent(llm=model, store=SQLiteStore(":memory:"), tools=[add], hooks=[Sloppy()])
    with caplog.at_level(logging.ERROR, logger="agentik.hooks"):
        async with agent:
            conv = await agent.create_conversation()
            sub = conv.events()
            await conv.send("2+2")
            events = await drain(sub)
    assert next(e for e in events if e.kind == "turn_ended").text == "4"
    assert not [e for e in events if e.kind.startswith("acme.")]
    logged = caplog.text
    assert "not a declared event kind" in logged
    assert "a field JSON cannot carry" in logged


def test_declaring_checks_the_kind_and_refuses_a_kind_taken_by_another_class():
    with pytest.raises(PluginError, match="dotted lowercase words"):

        @declare_event
        @dataclass(frozen=True, kw_only=True, slots=True)
        class Bad(PluginEvent):
            kind: Literal["flagged"] = field(default="flagged", init=False)

    with pytest.raises(PluginError, match="declared by both"):

        @declare_event
        @dataclass(frozen=True, kw_only=True, slots=True)
        class Other(PluginEvent):
            kind: Literal["acme.flagged"] = field(default="acme.flagged", init=False)

    assert declare_event(Flagged) is Flagged  # the same class again (a re-import): fine


def test_a_profile_may_name_a_plugin_kind_checked_once_plugins_are_loaded():
    data = {
        "llm": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"},
        "profiles": {"audit": {"extends": "chat", "kinds": ["zeta.unknown"]}},
    }
    config = parse_config(data)  # reading the file: plugins are not loaded yet
    with pytest.raises(
        ConfigError, match=r"profiles\.audit\.kinds: unknown event kind 'zeta.unknown'"
    ):
        resolve_profiles(config.profiles)
    assert (
        "acme.flagged"
        in resolve_profiles({"a": StreamProfileSettings(kinds=["acme.flagged"])})["a"].kinds
    )


# -- on_tool_error aborts the turn ---------------------------------------------------------------
class Breaker:
    def __init__(self):
        self.attempts = []

    @hookimpl
    def on_tool_error(self, call, error, attempt, emit):
        self.attempts.append((call.name, error.text, attempt))
        emit(Flagged, tool=call.name, reason="broken")
        return Abort(f"{call.name} is down; stopping")


async def test_on_tool_error_can_abort_the_turn_and_the_next_turn_runs(tmp_path):
    @tool
    async def deploy() -> str:
        """Deploy."""
        raise ToolError("cluster unreachable")

    breaker = Breaker()
    model = ScriptedModel(
        [Reply(tool_calls=[call("deploy"), call("add", {"a": 1, "b": 1})]), "hello"]
    )
    agent = Agent(
        llm=model, store=SQLiteStore(str(tmp_path / "t.db")), tools=[deploy, add], hooks=[breaker]
    )
    async with agent:
        conv = await agent.create_conversation()
        sub = conv.events()
        await conv.send("ship it")
        events = await drain(sub)
        await conv.send("hi")
        events += await drain(sub)
        log = await conv.messages(limit=100)
    assert breaker.attempts == [("deploy", "error: cluster unreachable", 1)]
    ended = [e for e in events if e.kind == "turn_ended"]
    assert [e.stop_reason for e in ended] == ["aborted", "stop"]
    [error] = [e for e in events if e.kind == "error"]
    assert error.message == "turn aborted: deploy is down; stopping"
    # The error stands as the call's result; the other call of the batch finished.
    results = {m.tool_name: (m.content, m.is_error) for m in log if m.kind == "tool_result"}
    assert results == {"deploy": ("error: cluster unreachable", True), "add": ("2", False)}
    # No model request after the abort; the next turn's request is a valid context.
    assert len(model.requests) == 2
    assert [m.role for m in model.requests[1].messages][-4:] == [
        "assistant",
        "tool",
        "tool",
        "user",
    ]
    # The aborted turn's answer is its error, in the audit log; the next one answers.
    assert [(m.content, m.status) for m in log if m.kind == "assistant"] == [
        ("", "error"),
        ("hello", "complete"),
    ]
    assert [e.reason for e in events if e.kind == "acme.flagged"] == ["broken"]


# -- tools with effects ---------------------------------------------------------------------------
@tool
async def finish(summary: str) -> ToolResult:
    """Report and end the turn."""
    return ToolResult(text=f"reported: {summary}", effects=(EndTurn(answer=f"Done: {summary}"),))


@tool
async def silent_stop() -> ToolResult:
    """End the turn without an answer."""
    return ToolResult(text="stopped", effects=(EndTurn(),))


async def test_a_tool_ends_the_turn_with_its_answer_and_no_more_model_requests(tmp_path):
    model = ScriptedModel(
        [
            Reply(tool_calls=[call("finish", {"summary": "3 files"})]),
            "next turn",
            Reply(tool_calls=[call("silent_stop")]),
        ]
    )
    agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "t.db")), tools=[finish, silent_stop])
    async with agent:
        conv = await agent.create_conversation()
        sub = conv.events(profile="chat")
        await conv.send("tidy up")
        first = await drain(sub)
        await conv.send("and now?")
        second = await drain(sub)
        await conv.send("stop")
        third = await drain(sub)
        log = await conv.messages(limit=100)
    assert len(model.requests) == 3  # one per turn: no request after an EndTurn
    [ended] = [e for e in first if e.kind == "turn_ended"]
    assert (ended.stop_reason, ended.text) == ("stop", "Done: 3 files")
    assert "".join(e.text for e in first if e.kind == "text_delta") == "Done: 3 files"
    assert [m.content for m in log if m.kind == "assistant"] == ["Done: 3 files", "next turn"]
    # The next request carries the tool result and the answer, then the new message.
    roles = [(m.role, m.content) for m in model.requests[1].messages]
    assert roles[-3:] == [("tool", "reported: 3 files"), ("assistant", "Done: 3 files"),
                          ("user", "and now?")]  # fmt: skip
    assert [e.text for e in second if e.kind == "turn_ended"] == ["next turn"]
    assert [(e.stop_reason, e.text) for e in third if e.kind == "turn_ended"] == [("stop", "")]


async def test_a_tool_asks_the_user_and_the_model_gets_the_answer_with_its_result(tmp_path):
    @tool
    async def plan() -> ToolResult:
        """Make a plan that needs a decision."""
        return ToolResult(
            text="two plans ready",
            data={"plans": 2},
            effects=(AskUser(question="which plan?", choices=("a", "b")),),
        )

    model = ScriptedModel([Reply(tool_calls=[call("plan")]), "going with b"])
    agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "t.db")), tools=[plan])
    async with agent:
        conv = await agent.conversation_for_channel("fake:chat:#c")
        sub = conv.events()
        await conv.send("plan it", author="alice", author_id="chat:alice")
        async with asyncio.timeout(60):
            async for event in sub:
                if event.kind == "question_asked":
                    break
        assert (event.question, event.choices, event.to) == ("which plan?", ("a", "b"), "alice")
        await conv.send("b", author="alice", author_id="chat:alice")
        events = await drain(sub)
        log = await conv.messages(limit=100)
    assert [e.text for e in events if e.kind == "turn_ended"] == ["going with b"]
    [result] = [m for m in log if m.kind == "tool_result"]
    assert result.content == "two plans ready\n\nalice answered: b"
    assert result.data["result"] == {"plans": 2}
    tool_msgs = [m.content for m in model.requests[1].messages if m.role == "tool"]
    assert tool_msgs == ["two plans ready\n\nalice answered: b"]


async def test_asking_effect_in_a_temporary_conversation_says_nobody_can_be_asked():
    @tool
    async def plan() -> ToolResult:
        """Plan."""
        return ToolResult(text="ready", effects=(AskUser(question="ok?"),))

    model = ScriptedModel([Reply(tool_calls=[call("plan")]), "fine"])
    agent = Agent(llm=model, store=SQLiteStore(":memory:"), tools=[plan])
    async with agent:
        conv = await agent.create_conversation(temp=True)
        await conv.send("go")
        await conv.wait_idle()
    [tool_msg] = [m.content for m in model.requests[1].messages if m.role == "tool"]
    assert tool_msg.startswith("ready\n\ncould not ask 'ok?': nobody can be asked here")


# -- prompt_rendered ---------------------------------------------------------------------------
async def test_prompt_rendered_shows_what_went_to_the_model_with_secrets_scrubbed(tmp_path):
    key = "sk-proj-" + "A1b2C3d4" * 4
    model = ScriptedModel([Reply(tool_calls=[call("add", {"a": 1, "b": 2})]), "3"])
    agent = Agent(
        llm=model,
        store=SQLiteStore(str(tmp_path / "t.db")),
        tools=[add],
        system_prompt="You are terse.",
        prompt_events=True,
    )
    async with agent:
        conv = await agent.create_conversation()
        debug, chat = conv.events(), conv.events(profile="chat")
        await conv.send(f"my key is {key}; add 1 and 2", author="alice")
        events = await drain(debug)
        chat_events = await drain(chat)
    rendered = [e for e in events if e.kind == "prompt_rendered"]
    assert [e.request for e in rendered] == [1, 2]
    first, second = rendered
    assert first.system == "You are terse." and first.tools == ("add",)
    assert first.messages[-1]["role"] == "user"
    assert first.messages[-1]["content"] == "my key is [redacted:openai-key]; add 1 and 2"
    assert first.messages[-1]["author"] == "alice"
    assert [m["role"] for m in second.messages] == ["user", "assistant", "tool"]
    assert second.messages[1]["tool_calls"][0]["name"] == "add"
    assert second.messages[2]["content"] == "3"
    assert not any(key in event_to_json(e) for e in rendered)
    # Sent as the model got it: the same number of messages, in the same order.
    assert [m.role for m in model.requests[1].messages] == [m["role"] for m in second.messages]
    assert event_from_json(event_to_json(second)) == second
    # Off in the chat profile; and off unless the agent asks for it.
    assert "prompt_rendered" not in [e.kind for e in chat_events]
    plain = Agent(llm=ScriptedModel(), store=SQLiteStore(":memory:"))
    async with plain:
        conv = await plain.create_conversation()
        sub = conv.events()
        await conv.send("hi")
        assert "prompt_rendered" not in [e.kind for e in await drain(sub)]


def test_prompt_events_is_an_agent_key():
    data = {
        "llm": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"},
        "agent": {"prompt_events": True},
    }
    assert parse_config(data).agent.prompt_events is True
    assert TurnPolicy().ask_user is False  # effects ask without the ask_user tool offered
