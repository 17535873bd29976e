"""Interception hooks: every outcome of every hook, with the scripted model."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from pathlib import Path

import pytest

from agentik.bot.app import Bot
from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.bot.config import parse_config
from agentik.core import Agent, SQLiteStore, hookspecs, tool
from agentik.core.errors import PromptRefused, ToolError
from agentik.core.hooks import Abort, Block, Hooks, Refuse, Retry, UseBackend
from agentik.core.hookspecs import hookimpl
from agentik.core.plugins import load_plugins
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.core.tools.base import ToolResult
from agentik.transports.testing import MemoryTransport
from helpers import manual_text

ROOT = Path(__file__).resolve().parent.parent


@tool
async def add(a: int, b: int) -> str:
    """Add two numbers."""
    return str(a + b)


@tool
async def secret() -> str:
    """A tool a plugin hides."""
    return "classified"


async def run(plugins, *texts, model=None, tools=(add,), policy=None, path=None):
    """Send ``texts`` to a fresh agent with ``plugins``; return (model, audit log, events)."""
    model = model or ScriptedModel()
    kwargs = {"policy": policy} if policy else {}
    agent = Agent(
        llm=model,
        store=SQLiteStore(path or ":memory:"),
        tools=tools,
        hooks=plugins,
        **kwargs,
    )
    async with agent:
        conv = await agent.create_conversation()
        events = conv.events()
        for text in texts:
            await conv.send(text, author="alice", author_id="net:alice")
            await conv.wait_idle()
        log = await conv.messages(limit=100)
        got = []
        while True:
            try:
                got.append(await asyncio.wait_for(anext(events), 0.05))
            except TimeoutError:
                break
    return model, log, got


# -- before_prompt ---------------------------------------------------------------------
class Shout:
    @hookimpl
    def before_prompt(self, text):
        return text.upper()


class Polite:
    @hookimpl(tryfirst=True)
    async def before_prompt(self, text, author):
        await asyncio.sleep(0)
        return f"{text} please, says {author}"


class Gate:
    @hookimpl
    def before_prompt(self, conversation, text):
        if "password" in text:
            return Refuse("I do not handle passwords here.")
        return None


async def test_before_prompt_rewrites_in_order_and_the_rewrite_is_stored():
    model, log, _ = await run([Shout(), Polite()], "hello")
    # tryfirst Polite runs first; Shout sees its result.
    assert model.requests[0].messages[-1].content == "HELLO PLEASE, SAYS ALICE"
    assert log[0].content == "HELLO PLEASE, SAYS ALICE"


async def test_before_prompt_refusal_stores_nothing_and_the_channel_hears_why():
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(":memory:"), hooks=[Gate()])
    async with agent:
        conv = await agent.create_conversation()
        with pytest.raises(PromptRefused, match="passwords"):
            await conv.send("my password is hunter2")
        assert await conv.count_messages() == 0
        bridge = Bridge(agent)
        t = MemoryTransport(name="net")
        bridge.attach(t, ChannelOptions(answer="all"))
        await t.start(bridge)
        await t.inject("the password is x", channel_key="net:#a", author="bob")
        await t.inject("hi", channel_key="net:#a", author="bob")
        await bridge.flush("net:#a")
        assert t.texts("error") == ["I do not handle passwords here."]
        assert t.texts("answer") == ["echo: hi"]
        await bridge.aclose()
    assert len(model.requests) == 1


# -- before_llm_request -------------------------------------------------------------------
class Steer:
    def __init__(self, other=None):
        self.other = other

    @hookimpl
    def before_llm_request(self, request):
        messages = (
            *request.messages[:-1],
            dataclasses.replace(request.messages[-1], content="changed"),
        )
        tools = [t for t in request.tools if t.name != "secret"]
        new = dataclasses.replace(request, messages=messages, tools=tools, model="big-model")
        return UseBackend(self.other, new) if self.other else new


async def test_before_llm_request_changes_messages_tools_and_model():
    model, log, _ = await run([Steer()], "original", tools=(add, secret))
    request = model.requests[0]
    assert request.messages[-1].content == "changed"
    assert [t.name for t in request.tools] == ["add"]
    assert request.model == "big-model"
    assert log[0].content == "original"  # the audit log keeps what was said


async def test_before_llm_request_can_switch_backend():
    other = ScriptedModel(default=lambda r: "from the other backend")
    main = ScriptedModel()
    _, log, _ = await run([Steer(other)], "hi", model=main)
    assert main.requests == [] and len(other.requests) == 1
    assert log[-1].content == "from the other backend"


# -- after_response ------------------------------------------------------------------------
class Censor:
    @hookimpl
    def after_response(self, text, tool_calls):
        return text.replace("darn", "d**n") if not tool_calls else None


class Stopper:
    @hookimpl
    async def after_response(self, run_id, text):
        return Abort("the answer leaked a secret") if "SECRET" in text else None


async def test_after_response_replaces_the_text_before_the_channel_sees_it():
    model = ScriptedModel([Reply(text="well darn it", chunks=["well ", "darn ", "it"])])
    model, log, events = await run([Censor()], "hi", model=model)
    deltas = [e.text for e in events if e.kind == "text_delta"]
    assert deltas == ["well d**n it"]  # held back, then sent replaced
    assert log[-1].content == "well d**n it"
    assert next(e for e in events if e.kind == "turn_ended").text == "well d**n it"


async def test_after_response_abort_ends_the_turn_and_records_no_answer():
    model = ScriptedModel(["the SECRET is 42", "fine"])
    model, log, events = await run([Stopper()], "tell me", "again", model=model)
    ended = [e for e in events if e.kind == "turn_ended"]
    assert [e.stop_reason for e in ended] == ["aborted", "stop"]
    error = next(e for e in events if e.kind == "error")
    assert error.message == "turn aborted: the answer leaked a secret"
    assert not any(e.kind == "text_delta" and "SECRET" in e.text for e in events)
    # No answer recorded: the aborted turn's row is its error (empty), then the next answer.
    assert [(m.content, m.status) for m in log if m.kind == "assistant"] == [
        ("", "error"),
        ("fine", "complete"),
    ]


# -- tool hooks ------------------------------------------------------------------------------
class Guard:
    @hookimpl
    def before_tool_call(self, call):
        if call.name == "secret":
            return Block("secrets are off limits")
        if call.name == "add":
            return {"a": 40, "b": 2}
        return None


class Redact:
    @hookimpl
    def after_tool_call(self, call, result):
        return ToolResult(text=f"[{call.name}] {result.text}")


async def test_before_tool_call_blocks_or_replaces_arguments():
    ran = []

    @tool
    async def secret() -> str:
        """Secret."""
        ran.append("secret")
        return "classified"

    model = ScriptedModel(
        [
            Reply(tool_calls=[call("secret"), call("add", {"a": 1, "b": 1})]),
            "done",
        ]
    )
    model, log, events = await run([Guard()], "go", model=model, tools=(add, secret))
    results = {m.tool_name: m.content for m in log if m.kind == "tool_result"}
    assert results == {"secret": "blocked: secrets are off limits", "add": "42"}
    assert ran == []
    started = {e.name: e.arguments for e in events if e.kind == "tool_call_started"}
    assert started["add"] == '{"a": 40, "b": 2}'


async def test_after_tool_call_replaces_the_result():
    model = ScriptedModel([Reply(tool_calls=[call("add", {"a": 2, "b": 3})]), "ok"])
    model, log, _ = await run([Redact()], "go", model=model)
    assert [m.content for m in log if m.kind == "tool_result"] == ["[add] 5"]
    assert [m.content for m in model.requests[1].messages if m.role == "tool"] == ["[add] 5"]


class Retrier:
    def __init__(self, want=True):
        self.want, self.attempts = want, []

    @hookimpl
    def on_tool_error(self, call, error, attempt):
        self.attempts.append((call.name, error.text, attempt))
        return Retry() if self.want else None


async def test_on_tool_error_retries_until_success():
    calls = []

    @tool
    async def flaky() -> str:
        """Fails once."""
        calls.append(1)
        if len(calls) < 2:
            raise ToolError("temporary")
        return "worked"

    retrier = Retrier()
    model = ScriptedModel([Reply(tool_calls=[call("flaky")]), "ok"])
    _, log, _ = await run([retrier], "go", model=model, tools=(flaky,))
    assert len(calls) == 2
    assert retrier.attempts == [("flaky", "error: temporary", 1)]
    assert [m.content for m in log if m.kind == "tool_result"] == ["worked"]


@pytest.mark.parametrize(("want", "expected_calls"), [(True, 3), (False, 1)])
async def test_on_tool_error_retries_are_bounded_and_giving_up_keeps_the_error(
    want, expected_calls
):
    calls = []

    @tool
    async def broken() -> str:
        """Always fails."""
        calls.append(1)
        raise ToolError("down")

    from agentik.core.tools.base import TurnPolicy

    model = ScriptedModel([Reply(tool_calls=[call("broken")]), "sorry"])
    _, log, _ = await run(
        [Retrier(want)], "go", model=model, tools=(broken,), policy=TurnPolicy(max_tool_retries=2)
    )
    assert len(calls) == expected_calls
    (result,) = [m for m in log if m.kind == "tool_result"]
    assert result.is_error and result.content == "error: down"


# -- sessions and transports -------------------------------------------------------------------
class Lifecycle:
    def __init__(self):
        self.seen = []

    @hookimpl
    def session_start(self, conversation):
        self.seen.append(("start", conversation.channel_key))

    @hookimpl
    async def session_end(self, conversation, reason):
        self.seen.append(("end", conversation.channel_key, reason))

    @hookimpl
    def transport_start(self, transport):
        self.seen.append(("transport_start", transport.name))

    @hookimpl
    def transport_stop(self, transport):
        self.seen.append(("transport_stop", transport.name))


async def test_session_start_and_end():
    life = Lifecycle()
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(":memory:"), hooks=[life]) as agent:
        plain = await agent.create_conversation()
        await agent.conversation_for_channel("net:#a")
        current = await agent.new_conversation_for_channel("net:#a")
        await agent.delete_conversation(plain.id)
        assert current.channel_key == "net:#a"  # still open when the agent closes
    assert life.seen == [
        ("start", None),
        ("start", "net:#a"),
        ("start", "net:#a"),
        ("end", "net:#a", "reset"),
        ("end", None, "deleted"),
        ("end", "net:#a", "closed"),
    ]


async def test_transport_start_and_stop(tmp_path):
    life = Lifecycle()
    config = parse_config(
        {"llm": {"backend": "scripted"}, "storage": {"path": str(tmp_path / "b.db")}}
    )
    registry = load_plugins([life])
    t = MemoryTransport(name="mem")
    async with Bot(config, registry=registry, transports={"mem": t}):
        assert life.seen == [("transport_start", "mem")]
    assert life.seen == [("transport_start", "mem"), ("transport_stop", "mem")]


# -- the rules every hook follows -------------------------------------------------------------
class Crashes:
    @hookimpl(tryfirst=True)
    def before_prompt(self, text):
        raise ValueError("plugin bug")


async def test_a_crashing_hook_is_logged_with_its_plugin_and_the_turn_goes_on(caplog):
    model, log, _ = await run([Crashes(), Shout()], "hi")
    assert "plugin 'Crashes' failed in hook before_prompt" in caplog.text
    assert log[0].content == "HI" and log[-1].content == "echo: HI"


class Last:
    def __init__(self, seen):
        self.seen = seen

    @hookimpl(trylast=True)
    def before_prompt(self, text):
        self.seen.append("last")


class First:
    def __init__(self, seen):
        self.seen = seen

    @hookimpl(tryfirst=True)
    def before_prompt(self, text):
        self.seen.append("first")


class Middle:
    def __init__(self, seen):
        self.seen = seen

    @hookimpl
    def before_prompt(self, text):
        self.seen.append("middle")


async def test_order_is_tryfirst_then_registration_then_trylast():
    seen: list[str] = []
    await run([Last(seen), First(seen), Middle(seen)], "x")
    assert seen == ["first", "middle", "last"]


async def test_trace_switch_logs_every_interception_call(caplog, monkeypatch):
    monkeypatch.setenv("AGENTIK_TRACE_HOOKS", "1")
    caplog.set_level(logging.DEBUG, logger="agentik.hooks")
    hooks = Hooks.of([Shout()])
    assert hooks.trace
    await run(hooks, "hi")
    assert re.search(r"hook before_prompt plugin=Shout call\(text\)", caplog.text)
    assert "hook before_prompt plugin=Shout result='HI'" in caplog.text


def test_no_plugins_means_no_hook_work():
    hooks = Hooks()
    assert not hooks.implemented("before_prompt")


# -- the contract stays honest ----------------------------------------------------------------
def _hook_names():
    return sorted(n for n, f in vars(hookspecs).items() if hasattr(f, "agentik_spec"))


def test_every_hook_is_documented_in_the_manual():
    manual = manual_text()
    missing = [n for n in _hook_names() if not re.search(rf"`{n}[`(]", manual)]
    assert not missing, f"hooks missing from the manual (docs/): {missing}"


def test_every_hook_has_a_test_implementing_it():
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    missing = [n for n in _hook_names() if not re.search(rf"def {n}\(", sources)]
    assert not missing, f"hooks no test implements: {missing}"
