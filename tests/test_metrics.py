"""Prometheus metrics and structured logs (issue 21).

Metrics are scraped over real HTTP from the HTTP transport and parsed with
prometheus_client's own parser; logs come from a real ``agentik run`` with
the IRC transport against a real IRC server, as JSON lines.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentik.bot.app import Bot
from agentik.bot.config import parse_config
from agentik.bot.logs import RedactingFormatter, log_event
from agentik.bot.metrics import Metrics
from agentik.core.testing.openai_server import Reply
from agentik.transports.http.transport import HttpTransport
from agentik.transports.testing.fake import FakeTransport
from helpers import AGENTIK

from ircservers import IRCTestClient

pytest_plugins = ["ircservers"]

API_TOKEN = "api-token-0123456789abcdef"
SCRAPE_TOKEN = "scrape-token-0123456789abcdef"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition, by (sample name, sorted labels)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _config(openai_server: Any, tmp_path: Any, **http: Any) -> Any:
    return parse_config(
        {
            "llm": {
                "backend": "openai",
                "base_url": openai_server.base_url,
                "api_key": "sk-x",
                "model": "fake-model",
            },
            "storage": {"path": str(tmp_path / "bot.db")},
            "compaction": {"enabled": False},
            "transports": {
                "web": {
                    "type": "http",
                    "port": 0,
                    "tokens": [{"name": "ops", "env": "METRICS_TEST_API"}],
                    **http,
                }
            },
        },
        env={},
    )


async def test_metrics_scraped_over_http_count_turns_tool_calls_and_tokens(
    openai_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("METRICS_TEST_API", API_TOKEN)
    monkeypatch.setenv("METRICS_TEST_SCRAPE", SCRAPE_TOKEN)
    config = _config(openai_server, tmp_path, metrics_token_env="METRICS_TEST_SCRAPE")
    # Turn 1 calls memory_save twice (once fine, once with an empty note: an
    # error) and a tool that does not exist, then answers; turns 2 and 3 just answer.
    openai_server.enqueue(
        Reply.tool_calls(
            [("c1", "memory_save", '{"text": "alice likes tea"}'),
             ("c2", "memory_save", '{"text": ""}'),
             ("c3", "made_up_by_the_model", "{}")],
            usage=(10, 2),
        ),
        Reply.text("noted", usage=(20, 3)),
        Reply.text("two", usage=(5, 1)),
        Reply.text("three", usage=(7, 4)),
    )  # fmt: skip
    chat = FakeTransport(name="chat")
    async with Bot(config, transports={"chat": chat}) as bot:
        for text in ("remember I like tea", "second", "third"):
            await chat.say(text, user="alice")
            await bot.bridge.flush(chat.key(user="alice"))
        assert chat.received(user="alice")[-3:] == ["noted", "two", "three"]
        registry = bot.metrics.registry
        stops = {"stop_reason": "stop"}
        async with asyncio.timeout(60):
            await bot.metrics.wait_until(
                lambda: registry.get_sample_value("agentik_turns_total", stops) == 3
            )

        web = bot.transports["web"]
        assert isinstance(web, HttpTransport) and web.url
        async with httpx.AsyncClient(base_url=web.url) as c:
            assert (await c.get("/metrics")).status_code == 401
            # With metrics_token_env only that token opens /metrics, not the API's.
            api = {"Authorization": f"Bearer {API_TOKEN}"}
            assert (await c.get("/metrics", headers=api)).status_code == 401
            r = await c.get("/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=")
        s = parse(r.text)

    assert value(s, "agentik_turns_total", stop_reason="stop") == 3
    assert sum(v for (n, _), v in s.items() if n == "agentik_turns_total") == 3
    assert value(s, "agentik_turn_duration_seconds_count") == 3
    assert value(s, "agentik_tool_calls_total", tool="memory_save", outcome="ok") == 1
    assert value(s, "agentik_tool_calls_total", tool="memory_save", outcome="error") == 1
    assert value(s, "agentik_tool_call_duration_seconds_count", tool="memory_save") == 2
    # A tool name the model made up is counted, under "unknown".
    assert value(s, "agentik_tool_calls_total", tool="unknown", outcome="error") == 1
    m = {"backend": "openai", "model": "fake-model"}
    assert value(s, "agentik_model_requests_total", **m, outcome="ok") == 4
    assert value(s, "agentik_model_request_duration_seconds_count", **m) == 4
    assert value(s, "agentik_model_time_to_first_token_seconds_count", **m) == 4
    assert value(s, "agentik_model_tokens_total", **m, type="prompt") == 10 + 20 + 5 + 7
    assert value(s, "agentik_model_tokens_total", **m, type="completion") == 2 + 3 + 1 + 4
    assert value(s, "agentik_messages_received_total", transport="chat") == 3
    assert value(s, "agentik_messages_sent_total", transport="chat", kind="answer") == 3
    assert value(s, "agentik_active_conversations") == 0
    assert value(s, "agentik_queue_depth") == 0
    # Low-cardinality labels: no person, channel or conversation in any label.
    labels = {v for (_, ls), _ in s.items() for _, v in ls}
    assert not {v for v in labels if "alice" in v or "fake:" in v}


async def test_metrics_token_protection_and_switch(openai_server, tmp_path, monkeypatch):
    """Without ``metrics_token_env`` an API token opens /metrics; ``metrics = false``
    serves none; a metrics token that is not set is a configuration error naming the key."""
    monkeypatch.setenv("METRICS_TEST_API", API_TOKEN)
    metrics = Metrics()
    metrics.message_in("irc")
    web = HttpTransport(
        name="web", settings={"port": 0, "tokens": [{"name": "ops", "env": "METRICS_TEST_API"}]},
        agent=None, metrics=metrics,
    )  # fmt: skip
    async with Bot(_config(openai_server, tmp_path), transports={"web": web}):
        async with httpx.AsyncClient(base_url=web.url or "") as c:
            assert (await c.get("/metrics")).status_code == 401
            bad = {"Authorization": "Bearer not-the-token-at-all"}
            assert (await c.get("/metrics", headers=bad)).status_code == 401
            r = await c.get("/metrics", headers={"Authorization": f"Bearer {API_TOKEN}"})
            assert r.status_code == 200
            assert value(parse(r.text), "agentik_messages_received_total", transport="irc") == 1

    off = _config(openai_server, tmp_path, metrics=False)
    async with Bot(off) as bot:
        web = bot.transports["web"]
        assert isinstance(web, HttpTransport)
        async with httpx.AsyncClient(base_url=web.url or "") as c:
            r = await c.get("/metrics", headers={"Authorization": f"Bearer {API_TOKEN}"})
            assert r.status_code == 404

    from agentik.core.errors import ConfigError

    monkeypatch.delenv("METRICS_TEST_SCRAPE", raising=False)
    with pytest.raises(ConfigError, match=r"transports\.web\.metrics_token_env: .*METRICS_TEST"):
        Bot(_config(openai_server, tmp_path, metrics_token_env="METRICS_TEST_SCRAPE"))
    monkeypatch.setenv("METRICS_TEST_SCRAPE", "short")
    with pytest.raises(ConfigError, match="too short") as err:
        Bot(_config(openai_server, tmp_path, metrics_token_env="METRICS_TEST_SCRAPE"))
    assert "short'" not in str(err.value)  # the value itself is never shown


def test_transport_states_reconnects_and_budget_refusals_are_exposed():
    metrics = Metrics()
    for state in ("starting", "connected", "reconnecting", "connected", "reconnecting"):
        metrics.transport_state("libera", state)
    metrics.transport_state("libera", "connected")
    metrics.transport_state("libera", "connected")  # no change: not a reconnect
    metrics.budget_refused("channel", "messages")
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    s = parse(body.decode())
    assert value(s, "agentik_transport_state", transport="libera", state="connected") == 1
    assert value(s, "agentik_transport_state", transport="libera", state="reconnecting") == 0
    assert value(s, "agentik_transport_reconnects_total", transport="libera") == 2
    assert value(s, "agentik_budget_refusals_total", scope="channel", kind="messages") == 1
    with pytest.raises(ValueError, match="unknown transport state"):
        metrics.transport_state("libera", "sleepy")
    # Each Metrics has its own registry: another bot in this process starts at zero.
    other = parse(Metrics().render()[0].decode())
    assert value(other, "agentik_transport_reconnects_total", transport="libera") == 0


async def test_budget_refusals_and_messages_in_are_counted(tmp_path):
    config = parse_config({
        "llm": {"backend": "scripted"}, "storage": {"path": str(tmp_path / "b.db")},
        "memory": {"backend": "none"}, "compaction": {"enabled": False},
        "transports": {"term": {"type": "stdio"}},
        "budgets": {"channel": {"messages_per_minute": 1}},
    }, env={})  # fmt: skip
    chat = FakeTransport(name="term")
    async with Bot(config, transports={"term": chat}) as bot:
        await chat.say("one", user="pat")
        await chat.say("two", user="pat")
        await chat.say("three", user="pat")
        await bot.bridge.flush(chat.key(user="pat"))
        s = parse(bot.metrics.render()[0].decode())
    assert value(s, "agentik_budget_refusals_total", scope="channel", kind="messages") == 2
    assert value(s, "agentik_messages_received_total", transport="term") == 3


async def test_approvals_requested_and_resolved_are_counted(tmp_path):
    from agentik.core.testing.scripted import Reply as ScriptedReply
    from agentik.core.testing.scripted import call
    from agentik.core.tools.base import tool

    @tool(
        name="fs__write_file",
        description="Write a file",
        parameters={"type": "object", "properties": {"path": {"type": "string"}}},
    )
    async def write(path: str) -> str:
        return f"wrote {path}"  # pragma: no cover - denied  # fmt: skip

    config = parse_config({
        "llm": {"backend": "scripted"}, "storage": {"path": str(tmp_path / "a.db")},
        "memory": {"backend": "none"}, "compaction": {"enabled": False},
        "transports": {"term": {"type": "stdio"}},
        "approvals": [{"tools": ["fs__*"], "approvers": "user"}],
    }, env={})  # fmt: skip
    chat = FakeTransport(name="term")
    bot = Bot(config, transports={"term": chat})
    bot.agent.add_tool(write)
    bot.agent.llm.enqueue(ScriptedReply(tool_calls=[call("fs__write_file", {"path": "/motd"})]))
    bot.agent.llm.enqueue("not written, then")
    async with bot:
        asked = bot.agent.events(kinds=["approval_requested"])
        await chat.say("write the motd", user="alice")
        async with asyncio.timeout(60):
            request = await anext(aiter(asked))
        await asked.aclose()
        await chat.say(f"!deny {request.approval_id}", user="alice")
        await bot.bridge.flush(chat.key(user="alice"))
        registry = bot.metrics.registry
        async with asyncio.timeout(60):
            await bot.metrics.wait_until(
                lambda: (
                    registry.get_sample_value("agentik_turns_total", {"stop_reason": "stop"}) == 1
                )
            )
        s = parse(bot.metrics.render()[0].decode())
    assert value(s, "agentik_approvals_requested_total", tool="fs__write_file") == 1
    assert value(s, "agentik_approvals_resolved_total", decision="denied") == 1
    assert value(s, "agentik_tool_calls_total", tool="fs__write_file", outcome="error") == 1


def test_json_log_fields_and_text_lines():
    record = logging.LogRecord("agentik.x", logging.INFO, __file__, 1, "answered %s", ("x",), None)
    record.__dict__.update(event="answer", run_id="r1", tokens=7, channels=["#a"], msg_extra=None)
    line = json.loads(RedactingFormatter("json", ["sekrit-value"]).format(record))
    assert line["msg"] == "answered x" and line["level"] == "info"
    assert (line["event"], line["run_id"], line["tokens"], line["channels"]) == (
        "answer", "r1", 7, ["#a"])  # fmt: skip
    # A field cannot replace the envelope, and secrets in fields are blanked too.
    record.__dict__.update(ts="forged", password="sekrit-value")
    line = json.loads(RedactingFormatter("json", ["sekrit-value"]).format(record))
    assert line["ts"] != "forged" and line["password"] == "***"
    # Text lines stay one readable line: the message only.
    text = RedactingFormatter("text").format(record)
    assert text.endswith("INFO    agentik.x: answered x")

    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logger = logging.getLogger("agentik.test_metrics")
    logger.addHandler(handler := Keep())
    logger.setLevel(logging.INFO)
    try:
        log_event(logger, logging.INFO, "startup", "model %s", "m", backend="openai")
        log_event(logger, logging.DEBUG, "answer_text", "text %s", "hidden")
    finally:
        logger.removeHandler(handler)
    assert [(r.getMessage(), r.event, r.backend) for r in seen] == [  # type: ignore[attr-defined]
        ("model m", "startup", "openai")
    ]


class JsonLog:
    """A process's stderr, one JSON object per line, read as it comes."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.lines: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self.changed = asyncio.Event()
        self.ended = False
        self.task = asyncio.ensure_future(self._read(stream))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        try:
            while line := await stream.readline():
                text = line.decode()
                self.raw.append(text)
                self.lines.append(json.loads(text))  # every line is one JSON object
                self.changed.set()
        finally:
            self.ended = True
            self.changed.set()

    async def line(self, **want: Any) -> dict[str, Any]:
        """The first line whose fields include ``want`` (waiting for it, 60 s at most)."""
        async with asyncio.timeout(60):
            while True:
                self.changed.clear()
                for line in self.lines:
                    if all(line.get(k) == v for k, v in want.items()):
                        return line
                assert not self.ended, "agentik exited:\n" + "".join(self.raw)
                await self.changed.wait()


async def test_agentik_run_logs_startup_connection_and_answers_as_json_fields(
    miniircd, openai_server, tmp_path
):
    """A real bot on a real IRC server, JSON logs at INFO: a line per start-up fact,
    per connection change (lost and restored at the same level) and per answer,
    with fields; no message text and no secret anywhere."""
    irc_pass, api_key = "irc-pass-4d1f9a0b7c", "sk-live-secret-8e2a61"
    config = tmp_path / "bot.toml"
    config.write_text(
        f"""
[llm]
backend = "openai"
base_url = "{openai_server.base_url}"
api_key = "${{TEST_OPENAI_KEY}}"
model = "fake-model"
[storage]
path = "{tmp_path / "bot.db"}"
[logging]
level = "info"
format = "json"
[transports.libera]
type = "irc"
host = "127.0.0.1"
port = {miniircd.port}
tls = false
nick = "metricbot"
channels = ["#ops"]
password = "${{TEST_IRC_PASS}}"
reconnect_min = 0.2
reconnect_max = 0.5
[transports.web]
type = "http"
port = 0
tokens = [{{ name = "ops", env = "TEST_API_TOKEN" }}]
metrics_token_env = "TEST_SCRAPE_TOKEN"
"""
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    env.update(TEST_OPENAI_KEY=api_key, TEST_IRC_PASS=irc_pass, TEST_API_TOKEN=API_TOKEN,
               TEST_SCRAPE_TOKEN=SCRAPE_TOKEN)  # fmt: skip
    openai_server.enqueue(Reply.text("the answer is forty-two", usage=(11, 5)))
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "run", "-c", str(config), env=env,
        stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    logs = JsonLog(proc.stderr)
    try:
        irc = await logs.line(event="startup", transport="libera")
        assert irc["level"] == "info"
        assert (irc["host"], irc["port"], irc["tls"], irc["channels"]) == (
            "127.0.0.1", miniircd.port, False, ["#ops"])  # fmt: skip
        model = await logs.line(event="startup", backend="openai")
        assert model["model"] == "fake-model" and model["level"] == "info"
        web = await logs.line(event="startup", transport="web")
        assert web["url"].endswith("/agentik") and web["metrics"].endswith("/metrics")
        connected = await logs.line(event="connected", transport="libera")
        assert connected["level"] == "info"

        async with await IRCTestClient.connect(miniircd.port, "alice") as alice:
            await alice.join("#ops")
            await logs.line(event="joined", transport="libera")
            alice.privmsg("#ops", "metricbot: what is six times seven")
            await alice.wait_for(lambda m: m.command == "PRIVMSG" and "forty-two" in m.text)
        answer = await logs.line(event="answer", transport="libera")
        assert answer["level"] == "info" and answer["channel"].endswith(":#ops")
        assert answer["conversation_id"] and answer["run_id"]
        assert answer["tokens"] == 16 and answer["duration"] >= 0
        assert answer["stop_reason"] == "stop"

        async with httpx.AsyncClient() as c:
            r = await c.get(web["metrics"], headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
        assert r.status_code == 200
        s = parse(r.text)
        assert value(s, "agentik_messages_received_total", transport="libera") >= 1
        assert value(s, "agentik_turns_total", stop_reason="stop") == 1

        # The server goes away and comes back: both changes logged, at one level.
        await miniircd.kill()
        lost = await logs.line(event="connection_lost", transport="libera")
        await miniircd.start()
        back = await logs.line(event="connection_restored", transport="libera")  # fmt: skip
        assert lost["level"] == back["level"] == "warning"
        assert back["host"] == "127.0.0.1" and back["port"] == miniircd.port

        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            await proc.wait()
        await logs.task
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        logs.task.cancel()
    everything = "".join(logs.raw)
    assert proc.returncode == 0, everything
    # The message and the answer only at DEBUG: not in INFO logs.
    assert "six times seven" not in everything and "forty-two" not in everything
    for secret in (irc_pass, api_key, API_TOKEN, SCRAPE_TOKEN):
        assert secret not in everything
