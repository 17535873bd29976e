"""A real ``agentik run`` when a transport fails, on SIGTERM and on SIGHUP (issue 29).

The IRC server is a real miniircd, Slack is :mod:`fakeslack` (slack-bolt and
slack-sdk run for real against it), the model is the fake OpenAI-compatible
server.  Assertions are on outcomes and order, never on how long things took;
every wait is on a condition with a generous deadline.
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
from typing import Any

import httpx

from helpers import AGENTIK

from fakeslack import FakeSlack
from ircservers import IRCTestClient, free_port
from rigs import said_by_bot as from_bot

pytest_plugins = ["ircservers"]

WAIT = 60.0


class Run:
    """One ``agentik run -c FILE`` process with its stderr collected."""

    def __init__(self, config: Path, health_port: int, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.health = f"http://127.0.0.1:{health_port}"
        skip = ("OPENAI_", "AGENTIK_", "SLACK_")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
        self.env.update(env or {})
        self.proc: asyncio.subprocess.Process | None = None
        self.stderr: list[str] = []
        self._drain: asyncio.Future[None] | None = None

    async def __aenter__(self) -> Run:
        self.proc = await asyncio.create_subprocess_exec(
            AGENTIK, "run", "-c", str(self.config), env=self.env,
            stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self._drain = asyncio.ensure_future(self._collect())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self._drain is not None:
            self._drain.cancel()

    async def _collect(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.stderr.append(line.decode())

    @property
    def log(self) -> str:
        return "".join(self.stderr)

    def logged(self, pattern: str) -> list[str]:
        return [line for line in self.stderr if re.search(pattern, line)]

    async def until(self, pred: Callable[[], Any], what: str) -> Any:
        """Wait for ``pred()`` to be true (async predicates are awaited)."""
        deadline = time.monotonic() + WAIT
        while True:
            value = pred()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            if self.proc is not None and self.proc.returncode is not None:
                code = self.proc.returncode
                raise AssertionError(f"the bot exited ({code}) before {what}:\n{self.log}")
            if time.monotonic() > deadline:
                raise AssertionError(f"gave up waiting for {what}; stderr:\n{self.log}")
            await asyncio.sleep(0.05)

    async def ready(self) -> tuple[int, dict[str, Any]]:
        try:
            async with httpx.AsyncClient() as client:
                r = await client.get(self.health + "/ready", timeout=WAIT)
        except httpx.TransportError:
            return 0, {}
        return r.status_code, r.json()

    async def component(self, name: str) -> dict[str, Any]:
        _, body = await self.ready()
        return (body.get("components") or {}).get(name) or {}

    async def exit_code(self) -> int:
        assert self.proc is not None
        await asyncio.wait_for(self.proc.wait(), WAIT)
        if self._drain is not None:
            await self._drain
        assert self.proc.returncode is not None
        return self.proc.returncode


def bot_toml(
    tmp_path: Path, openai_url: str, health_port: int, *, tables: list[str], extra: str = ""
) -> Path:
    path = tmp_path / "bot.toml"
    path.write_text(
        f"""
[llm]
base_url = "{openai_url}"
model = "fake-model"
[storage]
path = "{tmp_path / "bot.db"}"
[health]
listen = "127.0.0.1:{health_port}"
[supervision]
backoff_initial = 0.2
backoff_max = 0.5
{extra}
"""
        + "\n".join(tables)
    )
    return path


def irc_table(port: int) -> str:
    return f"""
[transports.local]
type = "irc"
host = "127.0.0.1"
port = {port}
tls = false
nick = "agentik"
channels = ["#ops"]
"""


def slack_table(api_url: str, *, bot_token: str, app_token: str) -> str:
    return f"""
[transports.work]
type = "slack"
mode = "socket"
bot_token = "{bot_token}"
app_token = "{app_token}"
api_url = "{api_url}"
"""


# -- item 3: one Slack failure never takes down the others ------------------------------------


async def test_a_rejected_slack_token_fails_slack_alone_and_irc_runs_whatever_the_table_order(
    miniircd, openai_server, tmp_path
):
    """Bot token refused (Slack table first), then app token refused (Slack table
    first again): each time IRC joins and answers, Slack is ``failed`` with a one-line
    reason naming the key, ``/ready`` says so, no traceback, and SIGTERM still says
    goodbye on IRC and exits 0."""
    alice = await IRCTestClient.connect(miniircd.port, "alice")
    await alice.join("#ops")
    try:
        async with FakeSlack() as slack:
            for key, bot_token, app_token in (
                ("bot_token", "xoxb-wrong", slack.app_token),
                ("app_token", slack.bot_token, "xapp-wrong"),
            ):
                health = free_port()
                config = bot_toml(tmp_path, openai_server.base_url, health, tables=[
                    slack_table(slack.api_url, bot_token=bot_token, app_token=app_token),
                    irc_table(miniircd.port),
                ])  # fmt: skip
                mark = alice.mark()
                async with Run(config, health) as run:
                    await alice.wait_for(
                        lambda m: m.command == "JOIN" and m.nick == "agentik", since=mark,
                        timeout=WAIT,
                    )  # fmt: skip
                    slack_state = await run.until(
                        lambda: _failed(run, "transport:work"), "Slack to be reported failed"
                    )
                    assert f"transports.work.{key}" in slack_state["reason"]
                    assert "\n" not in slack_state["reason"]
                    status, body = await run.ready()
                    assert status == 503 and body["ready"] is False
                    assert body["components"]["transport:local"]["state"] == "connected"

                    asked = alice.mark()
                    alice.privmsg("#ops", "agentik: still there?")
                    answer = await alice.wait_for(from_bot, since=asked, timeout=WAIT)
                    assert "still there?" in answer.text

                    assert run.proc is not None
                    run.proc.send_signal(signal.SIGTERM)
                    await alice.wait_for(
                        lambda m: m.command == "QUIT" and m.nick == "agentik", since=asked,
                        timeout=WAIT,
                    )  # fmt: skip
                    assert await run.exit_code() == 0, run.log
                    assert "Traceback" not in run.log
                    assert bot_token not in run.log and app_token not in run.log
                    assert len(run.logged(f"transports.work.{key}")) >= 1
    finally:
        await alice.close()


async def _failed(run: Run, name: str) -> dict[str, Any] | None:
    found = await run.component(name)
    return found if found.get("state") == "failed" else None


async def test_slack_unreachable_at_start_reconnects_with_backoff_then_serves(
    miniircd, openai_server, tmp_path
):
    """Nothing listens where Slack should be: IRC starts anyway, Slack is
    ``reconnecting`` with a reason; once Slack is up, it connects and ``/ready`` is 200."""
    slack_port = free_port()
    health = free_port()
    api_url = f"http://127.0.0.1:{slack_port}/api/"
    config = bot_toml(tmp_path, openai_server.base_url, health, tables=[
        slack_table(api_url, bot_token="xoxb-test", app_token="xapp-test"),
        irc_table(miniircd.port),
    ])  # fmt: skip
    alice = await IRCTestClient.connect(miniircd.port, "alice")
    await alice.join("#ops")
    try:
        async with Run(config, health) as run:
            await alice.wait_for(
                lambda m: m.command == "JOIN" and m.nick == "agentik", timeout=WAIT
            )

            async def reconnecting() -> dict[str, Any] | None:
                found = await run.component("transport:work")
                return found if found.get("state") == "reconnecting" else None

            state = await run.until(reconnecting, "Slack to be reported reconnecting")
            assert "cannot reach" in state["reason"] or "could not start" in state["reason"]
            assert (await run.ready())[0] == 503
            # Retried more often than [supervision] max_restarts (5) allows for crashes:
            # an unreachable server is retried for as long as it takes.
            await run.until(lambda: len(run.logged("transport work failed")) >= 8, "retries")
            assert (await run.component("transport:work"))["state"] == "reconnecting"

            async with FakeSlack(port=slack_port) as slack:
                await slack.wait_for_socket(timeout=WAIT)
                await run.until(lambda: _ready(run), "/ready to be 200")
                status, body = await run.ready()
                assert body["components"]["transport:work"]["state"] == "connected"
                assert run.proc is not None
                run.proc.send_signal(signal.SIGTERM)
                assert await run.exit_code() == 0, run.log
            assert "Traceback" not in run.log
    finally:
        await alice.close()


async def _ready(run: Run) -> bool:
    return (await run.ready())[0] == 200


async def test_a_socket_mode_token_revoked_while_running_is_reported_failed(
    miniircd, openai_server, tmp_path
):
    """Connected, then the app token is revoked and the socket drops: Slack turns
    ``failed`` (not "connected" for ever, not retried for ever), IRC keeps answering."""
    health = free_port()
    alice = await IRCTestClient.connect(miniircd.port, "alice")
    await alice.join("#ops")
    try:
        async with FakeSlack() as slack:
            config = bot_toml(tmp_path, openai_server.base_url, health, tables=[
                irc_table(miniircd.port),
                slack_table(slack.api_url, bot_token=slack.bot_token, app_token=slack.app_token),
            ])  # fmt: skip
            async with Run(config, health) as run:
                await run.until(lambda: _ready(run), "both transports to be up")
                # At the default log level, one line per transport says it is ready.
                await run.until(lambda: run.logged(r"agentik\.status: irc local ready"), "IRC")
                irc_line = run.logged(r"agentik\.status: irc local ready")
                assert f"127.0.0.1:{miniircd.port} as agentik, channels #ops" in irc_line[0]
                slack_line = run.logged(r"agentik\.status: slack work ready")
                assert len(slack_line) == 1 and "connected to team" in slack_line[0]
                slack.app_token = "xapp-rotated"  # the bot's token is revoked
                await slack.drop_socket(abort=False)
                state = await run.until(
                    lambda: _failed(run, "transport:work"), "Slack to be reported failed"
                )
                assert "transports.work.app_token" in state["reason"]
                assert (await run.ready())[0] == 503
                mark = alice.mark()
                alice.privmsg("#ops", "agentik: and now?")
                answer = await alice.wait_for(from_bot, since=mark, timeout=WAIT)
                assert "and now?" in answer.text
                assert run.proc is not None
                run.proc.send_signal(signal.SIGTERM)
                assert await run.exit_code() == 0, run.log
                assert "Traceback" not in run.log
    finally:
        await alice.close()


async def test_run_exits_non_zero_only_when_every_transport_failed(openai_server, tmp_path):
    """A bot whose only transport's token is refused exits 1 with a one-line reason."""
    async with FakeSlack() as slack:
        health = free_port()
        config = bot_toml(tmp_path, openai_server.base_url, health, tables=[
            slack_table(slack.api_url, bot_token="xoxb-wrong", app_token=slack.app_token),
        ])  # fmt: skip
        async with Run(config, health) as run:
            assert await run.exit_code() == 1, run.log
        assert "transports.work.bot_token" in run.log
        assert "Traceback" not in run.log
        assert "xoxb-wrong" not in run.log


# -- item 5: a reload is applied in full, or says what needs a restart -------------------------

MCP_SERVER = str(Path(__file__).with_name("mcp_server.py"))
OPS, BOSS = "ops-token-0123456789abcdef", "boss-token-0123456789abcdef"


def web_table(name: str, port: int) -> str:
    return f"""
[transports.{name}]
type = "http"
port = {port}
tokens = [{{ name = "ops", env = "OPS_TOKEN" }}, {{ name = "boss", env = "BOSS_TOKEN" }}]
"""


async def test_sighup_starts_an_added_web_transport_and_an_added_admin_approves_over_http(
    miniircd, openai_server, tmp_path
):
    import sys

    from agentik.core.testing.openai_server import Reply as HttpReply

    def model(body: dict) -> HttpReply:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return HttpReply.text(f"the sum is {last.get('content')}")
        return HttpReply.tool_calls([("call_1", "calc__add", '{"a": 2, "b": 3}')])

    openai_server.default = model
    health, web_port, added_port = free_port(), free_port(), free_port()
    common = f"""
[[mcp.servers]]
name = "calc"
command = "{sys.executable}"
args = ["{MCP_SERVER}"]
[[approvals]]
tools = ["calc__add"]
approvers = "admin"
"""
    tables = [irc_table(miniircd.port), web_table("web", web_port)]
    config = bot_toml(tmp_path, openai_server.base_url, health, tables=tables, extra=common)
    env = {"OPS_TOKEN": OPS, "BOSS_TOKEN": BOSS}
    base = f"http://127.0.0.1:{web_port}/agentik"
    async with Run(config, health, env) as run, httpx.AsyncClient(base_url=base) as web:
        await run.until(lambda: _ready(run), "the bot to be ready")
        ops = {"Authorization": f"Bearer {OPS}"}
        boss = {"Authorization": f"Bearer {BOSS}"}

        async def pending_approval(conv: str) -> str:
            r = await web.post(f"/conversations/{conv}/messages", headers=ops,
                               json={"content": "add 2 and 3"})  # fmt: skip
            assert r.status_code == 202, r.text

            async def found() -> str | None:
                got = await web.get(f"/conversations/{conv}/approvals", headers=ops)
                items = got.json()["items"]
                return items[0]["id"] if items else None

            return await run.until(found, "the approval request")

        conv = (await web.post("/conversations", headers=ops, json={})).json()["id"]
        first = await pending_approval(conv)
        refused = await web.post(f"/conversations/{conv}/approvals/{first}", headers=boss,
                                 json={"decision": "approve"})  # fmt: skip
        assert refused.status_code == 403  # boss is no admin yet

        # SIGHUP: boss becomes an admin, a second web transport is added.
        config.write_text(config.read_text() + '\n[access]\nadmins = ["web:token:boss"]\n'
                          + web_table("added", added_port))  # fmt: skip
        assert run.proc is not None
        run.proc.send_signal(signal.SIGHUP)
        await run.until(lambda: run.logged("configuration reloaded"), "the reload")
        assert "transports added: added" in run.logged("configuration reloaded")[0]

        # The added transport serves and is ready: /ready says so, and it answers.
        async def added_connected() -> bool:
            found = await run.component("transport:added")
            return found.get("state") == "connected"

        await run.until(added_connected, "the added web transport to be connected")
        assert (await run.ready())[0] == 200
        async with httpx.AsyncClient() as client:
            r = await client.get(f"http://127.0.0.1:{added_port}/agentik/conversations",
                                 headers=ops)  # fmt: skip
            assert r.status_code == 200

        # The admin added by the reload approves over the web transport that was running.
        approved = await web.post(f"/conversations/{conv}/approvals/{first}", headers=boss,
                                  json={"decision": "approve"})  # fmt: skip
        assert approved.status_code == 200, approved.text

        async def answered() -> bool:
            got = await web.get(f"/conversations/{conv}/messages", headers=ops)
            return any("the sum is 5" in str(m.get("content")) for m in got.json()["items"])

        await run.until(answered, "the approved tool call's answer")
        run.proc.send_signal(signal.SIGTERM)
        assert await run.exit_code() == 0, run.log
        assert "Traceback" not in run.log and OPS not in run.log and BOSS not in run.log


def _flipped(model: Any) -> dict[str, Any]:
    """A change to one plain key of a settings model (a bool flipped, a number raised)."""
    from pydantic import BaseModel

    instance = model() if isinstance(model, type) else model
    fields = type(instance).model_fields if isinstance(instance, BaseModel) else {}
    if not fields:
        fields = instance.__pydantic_fields__
    for key in fields:
        value = getattr(instance, key)
        if isinstance(value, bool):
            return {key: not value}
    for key in fields:
        value = getattr(instance, key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return {key: value + 1}
    raise AssertionError(f"no plain key to change in {model}")


async def test_a_reload_names_every_top_level_section_of_the_configuration_reference(tmp_path):
    """Each top-level section of docs/reference/config.md, changed alone, is either
    applied (the summary says what) or reported as needing a restart by name."""
    from agentik.bot.app import Bot
    from agentik.bot.config import Config, parse_config

    reference = (Path(__file__).parents[1] / "docs/reference/config.md").read_text()
    documented = {
        re.split(r"[.\]]", m)[0] for m in re.findall(r"^## `\[\[?([a-z_.<>]+)", reference, re.M)
    }
    sections = {n for n, f in Config.model_fields.items() if not f.exclude}
    assert documented == sections

    path = tmp_path / "bot.toml"
    base: dict[str, Any] = {
        "llm": {"backend": "scripted"},
        "storage": {"path": str(tmp_path / "bot.db")},
        "memory": {"backend": "none"},
        "compaction": {"enabled": False},
        "transports": {"mem": {"type": "memory", "answer": "all"}},
    }
    changes: dict[str, tuple[Any, str]] = {
        "agent": ({"system_prompt": "Another prompt."}, "system prompt"),
        "llm": ({"backend": "scripted", "model": "other"}, "restart needed for [llm]"),
        "storage": ({"path": str(tmp_path / "other.db")}, "restart needed for [storage]"),
        "tools": ({"allowed_tools": ["nothing"]}, "tool policy"),
        "memory": (None, "restart needed for [memory]"),
        "compaction": ({"enabled": True}, "restart needed for [compaction]"),
        "transports": ({"mem": {"type": "memory", "answer": "addressed"}},
                       "transports with new options: mem"),
        "channels": ({"memory:mem:*": {"answer": "all"}}, "channel settings"),
        "mcp": ({"servers": [{"name": "calc", "command": sys.executable,
                              "args": [MCP_SERVER]}]}, "MCP servers added: calc"),
        "approvals": ([{"tools": ["x__*"], "approvers": "admin"}], "approvals"),
        "plugins": ({"load": []}, "restart needed for [plugins]"),
        "logging": ({"level": "info"}, "restart needed for [logging]"),
        "agents": ({"helper": {"description": "Helps.", "system_prompt": "Help."}},
                   "restart needed for [agents]"),
        "budgets": ({"user": {"messages_per_minute": 5}}, "budgets"),
        "access": ({"ignored": ["mem:mallory"]}, "access rules"),
        "health": ({"ready_grace": 5}, "restart needed for [health]"),
        "supervision": ({"max_restarts": 2}, "restart needed for [supervision]"),
        "profiles": ({"mine": {"extends": "chat"}}, "restart needed for [profiles]"),
        "passthrough": ([{"name": "p_echo", "tool": "calc__echo"}],
                        "restart needed for [passthrough]"),
        "runs": (None, "restart needed for [runs]"),
        "retention": (None, "restart needed for [retention]"),
        "checkpoints": (None, "restart needed for [checkpoints]"),
        "attachments": (None, "restart needed for [attachments]"),
        "redaction": (None, "restart needed for [redaction]"),
        "cluster": ({"lease_seconds": 20}, "restart needed for [cluster]"),
        "links": ([{"name": "team", "channels": ["memory:mem:#a", "memory:mem:#b"]}],
                  "links added: team"),
        "webhooks": ([{"name": "ops", "url": "http://127.0.0.1:9/", "secret_env": "NONE"}],
                     "restart needed for [webhooks]"),
        "workspace": ({"max_results": 7}, "restart needed for [workspace]"),
    }  # fmt: skip
    assert set(changes) == sections, "a new section needs a line here"
    async with Bot(parse_config(base, source=str(path), env={})) as bot:
        for section, (value, expected) in changes.items():
            if value is None:
                value = _flipped(type(getattr(bot.config, section)))
            current = {**base, section: value} if section not in base else {
                **base, section: {**base[section], **value} if isinstance(value, dict)
                else value,
            }  # fmt: skip
            summary = await bot.reload(parse_config(current, source=str(path), env={}))
            assert expected in summary, (section, summary)
            assert "nothing changed" not in summary
            # And back, so that each section is changed alone.
            await bot.reload(parse_config(base, source=str(path), env={}))


# -- item 4: SIGTERM with a slow model ----------------------------------------------------------


async def test_sigterm_with_a_slow_model_stops_taking_turns_says_goodbye_and_exits_in_time(
    miniircd, openai_server, tmp_path
):
    """The model answers once, then never finishes (an answer, reflections): on
    SIGTERM /ready turns 503, the web API takes no new message, IRC gets a QUIT, the
    running turn is cut, and the process exits well before systemd's TimeoutStopSec."""
    from agentik.core.testing.openai_server import Reply as HttpReply

    openai_server.default = lambda body: HttpReply.endless("la ", delay=0.2)
    health, web_port = free_port(), free_port()
    config = bot_toml(
        tmp_path, openai_server.base_url, health,
        tables=[irc_table(miniircd.port), web_table("web", web_port)],
        extra="stop_timeout = 8\ndrain_timeout = 2\n",
    )  # fmt: skip
    alice = await IRCTestClient.connect(miniircd.port, "alice")
    await alice.join("#ops")
    base = f"http://127.0.0.1:{web_port}/agentik"
    ops = {"Authorization": f"Bearer {OPS}"}
    try:
        async with (
            Run(config, health, {"OPS_TOKEN": OPS, "BOSS_TOKEN": BOSS}) as run,
            httpx.AsyncClient(base_url=base, headers=ops) as web,
        ):
            await run.until(lambda: _ready(run), "the bot to be ready")
            conv = (await web.post("/conversations", json={})).json()["id"]
            # One finished turn (something to reflect on at the stop), then an endless one.
            openai_server.enqueue(HttpReply.text("hello alice"))
            first = alice.mark()
            alice.privmsg("#ops", "agentik: hello")
            await alice.wait_for(
                lambda m: from_bot(m) and "hello alice" in m.text, since=first, timeout=WAIT
            )
            alice.privmsg("#ops", "agentik: tell me a long story")
            await run.until(
                lambda: any("long story" in str(r["messages"]) for r in openai_server.requests),
                "the turn to reach the model",
            )
            mark = alice.mark()
            assert run.proc is not None
            sent = time.monotonic()
            run.proc.send_signal(signal.SIGTERM)

            async def not_ready() -> dict[str, Any] | None:
                status, body = await run.ready()
                return body if status == 503 else None

            body = await run.until(not_ready, "/ready to answer 503")
            assert body["status"] == "stopping"
            try:
                late = await web.post(f"/conversations/{conv}/messages",
                                      json={"content": "one more thing"})  # fmt: skip
            except httpx.TransportError:
                pass  # the API is already closed: refused too
            else:
                assert late.status_code == 503, late.text
            await alice.wait_for(
                lambda m: m.command == "QUIT" and m.nick == "agentik", since=mark, timeout=WAIT
            )
            assert await run.exit_code() == 0, run.log
            took = time.monotonic() - sent
            # systemd's TimeoutStopSec in contrib/agentik.service is 30 s.
            assert took < 30, f"took {took:.0f} s to stop:\n{run.log}"
            assert not any("one more thing" in str(r["messages"]) for r in openai_server.requests)
            assert len(run.logged("cut short")) >= 1
            assert "Traceback" not in run.log
    finally:
        await alice.close()


async def test_sigterm_while_slack_takes_its_time_to_answer_still_says_goodbye_on_irc(
    miniircd, openai_server, tmp_path
):
    """Slack accepts the connection and never answers (its start hangs): IRC, after
    it in the file, starts anyway; SIGTERM then stops the bot in order (IRC QUIT,
    exit 0) instead of killing it mid-start."""
    hold = asyncio.Event()
    accepted = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await hold.wait()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    health = free_port()
    config = bot_toml(tmp_path, openai_server.base_url, health, tables=[
        slack_table(f"http://127.0.0.1:{port}/api/", bot_token="xoxb-test", app_token="xapp-x"),
        irc_table(miniircd.port),
    ])  # fmt: skip
    alice = await IRCTestClient.connect(miniircd.port, "alice")
    await alice.join("#ops")
    try:
        async with Run(config, health) as run:
            mark = alice.mark()
            await alice.wait_for(
                lambda m: m.command == "JOIN" and m.nick == "agentik", since=mark, timeout=WAIT
            )
            await asyncio.wait_for(accepted.wait(), WAIT)
            assert run.proc is not None
            run.proc.send_signal(signal.SIGTERM)
            await alice.wait_for(
                lambda m: m.command == "QUIT" and m.nick == "agentik", since=mark, timeout=WAIT
            )
            assert await run.exit_code() == 0, run.log
            assert "Traceback" not in run.log
    finally:
        hold.set()
        server.close()
        await alice.close()
