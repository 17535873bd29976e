"""Reloading the configuration of a running bot: SIGHUP to a real ``agentik run``.

The IRC server is a real miniircd (it logs every accepted connection), the model
is the fake OpenAI-compatible server (it records every request), the MCP server
is ``tests/mcp_server.py`` over stdio.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from agentik.bot.app import Bot
from agentik.bot.config import parse_config
from agentik.core import ConfigError
from agentik.core.tools.mcp import MCPServerConfig, MCPToolset
from helpers import AGENTIK

from ircservers import IRCTestClient, free_port

pytest_plugins = ["ircservers"]

MCP_SERVER = str(Path(__file__).with_name("mcp_server.py"))
TOKEN = "reload-test-token-5f2a"


def from_bot(line) -> bool:
    return line.command == "PRIVMSG" and (line.nick or "").lower() == "agentik"


def config_text(tmp_path: Path, openai_url: str, irc_port: int, *, prompt: str, extra: str = "") -> str:
    return f"""
[agent]
system_prompt = "{prompt}"
[llm]
base_url = "{openai_url}"
model = "fake-model"
[storage]
path = "{tmp_path / "bot.db"}"
[logging]
level = "info"
[transports.local]
type = "irc"
host = "127.0.0.1"
port = {irc_port}
tls = false
nick = "agentik"
channels = ["#reload"]
{extra}
"""


async def wait_until(pred: Callable[[], bool], what: str, stderr: list[str]) -> None:
    """Wait for ``pred()``; the deadline only guards against a hang."""
    deadline = time.monotonic() + 60
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}; stderr:\n{''.join(stderr)}")
        await asyncio.sleep(0.05)


async def _collect(stream: asyncio.StreamReader, into: list[str]) -> None:
    while line := await stream.readline():
        into.append(line.decode())


def system_text(request: dict) -> str:
    first = request["messages"][0]
    assert first["role"] == "system"
    content = first["content"]
    return content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)


async def test_sighup_adds_a_transport_changes_the_prompt_and_keeps_the_irc_session(
    miniircd, openai_server, tmp_path
):
    config = tmp_path / "bot.toml"
    config.write_text(config_text(tmp_path, openai_server.base_url, miniircd.port,
                                  prompt="You are prompt one."))  # fmt: skip
    http_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    env["RELOAD_TOKEN"] = TOKEN
    alice = await IRCTestClient.connect(miniircd.port, "alice")
    await alice.join("#reload")
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "run", "-c", str(config), env=env, stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    stderr: list[str] = []
    drain = asyncio.ensure_future(_collect(proc.stderr, stderr))

    def logged(pattern: str) -> list[str]:
        return [line for line in stderr if re.search(pattern, line)]

    async def ask(text: str) -> dict:
        before = len(openai_server.requests)
        mark = alice.mark()
        alice.privmsg("#reload", f"agentik: {text}")
        answer = await alice.wait_for(from_bot, since=mark, timeout=60)
        assert answer.text == f"alice: echo: alice: {text}"
        assert len(openai_server.requests) == before + 1
        return openai_server.requests[-1]

    try:
        await alice.wait_for(lambda m: m.command == "JOIN" and m.nick == "agentik", timeout=60)
        server_log = miniircd.log()  # the bot's connection is in it now
        first = await ask("one")
        assert "You are prompt one." in system_text(first)
        assert not any(t["function"]["name"].startswith("calc__") for t in first.get("tools", []))

        # Reload: a new prompt, an HTTP transport and an MCP server.
        config.write_text(config_text(
            tmp_path, openai_server.base_url, miniircd.port, prompt="You are prompt two.",
            extra=f"""
[transports.web]
type = "http"
port = {http_port}
tokens = [{{ name = "ops", env = "RELOAD_TOKEN" }}]
[[mcp.servers]]
name = "calc"
command = "{sys.executable}"
args = ["{MCP_SERVER}"]
""",
        ))  # fmt: skip
        proc.send_signal(signal.SIGHUP)
        await wait_until(lambda: logged("configuration reloaded"), "the reload", stderr)
        summary = logged("configuration reloaded")[0]
        assert "transports added: web" in summary
        assert "system prompt" in summary and "MCP servers added: calc" in summary
        assert "local" not in summary  # the IRC transport was not touched

        # The new transport is up and serves the agent.
        url = f"http://127.0.0.1:{http_port}/agentik"
        async with httpx.AsyncClient(base_url=url) as web:
            refused = await web.get("/conversations")
            assert refused.status_code == 401
            listed = await web.get(
                "/conversations", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert listed.status_code == 200

        second = await ask("two")
        assert "You are prompt two." in system_text(second)
        assert "prompt one" not in system_text(second)
        assert "calc__add" in {t["function"]["name"] for t in second["tools"]}

        # A bad configuration is refused, the error names the key, the old one stays.
        good = config.read_text()
        config.write_text(good.replace('[agent]\n', '[agent]\nresume = "sometimes"\n', 1))
        proc.send_signal(signal.SIGHUP)
        await wait_until(lambda: logged("reload refused"), "the refusal", stderr)
        refusal = logged("reload refused")[0]
        assert "ERROR" in refusal and "agent.resume" in refusal and str(config) in refusal
        third = await ask("three")
        assert "You are prompt two." in system_text(third)
        assert "calc__add" in {t["function"]["name"] for t in third["tools"]}
        async with httpx.AsyncClient(base_url=url) as web:
            listed = await web.get(
                "/conversations", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert listed.status_code == 200

        # The IRC server saw one session of the bot all along: no connection ended or
        # began since the bot joined.
        since = miniircd.log()[len(server_log) :]
        assert "Accepted connection" not in since and "Disconnected" not in since, since
        assert not any(m.command == "QUIT" and m.nick == "agentik" for m in alice.received)

        proc.send_signal(signal.SIGTERM)
        await alice.wait_for(lambda m: m.command == "QUIT" and m.nick == "agentik", timeout=60)
        await asyncio.wait_for(proc.wait(), 60)
        await drain
        assert proc.returncode == 0, "".join(stderr)
        assert "Traceback" not in "".join(stderr)
        assert TOKEN not in "".join(stderr)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        drain.cancel()
        await alice.close()
