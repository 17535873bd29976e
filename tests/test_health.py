"""Health, readiness, supervision, the health listener, ``agentik status`` and sd_notify.

Real parts throughout: real IRC servers (miniircd, and a scripted one for a refused
SASL login), the real OpenAI SDK against the local fake server, the bot's own HTTP
stack on loopback TCP and unix sockets, ``agentik run`` as a subprocess.
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import socket
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentik.bot.app import Bot, load_registry
from agentik.bot.config import Config, parse_config
from agentik.bot.health import HealthServer, SupervisionSettings, sd_notify
from agentik.core import hookimpl
from agentik.core.health import HealthRegistry
from agentik.transports.base import Transport
from helpers import AGENTIK, clean_env

from ircservers import ScriptedIRCServer, registration_handler, sasl_plain

pytest_plugins = ["ircservers"]

IRC_FAST = 'tls = false\nreconnect_min = 0.2\nreconnect_max = 1.0\nnick = "agentik"\n'


def make_config(tmp_path: Path, openai_server: Any, body: str) -> Config:
    text = f"""
[llm]
base_url = "{openai_server.base_url}"
model = "fake-model"
[storage]
path = "{tmp_path / "bot.db"}"
{body}
"""
    return parse_config(tomllib.loads(text), source=str(tmp_path / "bot.toml"), env={})


async def until_state(registry: HealthRegistry, component: str, state: str) -> None:
    """Wait (generously) until ``component`` reports ``state``."""
    changed = asyncio.Event()
    unsubscribe = registry.subscribe(lambda c, h: changed.set())
    try:
        async with asyncio.timeout(60):
            while True:
                changed.clear()
                found = registry.get(component)
                if found is not None and found.state == state:
                    return
                await changed.wait()
    finally:
        unsubscribe()


async def serving(bot: Bot) -> asyncio.Task[None]:
    task = asyncio.create_task(bot.serve())
    await asyncio.sleep(0)
    return task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# -- IRC connection states ------------------------------------------------------------------


async def test_ready_follows_the_irc_connection_when_the_server_dies_and_comes_back(
    miniircd, openai_server, tmp_path
):
    config = make_config(
        tmp_path,
        openai_server,
        f"""
[health]
listen = "127.0.0.1:0"
[transports.libera]
type = "irc"
host = "127.0.0.1"
port = {miniircd.port}
channels = ["#ops"]
{IRC_FAST}
""",
    )
    async with Bot(config) as bot:
        task = await serving(bot)
        try:
            assert bot.listener is not None and bot.listener.address
            async with httpx.AsyncClient(base_url=bot.listener.address) as c:
                await until_state(bot.health, "transport:libera", "connected")
                ready = await c.get("/ready")
                assert ready.status_code == 200, ready.text
                irc = ready.json()["components"]["transport:libera"]
                assert (irc["state"], irc["type"], irc["ready"]) == ("connected", "irc", True)
                up_since = irc["since"]

                await miniircd.kill()
                await until_state(bot.health, "transport:libera", "reconnecting")
                ready = await c.get("/ready")
                assert ready.status_code == 503
                body = ready.json()
                assert body["status"] == "not ready" and body["degraded"] == ["transport:libera"]
                irc = body["components"]["transport:libera"]
                assert irc["state"] == "reconnecting" and not irc["ready"]
                # The reason says what happened and where.
                assert f"127.0.0.1:{miniircd.port}" in irc["reason"]
                assert "lost" in irc["reason"] or "cannot connect" in irc["reason"]
                assert irc["since"] >= up_since
                # Liveness is unaffected: the process works, one connection does not.
                health = await c.get("/health")
                assert health.status_code == 200 and health.json()["status"] == "ok"

                await miniircd.restart()
                await until_state(bot.health, "transport:libera", "connected")
                ready = await c.get("/ready")
                assert ready.status_code == 200
                irc = ready.json()["components"]["transport:libera"]
                assert irc["state"] == "connected" and irc["reason"] is None
        finally:
            await stop(task)


# -- supervision -------------------------------------------------------------------------------


class Crashy(Transport):
    """A plugin transport whose main task fails every time it runs."""

    type = "crashy"
    starts: list[str] = []

    async def start(self, sink: Any) -> None:
        Crashy.starts.append(self.name)

    async def send(self, message: Any) -> None:
        pass

    async def serve(self) -> None:
        raise RuntimeError(f"main loop broke on run {len(Crashy.starts)}")


class CrashyPlugin:
    @hookimpl
    def register_transports(self, register: Any) -> None:
        register("crashy", Crashy)


async def test_a_failing_transport_is_restarted_then_marked_failed_and_the_bot_stays_up(
    openai_server, tmp_path
):
    Crashy.starts = []
    config = make_config(
        tmp_path,
        openai_server,
        """
[supervision]
max_restarts = 2
window = 600
backoff_initial = 0.01
backoff_max = 0.02
[transports.flaky]
type = "crashy"
[transports.web]
type = "http"
port = 0
""",
    )
    registry = load_registry(config, extra=(CrashyPlugin(),))
    async with Bot(config, registry=registry) as bot:
        seen: list[tuple[str, str | None]] = []
        bot.health.subscribe(
            lambda c, h: seen.append((h.state, h.reason)) if c == "transport:flaky" else None
        )
        task = await serving(bot)
        try:
            await until_state(bot.health, "transport:flaky", "failed")
            # Started once, restarted twice (max_restarts), then given up on.
            assert Crashy.starts == ["flaky"] * 3
            restarts = [r for s, r in seen if s == "reconnecting" and r and "restarting in" in r]
            assert len(restarts) == 2
            assert "RuntimeError: main loop broke" in restarts[0]
            failed = bot.health.get("transport:flaky")
            assert failed is not None and failed.reason is not None
            assert failed.reason.startswith("gave up after 3 failures in 600 s")
            # The process is still up: the HTTP transport answers, and says why it is not ready.
            assert not task.done()
            web = bot.transports["web"]
            async with httpx.AsyncClient(base_url=web.url) as c:  # type: ignore[attr-defined]
                ready = await c.get("/ready")
                assert ready.status_code == 503
                comps = ready.json()["components"]
                assert comps["transport:flaky"]["state"] == "failed"
                assert comps["transport:web"]["state"] == "connected"
                status = (await c.get("/agentik/status")).json()
                assert status["components"]["transport:flaky"]["reason"] == failed.reason
            assert not task.done()
        finally:
            await stop(task)


def test_supervision_backoff_doubles_up_to_the_maximum():
    policy = SupervisionSettings(backoff_initial=1, backoff_max=5)
    assert [policy.backoff(n) for n in range(1, 6)] == [1, 2, 4, 5, 5]


# -- the health listener -------------------------------------------------------------------------


async def test_health_listener_on_a_unix_socket_with_a_token(openai_server, tmp_path, monkeypatch):
    sock_path = tmp_path / "h.sock"
    # A socket file a killed process left behind does not stop the listener.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock_path))
    stale.close()
    config = make_config(
        tmp_path,
        openai_server,
        """
[health]
listen = "unix:h.sock"
token_env = "HEALTH_TOKEN"
[transports.web]
type = "http"
port = 0
""",
    )
    monkeypatch.setenv("HEALTH_TOKEN", "health-token-1234")
    async with Bot(config) as bot:
        assert bot.listener is not None and bot.listener.address == f"unix:{sock_path}"
        transport = httpx.AsyncHTTPTransport(uds=str(sock_path))
        async with httpx.AsyncClient(transport=transport, base_url="http://agentik") as c:
            health = await c.get("/health")
            assert health.status_code == 200 and health.json()["status"] == "ok"
            ready = await c.get("/ready")
            assert ready.status_code == 200
            assert ready.json()["components"]["transport:web"]["state"] == "connected"
            # /status needs the token; /health and /ready do not.
            assert (await c.get("/status")).status_code == 401
            wrong = await c.get("/status", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            status = await c.get("/status", headers={"Authorization": "Bearer health-token-1234"})
            assert status.status_code == 200
            body = status.json()
            assert body["version"] and body["uptime"] >= 0 and body["ready"] is True
            assert body["conversations"] == {"busy": 0, "queued": 0, "active": []}
            assert (await c.get("/nope")).status_code == 404
            assert (await c.post("/ready")).status_code == 405
    # Closing removes the socket file.
    assert not sock_path.exists()


async def test_health_listener_on_tcp_serves_an_added_route(tmp_path):
    from starlette.responses import PlainTextResponse

    registry = HealthRegistry()
    registry.report("transport:a", "connected")

    async def answer(request: Any) -> Any:
        return PlainTextResponse("ok " + ",".join(registry.transports()))

    listener = HealthServer(
        "127.0.0.1:0", health=answer, ready=answer, status=answer, token="t0ken-t0ken"
    )
    # The route table takes more (``/metrics``), public or behind the token.
    listener.route("/metrics", answer)
    await listener.start()
    try:
        assert listener.address and listener.address.startswith("http://127.0.0.1:")
        async with httpx.AsyncClient(base_url=listener.address) as c:
            assert (await c.get("/health")).text == "ok a"
            assert (await c.get("/metrics")).status_code == 401
            got = await c.get("/metrics", headers={"Authorization": "Bearer t0ken-t0ken"})
            assert got.text == "ok a"
    finally:
        await listener.aclose()


async def test_a_health_address_in_use_is_a_config_error_naming_the_key():
    """Another socket listens on the TCP address: starting says ``health.listen``, the
    address and why; nothing is left listening, and the address works once it is free."""
    from starlette.responses import PlainTextResponse

    from agentik.core import ConfigError

    async def answer(request: Any) -> Any:
        return PlainTextResponse("ok")

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        listener = HealthServer(f"127.0.0.1:{port}", health=answer, ready=answer, status=answer)
        with pytest.raises(ConfigError) as info:
            await listener.start()
    said = str(info.value)
    assert said.startswith(f"health.listen: cannot listen on 127.0.0.1:{port}: ")
    assert "in use" in said
    await listener.start()
    try:
        async with httpx.AsyncClient(base_url=listener.address or "") as c:
            assert (await c.get("/health")).text == "ok"
    finally:
        await listener.aclose()


def test_a_bad_listen_address_is_a_config_error_naming_the_key(tmp_path):
    from agentik.core import ConfigError

    with pytest.raises(ConfigError, match=r"health\.listen"):
        parse_config({"health": {"listen": "localhost"}}, source="bot.toml", env={})


# -- agentik run: exit codes, status, sd_notify ---------------------------------------------------


#: Without this environment's systemd socket (a test passes its own).
_env = functools.partial(clean_env, drop=("NOTIFY_SOCKET",))


def _refusing_irc(name: str, port: int) -> str:
    return f"""
[transports.{name}]
type = "irc"
host = "127.0.0.1"
port = {port}
sasl_mechanism = "plain"
sasl_username = "bot"
sasl_password = "wrong-password"
{IRC_FAST}
"""


def _write(tmp_path: Path, openai_server: Any, body: str) -> Path:
    path = tmp_path / "bot.toml"
    path.write_text(
        f"""
[llm]
base_url = "{openai_server.base_url}"
model = "fake-model"
[storage]
path = "{tmp_path / "bot.db"}"
{body}
""",
        encoding="utf-8",
    )
    return path


async def test_agentik_run_exits_1_only_when_every_transport_failed_for_good(
    openai_server, tmp_path
):
    handler = registration_handler(sasl=sasl_plain("bot", "right", succeed=False))
    async with ScriptedIRCServer(handler) as one, ScriptedIRCServer(handler) as two:
        # Both refuse the login: nothing is left to run.
        config = _write(
            tmp_path, openai_server, _refusing_irc("one", one.port) + _refusing_irc("two", two.port)
        )
        proc = await asyncio.create_subprocess_exec(
            AGENTIK, "run", "-c", str(config), env=_env(),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 1, err
        text = err.decode()
        assert "SASL PLAIN login rejected" in text and "wrong-password" not in text

        # One refuses, the HTTP API survives: the bot keeps running, not ready.
        sock = tmp_path / "s.sock"
        config = _write(
            tmp_path,
            openai_server,
            f'[health]\nlisten = "unix:{sock}"\n[transports.web]\ntype = "http"\nport = 0\n'
            + _refusing_irc("one", one.port),
        )
        proc = await asyncio.create_subprocess_exec(
            AGENTIK, "run", "-c", str(config), env=_env(),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            transport = httpx.AsyncHTTPTransport(uds=str(sock), retries=0)
            async with httpx.AsyncClient(transport=transport, base_url="http://bot") as c:
                body = await _wait_for_ready_state(c, "transport:one", "failed")
            assert body["components"]["transport:web"]["state"] == "connected"
            assert "SASL PLAIN login rejected" in body["components"]["transport:one"]["reason"]
            assert proc.returncode is None  # still running
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.communicate(), 120)
            assert proc.returncode == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def _wait_for_ready_state(c: httpx.AsyncClient, component: str, state: str) -> Any:
    """Ask /ready until ``component`` is in ``state`` (the bot runs in another process)."""
    async with asyncio.timeout(60):
        while True:
            try:
                r = await c.get("/ready")
            except httpx.TransportError:  # not listening yet
                await asyncio.sleep(0.05)
                continue
            body = r.json()
            if body["components"].get(component, {}).get("state") == state:
                assert r.status_code == (200 if body["ready"] else 503)
                return body
            await asyncio.sleep(0.05)


async def test_agentik_run_notifies_systemd_and_answers_agentik_status(
    miniircd, openai_server, tmp_path
):
    notify_path = tmp_path / "n.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.setblocking(False)
    loop = asyncio.get_running_loop()
    config = _write(
        tmp_path,
        openai_server,
        f"""
[health]
listen = "unix:h.sock"
[transports.web]
type = "http"
port = 0
[transports.libera]
type = "irc"
host = "127.0.0.1"
port = {miniircd.port}
{IRC_FAST}
""",
    )
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "run", "-c", str(config), env=_env(NOTIFY_SOCKET=str(notify_path)),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        messages: list[str] = []
        async with asyncio.timeout(60):
            while not any("READY=1" in m for m in messages):
                messages.append((await loop.sock_recv(notify, 4096)).decode())
        ready = next(m for m in messages if "READY=1" in m)
        # READY=1 comes once every transport is connected, with a status line.
        assert ready.splitlines()[0] == "READY=1"
        assert "STATUS=libera connected, web connected" in ready.splitlines()

        result = await asyncio.to_thread(
            subprocess.run, [AGENTIK, "status", "-c", str(config)],
            env=_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        out = result.stdout
        assert out.startswith("agentik ") and ": ready, up " in out.splitlines()[0]
        assert "transports:" in out
        lines = out.splitlines()
        assert any(line.split()[:3] == ["libera", "irc", "connected"] for line in lines), out
        assert any(line.split()[:3] == ["web", "http", "connected"] for line in lines), out
        assert "conversations: 0 busy, 0 queued messages" in out

        as_json = await asyncio.to_thread(
            subprocess.run, [AGENTIK, "status", "--json", "--url", f"unix:{tmp_path / 'h.sock'}"],
            env=_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert as_json.returncode == 0, as_json.stderr
        data = json.loads(as_json.stdout)
        assert data["components"]["transport:libera"]["state"] == "connected"

        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            while not any("STOPPING=1" in m for m in messages):
                messages.append((await loop.sock_recv(notify, 4096)).decode())
        await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0
    finally:
        notify.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_agentik_status_says_clearly_when_nothing_listens(tmp_path):
    result = subprocess.run(
        [AGENTIK, "status", "--url", f"unix:{tmp_path / 'none.sock'}"],
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith("agentik: nothing answers at unix:")
    assert "is the bot running" in result.stderr and "Traceback" not in result.stderr
    config = tmp_path / "bot.toml"
    config.write_text("[agent]\nname = 'x'\n", encoding="utf-8")
    result = subprocess.run(
        [AGENTIK, "status", "-c", str(config)],
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "health.listen: not set, and no http transport is enabled" in result.stderr


def test_sd_notify_sends_one_datagram_and_is_quiet_without_systemd(tmp_path):
    path = tmp_path / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        assert sd_notify("STATUS=hello", {"NOTIFY_SOCKET": str(path)})
        assert sock.recv(100) == b"STATUS=hello"
    assert not sd_notify("READY=1", {})
    assert not sd_notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "missing.sock")})


# -- MCP servers and the model -------------------------------------------------------------------


async def test_mcp_servers_and_the_model_report_their_state(openai_server, tmp_path):
    import sys

    from agentik.core.testing.openai_server import Reply

    server = Path(__file__).with_name("mcp_server.py")
    config = make_config(
        tmp_path,
        openai_server,
        f"""
[[mcp.servers]]
name = "good"
command = "{sys.executable}"
args = ["{server}"]
[[mcp.servers]]
name = "broken"
command = "/nonexistent/agentik-mcp-server"
[transports.web]
type = "http"
port = 0
""",
    )
    async with Bot(config) as bot:
        components = bot.status()["components"]
        assert components["mcp:good"]["state"] == "connected"
        broken = components["mcp:broken"]
        assert broken["state"] == "failed" and "agentik-mcp-server" in broken["reason"]
        # MCP servers do not decide readiness; they show as degraded.
        assert bot.status()["ready"] is True and "mcp:broken" in bot.status()["degraded"]

        conv = await bot.agent.create_conversation(title="t")
        openai_server.enqueue(Reply.error(400, "the model refused this request"))
        await conv.send("hello")
        await until_state(bot.health, "model:openai", "degraded")
        model = bot.health.get("model:openai")
        assert model is not None and "the model refused this request" in (model.reason or "")

        await conv.send("again")  # the fake echoes: the next request works
        await until_state(bot.health, "model:openai", "connected")
        status = bot.status()
        assert status["components"]["model:openai"]["reason"] is None
