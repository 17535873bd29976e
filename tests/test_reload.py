"""Reloading the configuration of a running bot: SIGHUP to a real ``agentik run``.

The IRC server is a real miniircd (it logs every accepted connection), the model
is the fake OpenAI-compatible server (it records every request), the MCP server
is ``tests/mcp_server.py`` over stdio.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

from agentik.bot.app import Bot
from agentik.bot.config import parse_config
from agentik.core import ConfigError
from agentik.core.tools.mcp import MCPToolset
from helpers import AGENTIK

from ircservers import IRCTestClient, free_port
from rigs import eventually
from rigs import said_by_bot as from_bot

pytest_plugins = ["ircservers"]

MCP_SERVER = str(Path(__file__).with_name("mcp_server.py"))
TOKEN = "reload-test-token-5f2a"


def config_text(
    tmp_path: Path, openai_url: str, irc_port: int, *, prompt: str, extra: str = ""
) -> str:
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
    """Wait for ``pred()`` (:func:`rigs.eventually`); a failure shows the bot's stderr."""
    await eventually(pred, lambda: f"{what}; stderr:\n{''.join(stderr)}", interval=0.05)


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
            listed = await web.get("/conversations", headers={"Authorization": f"Bearer {TOKEN}"})
            assert listed.status_code == 200

        second = await ask("two")
        assert "You are prompt two." in system_text(second)
        assert "prompt one" not in system_text(second)
        assert "calc__add" in {t["function"]["name"] for t in second["tools"]}

        # A bad configuration is refused, the error names the key, the old one stays.
        good = config.read_text()
        config.write_text(good.replace("[agent]\n", '[agent]\nresume = "sometimes"\n', 1))
        proc.send_signal(signal.SIGHUP)
        await wait_until(lambda: logged("reload refused"), "the refusal", stderr)
        refusal = logged("reload refused")[0]
        assert "ERROR" in refusal and "agent.resume" in refusal and str(config) in refusal
        third = await ask("three")
        assert "You are prompt two." in system_text(third)
        assert "calc__add" in {t["function"]["name"] for t in third["tools"]}
        async with httpx.AsyncClient(base_url=url) as web:
            listed = await web.get("/conversations", headers={"Authorization": f"Bearer {TOKEN}"})
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


# -- in process: what a reload changes, and what it leaves alone -------------------------------


def bot_config(path: Path, *, servers: list[dict], **more) -> object:
    data = {
        "llm": {"backend": "scripted"},
        "storage": {"path": str(path.with_name("bot.db"))},
        "memory": {"backend": "none"},
        "compaction": {"enabled": False},
        "transports": {"mem": {"type": "memory", "answer": "all"}},
        "mcp": {"servers": servers},
        **more,
    }
    return parse_config(data, source=str(path), env={})


def calc(name: str, **more) -> dict:
    return {"name": name, "command": sys.executable, "args": [MCP_SERVER], "timeout": 30, **more}


def gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


async def test_reload_starts_stops_and_restarts_only_the_mcp_servers_that_changed(tmp_path):
    path = tmp_path / "bot.toml"
    first = bot_config(path, servers=[calc("keep"), calc("change"), calc("drop")])
    async with Bot(first) as bot:  # type: ignore[arg-type]
        toolset = next(t for t in bot.agent.toolsets if isinstance(t, MCPToolset))
        before = {s["name"]: s for s in toolset.status()}
        assert all(s["state"] == "connected" for s in before.values()), before
        mem = bot.transports["mem"]

        summary = await bot.reload(bot_config(path, servers=[
            calc("keep"), calc("change", deny=["secret_*"]), calc("fresh"),
        ]))  # fmt: skip
        assert "MCP servers added: fresh" in summary
        assert "MCP servers removed: drop" in summary
        assert "MCP servers restarted: change" in summary
        assert "keep" not in summary and "transports" not in summary
        after = {s["name"]: s for s in toolset.status()}
        assert set(after) == {"keep", "change", "fresh"}
        assert after["keep"]["pid"] == before["keep"]["pid"]  # the same session
        assert after["change"]["state"] == "connected"
        assert after["change"]["pid"] != before["change"]["pid"]
        assert gone(before["change"]["pid"]) and gone(before["drop"]["pid"])
        assert "change__secret_tool" not in after["change"]["tools"]
        assert bot.transports["mem"] is mem  # untouched

        # The next turn is offered the new set of tools.
        await mem.inject("which tools?", author="alice")
        await mem.wait_for(lambda m: m.kind == "answer")
        offered = {t.name for t in bot.agent.llm.requests[-1].tools}
        assert {"keep__add", "change__add", "fresh__add"} <= offered
        assert not any(n.startswith("drop__") for n in offered)


async def test_a_bad_reload_changes_nothing_and_names_the_key(tmp_path):
    path = tmp_path / "bot.toml"
    first = bot_config(path, servers=[calc("keep")], agent={"system_prompt": "Old prompt."})
    async with Bot(first) as bot:  # type: ignore[arg-type]
        mem = bot.transports["mem"]
        toolset = next(t for t in bot.agent.toolsets if isinstance(t, MCPToolset))
        pid = toolset.status()[0]["pid"]
        bad = bot_config(
            path, servers=[calc("other")], agent={"system_prompt": "New prompt."},
            transports={"mem": {"type": "memory", "answer": "all"},
                        "web": {"type": "http", "port": "not-a-port"}},
        )  # fmt: skip
        try:
            await bot.reload(bad)  # type: ignore[arg-type]
        except ConfigError as exc:
            assert "transports.web.port" in str(exc) and str(path) in str(exc)
        else:
            raise AssertionError("a bad configuration was accepted")
        assert bot.config is first
        assert bot.agent.system_prompt == "Old prompt."
        assert [s["name"] for s in toolset.status()] == ["keep"]
        assert toolset.status()[0]["pid"] == pid
        assert set(bot.transports) == {"mem"} and bot.transports["mem"] is mem
        await mem.inject("still there?", author="alice")
        await mem.wait_for(lambda m: m.kind == "answer")
        assert bot.agent.llm.requests[-1].system.startswith("Old prompt.")


async def test_reload_applies_access_rules_tool_policy_and_bridge_options_in_place(tmp_path):
    path = tmp_path / "bot.toml"
    async with Bot(bot_config(path, servers=[calc("calc")])) as bot:  # type: ignore[arg-type]
        mem = bot.transports["mem"]
        await mem.inject("first", author="alice")
        await mem.wait_for(lambda m: m.kind == "answer")
        assert "calc__add" in {t.name for t in bot.agent.llm.requests[-1].tools}

        summary = await bot.reload(bot_config(
            path, servers=[calc("calc")],
            tools={"allowed_tools": ["calc__echo"]},
            access={"ignored": ["mem:mallory"]},
            transports={"mem": {"type": "memory", "answer": "addressed"}},
        ))  # fmt: skip
        assert "transports with new options: mem" in summary
        assert "tool policy" in summary and "access rules" in summary
        assert bot.transports["mem"] is mem  # only the bridge's keys changed
        # The open channel's next turn has the new tool policy.
        await mem.inject("agentik: second", author="alice", addressed=True)
        await mem.wait_for(lambda m: m.kind == "answer", count=2)
        offered = {t.name for t in bot.agent.llm.requests[-1].tools}
        assert offered == {"calc__echo"}
        asked = len(bot.agent.llm.requests)
        # Not addressed: no answer any more; an ignored speaker gets none either.
        await mem.inject("third, unaddressed", author="alice")
        await mem.inject("agentik: let me in", author="mallory", addressed=True)
        await mem.inject("agentik: fourth", author="alice", addressed=True)
        await mem.wait_for(lambda m: m.kind == "answer", count=3)
        assert len(bot.agent.llm.requests) == asked + 1
        assert bot.agent.llm.requests[-1].messages[-1].content.endswith("fourth")


async def test_a_transport_whose_settings_changed_is_restarted_and_a_removed_one_stopped(
    tmp_path, caplog
):
    path = tmp_path / "bot.toml"
    transports = {"mem": {"type": "memory", "answer": "all"},
                  "old": {"type": "memory", "answer": "all"}}  # fmt: skip
    async with Bot(bot_config(path, servers=[], transports=transports)) as bot:  # type: ignore[arg-type]
        mem, old = bot.transports["mem"], bot.transports["old"]
        await mem.inject("before", author="alice")
        await mem.wait_for(lambda m: m.kind == "answer")
        with caplog.at_level(logging.WARNING, logger="agentik.bot.app"):
            summary = await bot.reload(bot_config(
                path, servers=[], transports={"mem": {"type": "memory", "answer": "all",
                                                      "flavour": "new"}},
                llm={"backend": "scripted", "model": "other"},
            ))  # fmt: skip
        assert "transports removed: old" in summary and "transports restarted: mem" in summary
        assert set(bot.transports) == {"mem"}
        fresh = bot.transports["mem"]
        assert fresh is not mem and fresh.settings == {"flavour": "new"}
        # Detached from the bridge: no channel of "old" has a transport any more.
        assert old.owns("memory:old:#test") and bot.bridge.transport_for("memory:old:#test") is None
        assert old not in bot.started
        # The open channel carries on through the new instance.
        await fresh.inject("after", author="alice")
        await fresh.wait_for(lambda m: m.kind == "answer")
        assert not [m for m in mem.sent if "after" in m.text]
        # [llm] is not changed in place: the warning says a restart is needed.
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warned == ["reload: [llm] changed but takes effect only after a restart"]


async def test_links_added_and_removed_in_the_configuration_apply_on_reload(tmp_path, caplog):
    """``[[links]]`` edited in the configuration: a reload links the channels (one
    conversation, the answer shown in both) and unlinks them again, without a restart."""
    path = tmp_path / "bot.toml"
    a_key, b_key = "memory:a:#test", "memory:b:#test"
    transports = {"a": {"type": "memory", "answer": "all"},
                  "b": {"type": "memory", "answer": "all"}}  # fmt: skip
    async with Bot(bot_config(path, servers=[], transports=transports)) as bot:  # type: ignore[arg-type]
        a, b = bot.transports["a"], bot.transports["b"]
        store = bot.agent.store
        await a.inject("alone in a", channel_key=a_key, author="alice")
        await a.wait_for(lambda m: m.kind == "answer")
        assert await store.get_binding(b_key) != await store.get_binding(a_key)

        linked = [{"name": "team", "channels": [a_key, b_key]}]
        with caplog.at_level(logging.WARNING, logger="agentik.bot.app"):
            summary = await bot.reload(
                bot_config(path, servers=[], transports=transports, links=linked)
            )
        assert "links added: team" in summary and "restart" not in summary, summary
        assert not [r for r in caplog.records if "restart" in r.getMessage()]
        # One conversation (a's, with its history); asked in b, answered in a and b.
        conv = await store.get_binding(a_key)
        assert await store.get_binding(b_key) == conv
        await b.inject("now linked", channel_key=b_key, author="bob")
        await b.wait_for(lambda m: m.kind == "answer")
        await a.wait_for(lambda m: m.kind == "answer", count=2)
        assert "link:team" in {name for name, _ in bot.bridge.links.health()}

        summary = await bot.reload(bot_config(path, servers=[], transports=transports))
        assert "links removed: team" in summary, summary
        # a keeps the conversation; b starts one of its own, and answers stay apart.
        assert await store.get_binding(a_key) == conv
        assert await store.get_binding(b_key) != conv
        answered_in_a = len(a.texts("answer"))
        await b.inject("apart again", channel_key=b_key, author="bob")
        await b.wait_for(lambda m: m.kind == "answer", count=2)
        await bot.bridge.flush(b_key)
        assert len(a.texts("answer")) == answered_in_a
        assert bot.bridge.links.health() == []


async def test_repeated_sighup_during_a_held_answer_changes_mcp_servers_and_answers_once(
    miniircd, openai_server, tmp_path
):
    """An operator reloads again and again while an answer streams: MCP servers
    come and go, one file is broken.  The answer arrives once, whole; the
    next question sees the last good configuration."""
    from agentik.core.testing.openai_server import Reply as OpenAIReply

    config = tmp_path / "bot.toml"
    base = config_text(tmp_path, openai_server.base_url, miniircd.port, prompt="P.")
    mcp = f'[[mcp.servers]]\nname = "NAME"\ncommand = "{sys.executable}"\nargs = ["{MCP_SERVER}"]\n'
    config.write_text(base)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    alice = await IRCTestClient.connect(miniircd.port, "alice")
    await alice.join("#reload")
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "run", "-c", str(config), env=env, stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    stderr: list[str] = []
    drain = asyncio.ensure_future(_collect(proc.stderr, stderr))

    def logged(pattern: str) -> int:
        return sum(1 for line in stderr if re.search(pattern, line))

    try:
        await alice.wait_for(lambda m: m.command == "JOIN" and m.nick == "agentik", timeout=60)
        held = OpenAIReply.text("a long answer\nin two lines", chunks=4, hold_after=1)
        openai_server.enqueue(held)
        mark = alice.mark()
        alice.privmsg("#reload", "agentik: tell me")
        await held.wait_held()
        steps = [
            base + mcp.replace("NAME", "one"),
            base + mcp.replace("NAME", "two"),
            base.replace("[agent]\n", '[agent]\nresume = "sometimes"\n', 1),  # refused
            base + mcp.replace("NAME", "two") + mcp.replace("NAME", "three"),
            base + mcp.replace("NAME", "three"),
        ]
        for i, text in enumerate(steps):
            done = logged("configuration reloaded|reload refused")
            config.write_text(text)
            proc.send_signal(signal.SIGHUP)
            await wait_until(
                lambda done=done: logged("configuration reloaded|reload refused") > done,
                f"reload {i}", stderr,
            )  # fmt: skip
        assert logged("reload refused") == 1
        held.release()
        first = await alice.wait_for(from_bot, since=mark, timeout=60)
        assert first.text == "alice: a long answer"
        mark2 = alice.mark()
        alice.privmsg("#reload", "agentik: and now?")
        answer = await alice.wait_for(
            lambda m: from_bot(m) and "and now" in m.text, since=mark2, timeout=60
        )
        assert answer.text == "alice: echo: alice: and now?"
        said = [m.text for m in alice.received if from_bot(m)]
        assert said == ["alice: a long answer", "in two lines", answer.text]
        tools = {t["function"]["name"] for t in openai_server.requests[-1].get("tools", [])}
        assert "three__add" in tools and not {"one__add", "two__add"} & tools
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)
        await drain
        assert proc.returncode == 0, "".join(stderr)
        assert "Traceback" not in "".join(stderr)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        drain.cancel()
        await alice.close()
