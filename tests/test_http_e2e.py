"""The whole path: ``agentik run`` from a TOML file serves the HTTP API next to the
terminal transport in one event loop, answers through the real OpenAI SDK
against a local fake, and SIGTERM ends both cleanly."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import tomllib
from pathlib import Path

import httpx

from agentik.transports.http.settings import HttpSettings
from helpers import AGENTIK

from httpserver import sse

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "e2e-token-0123456789abcdef"


async def test_agentik_run_serves_http_next_to_the_terminal(openai_server, tmp_path):
    config = tmp_path / "bot.toml"
    config.write_text(
        f"""
[llm]
base_url = "{openai_server.base_url}"
model = "fake-model"
[storage]
path = "{tmp_path / "bot.db"}"
[transports.terminal]
type = "stdio"
channel = "e2e"
user = "tess"
interactive = false
[transports.web]
type = "http"
port = 0
tokens = [{{ name = "e2e", env = "E2E_TOKEN" }}]
"""
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    env["E2E_TOKEN"] = TOKEN
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "-v", "run", "-c", str(config), env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin and proc.stdout and proc.stderr
    stderr: list[str] = []
    try:
        # The transport logs where it listens (port 0: the kernel picked one).
        url = None
        while url is None:
            line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
            assert line, "agentik exited: " + "".join(stderr)
            stderr.append(line)
            if m := re.search(r"HTTP API on (http://127\.0\.0\.1:\d+)/agentik", line):
                url = m.group(1)
        drain = asyncio.ensure_future(_collect(proc.stderr, stderr))

        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=url + "/agentik", headers=headers) as c:
            assert (await c.get("/conversations")).status_code == 200
            conv = (await c.post("/conversations", json={"title": "e2e"})).json()
            path = f"/conversations/{conv['id']}"
            async with sse(c, path + "/events", params={"profile": "chat"}) as events:
                await c.post(path + "/messages", json={"content": "hello over HTTP"})
                got = await events.until("turn_ended", timeout=30)
            assert got[-1].data["text"] == "echo: e2e: hello over HTTP"

            # The terminal transport answers in the same process meanwhile.
            proc.stdin.write(b"hello from the terminal\n")
            await proc.stdin.drain()
            answer = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert answer.decode().strip() == "echo: tess: hello from the terminal"

            # A client still following events when the bot stops: it learns the
            # conversation ended with the shutdown (after which reflection may
            # report what it noted), then its stream ends.
            async with sse(c, path + "/events") as events:
                proc.send_signal(signal.SIGTERM)
                rest = await events.rest(timeout=30)
            assert [m.data["kind"] for m in rest][:1] == ["conversation_ended"]
            assert rest[0].data["reason"] == "shutdown"
            assert {m.data["kind"] for m in rest[1:]} <= {"memory_noted"}
        await asyncio.wait_for(proc.wait(), 30)
        await drain
        assert proc.returncode == 0, "".join(stderr)
        assert "Traceback" not in "".join(stderr)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_agentik_port_alone_opens_the_http_api(tmp_path):
    """The standalone seed's runbook: ``AGENTIK_PORT=8080 agentik run`` with a file
    that has no http table serves the API on that port (it opened nothing, and with
    no other transport refused to start)."""
    config = tmp_path / "bot.toml"
    config.write_text(f'[llm]\nbackend = "scripted"\n[storage]\npath = "{tmp_path / "bot.db"}"\n')
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    env["AGENTIK_PORT"] = str(port)
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "-v", "run", "-c", str(config), env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout and proc.stderr
    stderr: list[str] = []
    try:
        url = None
        while url is None:
            line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
            assert line, "agentik exited: " + "".join(stderr)
            stderr.append(line)
            if m := re.search(r"HTTP API on (http://127\.0\.0\.1:\d+)/agentik", line):
                url = m.group(1)
        drain = asyncio.ensure_future(_collect(proc.stderr, stderr))
        assert url == f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=url + "/agentik") as c:
            health = await c.get(url + "/health")
            assert health.status_code == 200 and health.json()["status"] == "ok"
            # The agent has an id (the seed's agent.id): the bot's [agent] name.
            assert (await c.get("/status")).json()["agent_id"] == "agentik"
            conv = (await c.post("/conversations", json={"title": "seed"})).json()
            path = f"/conversations/{conv['id']}"
            async with sse(c, path + "/events", params={"profile": "chat"}) as events:
                await c.post(path + "/messages", json={"content": "hello"})
                got = await events.until("turn_ended", timeout=30)
            assert got[-1].data["text"].endswith("hello")
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
        await drain
        assert proc.returncode == 0, "".join(stderr)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _collect(stream: asyncio.StreamReader, into: list[str]) -> None:
    while line := await stream.readline():
        into.append(line.decode())


def test_the_example_configuration_documents_valid_tokens():
    """The commented-out ``tokens`` example in config.example.toml is valid as written."""
    text = (ROOT / "config.example.toml").read_text(encoding="utf-8")
    block = re.search(r"^# tokens = \[\n(?:#.*\n)*?# \]\n", text, re.M)
    assert block, "config.example.toml shows a tokens example"
    toml = "\n".join(line[2:] for line in block.group(0).splitlines())
    settings = HttpSettings.model_validate(tomllib.loads(toml))
    assert [t.name for t in settings.tokens] == ["frontend", "alice"]
