"""MCP tools against real MCP servers: our test server (stdio and streamable
HTTP) and ``mcp-server-time``.  No mocks: real processes, real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentik.core import Agent, OpenAIBackend, SQLiteStore
from agentik.core.compaction import SUMMARY_PROMPT, estimate_tokens
from agentik.core.errors import ToolError
from agentik.core.llm.base import ToolSpec
from agentik.core.testing.openai_server import Reply as OpenAIReply
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.core.tools.base import ToolContext
from agentik.core.tools.mcp import MCPServerConfig, MCPToolset
from helpers import in_ci

from rigs import eventually, free_port

SERVER = str(Path(__file__).with_name("mcp_server.py"))
CTX = ToolContext(conversation_id="c", run_id="r", call_id="k")


def stdio(name: str = "calc", **kw) -> MCPServerConfig:
    kw.setdefault("restart_min", 0.05)
    kw.setdefault("restart_max", 0.5)
    kw.setdefault("timeout", 20.0)
    kw.setdefault("args", (SERVER,))
    return MCPServerConfig(name=name, command=sys.executable, **kw)


def gone(pid: int) -> bool:
    """The process no longer exists (not even as a zombie)."""
    return not os.path.exists(f"/proc/{pid}")


def by_name(toolset: MCPToolset) -> dict:
    return {t.name: t for t in toolset.tools()}


def status(toolset: MCPToolset, name: str) -> dict:
    return next(s for s in toolset.status() if s["name"] == name)


@pytest.fixture
async def calc() -> AsyncIterator[MCPToolset]:
    toolset = MCPToolset([stdio(deny=("secret_*",))])
    await toolset.start()
    try:
        yield toolset
    finally:
        await toolset.aclose()


async def test_stdio_tools_and_result_mapping(calc):
    tools = by_name(calc)
    assert "calc__add" in tools and "calc__echo" in tools
    assert all(name.startswith("calc__") for name in tools)
    assert "calc__secret_tool" not in tools  # denied
    add = tools["calc__add"]
    assert add.description == "Add two integers."
    assert add.parameters["type"] == "object"
    assert set(add.parameters["properties"]) == {"a", "b"}

    result = await add.call({"a": 2, "b": 40}, CTX)
    assert not result.is_error
    assert result.data == {"result": 42}  # structured content kept for the log
    assert result.text == "42"  # the text only: its structured twin is not sent again

    echoed = await tools["calc__echo"].call({"text": "hi there"}, CTX)
    assert echoed.text.splitlines()[0] == "hi there"

    failed = await tools["calc__fail"].call({}, CTX)
    assert failed.is_error and "this tool always fails" in failed.text

    img = await tools["calc__image"].call({}, CTX)
    assert img.text.startswith("[image image/png, ") and img.text.endswith(" bytes]")
    res = await tools["calc__resource"].call({}, CTX)
    assert res.text == "[resource file:///x (text/plain)]\nhello"  # the text reaches the model

    st = status(calc, "calc")
    assert st["state"] == "connected" and st["error"] is None and st["pid"] > 0
    assert "calc__add" in st["tools"]


async def test_allow_and_deny_globs():
    toolset = MCPToolset([stdio(allow=("a*", "echo", "secret_*"), deny=("secret_*", "add_tool"))])
    await toolset.start()
    try:
        assert sorted(by_name(toolset)) == ["calc__add", "calc__echo"]
    finally:
        await toolset.aclose()


async def test_conversation_calls_mcp_tool_and_denied_tool_is_unknown(tmp_path):
    toolset = MCPToolset([stdio(deny=("secret_*",))])
    model = ScriptedModel()
    model.enqueue(
        Reply(tool_calls=[call("calc__add", {"a": 20, "b": 22}, id="c1")]),
        Reply(tool_calls=[call("calc__secret_tool", {}, id="c2")]),
        "the answer is 42",
    )
    if "toolsets" in inspect.signature(Agent.__init__).parameters:
        agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "a.db")), toolsets=[toolset])
    else:  # pragma: no cover - older Agent
        await toolset.start()
        agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "a.db")), tools=toolset.tools())
    try:
        async with agent:
            offered = {t.name for t in agent.tools} if hasattr(agent, "tools") else set()
            assert "calc__add" in offered and "calc__secret_tool" not in offered
            conv = await agent.create_conversation()
            await conv.send("what is 20 + 22?")
            await conv.wait_idle()
    finally:
        await toolset.aclose()
    second = model.requests[1].messages
    tool_msg = next(m for m in second if m.role == "tool" and m.tool_call_id == "c1")
    assert tool_msg.content.splitlines()[0] == "42" and not tool_msg.is_error
    assert any(t.name == "calc__add" for t in model.requests[0].tools)
    assert all(t.name != "calc__secret_tool" for t in model.requests[0].tools)
    third = model.requests[2].messages
    refused = next(m for m in third if m.role == "tool" and m.tool_call_id == "c2")
    assert refused.is_error and "unknown tool 'calc__secret_tool'" in refused.content
    assert len([m for m in third if m.role == "tool"]) == 2


async def test_tools_list_changed_refreshes_tools(calc):
    added = await by_name(calc)["calc__add_tool"].call({"name": "fresh"}, CTX)
    assert not added.is_error
    await eventually(lambda: "calc__fresh" in by_name(calc), "the new tool to be listed")
    result = await by_name(calc)["calc__fresh"].call({}, CTX)
    assert result.text.splitlines()[0] == "I am fresh"


async def test_killed_between_calls_restarts(calc):
    pid_tool = by_name(calc)["calc__pid"]
    first = (await pid_tool.call({}, CTX)).data["result"]
    assert status(calc, "calc")["pid"] == first
    os.kill(first, signal.SIGKILL)
    # The toolset notices the death by itself (no call needed) ...
    await eventually(lambda: status(calc, "calc")["pid"] != first, "the death to be noticed")
    # ... and the next call waits for the restart and works.
    second = (await pid_tool.call({}, CTX)).data["result"]
    assert second != first
    assert status(calc, "calc")["state"] == "connected"
    assert status(calc, "calc")["pid"] == second
    await eventually(lambda: gone(first), "the killed process to be reaped")


async def test_crash_during_call_then_next_call_works(calc):
    tools = by_name(calc)
    old = status(calc, "calc")["pid"]
    with pytest.raises(ToolError, match=r"MCP server 'calc' stopped: .*; restarting"):
        await tools["calc__crash"].call({}, CTX)
    assert status(calc, "calc")["state"] in ("restarting", "starting", "connected")
    result = await tools["calc__add"].call({"a": 1, "b": 1}, CTX)
    assert result.data == {"result": 2}
    assert status(calc, "calc")["pid"] != old
    await eventually(lambda: gone(old), "the crashed process to be reaped")


async def test_slow_call_times_out_and_session_survives():
    # The limit applies to every call, so the echo below must fit in it even on a
    # loaded machine: a few seconds, not one.
    toolset = MCPToolset([stdio(timeout=5.0)])
    await toolset.start()
    try:
        tools = by_name(toolset)
        with pytest.raises(ToolError, match=r"MCP server 'calc' did not answer within 5s"):
            await tools["calc__slow"].call({"seconds": 300}, CTX)
        pid = status(toolset, "calc")["pid"]
        result = await tools["calc__echo"].call({"text": "still here"}, CTX)
        assert result.text.startswith("still here")
        assert status(toolset, "calc")["pid"] == pid
    finally:
        await toolset.aclose()


async def test_missing_command_fails_alone():
    toolset = MCPToolset(
        [
            MCPServerConfig(name="broken", command="/nonexistent/agentik-mcp-server"),
            stdio(),
        ]
    )
    await toolset.start()
    try:
        broken = status(toolset, "broken")
        assert broken["state"] == "failed" and broken["tools"] == []
        assert "agentik-mcp-server" in broken["error"]
        assert all(not name.startswith("broken__") for name in by_name(toolset))
        result = await by_name(toolset)["calc__add"].call({"a": 3, "b": 4}, CTX)
        assert result.data == {"result": 7}
    finally:
        await toolset.aclose()


async def test_lazy_server_connects_on_first_use():
    toolset = MCPToolset([stdio(startup="lazy")])
    await toolset.start()
    try:
        assert status(toolset, "calc")["state"] == "lazy"
        tools = {t.name: t for t in await toolset.refresh()}
        assert status(toolset, "calc")["state"] == "connected"
        assert (await tools["calc__add"].call({"a": 1, "b": 2}, CTX)).data == {"result": 3}
    finally:
        await toolset.aclose()


async def test_aclose_leaves_no_process_and_no_task(tmp_path):
    before = asyncio.all_tasks()
    toolset = MCPToolset([stdio("one"), stdio("two"), stdio("three", startup="lazy")])
    await toolset.start()
    await toolset.refresh()
    pids = [s["pid"] for s in toolset.status()]
    assert all(isinstance(p, int) for p in pids) and len(set(pids)) == 3
    started = tmp_path / "started"
    args = {"seconds": 30, "started": str(started)}
    slow = asyncio.create_task(by_name(toolset)["one__slow"].call(args, CTX))
    await eventually(started.exists, "the slow call to be running")  # closed with a call in flight
    await toolset.aclose()
    with contextlib.suppress(ToolError):
        await slow
    assert [s["state"] for s in toolset.status()] == ["closed"] * 3
    await eventually(lambda: all(gone(p) for p in pids), "the server processes to end")
    assert asyncio.all_tasks() == before


# -- streamable HTTP -------------------------------------------------------------------


class HTTPServer:
    """An MCP server over streamable HTTP (ours by default), as a real process on
    127.0.0.1 that a test can stop and start again on the same port."""

    def __init__(self, argv: tuple[str, ...] | None = None) -> None:
        self.port = free_port()
        ours = (sys.executable, SERVER, "--transport", "http", "--port", str(self.port))
        self.argv = argv or ours
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self) -> HTTPServer:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PORT": str(self.port)},  # how server-everything takes it
        )
        await wait_port(self.port, self.proc)
        return self

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            async with asyncio.timeout(60):
                await proc.wait()
        except TimeoutError:  # pragma: no cover
            proc.kill()
            await proc.wait()


async def wait_port(port: int, proc: asyncio.subprocess.Process | None = None) -> None:
    """Wait until something accepts connections on ``port`` (60 s against hangs)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if (proc is not None and proc.returncode is not None) or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP MCP server on port {port} did not start") from None
            await asyncio.sleep(0.05)
        else:
            writer.close()
            await writer.wait_closed()
            return


@pytest.fixture
async def http_proc() -> AsyncIterator[HTTPServer]:
    server = await HTTPServer().start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def http_server(http_proc) -> AsyncIterator[str]:
    yield http_proc.url


def web(url: str, name: str = "web", **kw) -> MCPServerConfig:
    kw.setdefault("restart_min", 0.05)
    kw.setdefault("restart_max", 0.5)
    kw.setdefault("timeout", 20.0)
    return MCPServerConfig(name=name, url=url, **kw)


async def test_streamable_http_server(http_server):
    cfg = MCPServerConfig(
        name="web",
        url=http_server,
        bearer_token="tok-very-secret",
        headers={"X-Test": "1"},
        deny=("secret_*",),
    )
    assert "tok-very-secret" not in repr(cfg)
    toolset = MCPToolset([cfg])
    await toolset.start()
    try:
        st = status(toolset, "web")
        assert st["state"] == "connected", st
        assert "pid" not in st
        tools = by_name(toolset)
        assert "web__add" in tools and "web__secret_tool" not in tools
        assert (await tools["web__add"].call({"a": 5, "b": 6}, CTX)).data == {"result": 11}
        failed = await tools["web__fail"].call({}, CTX)
        assert failed.is_error
        img = await tools["web__image"].call({}, CTX)
        assert img.text.startswith("[image image/png")
    finally:
        await toolset.aclose()
    assert status(toolset, "web")["state"] == "closed"


async def test_http_session_forgotten_new_session_and_the_call_goes_through(http_proc, caplog):
    caplog.set_level(logging.INFO, logger="agentik.core.tools.mcp")
    toolset = MCPToolset([web(http_proc.url)])
    await toolset.start()
    try:
        tools = by_name(toolset)
        assert (await tools["web__forget_sessions"].call({}, CTX)).text == "forgotten"
        # The next call carries the forgotten session ID: the server answers 404
        # "Session not found"; a new session is initialised and the call is sent again.
        assert (await tools["web__add"].call({"a": 1, "b": 2}, CTX)).data == {"result": 3}
        assert "no longer knows our session (HTTP 404)" in caplog.text
        assert status(toolset, "web")["state"] == "connected"
        assert (await tools["web__add"].call({"a": 2, "b": 2}, CTX)).data == {"result": 4}
    finally:
        await toolset.aclose()


async def test_http_server_restarted_while_idle_next_call_works(http_proc):
    toolset = MCPToolset([web(http_proc.url)])
    await toolset.start()
    try:
        pid_tool = by_name(toolset)["web__pid"]
        first = (await pid_tool.call({}, CTX)).data["result"]
        await http_proc.stop()
        await http_proc.start()  # same port, a new process that knows no session
        second = (await pid_tool.call({}, CTX)).data["result"]
        assert http_proc.proc is not None and second == http_proc.proc.pid != first
        assert status(toolset, "web")["state"] == "connected"
    finally:
        await toolset.aclose()


async def test_http_server_down_clear_error_then_tools_come_back(http_proc, caplog):
    caplog.set_level(logging.INFO, logger="agentik.core.tools.mcp")
    toolset = MCPToolset([web(http_proc.url)])
    await toolset.start()
    try:
        add = by_name(toolset)["web__add"]
        assert (await add.call({"a": 1, "b": 1}, CTX)).data == {"result": 2}
        await http_proc.stop()
        for _ in range(2):  # the call that finds it gone, and one while it stays down
            with pytest.raises(ToolError) as info:
                await add.call({"a": 1, "b": 2}, CTX)
            assert str(info.value).startswith("MCP server 'web' is unavailable (")
            assert str(info.value).endswith("; retrying")
            assert len(str(info.value)) < 200
        # Its tools stay offered: the model gets that error, not "unknown tool".
        assert "web__add" in by_name(toolset)
        assert status(toolset, "web")["state"] == "restarting"
        assert "failed to start" not in caplog.text
        await http_proc.start()
        # Retried with backoff in the background: it comes back by itself.
        await eventually(
            lambda: status(toolset, "web")["state"] == "connected", "the server to be back"
        )
        assert (await by_name(toolset)["web__add"].call({"a": 2, "b": 3}, CTX)).data == {
            "result": 5
        }
        back = [r for r in caplog.records if "mcp web: back" in r.getMessage()]
        lost = [r for r in caplog.records if "is unavailable" in r.getMessage()]
        assert back and lost and back[0].levelno == lost[0].levelno == logging.WARNING
    finally:
        await toolset.aclose()


async def test_http_server_down_at_start_connects_when_it_comes_up(caplog):
    caplog.set_level(logging.INFO, logger="agentik.core.tools.mcp")
    server = HTTPServer()
    toolset = MCPToolset([web(server.url)])
    await toolset.start()
    try:
        st = status(toolset, "web")
        assert st["state"] == "failed" and "ConnectError" in st["error"]
        await server.start()
        await eventually(
            lambda: status(toolset, "web")["state"] == "connected", "the server to be up"
        )
        assert (await by_name(toolset)["web__add"].call({"a": 4, "b": 4}, CTX)).data == {
            "result": 8
        }
    finally:
        await toolset.aclose()
        await server.stop()
    failed = [r for r in caplog.records if "failed to start" in r.getMessage()]
    back = [r for r in caplog.records if "mcp web: back, 13 tools" in r.getMessage()]
    assert len(failed) == 1 and back and back[0].levelno == failed[0].levelno == logging.ERROR


async def test_startup_logs_one_info_line_per_server(caplog):
    caplog.set_level(logging.INFO, logger="agentik.core.tools.mcp")
    toolset = MCPToolset([stdio("one", deny=("secret_*",)), stdio("two")])
    await toolset.start()
    await toolset.aclose()
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert "mcp one: 12 tools" in lines and "mcp two: 13 tools" in lines


async def test_stdout_noise_is_one_short_warning_and_the_server_keeps_working(caplog):
    caplog.set_level(logging.DEBUG)
    toolset = MCPToolset([stdio(args=(SERVER, "--banner", "5"))])
    await toolset.start()
    try:
        echoed = await by_name(toolset)["calc__echo"].call({"text": "still fine"}, CTX)
        assert echoed.text == "still fine"
    finally:
        await toolset.aclose()
    noise = [r for r in caplog.records if "not JSON-RPC" in r.getMessage()]
    assert len(noise) == 1 and noise[0].levelno == logging.WARNING
    assert "'calc'" in noise[0].getMessage()
    assert "agentik-test server starting (1/5)" in noise[0].getMessage()
    assert all(r.exc_info is None for r in caplog.records)
    assert "Traceback" not in caplog.text


async def test_model_gets_resource_text_and_structured_results_once(openai_server, db_path):
    toolset = MCPToolset([stdio()])
    openai_server.enqueue(
        OpenAIReply.tool_calls(
            [
                ("c1", "calc__resource", "{}"),
                ("c2", "calc__echo", '{"text": "hi there"}'),
                ("c3", "calc__record", '{"name": "box"}'),
                ("c4", "calc__blob", "{}"),
            ]
        ),
        OpenAIReply.text("done"),
    )
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url)
    try:
        async with Agent(llm=llm, store=SQLiteStore(db_path), toolsets=[toolset]) as agent:
            conv = await agent.create_conversation()
            await conv.send("use the tools")
            await conv.wait_idle()
    finally:
        await toolset.aclose()
    # What the model received in the request after the tool calls.
    sent = openai_server.requests[1]["messages"]
    results = {m["tool_call_id"]: m["content"] for m in sent if m["role"] == "tool"}
    assert results["c1"] == "[resource file:///x (text/plain)]\nhello"
    assert results["c2"] == "hi there"  # not "hi there" plus {"result": "hi there"}
    assert json.loads(results["c3"]) == {"name": "box", "size": 3}  # one copy
    assert results["c4"].startswith("[resource file:///y.png: image/png, ")


# -- many tool schemas and the context budget ---------------------------------------------


def four_servers() -> list[MCPServerConfig]:
    """Four servers, 52 tools with descriptions as long as real servers write them."""
    return [
        MCPServerConfig(name=n, command=sys.executable, args=(SERVER, "--long-docs"), timeout=20)
        for n in ("fs", "git", "web", "notes")
    ]


async def test_many_tool_schemas_short_turns_do_not_compact_by_default(openai_server, db_path):
    toolset = MCPToolset(four_servers())
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url)  # window unknown
    turns = 20
    try:
        async with Agent(llm=llm, store=SQLiteStore(db_path), toolsets=[toolset]) as agent:
            conv = await agent.create_conversation()
            for i in range(turns):
                await conv.send(f"short question number {i}, please answer briefly")
                await conv.wait_idle()
            specs = [ToolSpec(name=t.name, description=t.description, parameters=t.parameters)
                     for t in toolset.tools()]  # fmt: skip
    finally:
        await toolset.aclose()
    assert len(specs) == 52
    summaries = [r for r in openai_server.requests if SUMMARY_PROMPT[:30] in json.dumps(r)]
    assert not summaries and len(openai_server.requests) == turns
    last = openai_server.requests[-1]
    assert len(last["tools"]) == 52
    assert "short question number 0" in json.dumps(last["messages"])  # nothing dropped
    # The scene of the report: the old default (8192) would have compacted here.
    assert estimate_tokens([], None, specs) > 0.6 * 8192


async def test_a_known_small_window_still_forces_fitting(db_path):
    toolset = MCPToolset(four_servers())
    await toolset.start()
    specs = [ToolSpec(name=t.name, description=t.description, parameters=t.parameters)
             for t in toolset.tools()]  # fmt: skip
    window = estimate_tokens([], None, specs) + 400  # room for a few turns only
    model = ScriptedModel(context_window=window)
    try:
        async with Agent(llm=model, store=SQLiteStore(db_path), toolsets=[toolset]) as agent:
            conv = await agent.create_conversation()
            for i in range(20):
                await conv.send(f"short question number {i}, please answer briefly")
                await conv.wait_idle()
    finally:
        await toolset.aclose()
    summaries = [r for r in model.requests if (r.system or "").startswith(SUMMARY_PROMPT[:30])]
    assert summaries and not model.refused
    last = model.requests[-1]
    assert len(last.tools) == 52 and "number 19," in last.messages[-1].content
    assert estimate_tokens(last.messages, last.system, last.tools) <= window
    assert all(not (m.role == "user" and "number 0," in m.content) for m in last.messages)


# -- a third-party server ----------------------------------------------------------------


def time_server() -> MCPServerConfig:
    exe = Path(sys.executable).with_name("mcp-server-time")
    if exe.exists():
        return MCPServerConfig(name="time", command=str(exe), timeout=30)
    if shutil.which("mcp-server-time") is None:  # pragma: no cover
        return MCPServerConfig(name="time", command=sys.executable, args=("-m", "mcp_server_time"))
    return MCPServerConfig(name="time", command="mcp-server-time", timeout=30)  # pragma: no cover


async def test_mcp_server_time():
    toolset = MCPToolset([time_server()])
    await toolset.start()
    try:
        st = status(toolset, "time")
        assert st["state"] == "connected", st
        tools = by_name(toolset)
        assert "time__get_current_time" in tools
        result = await tools["time__get_current_time"].call({"timezone": "UTC"}, CTX)
        assert not result.is_error
        assert "UTC" in result.text
        pid = st["pid"]
    finally:
        await toolset.aclose()
    await eventually(lambda: gone(pid), "mcp-server-time to end")


def test_agentik_mcp_list_shows_status_and_tools(tmp_path):
    """The CLI connects to every configured server: a good one, a denied tool, a bad one."""
    import os
    import subprocess
    import sys

    server = os.path.join(os.path.dirname(__file__), "mcp_server.py")
    config = tmp_path / "bot.toml"
    config.write_text(
        f"""
[storage]
path = ":memory:"
[mcp]
startup = "lazy"
[[mcp.servers]]
name = "calc"
command = "{sys.executable}"
args = ["{server}", "--transport", "stdio"]
deny = ["secret_*"]
[[mcp.servers]]
name = "broken"
command = "/nonexistent/mcp-server"
"""
    )
    exe = os.path.join(os.path.dirname(sys.executable), "agentik")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    result = subprocess.run(
        [exe, "mcp", "list", "-c", str(config)], capture_output=True, text=True, env=env,
        timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr  # one server failed
    out = result.stdout
    assert "calc: connected" in out and "  calc__add" in out
    assert "secret_tool" not in out
    assert "broken: failed" in out and "nonexistent" in out
    assert "Traceback" not in result.stderr


# -- the npm reference server ---------------------------------------------------------------
#: ``make mcp-servers`` (part of ``make test``) installs it here with npm.
EVERYTHING = (
    Path(__file__).resolve().parent.parent
    / ".npm-tools/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)


def require_everything() -> str:
    """node, when it and server-everything are installed; else skip (CI=true: fail)."""
    node = shutil.which("node")
    problem = None
    if node is None:
        problem = "node is not installed: the server-everything MCP tests need it"
    elif not EVERYTHING.exists():
        problem = "@modelcontextprotocol/server-everything is missing (run `make mcp-servers`)"
    if problem is not None:
        if in_ci():
            pytest.fail(f"{problem} (CI=true: `make test` installs it)", pytrace=False)
        pytest.skip(problem)
    assert node is not None
    return node


@contextlib.asynccontextmanager
async def everything(transport: str) -> AsyncIterator[tuple[MCPServerConfig, HTTPServer | None]]:
    node = require_everything()
    if transport == "stdio":
        yield MCPServerConfig(name="ev", command=node, args=(str(EVERYTHING), "stdio")), None
        return
    server = await HTTPServer((node, str(EVERYTHING), "streamableHttp")).start()
    try:
        yield web(server.url, name="ev"), server
    finally:
        await server.stop()


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_server_everything_tool_calls_reach_the_model(transport, openai_server, db_path):
    async with everything(transport) as (cfg, _):
        toolset = MCPToolset([cfg])
        openai_server.enqueue(
            OpenAIReply.tool_calls(
                [
                    ("c1", "ev__echo", '{"message": "hello from agentik"}'),
                    ("c2", "ev__get-resource-reference", '{"resourceType": "Text"}'),
                    ("c3", "ev__get-structured-content", '{"location": "Chicago"}'),
                    ("c4", "ev__get-sum", '{"a": 20, "b": 22}'),
                ]
            ),
            OpenAIReply.text("done"),
        )
        llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url)
        try:
            async with Agent(llm=llm, store=SQLiteStore(db_path), toolsets=[toolset]) as agent:
                conv = await agent.create_conversation()
                await conv.send("try the reference server")
                await conv.wait_idle()
        finally:
            await toolset.aclose()
    offered = {t["function"]["name"] for t in openai_server.requests[0]["tools"]}
    assert {"ev__echo", "ev__get-resource-reference", "ev__get-sum"} <= offered
    sent = openai_server.requests[1]["messages"]
    results = {m["tool_call_id"]: m["content"] for m in sent if m["role"] == "tool"}
    assert results["c1"] == "Echo: hello from agentik"
    # The embedded text resource arrives with its text, under its uri.
    assert "[resource demo://resource/dynamic/text/1 (text/plain)]\nResource 1: " in results["c2"]
    weather = json.loads(results["c3"])  # its text block only: one copy of the JSON
    assert set(weather) == {"temperature", "conditions", "humidity"}
    assert "42" in results["c4"]


async def test_server_everything_http_restarted_while_idle_next_call_works():
    async with everything("http") as (cfg, server):
        assert server is not None
        toolset = MCPToolset([cfg])
        await toolset.start()
        try:
            echo = by_name(toolset)["ev__echo"]
            assert (await echo.call({"message": "one"}, CTX)).text == "Echo: one"
            await server.stop()
            await server.start()  # it answers the old session ID with 400
            assert (await echo.call({"message": "two"}, CTX)).text == "Echo: two"
            assert status(toolset, "ev")["state"] == "connected"
        finally:
            await toolset.aclose()


# -- finding the program ---------------------------------------------------------------------


def test_command_resolves_from_the_bots_own_venv_when_path_lacks_it(tmp_path):
    """A unit starts agentik by its full path, without an activated venv: a bare
    ``mcp-server-time`` still runs, found next to agentik's own interpreter."""
    venv_bin = os.path.dirname(sys.executable)
    if not os.path.exists(os.path.join(venv_bin, "mcp-server-time")):
        pytest.fail(f"mcp-server-time is not installed in {venv_bin} (the dev extra has it)")
    config = tmp_path / "bot.toml"
    config.write_text(
        """
[storage]
path = ":memory:"
[[mcp.servers]]
name = "time"
command = "mcp-server-time"
"""
    )
    path = os.pathsep.join(d for d in ("/usr/local/bin", "/usr/bin", "/bin") if d != venv_bin)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = path
    assert shutil.which("mcp-server-time", path=path) is None  # not reachable through PATH
    result = subprocess.run(
        [os.path.join(venv_bin, "agentik"), "mcp", "list", "-c", str(config)],
        capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "time: connected" in result.stdout
    assert "  time__get_current_time" in result.stdout


async def test_command_not_found_names_the_server_and_the_places_looked(caplog):
    cfg = MCPServerConfig(
        name="nowhere", command="agentik-no-such-mcp-server", env={"PATH": "/opt/none:/usr/bin"}
    )
    toolset = MCPToolset([cfg, stdio()])
    with caplog.at_level(logging.ERROR, logger="agentik.core.tools.mcp"):
        await toolset.start()
    try:
        st = status(toolset, "nowhere")
        assert st["state"] == "failed"
        venv_bin = os.path.dirname(sys.executable)
        assert st["error"] == (
            "command 'agentik-no-such-mcp-server' not found in the bot's own environment"
            f" ({', '.join(_own_dirs())}) or on PATH (/opt/none, /usr/bin)"
        )
        assert venv_bin in st["error"]
        logged = [r.getMessage() for r in caplog.records if "nowhere" in r.getMessage()]
        assert logged == [f"MCP server 'nowhere' failed to start: {st['error']}"]
        # The other server is unaffected.
        assert status(toolset, "calc")["state"] == "connected"
    finally:
        await toolset.aclose()


def _own_dirs() -> list[str]:
    import sysconfig

    out = [os.path.dirname(sys.executable)]
    scripts = sysconfig.get_path("scripts")
    if scripts not in out:
        out.append(scripts)
    return out


async def test_a_command_with_a_slash_is_taken_as_given(tmp_path):
    """A path is never looked up elsewhere, even when a program of that name exists in the venv."""
    cfg = MCPServerConfig(name="rel", command=str(tmp_path / "mcp-server-time"))
    toolset = MCPToolset([cfg])
    await toolset.start()
    try:
        st = status(toolset, "rel")
        assert st["state"] == "failed" and str(tmp_path) in st["error"]
    finally:
        await toolset.aclose()


async def test_a_message_over_the_limit_stops_the_server_and_the_next_call_works(monkeypatch):
    """A stdio server's answer is one JSON-RPC line: a long one arrives whole (read
    in linear time), one over ``MAX_STDIO_MESSAGE`` stops that server — the call
    fails with a clear error, the server is started again and the next call works."""
    from agentik.core.tools import mcp as mcp_module

    # The text goes twice in the line (content, and structured content).
    monkeypatch.setattr(mcp_module, "MAX_STDIO_MESSAGE", 8 * 1024 * 1024)
    toolset = MCPToolset([stdio(args=(SERVER, "--big"), timeout=60.0)])
    await toolset.start()
    try:
        tools = by_name(toolset)
        # 3 MiB: many pipe reads, one line, under the limit: all of it.
        result = await tools["calc__big"].call({"size": 3 * 1024 * 1024}, CTX)
        assert result.text == "x" * (3 * 1024 * 1024)
        old = status(toolset, "calc")["pid"]
        with pytest.raises(
            ToolError, match=r"MCP server 'calc' stopped: it sent a message over 8388608 bytes"
        ):
            await tools["calc__big"].call({"size": 6 * 1024 * 1024}, CTX)
        result = await tools["calc__add"].call({"a": 2, "b": 3}, CTX)
        assert result.data == {"result": 5}
        assert status(toolset, "calc")["pid"] != old
        await eventually(lambda: gone(old), "the stopped server to be reaped")
    finally:
        await toolset.aclose()


# -- hostile servers (issue 28 item 6) ---------------------------------------------------------
async def test_a_hostile_server_is_capped_and_a_conversation_that_never_uses_it_is_answered(
    openai_server, db_path, caplog
):
    """One server offering 10,000 tools, a 10 MB description and names over 64
    characters used to put all that into every model request (refused: too
    large, bad names): now it is capped, with one warning naming the server."""
    import re

    from agentik.core.tools.mcp import tool_name

    flood = stdio(
        "flood",
        args=(SERVER, "--many", "10000", "--huge-description", "10000000", "--long-names"),
        timeout=60,
    )
    toolset = MCPToolset([stdio(deny=("secret_*",)), flood])
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url)
    caplog.set_level(logging.WARNING, logger="agentik.core.tools.mcp")
    try:
        async with Agent(llm=llm, store=SQLiteStore(db_path), toolsets=[toolset]) as agent:
            assert status(toolset, "flood")["state"] == "connected"
            conv = await agent.create_conversation()
            await conv.send("hello, what time is it?")
            await conv.wait_idle()
            [answer] = [m for m in await conv.messages() if m.kind == "assistant"]
            assert answer.content and not answer.is_error
            flood_tools = [t for t in toolset.tools() if t.name.startswith("flood__")]
            # A refresh lists the same tools: no second warning.
            await toolset.refresh()
    finally:
        await toolset.aclose()
    assert openai_server.too_large == 0
    sent = openai_server.requests[-1]["tools"]
    names = [t["function"]["name"] for t in sent]
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", n) for n in names), names
    assert len(flood_tools) == 100 and len(names) == 100 + len(status_tools_of_calc())
    assert len(json.dumps(sent)) < 200_000
    [huge] = [t for t in flood_tools if t.remote_name == "huge"]
    assert len(huge.description) == 2000 and huge.description.endswith("…")
    long_ones = sorted(t.name for t in flood_tools if t.remote_name.startswith("a_very_long"))
    assert len(long_ones) == 2 and len(set(long_ones)) == 2
    assert all(len(n) == 64 for n in long_ones)
    remote = "a_very_long_tool_name_" + "x" * 60 + "one"
    assert tool_name("flood", remote) == tool_name("flood", remote) in long_ones  # stable
    assert "calc__add" in names
    warnings = [r.getMessage() for r in caplog.records if "flood" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "max_tools" in warnings[0] and "max_description" in warnings[0]
    assert "shortened" in warnings[0]


def status_tools_of_calc() -> list[str]:
    """The tools of the plain test server without ``secret_*`` (what ``calc`` offers)."""
    return [
        "add", "echo", "fail", "slow", "crash", "image", "resource", "blob", "record",
        "forget_sessions", "pid", "add_tool",
    ]  # fmt: skip


async def test_a_server_hanging_in_initialize_does_not_hold_up_the_bot(tmp_path):
    """The transports start without waiting for a slow server; the tools of a
    server that comes up later are offered from then on."""
    from agentik.bot.app import Bot
    from agentik.bot.config import parse_config

    hang = {"name": "hang", "command": sys.executable, "args": [SERVER, "--hang"],
            "timeout": 600}  # fmt: skip
    calc = {"name": "calc", "command": sys.executable, "args": [SERVER], "timeout": 30}
    config = parse_config({
        "llm": {"backend": "scripted"},
        "storage": {"path": str(tmp_path / "bot.db")},
        "memory": {"backend": "none"},
        "compaction": {"enabled": False},
        "transports": {"mem": {"type": "memory", "answer": "all"}},
        "mcp": {"servers": [hang, calc], "start_wait": 0},
    }, source=str(tmp_path / "bot.toml"), env={})  # fmt: skip
    # The hanging server's start-up timeout is 600 s: waiting for it would
    # blow this deadline (a guard against hanging, not a timing check).
    async with asyncio.timeout(120):
        async with Bot(config) as bot:  # type: ignore[arg-type]
            mem = bot.transports["mem"]
            await mem.inject("first", author="alice")
            await mem.wait_for(lambda m: m.kind == "answer")
            await eventually(
                lambda: "calc__add" in {t.name for t in bot.agent.tools}, "calc's tools"
            )
            await mem.inject("second", author="alice")
            await mem.wait_for(lambda m: m.kind == "answer", count=2)
            offered = {t.name for t in bot.agent.llm.requests[-1].tools}
            assert "calc__add" in offered
            assert not any(n.startswith("hang__") for n in offered)
            assert status(bot.agent.toolsets[0], "hang")["state"] == "starting"
