"""MCP tools against real MCP servers: our test server (stdio and streamable
HTTP) and ``mcp-server-time``.  No mocks: real processes, real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from agentik.core import Agent, SQLiteStore
from agentik.core.errors import ToolError
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.core.tools.base import ToolContext
from agentik.core.tools.mcp import MCPServerConfig, MCPToolset

SERVER = str(Path(__file__).with_name("mcp_server.py"))
CTX = ToolContext(conversation_id="c", run_id="r", call_id="k")


def stdio(name: str = "calc", **kw) -> MCPServerConfig:
    kw.setdefault("restart_min", 0.05)
    kw.setdefault("restart_max", 0.5)
    kw.setdefault("timeout", 20.0)
    return MCPServerConfig(name=name, command=sys.executable, args=(SERVER,), **kw)


async def until(pred: Callable[[], bool], what: str, wait: float = 60.0) -> None:
    """Wait for ``pred()`` (a deadline only against hanging, not a timing check)."""
    deadline = time.monotonic() + wait
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.02)


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
    await until(lambda: "calc__fresh" in by_name(calc), "the new tool to be listed")
    result = await by_name(calc)["calc__fresh"].call({}, CTX)
    assert result.text.splitlines()[0] == "I am fresh"


async def test_killed_between_calls_restarts(calc):
    pid_tool = by_name(calc)["calc__pid"]
    first = (await pid_tool.call({}, CTX)).data["result"]
    assert status(calc, "calc")["pid"] == first
    os.kill(first, signal.SIGKILL)
    # The toolset notices the death by itself (no call needed) ...
    await until(lambda: status(calc, "calc")["pid"] != first, "the death to be noticed")
    # ... and the next call waits for the restart and works.
    second = (await pid_tool.call({}, CTX)).data["result"]
    assert second != first
    assert status(calc, "calc")["state"] == "connected"
    assert status(calc, "calc")["pid"] == second
    await until(lambda: gone(first), "the killed process to be reaped")


async def test_crash_during_call_then_next_call_works(calc):
    tools = by_name(calc)
    old = status(calc, "calc")["pid"]
    with pytest.raises(ToolError, match=r"MCP server 'calc' stopped: .*; restarting"):
        await tools["calc__crash"].call({}, CTX)
    assert status(calc, "calc")["state"] in ("restarting", "starting", "connected")
    result = await tools["calc__add"].call({"a": 1, "b": 1}, CTX)
    assert result.data == {"result": 2}
    assert status(calc, "calc")["pid"] != old
    await until(lambda: gone(old), "the crashed process to be reaped")


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
    await until(started.exists, "the slow call to be running")  # closed with a call in flight
    await toolset.aclose()
    with contextlib.suppress(ToolError):
        await slow
    assert [s["state"] for s in toolset.status()] == ["closed"] * 3
    await until(lambda: all(gone(p) for p in pids), "the server processes to end")
    assert asyncio.all_tasks() == before


# -- streamable HTTP -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def http_server() -> AsyncIterator[str]:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, SERVER, "--transport", "http", "--port", str(port)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError("the HTTP MCP server did not start") from None
                await asyncio.sleep(0.05)
            else:
                writer.close()
                await writer.wait_closed()
                break
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            async with asyncio.timeout(60):
                await proc.wait()
        except TimeoutError:  # pragma: no cover
            proc.kill()
            await proc.wait()


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
    await until(lambda: gone(pid), "mcp-server-time to end")


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
