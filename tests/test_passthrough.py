"""Passthrough tools (``[[passthrough]]``): a tool that calls an MCP tool of the in-suite
MCP server (tests/mcp_server.py, a real stdio subprocess) directly, with fixed
arguments and the caller's validated against the target's JSON Schema."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agentik.bot.builder import AgentBuilder, mcp_toolset
from agentik.bot.config import parse_config
from agentik.core import SQLiteStore
from agentik.core.errors import ConfigError
from agentik.core.events import ToolCallEnded
from agentik.core.memory import NoMemory
from agentik.core.testing.scripted import Reply, ScriptedModel, call

from rigs import joined

pytest_plugins = ["ircservers"]

SERVER = str(Path(__file__).with_name("mcp_server.py"))

CONFIG = {
    "mcp": {
        "servers": [{"name": "calc", "command": sys.executable, "args": [SERVER], "timeout": 20}]
    },
    "passthrough": [
        {
            "name": "add_ten",
            "tool": "calc__add",
            "description": "Add ten to a number",
            "arguments": {"b": 10},
        },
        {"name": "nap", "tool": "calc__slow", "defaults": {"seconds": 0}},
        {"name": "ghost", "tool": "calc__no_such_tool"},
    ],
}


async def run_turn(tmp_path, *calls) -> tuple[ScriptedModel, list[ToolCallEnded]]:
    config = parse_config(CONFIG)
    model = ScriptedModel()
    builder = (
        AgentBuilder()
        .llm(model)
        .storage(SQLiteStore(str(tmp_path / "agent.db")))
        .memory(NoMemory())
        .toolset(mcp_toolset(config))
        .passthrough(*config.passthrough)
    )
    model.enqueue(Reply(tool_calls=list(calls)))
    model.enqueue(Reply(text="done"))
    async with builder.build() as agent:
        conv = await agent.create_conversation()
        events = conv.events(kinds=["tool_call_ended", "turn_ended"])
        await conv.send("go")
        ended: list[ToolCallEnded] = []
        async for e in events:
            if e.kind == "turn_ended":
                break
            ended.append(e)
        await events.aclose()
    return model, ended


async def test_a_passthrough_tool_is_offered_and_reaches_the_mcp_server(tmp_path):
    model, ended = await run_turn(tmp_path, call("add_ten", {"a": 5}, id="k1"))
    offered = {t.name: t for t in model.requests[0].tools}
    # Offered with the target's schema minus the fixed argument; a tool whose
    # target does not exist is not offered.
    assert offered["add_ten"].description == "Add ten to a number"
    assert set(offered["add_ten"].parameters["properties"]) == {"a"}
    assert offered["add_ten"].parameters["required"] == ["a"]
    assert "ghost" not in offered
    # A defaulted argument becomes optional.
    assert (
        "required" not in offered["nap"].parameters
        or "seconds" not in offered["nap"].parameters["required"]
    )
    # The MCP server did the sum: 5 + the fixed 10.
    assert [(e.name, e.result, e.is_error) for e in ended] == [("add_ten", "15", False)]
    # One model request for the call, one for the answer: the passthrough itself asks no model.
    assert len(model.requests) == 2
    tool_msg = next(m for m in model.requests[1].messages if m.role == "tool")
    assert tool_msg.content == "15"


async def test_defaults_apply_and_the_caller_may_override_them(tmp_path):
    started = tmp_path / "started"
    _, ended = await run_turn(
        tmp_path,
        call("nap", {"started": str(started)}, id="k1"),
        call("nap", {"seconds": 0.01}, id="k2"),
    )
    assert {e.call_id: e.result for e in ended} == {"k1": "slept 0.0", "k2": "slept 0.01"}
    assert started.read_text() == "started"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"seconds": "long", "started": "FILE"}, "nap: argument 'seconds': 'long' is not of type"),
        ({"started": 5, "seconds": 0}, "nap: argument 'started': 5 is not of type 'string'"),
        (
            {"started": "FILE", "oops": 1},
            "nap: unknown argument 'oops' (arguments: seconds, started)",
        ),
    ],
)
async def test_a_bad_argument_is_a_clear_tool_error_and_the_target_is_not_called(
    tmp_path, arguments, message
):
    started = tmp_path / "started"
    arguments = {k: str(started) if v == "FILE" else v for k, v in arguments.items()}
    _, ended = await run_turn(tmp_path, call("nap", arguments, id="k1"))
    [e] = ended
    assert e.is_error and message in e.result, e.result
    assert not started.exists()  # the MCP tool never ran


async def test_fixed_arguments_cannot_be_changed_and_required_ones_are_named(tmp_path):
    _, ended = await run_turn(
        tmp_path,
        call("add_ten", {"a": 1, "b": 3}, id="k1"),
        call("add_ten", {}, id="k2"),
        call("add_ten", {"a": 1, "b": 10}, id="k3"),
    )
    by_id = {e.call_id: e for e in ended}
    assert (
        by_id["k1"].is_error and "argument 'b' is fixed by the configuration" in by_id["k1"].result
    )
    assert by_id["k2"].is_error
    assert "add_ten: arguments: 'a' is a required property" in by_id["k2"].result
    # Giving the fixed value itself is not an error.
    assert (by_id["k3"].result, by_id["k3"].is_error) == ("11", False)


def test_bad_passthrough_declarations_name_the_key():
    with pytest.raises(ConfigError, match=r"passthrough\.0\.tool"):
        parse_config({"passthrough": [{"name": "x"}]})
    with pytest.raises(ConfigError, match=r"passthrough\.0\.name"):
        parse_config({"passthrough": [{"name": "bad name!", "tool": "t"}]})
    with pytest.raises(ConfigError, match=r"passthrough\.0\.argumentz"):
        parse_config({"passthrough": [{"name": "x", "tool": "t", "argumentz": {}}]})
    with pytest.raises(ConfigError, match=r"passthrough\.1\.name: two passthrough tools"):
        parse_config({"passthrough": [{"name": "x", "tool": "t"}, {"name": "x", "tool": "u"}]})


def test_a_fixed_argument_that_does_not_fit_the_schema_is_reported_without_its_value():
    from agentik.core.errors import ToolError
    from agentik.core.tools.base import FunctionTool
    from agentik.core.tools.passthrough import PassthroughSpec, PassthroughToolset

    async def target(token: str) -> str:
        return token

    t = FunctionTool(
        target,
        name="t",
        parameters={"type": "object", "properties": {"token": {"type": "string"}}},
    )
    spec = PassthroughSpec(name="p", tool="t", arguments={"token": 123456789})
    [p] = PassthroughToolset([spec], [t]).tools()
    with pytest.raises(ToolError) as info:
        p.prepare({})  # type: ignore[attr-defined]
    assert "configured argument 'token'" in str(info.value)
    assert "123456789" not in str(info.value)
    assert json.dumps(p.parameters) == json.dumps({"type": "object", "properties": {}})


# -- !tool in a channel, over a real IRC server -------------------------------------------


async def test_people_run_passthrough_tools_with_the_tool_command(miniircd, tmp_path):

    from agentik.bot.bridge import Bridge, ChannelOptions
    from agentik.core import Agent, tool
    from agentik.core.approvals import ApprovalRule
    from agentik.core.tools.passthrough import PassthroughSpec, PassthroughToolset
    from agentik.transports.irc.transport import IRCTransport

    from ircservers import IRCTestClient

    @tool(
        parameters={
            "type": "object",
            "properties": {"tz": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["tz"],
        }
    )
    async def clock(tz: str, n: int = 1) -> str:
        return f"{n} o'clock in {tz}"

    @tool
    async def vault() -> str:
        return "the vault is open"

    specs = [
        PassthroughSpec(
            name="utc_now", tool="clock", description="UTC time", arguments={"tz": "UTC"}
        ),
        PassthroughSpec(name="risky", tool="clock", defaults={"tz": "X"}),
        PassthroughSpec(name="peek", tool="vault"),  # its target is not allowed here
    ]
    model = ScriptedModel()
    agent = Agent(
        llm=model,
        store=SQLiteStore(str(tmp_path / "t.db")),
        tools=[clock, vault],
        toolsets=[PassthroughToolset(specs, [clock, vault])],
        approvals=[ApprovalRule(tools=("risky",))],
    )
    await agent.start()
    bridge = Bridge(agent)
    transport = IRCTransport(
        name="testnet",
        settings={"host": "127.0.0.1", "port": miniircd.port, "nick": "agentik", "tls": False,
                  "channels": ["#t"], "flood_burst": 50, "flood_rate": 500.0},
    )  # fmt: skip
    options = ChannelOptions(
        command_prefix="!", allowed_tools=("utc_now", "clock", "risky", "peek")
    )
    bridge.attach(transport, options)
    await transport.start(bridge)
    alice = None
    try:
        await joined(transport, "#t")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        await alice.join("#t")

        async def ask(text: str) -> str:
            alice.privmsg("#t", text)
            line = await alice.wait_for(
                lambda m: m.command in ("PRIVMSG", "NOTICE") and (m.nick or "") == "agentik"
            )
            return line.text

        listed = await ask("!tool")
        assert "utc_now — UTC time" in listed and "risky" in listed and "peek" not in listed
        assert await ask("!tool utc_now") == "1 o'clock in UTC"
        assert await ask("!tool utc_now n=3") == "3 o'clock in UTC"
        assert await ask('!tool utc_now {"n": 4}') == "4 o'clock in UTC"
        assert "argument 'tz' is fixed by the configuration" in await ask("!tool utc_now tz=CET")
        assert "argument 'n': 'many' is not of type 'integer'" in await ask("!tool utc_now n=many")
        assert "write key=value" in await ask("!tool utc_now 3")
        assert "needs a person's approval" in await ask("!tool risky")
        assert "no passthrough tool 'peek' here" in await ask("!tool peek")
        assert "no passthrough tool 'vault' here" in await ask("!tool vault")
        # No model was asked for any of it.
        assert model.requests == []
    finally:
        if alice is not None:
            await alice.close()
        await transport.aclose()
        await bridge.aclose()
        await agent.aclose()


def test_a_passthrough_cannot_bypass_an_approval_its_target_needs():
    base = {"passthrough": [{"name": "push_main", "tool": "git__push"}]}
    with pytest.raises(ConfigError, match=r"passthrough\.0\.tool: git__push needs approval"):
        parse_config({**base, "approvals": [{"tools": ["git__*"]}]})
    # Named by a rule of its own (or the same one): accepted.
    parse_config({**base, "approvals": [{"tools": ["git__*", "push_main"]}]})
    parse_config({**base, "approvals": [{"tools": ["push_*"]}, {"tools": ["git__*"]}]})
    # An exception for the target: nothing to bypass.
    parse_config(
        {**base, "approvals": [{"tools": ["git__push"], "approve": "never"}, {"tools": ["*"]}]}
    )
